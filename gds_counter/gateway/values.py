"""The values that cross the gateway boundary, and Datastore's rules for them.

Values are plain Python: ``None``, ``bool``, ``int``, ``float``, ``str``,
``bytes``, timezone-aware UTC ``datetime``, ``Key``, ``Geopoint``,
``RawEntity`` (an embedded entity) and ``list`` of those. Everything above the
gateway layer speaks only these, never google-cloud-datastore or sqlite3
types, which is what lets one conformance suite run on every gateway.
"""

from __future__ import annotations

import datetime as _dt
import reprlib
from typing import Any, Iterable, Iterator, Mapping, Union

import attrs

from gds_counter._checks import INT64_MAX, INT64_MIN, utf8_size
from gds_counter.errors import BadKeyError, BadValueError
from gds_counter.gateway._meanings import INDEX_VALUE, NO_MEANINGS, Meaning, check_meanings
from gds_counter.gateway.keys import METADATA_KINDS, RESERVED_NAME, Key

__all__ = ["EPOCH", "INDEX_VALUE", "NO_MEANINGS", "Meaning", "SealedProperties", "check_entity_limits", "seal", "epoch_micros", "index_values", "MAX_ENTITY_BYTES", "MAX_INDEXED_STRING_BYTES", "MAX_INDEXED_VALUES", "MAX_PROPERTY_NAME_BYTES", "MAX_VALUE_BYTES", "Geopoint", "RawEntity", "Value"]

#: Datastore's limit on an indexed string or blob, in bytes.
MAX_INDEXED_STRING_BYTES = 1500

#: Datastore's limit on a property name, in UTF-8 bytes.
MAX_PROPERTY_NAME_BYTES = 1500

#: Datastore's limit on an entity's size (1 MiB less 4 bytes).
MAX_ENTITY_BYTES = 1_048_572

#: The longest string or blob value, in bytes: the Firestore emulator in
#: Datastore mode refuses a longer one ("longer than 1048487 bytes").
MAX_VALUE_BYTES = 1_048_487

#: Indexed values (list elements each) one entity may carry: the Firestore
#: emulator in Datastore mode accepts 5,000 and refuses 5,001 ("Too many
#: indexed properties"), measured with lists of integers.
MAX_INDEXED_VALUES = 5000

#: The zero of Datastore timestamps (and of their integer-microsecond form).
EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)
_ONE_MICRO = _dt.timedelta(microseconds=1)


def epoch_micros(moment: _dt.datetime) -> int:
    """A timestamp's integer-microsecond form, as Datastore's index keeps it
    (``moment`` is timezone-aware)."""
    return (moment - EPOCH) // _ONE_MICRO


def _check_latitude(_: Any, __: Any, value: float) -> None:
    if not -90.0 <= value <= 90.0:
        raise BadValueError(f"latitude {value!r} is outside -90..90")


def _check_longitude(_: Any, __: Any, value: float) -> None:
    if not -180.0 <= value <= 180.0:
        raise BadValueError(f"longitude {value!r} is outside -180..180")


@attrs.frozen
class Geopoint:
    """A latitude/longitude pair, as php-gds's ``Geopoint``."""

    latitude: float = attrs.field(converter=float, validator=_check_latitude)
    longitude: float = attrs.field(converter=float, validator=_check_longitude)


def _names(names: Iterable[str]) -> frozenset[str]:
    return frozenset(names)


@attrs.define(eq=True)
class RawEntity:
    """An entity as it crosses the gateway: key, values and index flags.

    ``unindexed`` names the properties stored with exclude_from_indexes. For a
    list property the flag applies to each element, as php-gds writes it.
    ``key`` may be None only for an entity embedded as a property value.
    ``meanings`` holds the Datastore meanings of its values, by property
    name (``gateway._meanings``): none for almost every entity.
    """

    key: Key | None
    properties: dict[str, Any] = attrs.field(factory=dict)
    unindexed: frozenset[str] = attrs.field(factory=frozenset, converter=_names)
    meanings: Mapping[str, Meaning] = NO_MEANINGS


Value = Union[None, bool, int, float, str, bytes, _dt.datetime, Key, Geopoint, RawEntity, list]


#: Datastore's limit on entity values inside entity values (the emulator's words refuse more).
MAX_NESTED_ENTITIES = 20


