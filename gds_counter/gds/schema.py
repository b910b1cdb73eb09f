"""Schema: the kind, its typed properties and their index flags.

As in php-gds, a schema is optional: a property with no schema entry is
typed by detection and indexed. A schema earns its keep by catching wrong
types before anything is written and by choosing which properties are
excluded from indexes (which Datastore bills and limits).
"""

from __future__ import annotations

import datetime as _dt
import enum
from typing import Any, Callable

import attrs

from gds_counter._checks import check_text, is_int
from gds_counter.errors import CorruptDataError, SchemaError
from gds_counter.gateway.keys import Key
from gds_counter.gateway.values import EPOCH, Geopoint, RawEntity


class PropertyType(enum.Enum):
    STRING = "string"
    INTEGER = "integer"
    DATETIME = "datetime"
    FLOAT = "float"
    BOOLEAN = "boolean"
    STRING_LIST = "string_list"
    GEOPOINT = "geopoint"
    KEY = "key"
    BLOB = "blob"
    ENTITY = "entity"
    LIST = "list"


@attrs.frozen
class Property:
    name: str
    type: PropertyType
    index: bool = True


def _to_float(value: Any) -> float:
    if isinstance(value, float):
        return value
    if is_int(value):
        return float(value)
    raise TypeError


def _to_datetime(value: Any) -> _dt.datetime:
    if not isinstance(value, _dt.datetime):
        raise TypeError
    if value.tzinfo is None:
        raise SchemaError(f"naive datetime {value!r}: give it a timezone (php-gds stores UTC)")
    return value.astimezone(_dt.timezone.utc)


def _to_string_list(value: Any) -> list[str]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise TypeError
    return list(value)


