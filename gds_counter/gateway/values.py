"""The values that cross the gateway boundary, and Datastore's rules for them.

Values are plain Python: ``None``, ``bool``, ``int``, ``float``, ``str``,
``bytes``, timezone-aware UTC ``datetime``, ``Key``, ``Geopoint``,
``RawEntity`` (an embedded entity) and ``list`` of those. Everything above the
gateway layer speaks only these, never google-cloud-datastore or sqlite3
types, which is what lets one conformance suite run on every gateway.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any, Iterable, Union

import attrs

from gds_counter._checks import INT64_MAX, INT64_MIN, utf8_size
from gds_counter.errors import BadValueError
from gds_counter.gateway.keys import RESERVED_NAME, Key

__all__ = ["EPOCH", "MAX_INDEXED_STRING_BYTES", "Geopoint", "RawEntity", "Value", "check_value", "validate_entity"]

#: Datastore's limit on an indexed string or blob, in bytes.
MAX_INDEXED_STRING_BYTES = 1500

#: The zero of Datastore timestamps (and of their integer-microsecond form).
EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)

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
    """

    key: Key | None
    properties: dict[str, Any] = attrs.field(factory=dict)
    unindexed: frozenset[str] = attrs.field(factory=frozenset, converter=_names)


Value = Union[None, bool, int, float, str, bytes, _dt.datetime, Key, Geopoint, RawEntity, list]


def check_value(name: str, value: Any, indexed: bool) -> None:
    """Reject values Datastore cannot store, naming the property."""
    if isinstance(value, list):
        for item in value:
            if isinstance(item, list):
                raise BadValueError(f"property {name!r}: a list may not contain a list")
            check_value(name, item, indexed)
        return
    if value is None or isinstance(value, (bool, float, Key, Geopoint)):
        return
    if isinstance(value, int):
        if not INT64_MIN <= value <= INT64_MAX:
            raise BadValueError(f"property {name!r}: integer {value} does not fit in 64 bits")
        return
    if isinstance(value, str):
        size = utf8_size(value, f"property {name!r}: string")
        if indexed:
            if size > MAX_INDEXED_STRING_BYTES:
                raise BadValueError(
                    f"property {name!r}: indexed string of {size} bytes is over the "
                    f"{MAX_INDEXED_STRING_BYTES}-byte limit; store it unindexed (index=False)"
                )
        return
    if isinstance(value, bytes):
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
        validate_entity(value)
        return
    raise BadValueError(f"property {name!r}: cannot store a {type(value).__name__} ({value!r})")


def validate_entity(entity: RawEntity) -> None:
    """Check every property of an entity against Datastore's rules."""
    for name, value in entity.properties.items():
        if not isinstance(name, str) or not name:
            raise BadValueError(f"property name must be a non-empty string, got {name!r}")
        if RESERVED_NAME.match(name):
            raise BadValueError(f"property name {name!r} is reserved (names of the form __x__)")
        check_value(name, value, name not in entity.unindexed)