def check_value(name: str, value: Any, indexed: bool, depth: int = 0) -> None:
    """Reject values Datastore cannot store, naming the property; ``depth``:
    how many entity values hold this one's entity."""
    if isinstance(value, list):
        for item in value:
            if isinstance(item, list):
                raise BadValueError(f"property {name!r}: a list may not contain a list")
            check_value(name, item, indexed, depth)
        return
    if value is None or isinstance(value, (bool, float, Key, Geopoint)):
        return
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise BadValueError(f"property {name!r}: integer {value} does not fit in 64 bits")
        return
    if isinstance(value, str):
        size = utf8_size(value, f"property {name!r}: string")
        if size > MAX_VALUE_BYTES:
            raise BadValueError(f"property {name!r}: string of {size} bytes is over the {MAX_VALUE_BYTES}-byte value limit")
        if indexed:
            if size > MAX_INDEXED_STRING_BYTES:
                raise BadValueError(
                    f"property {name!r}: indexed string of {size} bytes is over the "
                    f"{MAX_INDEXED_STRING_BYTES}-byte limit; store it unindexed (index=False)"
                )
        return
    if isinstance(value, bytes):
        if len(value) > MAX_VALUE_BYTES:
            raise BadValueError(f"property {name!r}: blob of {len(value)} bytes is over the {MAX_VALUE_BYTES}-byte value limit")
        if indexed and len(value) > MAX_INDEXED_STRING_BYTES:
            raise BadValueError(
                f"property {name!r}: indexed blob of {len(value)} bytes is over the "
                f"{MAX_INDEXED_STRING_BYTES}-byte limit; store it unindexed (index=False)"
            )
        return
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise BadValueError(f"property {name!r}: naive datetime {value!r}; give it a timezone")
        return
    if isinstance(value, RawEntity):
        if depth >= MAX_NESTED_ENTITIES:
            raise BadValueError(f"At most {MAX_NESTED_ENTITIES} nested entity values are supported. (property {name!r})")
        validate_entity(value, depth + 1)
        return
    # reprlib: a value nested thousands deep (or huge) would make the
    # message itself fail (RecursionError) or flood the log.
    raise BadValueError(f"property {name!r}: cannot store a {type(value).__name__} ({reprlib.repr(value)})")


class SealedProperties(dict[str, Any]):
    """The properties of an entity checked once (``seal``): a dict that
    refuses every change, and that remembers the key and index flags it was
    checked with. ``validate_entity`` passes an entity holding it at once
    while its key and flags are those very objects (both immutable), since
    nothing it was checked on can have changed: an entity the library
    builds once and writes many times (a counter's shard) is checked once,
    not at every commit. Any other entity is checked in full."""

    __slots__ = ("key", "unindexed", "holds_keys")

    def __init__(self, properties: dict[str, Any], key: Key | None, unindexed: frozenset[str], *, by: object = None) -> None:
        if by is not _SEALING:  # made by ``seal`` alone, after its check: else an unchecked entity would pass as checked
            raise TypeError("SealedProperties are made by seal(entity), which checks the entity first")
        super().__init__(properties)
        self.key, self.unindexed = key, unindexed
        #: Whether a value is a ``Key`` (``mutations.map_keys`` walks it then).
        self.holds_keys = any(isinstance(value, Key) for value in properties.values())

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("a sealed entity's properties cannot change; make a new entity from a copy")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> Any:
        return dict, (dict(self),)  # a copy (pickled, deep-copied) is a plain dict: checked again where written

    def sealed_for(self, entity: RawEntity) -> bool:
        return self.key is entity.key and self.unindexed is entity.unindexed


#: What ``seal`` passes to ``SealedProperties``, which no one else has.
_SEALING = object()

#: Values a sealed entity may hold: immutable ones (a list or an embedded
#: entity could change after the check).
_SEALABLE = (type(None), bool, int, float, str, bytes, _dt.datetime, Key, Geopoint)


def seal(entity: RawEntity) -> RawEntity:
    """A copy of ``entity``, checked now (``validate_entity``: ``BadValueError``
    as at a commit), whose properties can no longer change
    (``SealedProperties``). Only a top-level entity of immutable values is
    sealed; another (a list or an embedded entity could change after the
    check) comes back a plain copy, checked again at each write."""
    validate_entity(entity)
    if entity.key is None or entity.meanings or any(not isinstance(value, _SEALABLE) for value in entity.properties.values()):
        return RawEntity(entity.key, dict(entity.properties), entity.unindexed, dict(entity.meanings))
    sealed = RawEntity(entity.key, {}, entity.unindexed)
    sealed.properties = SealedProperties(entity.properties, sealed.key, sealed.unindexed, by=_SEALING)
    return sealed


