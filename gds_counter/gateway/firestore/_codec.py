"""Conversion between gds_counter's neutral gateway types and raw
``google.firestore.v1`` protobufs (Firestore in native mode).

What maps to what (docs/firestore.md, "The gateway", says it for users):

* A key is a document: ``keys.document_path`` and ``keys.key_of_document``
  (a kind is a collection id, a name a document id, a numeric id
  ``__id7__``), the one mapping of the project. A key in a namespace, or
  an incomplete one where a document is named, is ``BadKeyError`` from
  there: native mode has no namespaces.
* Values: ``None`` null, ``bool`` boolean, ``int`` integer, ``float``
  double, ``str`` string, ``bytes`` bytes, ``datetime`` timestamp (UTC,
  microseconds), ``Geopoint`` geo point, ``Key`` a reference (the full
  resource name), ``list`` array, ``RawEntity`` map. Firestore refuses an
  array directly in an array and a map has no key: both ``BadValueError``
  before anything is sent. Firestore has no per-value exclude-from-indexes
  flag: ``RawEntity.unindexed`` is not sent, and what is read has none.
* Property paths (masks, transforms, filters, orders): ``_paths.parse``'s
  members, each written as a Firestore field path (backticks where a member
  is not a plain identifier); ``__key__`` is Firestore's ``__name__``.
* Writes: ``Upsert`` is an update with no precondition (a property mask is
  its update mask: set-with-merge), ``Insert`` one with the precondition
  exists=false, ``Update`` exists=true, ``Delete`` a delete; increments are
  ``update_transforms``. An incomplete key gets a random id here
  (``random_id``) and the precondition exists=false, so a clash of ids is
  ``AlreadyExists``, never an overwrite.

Raw protobuf classes, not proto-plus wrappers, as in the Datastore codec:
they are faster and expose ``HasField``/``WhichOneof``.
"""

from __future__ import annotations

import datetime as _dt
import secrets
from typing import Any

import attrs
from google.cloud.firestore_v1.types import document as _doc
from google.cloud.firestore_v1.types import write as _write

from gds_counter.errors import BadValueError, GatewayError
from gds_counter.gateway._paths import parse, quote
from gds_counter.gateway.keys import Key, document_path, key_of_document
from gds_counter.gateway.mutations import (
    AppendMissingElements,
    Delete,
    Increment,
    Insert,
    Maximum,
    Minimum,
    Mutation,
    RequestTime,
    Transform,
    Update,
    Upsert,
)
from gds_counter.gateway.query import KEY_PROPERTY
from gds_counter.gateway.values import EPOCH, Geopoint, RawEntity

__all__ = ["DocumentCodec", "field_path", "random_id"]

_ValuePb = _doc.Value.pb()
_WritePb = _write.Write.pb()
_REQUEST_TIME = int(_write.DocumentTransform.FieldTransform.ServerValue.REQUEST_TIME)
_UTC = _dt.timezone.utc

#: Firestore's name for a document's key in field paths.
NAME_FIELD = "__name__"


def field_path(path: str) -> str:
    """A neutral property path (``_paths``: ``e.x``, ```a.b``` whole) as a
    Firestore field path; ``__key__`` is ``__name__``."""
    if path == KEY_PROPERTY:
        return NAME_FIELD
    return ".".join(quote(member) for member in parse(path))


def random_id() -> int:
    """A scattered random id in 1..2**63-1 (native mode allocates none)."""
    while True:
        found = secrets.randbits(63)
        if found:
            return found


