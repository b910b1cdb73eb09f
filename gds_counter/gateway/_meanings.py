"""Value meanings: Datastore's ``Value.meaning``, kept beside the values.

A meaning is an int32 a client puts on a value to say how an older API
read it: google-cloud-ndb stores a compressed ``BlobProperty`` or
``TextProperty`` as a blob with meaning 22 (zlib) and decompresses only
what carries it; a ``TextProperty`` of the legacy runtime is a string with
meaning 15. google-cloud-datastore keeps the meanings it reads in
``Entity._meanings`` and sends them back when it writes the entity again.

The neutral types keep them the same way, as side data of ``RawEntity``
(``RawEntity.meanings``: property name -> meaning), so values, filters,
indexes and the counters never see one: a meaning changes nothing of how a
value is indexed, filtered or sorted on the Firestore emulator in Datastore
mode (a filter's own meaning is ignored). A property's meaning is an
``int`` for a single value, or, for a list, a tuple with one meaning (or
None) per element: the emulator refuses a meaning on a list value itself
("A Value containing a list_value cannot specify a meaning"), and keeps each
element's. An embedded entity keeps its properties' meanings in its own
``meanings``.

Which meanings a value may carry is the emulator's table, measured with the
raw client on every value type, indexed and not, for meanings 1..30
(``ALLOWED``; a rating, 13, only on 0..100; a user, 20, on an embedded
entity of the user's properties: ``_check_user``); anything else it refuses, and so does ``check_meanings``,
naming the property. Meaning 16 on an indexed blob is accepted and dropped
(``kept``), as the emulator stores it. Meaning 18 marks a projection's
values (``INDEX_VALUE``): the emulator puts it on every projected value and
refuses it in a write ("Projection property cannot be used"); the
Datastore codec leaves it out of ``meanings`` when it reads, and ``serve``
puts it on projected values as the emulator does.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Mapping, Union

from gds_counter.errors import BadValueError

__all__ = ["ALLOWED", "INDEX_VALUE", "USER", "NO_MEANINGS", "Meaning", "check_meanings", "kept"]

#: A property's meaning: one int, or one per list element (None: none).
Meaning = Union[int, tuple[Union[int, None], ...]]

class _NoMeanings(dict[str, Any]):
    """The meanings of an entity that has none: one shared empty mapping
    that refuses every change, and is itself again when pickled or copied."""

    __slots__ = ()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("an entity's empty meanings are shared; give the entity a dict of its own")

    __setitem__ = __delitem__ = __ior__ = clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self) -> Any:
        return _no_meanings, ()


def _no_meanings() -> Mapping[str, Meaning]:
    return NO_MEANINGS


#: An entity without meanings (the default of ``RawEntity.meanings``: shared, so read-only).
NO_MEANINGS: Mapping[str, Meaning] = _NoMeanings()

#: The meaning the emulator puts on every value a projection query returns.
INDEX_VALUE = 18

#: Meaning 16 (a byte string), which the emulator drops from an indexed blob.
_BYTESTRING = 16

#: Meaning 20: an embedded entity that is a user (google-cloud-ndb's ``UserProperty``).
USER = 20
_USER_REQUIRED = frozenset({"email", "auth_domain"})
_USER_PROPERTIES = _USER_REQUIRED | {"user_id", "federated_identity", "federated_provider"}

#: Meaning 13 (a rating), which the emulator takes on integers 0..100 only.
_RATING = 13

_STRING_MEANINGS = frozenset({1, 2, 3, 4, 5, 6, 8, 10, 11, 12, 17})

#: (value type, indexed) -> the meanings the Firestore emulator in Datastore
#: mode stores with such a value. No other type takes any (null, booleans,
#: doubles, timestamps, keys, geopoints), but an embedded entity that is a
#: user (``USER``).
ALLOWED: Mapping[tuple[type, bool], frozenset[int]] = MappingProxyType({
    (int, True): frozenset({13, 29, 30}),
    (int, False): frozenset({13, 29, 30}),
    (str, True): _STRING_MEANINGS,
    (str, False): _STRING_MEANINGS | {15},  # 15: text, never indexed
    (bytes, True): frozenset({_BYTESTRING}),
    (bytes, False): frozenset({_BYTESTRING, 22}),  # 22: zlib-compressed, never indexed
})


def check_meanings(name: str, value: Any, meaning: Any, indexed: bool) -> None:
    """Refuse a meaning the emulator refuses on ``value`` (property ``name``)."""
    if isinstance(value, list):
        if not isinstance(meaning, tuple) or len(meaning) != len(value):
            raise BadValueError(
                f"property {name!r}: a list's meaning is one per element (a tuple of {len(value)}), got {meaning!r}; "
                "Datastore takes no meaning on a list itself"
            )
        for item, one in zip(value, meaning):
            if one is not None:
                check_meanings(name, item, one, indexed)
        return
    if type(meaning) is not int:
        raise BadValueError(f"property {name!r}: a meaning is an integer, got {meaning!r}")
    if meaning == USER and hasattr(value, "unindexed"):  # an embedded entity (RawEntity, which imports this module)
        _check_user(name, value)
        return
    allowed = ALLOWED.get((type(value), indexed), frozenset())
    if meaning == _RATING and meaning in allowed and not 0 <= value <= 100:
        raise BadValueError(f"property {name!r}: meaning {_RATING} (a rating) takes 0..100, got {value}")
    if meaning not in allowed:
        where = "an indexed" if indexed else "an unindexed"
        raise BadValueError(
            f"property {name!r}: meaning {meaning} is not one Datastore takes on {where} {type(value).__name__} value"
            f" (it takes {sorted(allowed) or 'none'})"
        )


def _check_user(name: str, entity: Any) -> None:
    """A user (meaning 20), as the emulator takes one: an embedded entity
    without a key, of unindexed strings without meanings, ``email`` and
    ``auth_domain`` among them, and no property but ``_USER_PROPERTIES``."""
    problem = (
        "has a key" if entity.key is not None
        else f"has no {sorted(_USER_REQUIRED - set(entity.properties))}" if not _USER_REQUIRED <= set(entity.properties)
        else f"has properties {sorted(set(entity.properties) - _USER_PROPERTIES)}" if not set(entity.properties) <= _USER_PROPERTIES
        else "has an indexed property" if set(entity.properties) - entity.unindexed
        else "has a value that is no string" if not all(type(v) is str for v in entity.properties.values())
        else "has a property with a meaning" if entity.meanings
        else None
    )
    if problem is not None:
        raise BadValueError(
            f"property {name!r}: a user entity (meaning {USER}) {problem}; it holds unindexed strings "
            f"{sorted(_USER_REQUIRED)} and may hold {sorted(_USER_PROPERTIES - _USER_REQUIRED)}, no key"
        )


def kept(value: Any, meaning: Meaning, indexed: bool) -> Meaning | None:
    """The meaning stored with ``value``: as given, less meaning 16 on an
    indexed blob, which the emulator drops (None: no meaning is kept)."""
    if isinstance(meaning, tuple):
        items = tuple(None if one is None else _kept_one(item, one, indexed) for item, one in zip(value, meaning))
        return items if any(one is not None for one in items) else None
    return _kept_one(value, meaning, indexed)


def _kept_one(value: Any, meaning: int, indexed: bool) -> int | None:
    return None if meaning == _BYTESTRING and indexed and isinstance(value, bytes) else meaning