def validate_entity(entity: RawEntity, depth: int = 0) -> None:
    """Check every property of an entity against Datastore's rules, and the
    entity against its limits on size and indexed values (at once for a
    sealed entity still as it was sealed: ``SealedProperties``)."""
    properties = entity.properties
    if type(properties) is SealedProperties and properties.sealed_for(entity) and not entity.meanings:
        return
    if entity.key is not None and any(e.kind in METADATA_KINDS for e in entity.key.path):
        raise BadKeyError(f"{entity.key} is a metadata key: Datastore makes those entities, nobody writes them")
    for name, value in entity.properties.items():
        if not isinstance(name, str) or not name:
            raise BadValueError(f"property name must be a non-empty string, got {name!r}")
        if RESERVED_NAME.match(name):
            raise BadValueError(f"property name {name!r} is reserved (names of the form __x__)")
        if utf8_size(name, "property name") > MAX_PROPERTY_NAME_BYTES:
            raise BadValueError(f"property name {name[:40]!r}... is over the {MAX_PROPERTY_NAME_BYTES}-byte limit")
        check_value(name, value, name not in entity.unindexed, depth)
    for name, meaning in entity.meanings.items():
        if name not in entity.properties:
            raise BadValueError(f"a meaning ({meaning!r}) for {name!r}, which is no property of {_named(entity)}")
        check_meanings(name, entity.properties[name], meaning, name not in entity.unindexed)
    check_entity_limits(entity)


def check_entity_limits(entity: RawEntity) -> None:
    """The entity as a whole against Datastore's limits: indexed values and
    size. (Also for what a property mask makes of a stored entity and a
    few new values, which no one validated as a whole: the emulator refuses
    it with "maximum entity size is 1048576 bytes".)"""
    _check_nesting(entity, 0)
    indexed = sum(1 for _ in index_values(entity))
    if indexed > MAX_INDEXED_VALUES:
        raise BadValueError(
            f"{_named(entity)} has {indexed} indexed values, over the {MAX_INDEXED_VALUES} Datastore accepts; "
            "store the large lists unindexed"
        )
    size = entity_size(entity)
    if size > MAX_ENTITY_BYTES:
        raise BadValueError(f"{_named(entity)} is about {size} bytes, over Datastore's {MAX_ENTITY_BYTES}-byte entity limit")


def _check_nesting(entity: RawEntity, depth: int) -> None:
    """What transforms made of an entity (an entity appended to a list
    inside an entity value, say) nests at most ``MAX_NESTED_ENTITIES`` deep."""
    for name, value in entity.properties.items():
        for item in value if isinstance(value, list) else (value,):
            if isinstance(item, RawEntity):
                if depth >= MAX_NESTED_ENTITIES:
                    raise BadValueError(f"At most {MAX_NESTED_ENTITIES} nested entity values are supported. "
                                        f"(property {name!r} of {_named(entity)})")
                _check_nesting(item, depth + 1)


def _named(entity: RawEntity) -> str:
    """How an error names ``entity`` (spelled out only when one is raised)."""
    return f"entity {entity.key}" if entity.key is not None else "embedded entity"


def index_values(entity: RawEntity, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(name, value) of every value a Datastore index holds for ``entity``:
    one per list element, none for unindexed properties, and an embedded
    entity's own indexed properties as ``outer.inner``. What the embedded
    engine indexes, what an aggregation reads and what counts against
    ``MAX_INDEXED_VALUES``.

    Excluding an entity value from the indexes excludes the value, not its
    properties, as the Firestore emulator indexes them (``WHERE e.k = 5``
    finds it unless ``k`` itself is excluded). The properties of entities
    in an indexed list are indexed too, where the emulator indexes none:
    a deliberate difference (docs/gql.md)."""
    for name, value in entity.properties.items():
        if isinstance(value, RawEntity):
            yield from index_values(value, f"{prefix}{name}.")
        elif name not in entity.unindexed:
            for item in value if isinstance(value, list) else [value]:
                if isinstance(item, RawEntity):
                    yield from index_values(item, f"{prefix}{name}.")
                else:
                    yield f"{prefix}{name}", item


def entity_size(entity: RawEntity) -> int:
    """An entity's stored size, counted as Firestore documents its storage
    sizes (strings and names: UTF-8 bytes + 1; numbers, timestamps: 8;
    geopoints: 16; keys: their path; 32 bytes of overhead). Datastore's own
    count differs from this by up to about a hundred bytes near the limit
    (docs/gql.md: deliberate differences)."""
    key = _key_size(entity.key) if entity.key is not None else 0
    return key + 32 + sum(len(name.encode()) + 1 + _value_size(value) for name, value in entity.properties.items())


def _key_size(key: Key) -> int:
    return 16 + sum(len(e.kind.encode()) + 1 + (8 if e.id is not None else len((e.name or "").encode()) + 1) for e in key.path)


def _value_size(value: Any) -> int:
    if value is None or isinstance(value, bool):
        return 1
    if isinstance(value, (int, float, _dt.datetime)):
        return 8
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass")) + 1
    if isinstance(value, bytes):
        return len(value)
    if isinstance(value, Geopoint):
        return 16
    if isinstance(value, Key):
        return _key_size(value)
    if isinstance(value, list):
        return sum(_value_size(item) for item in value)
    if isinstance(value, RawEntity):
        return entity_size(value)
    return 0

