"""Entity <-> RawEntity: where schema types and index flags are applied.

This is the php-gds "Mapper": it decides what is written (type checks,
UTC datetimes, per-property index flags, detected types for fields with no
schema entry) and how stored data is read back (including the legacy values
older php-gds versions wrote).
"""

from __future__ import annotations

from typing import Any

from gds_counter.errors import SchemaError
from gds_counter.gateway.keys import Key
from gds_counter.gateway.values import RawEntity, validate_entity
from gds_counter.gds.entity import Entity
from gds_counter.gds.schema import Schema


def to_raw(entity: Entity, schema: Schema, namespace: str) -> RawEntity:
    """The storable form of ``entity``; raises before anything is written.

    The entity's kind and namespace are filled in from the store when unset,
    so that ``get_key()`` afterwards names what was written.
    """
    if not isinstance(entity, Entity):
        raise SchemaError(f"expected an Entity, got {type(entity).__name__} {entity!r}")
    kind = entity.get_kind()
    if kind is None:
        entity.set_kind(schema.kind)
    elif kind != schema.kind:
        raise SchemaError(f"entity of kind {kind!r} given to a store for kind {schema.kind!r}")
    if entity.get_namespace() is None:
        entity.set_namespace(namespace)
    key = entity.get_key()
    assert key is not None
    properties = {name: schema.to_storage(name, _embed(value)) for name, value in entity.get_data().items()}
    unindexed = {name for name in properties if not schema.is_indexed(name)}
    raw = RawEntity(key, properties, frozenset(unindexed))
    validate_entity(raw)
    return raw


def _embed(value: Any) -> Any:
    """Entities inside data are stored as embedded entities (with their key)."""
    if isinstance(value, Entity):
        schema = value.get_schema()
        unindexed = {n for n in value.get_data() if schema is not None and not schema.is_indexed(n)}
        return RawEntity(value.get_key(), {n: _embed(v) for n, v in value.get_data().items()}, frozenset(unindexed))
    if isinstance(value, (list, tuple)):
        return [_embed(item) for item in value]
    return value


def from_raw(raw: RawEntity, schema: Schema) -> Entity:
    """Build the entity class the schema names (a plain Entity otherwise)."""
    key = raw.key
    entity_class = schema.get_entity_class() if key is not None and key.kind == schema.kind else None
    entity = _blank(entity_class or Entity)
    if key is not None:
        _apply_key(entity, key)
    where = str(key) if key is not None else "embedded entity"
    same_kind = key is not None and key.kind == schema.kind
    for name, value in raw.properties.items():
        value = _unembed(value)
        entity[name] = schema.from_storage(name, value, where) if same_kind else value
    return entity


def _blank(entity_class: type[Entity]) -> Entity:
    """An instance without calling the subclass constructor, whose arguments
    (like CounterShardEntity's target and shard number) are not known here."""
    entity = entity_class.__new__(entity_class)
    Entity.__init__(entity)
    return entity


def _apply_key(entity: Entity, key: Key) -> None:
    entity.set_kind(key.kind)
    entity.set_namespace(key.namespace)
    if key.id is not None:
        entity.set_key_id(key.id)
    elif key.name is not None:
        entity.set_key_name(key.name)
    entity.set_ancestry(key.parent)


def _unembed(value: Any) -> Any:
    if isinstance(value, RawEntity):
        inner = _blank(Entity)
        if value.key is not None:
            _apply_key(inner, value.key)
        for name, item in value.properties.items():
            inner[name] = _unembed(item)
        return inner
    if isinstance(value, list):
        return [_unembed(item) for item in value]
    return value