@attrs.frozen
class DocumentCodec:
    """Protobufs for one project and database (``"(default)"`` by default)."""

    project: str
    database: str

    @property
    def database_name(self) -> str:
        return f"projects/{self.project}/databases/{self.database}"

    @property
    def root(self) -> str:
        """The parent of every top-level collection."""
        return f"{self.database_name}/documents"

    # --- keys ----------------------------------------------------------------

    def name_of(self, key: Key) -> str:
        """The document's full resource name (``BadKeyError`` for a key in a
        namespace or an incomplete one, from ``document_path``)."""
        project = self.project if key.project is None else key.project
        return f"projects/{project}/databases/{self.database}/documents/{document_path(key)}"

    def key_of(self, name: str) -> Key:
        """The key of a full document name the server gave; its project only
        when it is not this codec's."""
        parts = name.split("/", 5)
        if len(parts) < 6 or parts[0] != "projects" or parts[2] != "databases" or parts[4] != "documents":
            raise GatewayError(f"Firestore sent a document name that is not one: {name!r}")
        key = key_of_document(parts[5])
        return key if parts[1] == self.project else Key(key.path, project=parts[1])

    # --- values --------------------------------------------------------------

    def value_to_pb(self, value: Any, out: Any = None, *, name: str = "", in_array: bool = False) -> Any:
        pb = _ValuePb() if out is None else out
        if value is None:
            pb.null_value = 0
        elif isinstance(value, bool):
            pb.boolean_value = value
        elif isinstance(value, int):
            pb.integer_value = value
        elif isinstance(value, float):
            pb.double_value = value
        elif isinstance(value, str):
            pb.string_value = value
        elif isinstance(value, bytes):
            pb.bytes_value = value
        elif isinstance(value, _dt.datetime):
            delta = value.astimezone(_UTC) - EPOCH
            pb.timestamp_value.seconds = delta.days * 86400 + delta.seconds
            pb.timestamp_value.nanos = delta.microseconds * 1000
        elif isinstance(value, Key):
            pb.reference_value = self.name_of(value)
        elif isinstance(value, Geopoint):
            pb.geo_point_value.latitude = value.latitude
            pb.geo_point_value.longitude = value.longitude
        elif isinstance(value, list):
            if in_array:
                raise BadValueError(f"property {name!r}: Firestore refuses an array directly in an array")
            pb.array_value.SetInParent()
            for item in value:
                self.value_to_pb(item, pb.array_value.values.add(), name=name, in_array=True)
        elif isinstance(value, RawEntity):
            if value.key is not None:
                raise BadValueError(
                    f"property {name!r}: an embedded entity with a key ({value.key}); a Firestore map has no key"
                )
            if value.meanings:
                raise BadValueError(f"property {name!r}: Firestore has no value meanings; cannot store {dict(value.meanings)!r}")
            pb.map_value.SetInParent()
            for inner, item in value.properties.items():
                self.value_to_pb(item, pb.map_value.fields[inner], name=f"{name}.{inner}")
        else:
            raise BadValueError(f"property {name!r}: cannot store a {type(value).__name__} ({value!r}) in Firestore")
        return pb

    def fields_to_pb(self, properties: dict[str, Any], out: Any) -> None:
        for name, value in properties.items():
            self.value_to_pb(value, out[name], name=name)

    def value_from_pb(self, pb: Any) -> Any:
        which = pb.WhichOneof("value_type")
        if which is None or which == "null_value":
            return None
        if which == "boolean_value":
            return pb.boolean_value
        if which == "integer_value":
            return pb.integer_value
        if which == "double_value":
            return pb.double_value
        if which == "string_value":
            return pb.string_value
        if which == "bytes_value":
            return bytes(pb.bytes_value)
        if which == "timestamp_value":
            ts = pb.timestamp_value
            return EPOCH + _dt.timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000)
        if which == "reference_value":
            return self.key_of(pb.reference_value)
        if which == "geo_point_value":
            return Geopoint(pb.geo_point_value.latitude, pb.geo_point_value.longitude)
        if which == "array_value":
            return [self.value_from_pb(item) for item in pb.array_value.values]
        if which == "map_value":
            return RawEntity(None, {k: self.value_from_pb(v) for k, v in pb.map_value.fields.items()})
        raise GatewayError(f"Firestore sent a value of a type gds_counter does not read: {which!r}")

    def entity_from_pb(self, pb: Any) -> RawEntity:
        """A document as an entity (no index flags: Firestore has none)."""
        return RawEntity(self.key_of(pb.name), {k: self.value_from_pb(v) for k, v in pb.fields.items()})

    # --- writes --------------------------------------------------------------

    def write_to_pb(self, mutation: Mutation, key: Key) -> Any:
        """One mutation as a ``Write`` on the document of ``key`` (the
        mutation's own key, completed by the caller when it was incomplete)."""
        pb = _WritePb()
        if isinstance(mutation, Delete):
            pb.delete = self.name_of(key)
            return pb
        pb.update.name = self.name_of(key)
        if mutation.entity.meanings:
            raise BadValueError(f"{key}: Firestore has no value meanings; cannot store {dict(mutation.entity.meanings)!r}")
        self.fields_to_pb(dict(mutation.entity.properties), pb.update.fields)
        if mutation.property_mask is not None:
            pb.update_mask.SetInParent()  # an empty mask writes nothing and keeps every field
            pb.update_mask.field_paths.extend(field_path(path) for path in mutation.property_mask)
        for transform in mutation.transforms:
            self._transform_to_pb(transform, pb.update_transforms.add())
        if isinstance(mutation, Insert) or mutation.entity.key is not key:
            pb.current_document.exists = False  # (a completed key: a clash of random ids is no overwrite)
        elif isinstance(mutation, Update):
            pb.current_document.exists = True
        return pb


    def _transform_to_pb(self, transform: Transform, item: Any) -> None:
        """A neutral transform as a Firestore ``FieldTransform``: the same six
        transforms, on the field of the same path."""
        name = transform.name
        item.field_path = field_path(name)
        if isinstance(transform, Increment):
            self.value_to_pb(transform.amount, item.increment, name=name)
        elif isinstance(transform, (Maximum, Minimum)):
            self.value_to_pb(transform.value, getattr(item, type(transform).__name__.lower()), name=name)
        elif isinstance(transform, RequestTime):
            item.set_to_server_value = _REQUEST_TIME
        else:
            array = item.append_missing_elements if isinstance(transform, AppendMissingElements) else item.remove_all_from_array
            array.SetInParent()
            for element in transform.elements:
                self.value_to_pb(element, array.values.add(), name=name, in_array=True)


def document_of(mutation: Mutation) -> Key:
    """The key a mutation names (incomplete for an upsert to be numbered)."""
    return mutation.key if isinstance(mutation, Delete) else _upserted(mutation)


def _upserted(mutation: Upsert) -> Key:
    key = mutation.entity.key
    assert key is not None  # checked by the rules (check_mutation)
    return key