def _require(kind: type | tuple[type, ...]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise TypeError
        return value

    return check


def _to_list(value: Any) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise TypeError
    return list(value)


def _to_entity(value: Any) -> RawEntity:
    # An Entity (from the layer above) embeds as its raw form; a dict as a keyless entity.
    if isinstance(value, RawEntity):
        return value
    if isinstance(value, dict):
        return RawEntity(None, dict(value))
    raise TypeError


#: How a value written to each schema type is checked and normalised.
_WRITERS: dict[PropertyType, Callable[[Any], Any]] = {
    PropertyType.STRING: _require(str),
    PropertyType.INTEGER: _require(int),
    PropertyType.DATETIME: _to_datetime,
    PropertyType.FLOAT: _to_float,
    PropertyType.BOOLEAN: _require(bool),
    PropertyType.STRING_LIST: _to_string_list,
    PropertyType.GEOPOINT: _require(Geopoint),
    PropertyType.KEY: _require(Key),
    PropertyType.BLOB: _require(bytes),
    PropertyType.ENTITY: _to_entity,
    PropertyType.LIST: _to_list,
}


class Schema:
    """A kind and its typed properties, built with chainable ``add_*`` calls::

        Schema("Book").add_string("title").add_integer("pages", index=False)
    """

    def __init__(self, kind: str) -> None:
        if not isinstance(kind, str) or not kind:
            raise SchemaError(f"a schema needs a non-empty kind name, got {kind!r}")
        # Refused here, when the schema is declared, rather than at the first
        # query or write that would carry it to storage.
        self._kind = check_text(kind, "schema kind", SchemaError)
        self._properties: dict[str, Property] = {}
        self._entity_class: type[Any] | None = None

    def add_property(self, name: str, type: PropertyType, index: bool = True) -> "Schema":
        if not isinstance(name, str) or not name:
            raise SchemaError(f"property name must be a non-empty string, got {name!r}")
        check_text(name, "schema property name", SchemaError)
        self._properties[name] = Property(name, type, bool(index))
        return self

    def add_string(self, name: str, index: bool = True) -> "Schema":
        return self.add_property(name, PropertyType.STRING, index)

    def add_integer(self, name: str, index: bool = True) -> "Schema":
        return self.add_property(name, PropertyType.INTEGER, index)

    def add_datetime(self, name: str, index: bool = True) -> "Schema":
        return self.add_property(name, PropertyType.DATETIME, index)

    def add_float(self, name: str, index: bool = True) -> "Schema":
        return self.add_property(name, PropertyType.FLOAT, index)

    def add_boolean(self, name: str, index: bool = True) -> "Schema":
        return self.add_property(name, PropertyType.BOOLEAN, index)

    def add_string_list(self, name: str, index: bool = True) -> "Schema":
        return self.add_property(name, PropertyType.STRING_LIST, index)

    def add_geopoint(self, name: str, index: bool = True) -> "Schema":
        return self.add_property(name, PropertyType.GEOPOINT, index)

    def add_key(self, name: str, index: bool = True) -> "Schema":
        return self.add_property(name, PropertyType.KEY, index)

    def add_blob(self, name: str, index: bool = False) -> "Schema":
        """Blobs default to unindexed: an indexed blob is limited to 1500 bytes."""
        return self.add_property(name, PropertyType.BLOB, index)

    def add_entity(self, name: str, index: bool = False) -> "Schema":
        """An embedded entity; unindexed by default, as Datastore clients do."""
        return self.add_property(name, PropertyType.ENTITY, index)

    def add_list(self, name: str, index: bool = True) -> "Schema":
        """A list of any storable values (php-gds only had string lists)."""
        return self.add_property(name, PropertyType.LIST, index)

    def set_entity_class(self, entity_class: type[Any]) -> "Schema":
        """Fetched entities of this kind are built as ``entity_class`` (an
        ``Entity`` subclass; typed loosely because entity.py builds on this
        module, not the other way round)."""
        if not isinstance(entity_class, type):
            raise SchemaError(f"an entity class is a class, got {type(entity_class).__name__} {entity_class!r}")
        self._entity_class = entity_class
        return self

    def get_entity_class(self) -> type[Any] | None:
        return self._entity_class

    def get_kind(self) -> str:
        return self._kind

    @property
    def kind(self) -> str:
        return self._kind

    def get_properties(self) -> dict[str, Property]:
        return dict(self._properties)

    def get_property(self, name: str) -> Property | None:
        return self._properties.get(name)

    def is_indexed(self, name: str) -> bool:
        """Fields with no schema entry are indexed, as php-gds does."""
        prop = self._properties.get(name)
        return True if prop is None else prop.index

    def to_storage(self, name: str, value: Any) -> Any:
        """Check ``value`` against the property's type and normalise it.

        None is always allowed (stored as null). Unknown properties pass
        through untouched; the gateway's value check still applies to them.
        """
        prop = self._properties.get(name)
        if prop is None or value is None:
            return value
        try:
            return _WRITERS[prop.type](value)
        except TypeError:
            raise SchemaError(
                f"{self._kind}.{name} is declared {prop.type.value}; "
                f"got {type(value).__name__} {value!r}"
            ) from None

    def from_storage(self, name: str, value: Any, where: str) -> Any:
        """Read a stored value, accepting what older php-gds wrote.

        Before php-gds 6.0, null was sometimes written as ``""``; integers
        arrive as strings from some PHP code paths; projection queries return
        datetimes as integer microseconds. These are coerced only where the
        schema says the property is an integer or a datetime; any
        other mismatch is left as stored (schemas evolve; reading must not
        fail on old rows). ``where`` names the entity for error messages.
        """
        prop = self._properties.get(name)
        if prop is None or value is None:
            return value
        if prop.type is PropertyType.INTEGER:
            return read_integer(value, f"{where}.{name}")
        if prop.type is PropertyType.DATETIME:
            if value == "":
                return None
            if is_int(value):
                # Datastore projections return a timestamp's index value:
                # microseconds since the epoch.
                return EPOCH + _dt.timedelta(microseconds=value)
        return value


def read_integer(value: Any, where: str) -> Any:
    """A stored integer as php-gds wrote it: some PHP code paths wrote
    integers as strings (and ``""`` for null). Other types are returned as
    stored; ``where`` names the property for the error."""
    if not isinstance(value, str):
        return value
    text = value
    if text.strip() == "":
        return None
    try:
        return int(text.strip(), 10)
    except ValueError:
        raise CorruptDataError(f"{where} should be an integer but holds the string {text!r}") from None
