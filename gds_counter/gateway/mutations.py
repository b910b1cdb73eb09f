"""Writes as data: the mutations a commit carries, the rules a commit's
mutations must meet before anything is sent, and what it reports back."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence, Union, get_args

import attrs

from gds_counter._checks import check_int
from gds_counter.errors import BadKeyError, BadValueError
from gds_counter.gateway._paths import check_path, parse, quote
from gds_counter.gateway.keys import Key, require_complete
from gds_counter.gateway.values import RawEntity, SealedProperties, check_value, validate_entity

__all__ = [
    "MAX_MUTATIONS_PER_COMMIT", "AppendMissingElements", "CommitResult", "Delete", "Increment", "Insert", "Maximum",
    "Minimum", "Mutation", "MutationResult", "RemoveAllFromArray", "RequestTime", "Transform", "Update", "Upsert",
    "check_commit", "check_mutation", "check_transforms", "map_keys", "path_of",
]

#: Datastore's limit on the mutations of one commit.
MAX_MUTATIONS_PER_COMMIT = 500


def path_of(name: str) -> str:
    """The property path (a mask's or an ``Increment``'s) of the top-level
    property ``name``: ``name`` itself when it is a plain name, else quoted
    in backticks, as Datastore requires (``a-b`` is refused bare)."""
    return quote(name)

@attrs.frozen
class Increment:
    """A server-side transform: add ``amount`` to property ``name``.
    Datastore's PropertyTransform.increment: integers saturate at the 64-bit
    bounds, a double on either side makes a double, and a value that is not
    a number (or none) is replaced by ``amount``."""

    name: str
    amount: int | float


@attrs.frozen
class Maximum:
    """A server-side transform: set property ``name`` to the larger of its
    value and ``value`` (Datastore's PropertyTransform.maximum). Measured on
    the Firestore emulator: integers and doubles compare as numbers (exactly:
    2**53 + 1 beats 2.0**53); on a tie (1 and 1.0, 0 and -0.0) the stored
    value stays, type included; NaN on either side makes NaN; a value that
    is not a number (or none) is replaced by ``value``."""

    name: str
    value: int | float


@attrs.frozen
class Minimum:
    """``Maximum``'s twin: the smaller of the two (PropertyTransform.minimum)."""

    name: str
    value: int | float


@attrs.frozen
class AppendMissingElements:
    """A server-side transform: append to the array ``name`` each of
    ``elements`` it does not hold yet, in order (PropertyTransform.
    append_missing_elements). Equality is the server's: integers and doubles
    by number (1 is 1.0, 0 is -0.0), NaN equals NaN, entity values by their
    properties (index flags aside); other types never equal each other
    (True is not 1, "a" is not b"a"). Elements already stored twice stay
    twice; a value that is not an array (or none) is replaced by a new one.
    Its transform result is None."""

    name: str
    elements: tuple[Any, ...] = attrs.field(converter=tuple)


@attrs.frozen
class RemoveAllFromArray:
    """A server-side transform: remove from the array ``name`` every element
    equal to one of ``elements`` (``AppendMissingElements``' equality;
    PropertyTransform.remove_all_from_array). A value that is not an array
    (or none) becomes an empty array. Its transform result is None."""

    name: str
    elements: tuple[Any, ...] = attrs.field(converter=tuple)


@attrs.frozen
class RequestTime:
    """A server-side transform: set property ``name`` to the time the server
    took the commit (PropertyTransform.set_to_server_value REQUEST_TIME).
    Every such transform of one commit gets the same time, its result; it
    is not the commit's ``commit_time`` (the emulator's is a little later)."""

    name: str


#: The transforms an upsert carries, applied in order, each on the value the
#: ones before it left (two on one property chain).
Transform = Union[Increment, Maximum, Minimum, AppendMissingElements, RemoveAllFromArray, RequestTime]


def _transforms(transforms: Iterable[Transform]) -> tuple[Transform, ...]:
    return tuple(transforms)


@attrs.frozen
class Upsert:
    """Write ``entity``. With ``property_mask``, only the named properties are
    written and other stored properties are kept (an empty mask keeps every
    stored property); ``transforms`` run after the write, in the same
    mutation, atomically. A server that ignores masks and transforms (the
    legacy Datastore emulator) would replace the whole entity instead, so
    callers must check ``Gateway.capabilities`` before sending them."""

    entity: RawEntity
    property_mask: tuple[str, ...] | None = None
    transforms: tuple[Transform, ...] = attrs.field(default=(), converter=_transforms)


@attrs.frozen
class Insert(Upsert):
    """An upsert that requires the entity not to exist: if it does, the
    commit fails with ``AlreadyExists`` (Datastore's ALREADY_EXISTS) and
    this entity is not written (see ``errors.AlreadyExists`` for the rest of
    the commit). An incomplete key gets a new id, as with ``Upsert``."""


@attrs.frozen
class Update(Upsert):
    """An upsert that requires the entity to exist: if it does not, the
    commit fails with ``NotFound`` (Datastore's NOT_FOUND) and this entity
    is not written (see ``errors.NotFound``). Its key must be complete."""


@attrs.frozen
class Delete:
    key: Key


Mutation = Union[Upsert, Delete]


@attrs.frozen
class MutationResult:
    """What a commit did for one mutation: the entity's (possibly newly
    allocated) key, and the values the transforms produced. A gateway that
    ignored the transforms returns ``transform_results=None``, which is how
    the counter detects a server that silently drops increments."""

    key: Key | None
    transform_results: tuple[Any, ...] | None = None


@attrs.frozen
class CommitResult:
    mutation_results: tuple[MutationResult, ...]


# --- the rules, checked before anything is sent ------------------------------------


def check_commit(mutations: Sequence[Mutation], *, transactional: bool) -> None:
    """Every mutation's checks, then the rules on keys named more than once.

    Without a transaction, one complete key named twice (two upserts, an
    upsert and a delete) is refused before anything is written, as both
    emulators and Cloud Datastore refuse it (INVALID_ARGUMENT), instead of
    keeping whichever came last. In a transaction they accept it and apply
    the mutations in order (the last one wins), and so does every gateway,
    but for ``check_sequences``. Incomplete keys are distinct entities: each
    gets its own id."""
    for mutation in mutations:
        check_mutation(mutation)
    if transactional:
        check_sequences(mutations)
        return
    if len(mutations) < 2:
        return  # no key can be named twice
    named: set[Key] = set()
    for mutation in mutations:
        key = _key_of(mutation)
        if key is not None and not key.is_partial:
            if key in named:
                raise BadValueError(
                    f"{key} is named twice in one non-transactional commit; Datastore refuses that: "
                    "send one mutation per key (a transaction applies them in order)"
                )
            named.add(key)


def _key_of(mutation: Mutation) -> Key | None:
    return mutation.key if isinstance(mutation, Delete) else mutation.entity.key


def _operation(mutation: Mutation) -> str:
    return type(mutation).__name__.lower()


def check_sequences(mutations: Sequence[Mutation]) -> None:
    """In a transaction one key may be named more than once, but Datastore
    (measured on the Firestore emulator) refuses an insert after any write
    of the same key but a delete, and an update after a delete."""
    last: dict[Key, str] = {}
    for mutation in mutations:
        key = _key_of(mutation)
        if key is None or key.is_partial:
            continue
        this, before = _operation(mutation), last.get(key)
        if (this == "insert" and before not in (None, "delete")) or (this == "update" and before == "delete"):
            raise BadValueError(f"cannot {before} then {this} {key} in one commit; Datastore refuses that")
        last[key] = this


def check_mutation(mutation: Any) -> None:
    """Every input check of one mutation, before anything is sent."""
    if isinstance(mutation, Delete):
        require_complete(mutation.key, "Delete")
    elif isinstance(mutation, Upsert):
        if not isinstance(mutation.entity, RawEntity) or not isinstance(mutation.entity.key, Key):
            raise BadKeyError(f"an upserted entity needs a key, got {mutation.entity!r}")
        if isinstance(mutation, Update):
            require_complete(mutation.entity.key, "Update")
        validate_entity(mutation.entity)
        for name in mutation.property_mask or ():
            check_path(name, "property mask path")
        check_transforms(mutation.transforms)
    else:
        raise BadValueError(f"unknown mutation {mutation!r}")


def check_transforms(transforms: Sequence[Any]) -> None:
    """Each transform's path and operand, then Datastore's rule that one
    commit may not transform both a property and a property inside it
    ("Cannot transform property a and its nested property at the same
    time", measured on the Firestore emulator); one path twice is fine."""
    paths: dict[tuple[str, ...], str] = {}
    for transform in transforms:
        if not isinstance(transform, _TRANSFORMS):
            raise BadValueError(f"unknown property transform {transform!r}")
        name = transform.name
        check_path(name, "transformed property")
        if isinstance(transform, (Increment, Maximum, Minimum)):
            number = transform.amount if isinstance(transform, Increment) else transform.value
            what = f"{type(transform).__name__.lower()} of {name!r}"
            if isinstance(number, bool) or not isinstance(number, (int, float)):
                raise BadValueError(f"the {what} needs an integer or a double, got {number!r}")
            isinstance(number, float) or check_int(number, what)
        elif isinstance(transform, (AppendMissingElements, RemoveAllFromArray)):
            for element in transform.elements:
                if isinstance(element, list):
                    raise BadValueError(f"property {name!r}: an array transform's element may not be an array")
                check_value(name, element, False)
        members = tuple(parse(name))
        for other, other_name in paths.items():
            shorter = min(len(other), len(members))
            if other != members and other[:shorter] == members[:shorter]:
                raise BadValueError(
                    f"cannot transform {other_name!r} and {name!r}, a property and one inside it, in one mutation; "
                    "Datastore refuses that"
                )
        paths[members] = name


_TRANSFORMS = get_args(Transform)


#: What ``map_keys`` calls for each key: the key, then the entity holding it
#: as a value and the property's name (None, None for a mutation's own key).
KeyMap = Callable[[Key, "RawEntity | None", "str | None"], Key]


def map_keys(mutations: Sequence[Mutation], change: KeyMap) -> list[Mutation]:
    """``mutations`` with every key ``change``d: each one's own key and every
    key value it writes, in lists and embedded entities too. A mutation
    nothing changed in is the same object (the common case costs a walk)."""
    out: list[Mutation] = []
    for mutation in mutations:
        if isinstance(mutation, Delete) and isinstance(mutation.key, Key):
            key = change(mutation.key, None, None)
            out.append(mutation if key is mutation.key else Delete(key))
        elif isinstance(mutation, Upsert) and isinstance(mutation.entity, RawEntity):
            entity = _entity_keys(mutation.entity, change, top=True)
            out.append(mutation if entity is mutation.entity else attrs.evolve(mutation, entity=entity))
        else:
            out.append(mutation)  # not a mutation: ``check_commit`` names it
    return out


def _entity_keys(entity: RawEntity, change: KeyMap, top: bool = False) -> RawEntity:
    key = change(entity.key, None, None) if top and isinstance(entity.key, Key) else entity.key
    if type(entity.properties) is SealedProperties and not entity.properties.holds_keys:
        return entity if key is entity.key else RawEntity(key, dict(entity.properties), entity.unindexed, entity.meanings)
    properties = {name: _value_keys(name, value, entity, change) for name, value in entity.properties.items()}
    if key is entity.key and all(properties[name] is value for name, value in entity.properties.items()):
        return entity
    return RawEntity(key, properties, entity.unindexed, entity.meanings)


def _value_keys(name: str, value: Any, holder: RawEntity, change: KeyMap) -> Any:
    if isinstance(value, list):
        items = [_value_keys(name, item, holder, change) for item in value]
        return value if all(new is old for new, old in zip(items, value)) else items
    if isinstance(value, RawEntity):
        inner = _entity_keys(value, change)
        if isinstance(value.key, Key):  # an embedded entity's key is a value it holds, named by its property
            key = change(value.key, holder, name)
            if key is not value.key:
                inner = RawEntity(key, inner.properties, inner.unindexed, inner.meanings)
        return inner
    return change(value, holder, name) if isinstance(value, Key) else value
