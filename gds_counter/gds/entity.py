"""Entity: a bag of data with a key, as in php-gds.

Data is read and written as attributes (``book.title = "x"``); unset fields
read as None, as PHP's magic ``__get`` did. Key parts and metadata live
behind the php-gds accessor methods in PEP 8 form (``get_key_name``...), so
a data field never collides with them. A field whose name clashes with a
method (``kind``, say) is still reachable as ``entity["kind"]``.

Subclasses declare their kind and schema with the classmethods ``kind()``
and ``schema()``, as the PHP article's ``CounterShardEntity`` does.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterator, Mapping, Sequence

from gds_counter.errors import BadKeyError, BadValueError
from gds_counter.gateway.keys import Key, check_key_id, check_key_name
from gds_counter.gds.schema import Schema

#: Instance attributes that are metadata, not data.
_META = ("_kind", "_key_id", "_key_name", "_parent", "_namespace", "_schema", "_data")


class Entity:
    def __init__(self, data: Mapping[str, Any] | None = None, /, **fields: Any) -> None:
        object.__setattr__(self, "_data", {})
        object.__setattr__(self, "_kind", None)
        object.__setattr__(self, "_key_id", None)
        object.__setattr__(self, "_key_name", None)
        object.__setattr__(self, "_parent", None)
        object.__setattr__(self, "_namespace", None)
        object.__setattr__(self, "_schema", None)
        for name, value in {**(data or {}), **fields}.items():
            self[name] = value

    # --- declared by subclasses -----------------------------------------

    @classmethod
    def kind(cls) -> str | None:
        """The kind for entities of this class; None for a plain Entity."""
        return None

    @classmethod
    def schema(cls) -> "Schema | None":
        """The schema for this class, or None to type fields by detection."""
        return None

    # --- data -------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Only reached for names that are not real attributes: i.e. data.
        if name.startswith("_"):
            raise AttributeError(name)
        return self._data.get(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _META:
            object.__setattr__(self, name, value)
            return
        declared = inspect.getattr_static(type(self), name, None)
        if declared is None:
            self._data[name] = value
        elif hasattr(declared, "__set__"):
            object.__setattr__(self, name, value)  # a property (or other descriptor) a subclass made settable
        else:
            # ``entity.kind = "novel"`` would hide the method and store nothing.
            raise BadValueError(
                f"cannot set field {name!r} as an attribute: {type(self).__name__}.{name} is part of the "
                f"class, so the value would never be stored; use entity[{name!r}] = {value!r} "
                f"(or {type(self).__name__}({name}=...))"
            )

    def __delattr__(self, name: str) -> None:
        self._data.pop(name, None)

    def __getitem__(self, name: str) -> Any:
        return self._data.get(name)

    def __setitem__(self, name: str, value: Any) -> None:
        if not isinstance(name, str) or not name:
            raise BadKeyError(f"field name must be a non-empty string, got {name!r}")
        self._data[name] = value

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def get_data(self) -> dict[str, Any]:
        """A copy of the data, so callers cannot change the entity by accident."""
        return dict(self._data)

    # --- key and metadata (php-gds accessors) ------------------------------

    def get_kind(self) -> str | None:
        return self._kind or type(self).kind()

    def set_kind(self, kind: str) -> "Entity":
        object.__setattr__(self, "_kind", kind)
        return self

    def get_key_id(self) -> int | None:
        return self._key_id

    def set_key_id(self, key_id: int | str | None) -> "Entity":
        """php-gds passes ids around as strings; accept a decimal string too."""
        if isinstance(key_id, str):
            if not key_id.isdigit():
                raise BadKeyError(f"key id must be a positive integer, got {key_id!r}")
            key_id = int(key_id)
        if key_id is not None:
            check_key_id(key_id)
        object.__setattr__(self, "_key_id", key_id)
        object.__setattr__(self, "_key_name", None)
        return self

    def get_key_name(self) -> str | None:
        return self._key_name

    def set_key_name(self, key_name: str | None) -> "Entity":
        if key_name is not None:
            check_key_name(key_name)
        object.__setattr__(self, "_key_name", key_name)
        object.__setattr__(self, "_key_id", None)
        return self

    def get_namespace(self) -> str | None:
        return self._namespace

    def set_namespace(self, namespace: str | None) -> "Entity":
        object.__setattr__(self, "_namespace", namespace)
        return self

    def get_ancestry(self) -> Key | None:
        """The parent key, or None for a root entity."""
        return self._parent

    def set_ancestry(self, ancestry: "Entity | Key | Sequence[Mapping[str, Any]] | None") -> "Entity":
        """Set the parent: an Entity with a key, a Key, or php-gds's array form
        ``[{"kind": "A", "name": "a"}, {"kind": "B", "id": 7}]`` (root first)."""
        object.__setattr__(self, "_parent", parent_key(ancestry))
        return self

    def get_schema(self) -> "Schema | None":
        return self._schema or type(self).schema()

    def set_schema(self, schema: "Schema") -> "Entity":
        object.__setattr__(self, "_schema", schema)
        return self

    def get_key(self) -> Key | None:
        """The entity's key, incomplete when no id or name is set yet; None
        when its kind is unknown (a plain Entity not yet given to a Store)."""
        kind = self.get_kind()
        if kind is None:
            return None
        ident = self._key_id if self._key_id is not None else self._key_name
        return child_key(self._parent, kind, ident, self._namespace or "")

    def __gds_key__(self) -> Key:
        """Lets GQL bind an entity as its key, as php-gds does."""
        key = self.get_key()
        if key is None or key.is_partial:
            raise BadKeyError(f"{self!r} has no complete key to bind (save it first)")
        return key

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Entity):
            return NotImplemented
        return self.get_key() == other.get_key() and self._data == other._data

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        key = self.get_key()
        return f"<{type(self).__name__} {key if key is not None else '(no kind)'} {self._data!r}>"


def child_key(parent: Key | None, kind: str, ident: int | str | None, namespace: str) -> Key:
    """The key of a ``kind`` entity under ``parent``: in the parent's
    namespace (else ``namespace``) and project, for a parent of another
    project is never moved into the gateway's own here (the gateway
    decides); the key an entity is written under and looked up by."""
    if parent is None:
        return Key.of(kind, ident, namespace=namespace)
    return Key.of(*parent.flat_path, kind, ident, namespace=parent.namespace or namespace, project=parent.project)


def parent_key(ancestry: Any) -> Key | None:
    """The parent key named by any accepted ancestry form (see set_ancestry);
    the Store uses it for ``parent=`` arguments so both accept the same forms."""
    if ancestry is None:
        return None
    parent: Key | None
    if isinstance(ancestry, Key):
        parent = ancestry
    elif isinstance(ancestry, Entity):
        parent = ancestry.get_key()
        if parent is None or parent.is_partial:
            raise BadKeyError(f"parent {ancestry!r} has no complete key; save it before using it as a parent")
    elif isinstance(ancestry, (list, tuple)):
        flat: list[Any] = []
        for step in ancestry:
            if not isinstance(step, Mapping) or "kind" not in step:
                raise BadKeyError(f"ancestry step {step!r} must be a mapping with 'kind' and 'id' or 'name'")
            ident = step.get("id", step.get("name"))
            if ident is None:
                raise BadKeyError(f"ancestry step {step!r} has neither 'id' nor 'name'")
            flat += [step["kind"], int(ident) if "id" in step else ident]
        parent = Key.of(*flat)
    else:
        raise BadKeyError(f"cannot use {ancestry!r} as ancestry: give an Entity, a Key or a list of steps")
    if parent.is_partial:
        raise BadKeyError(f"parent key {parent} is incomplete")
    return parent
