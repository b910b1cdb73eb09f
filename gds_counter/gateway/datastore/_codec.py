"""Conversion between gds_counter's neutral gateway types and raw
``datastore_v1`` protobufs, in both directions.

The gateway sends protobufs it builds itself (see the package docstring for
why not google.cloud.datastore's entities), so this is where php-gds's wire
format is decided: index flags go on each list element (Datastore rejects
``exclude_from_indexes`` on an array value), an empty embedded entity is still
sent as set, an empty property mask is sent as ``__key__`` (an empty mask
would mean "write everything"), a GQL cursor binding travels in its own
field, and every aggregation is sent with its alias spelled out.

The reverse direction, requests read back into neutral queries, mutations
and GQL bindings (``query_from_pb``, ``mutation_from_pb``...), is what
``gds-counter serve`` (``gds_counter.server``) runs on: one codec, so a
value or a filter means the same thing whichever side of the wire it is on.
What the neutral types cannot say (conflict detection by version, a
vector search, a server value other than REQUEST_TIME) is refused with
``BadValueError`` there rather than dropped.

Raw protobuf classes, not proto-plus wrappers: they are faster, and they
expose HasField/WhichOneof, which the value mapping needs. Keys carry no
project or database (they belong to the gateway, so keys compare equal across
gateways), which is why a ``Codec`` is made for one project and database.
The exception is a key naming another project (``Key.project``: a GQL
``KEY(PROJECT('other'), ...)``, or a key value Datastore stored with another
project): it is sent with its own project, and read back with it, so Datastore
decides what it means and the project is never silently dropped.
"""

from __future__ import annotations

import datetime as _dt
from typing import Any

import attrs
from google.cloud.datastore_v1.types import datastore as _ds
from google.cloud.datastore_v1.types import entity as _ent
from google.cloud.datastore_v1.types import query as _qry

from gds_counter.errors import BadValueError, GatewayError
from gds_counter.gateway._meanings import INDEX_VALUE, NO_MEANINGS, Meaning
from gds_counter.gateway.keys import Key, PathElement
from gds_counter.gateway.mutations import (
    AppendMissingElements,
    Delete,
    Increment,
    Insert,
    Maximum,
    Minimum,
    Mutation,
    RemoveAllFromArray,
    RequestTime,
    Transform,
    Update,
    Upsert,
)
from gds_counter.gateway.query import (
    Aggregation,
    AggregationQuery,
    CompositeFilter,
    Cursor,
    Filter,
    Order,
    PropertyFilter,
    Query,
)
from gds_counter.gateway.values import EPOCH, Geopoint, RawEntity

_ValuePb = _ent.Value.pb()
_EntityPb = _ent.Entity.pb()
_KeyPb = _ent.Key.pb()
_PartitionIdPb = _ent.PartitionId.pb()
_MutationPb = _ds.Mutation.pb()
_REQUEST_TIME = int(_ds.PropertyTransform.ServerValue.REQUEST_TIME)
_QueryPb = _qry.Query.pb()
_GqlQueryPb = _qry.GqlQuery.pb()
_PropertyFilterPb = _qry.PropertyFilter.pb()
_CompositeFilterPb = _qry.CompositeFilter.pb()
_PropertyOrderPb = _qry.PropertyOrder.pb()
_AggregationQueryPb = _qry.AggregationQuery.pb()

_UTC = _dt.timezone.utc

_OPS = {
    "=": _PropertyFilterPb.EQUAL,
    "<": _PropertyFilterPb.LESS_THAN,
    "<=": _PropertyFilterPb.LESS_THAN_OR_EQUAL,
    ">": _PropertyFilterPb.GREATER_THAN,
    ">=": _PropertyFilterPb.GREATER_THAN_OR_EQUAL,
    "!=": _PropertyFilterPb.NOT_EQUAL,
    "IN": _PropertyFilterPb.IN,
    "NOT_IN": _PropertyFilterPb.NOT_IN,
    "HAS_ANCESTOR": _PropertyFilterPb.HAS_ANCESTOR,
}
#: The neutral operator of each wire operator (``_OPS`` read backwards).
_OPS_BACK = {number: name for name, number in _OPS.items()}


@attrs.frozen
class Codec:
    """Protobufs for one project and database (``""`` is the default database)."""

    project: str
    database: str

    def partition(self, namespace: str) -> Any:
        return _PartitionIdPb(project_id=self.project, database_id=self.database, namespace_id=namespace)

    # --- keys and values ----------------------------------------------------

    def key_to_pb(self, key: Key) -> Any:
        pb = _KeyPb()
        pb.partition_id.project_id = self.project if key.project is None else key.project
        pb.partition_id.database_id = self.database
        pb.partition_id.namespace_id = key.namespace
        for element in key.path:
            path = pb.path.add()
            path.kind = element.kind
            if element.id is not None:
                path.id = element.id
            elif element.name is not None:
                path.name = element.name
        return pb

    def key_from_pb(self, pb: Any) -> Key:
        """The key; its project only when it is not this codec's (an empty
        project id is the request's, as Datastore reads it)."""
        elements = []
        for path in pb.path:
            which = path.WhichOneof("id_type")
            if which == "id":
                elements.append(PathElement(path.kind, id=path.id))
            elif which == "name":
                elements.append(PathElement(path.kind, name=path.name))
            else:
                elements.append(PathElement(path.kind))
        database = pb.partition_id.database_id
        if database != self.database:
            # A key holds no database: storing it would write, or point, into
            # this one. (An empty one is the default database's, as on the emulator.)
            raise BadValueError(f"mismatched databases within request: a key of database {database!r} in a request "
                                f"for {self.database or 'the default database'!r}")
        project = pb.partition_id.project_id
        return Key(tuple(elements), pb.partition_id.namespace_id, project=None if project == self.project else project)

    def value_to_pb(self, value: Any, excluded: bool, out: Any = None) -> Any:
        pb = _ValuePb() if out is None else out
        if isinstance(value, list):
            # Datastore rejects exclude_from_indexes on an array value: the
            # flag goes on each element, as php-gds writes it.
            pb.array_value.SetInParent()
            for item in value:
                self.value_to_pb(item, excluded, pb.array_value.values.add())
            return pb
        pb.exclude_from_indexes = excluded
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
            pb.blob_value = value
        elif isinstance(value, _dt.datetime):
            delta = value.astimezone(_UTC) - EPOCH
            pb.timestamp_value.seconds = delta.days * 86400 + delta.seconds
            pb.timestamp_value.nanos = delta.microseconds * 1000
        elif isinstance(value, Key):
            pb.key_value.CopyFrom(self.key_to_pb(value))
        elif isinstance(value, Geopoint):
            pb.geo_point_value.latitude = value.latitude
            pb.geo_point_value.longitude = value.longitude
        elif isinstance(value, RawEntity):
            self.entity_to_pb(value, pb.entity_value)
        else:
            raise BadValueError(f"cannot store a {type(value).__name__} ({value!r})")
        return pb

    def entity_to_pb(self, entity: RawEntity, out: Any = None) -> Any:
        pb = _EntityPb() if out is None else out
        # An empty embedded entity must still count as set, or the value goes
        # out with no value type and the server rejects it.
        pb.SetInParent()
        if entity.key is not None:
            pb.key.CopyFrom(self.key_to_pb(entity.key))
        for name, value in entity.properties.items():
            self.value_to_pb(value, name in entity.unindexed, pb.properties[name])
        for name, meaning in entity.meanings.items():  # (gateway._meanings: checked with the entity)
            _meaning_to_pb(meaning, pb.properties[name])
        return pb

    def value_from_pb(self, pb: Any) -> tuple[Any, bool]:
        """The neutral value and whether it is excluded from indexes."""
        which = pb.WhichOneof("value_type")
        if which == "array_value":
            items = [self.value_from_pb(v) for v in pb.array_value.values]
            excluded = all(flag for _, flag in items) if items else pb.exclude_from_indexes
            return [v for v, _ in items], excluded
        excluded = pb.exclude_from_indexes
        if which is None or which == "null_value":
            return None, excluded
        if which == "boolean_value":
            return pb.boolean_value, excluded
        if which == "integer_value":
            return pb.integer_value, excluded
        if which == "double_value":
            return pb.double_value, excluded
        if which == "string_value":
            return pb.string_value, excluded
        if which == "blob_value":
            return bytes(pb.blob_value), excluded
        if which == "timestamp_value":
            ts = pb.timestamp_value
            return EPOCH + _dt.timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000), excluded
        if which == "key_value":
            return self.key_from_pb(pb.key_value), excluded
        if which == "geo_point_value":
            return Geopoint(pb.geo_point_value.latitude, pb.geo_point_value.longitude), excluded
        if which == "entity_value":
            return self.entity_from_pb(pb.entity_value), excluded
        raise GatewayError(f"unsupported Datastore value type {which!r}")

    def entity_from_pb(self, pb: Any) -> RawEntity:
        key = self.key_from_pb(pb.key) if pb.HasField("key") else None
        properties: dict[str, Any] = {}
        unindexed = set()
        meanings = {}
        for name, value_pb in pb.properties.items():
            value, excluded = self.value_from_pb(value_pb)
            properties[name] = value
            if excluded:
                unindexed.add(name)
            meaning = _meaning_from_pb(value_pb)
            if meaning is not None:
                meanings[name] = meaning
        return RawEntity(key, properties, frozenset(unindexed), meanings or NO_MEANINGS)

    # --- queries ------------------------------------------------------------

    def filter_to_pb(self, flt: Filter, out: Any) -> None:
        if isinstance(flt, CompositeFilter):
            parts = [f for f in flt.filters]
            if len(parts) == 1:
                self.filter_to_pb(parts[0], out)
                return
            composite = out.composite_filter
            composite.op = _CompositeFilterPb.AND if flt.op == "AND" else _CompositeFilterPb.OR
            for part in parts:
                self.filter_to_pb(part, composite.filters.add())
            return
        if isinstance(flt, PropertyFilter):
            prop = out.property_filter
            prop.property.name = flt.name
            prop.op = _OPS[flt.op]
            if flt.op in ("IN", "NOT_IN"):
                prop.value.array_value.SetInParent()
                for item in flt.value:
                    self.value_to_pb(item, False, prop.value.array_value.values.add())
            else:
                self.value_to_pb(flt.value, False, prop.value)
            return
        raise BadValueError(f"unknown filter {flt!r}")

    def query_to_pb(self, query: Query) -> Any:
        pb = _QueryPb()
        if query.kind:
            pb.kind.add().name = query.kind
        if query.filter is not None:
            self.filter_to_pb(query.filter, pb.filter)
        for order in query.order:
            item = pb.order.add()
            item.property.name = order.name
            item.direction = _PropertyOrderPb.DESCENDING if order.descending else _PropertyOrderPb.ASCENDING
        if query.keys_only:
            pb.projection.add().property.name = "__key__"
        else:
            for name in query.projection:
                pb.projection.add().property.name = name
        for name in query.distinct_on:
            pb.distinct_on.add().name = name
        if query.limit is not None:
            pb.limit.value = query.limit
            pb.limit.SetInParent()
        if query.offset:
            pb.offset = query.offset
        if query.start_cursor:
            pb.start_cursor = query.start_cursor
        if query.end_cursor:
            pb.end_cursor = query.end_cursor
        return pb

    def aggregation_to_pb(self, aggregation: AggregationQuery, extra_count: str | None = None) -> Any:
        """An ``AggregationQuery`` protobuf. Aliases are always sent (the
        defaults too), so the server names results as ``aliases()`` does;
        ``extra_count`` adds a ``COUNT(*)`` under that alias."""
        pb = _AggregationQueryPb()
        pb.nested_query.CopyFrom(self.query_to_pb(aggregation.query))
        for item, alias in zip(aggregation.aggregations, aggregation.aliases()):
            out = pb.aggregations.add()
            out.alias = alias
            if item.kind == "COUNT":
                out.count.SetInParent()
            elif item.kind == "COUNT_UP_TO":
                out.count.up_to.value = item.up_to or 0
                out.count.up_to.SetInParent()  # up_to 0 must still be sent: absent means no bound
            elif item.kind == "SUM":
                out.sum.property.name = item.property or ""
            else:
                out.avg.property.name = item.property or ""
        if extra_count is not None:
            extra = pb.aggregations.add()
            extra.alias = extra_count
            extra.count.SetInParent()
        return pb

    def gql_to_pb(self, query: Query) -> Any:
        assert query.gql is not None
        pb = _GqlQueryPb(query_string=query.gql.text, allow_literals=True)
        for name, value in query.gql.named:
            self._binding_to_pb(value, pb.named_bindings[name])
        for value in query.gql.positional:
            self._binding_to_pb(value, pb.positional_bindings.add())
        return pb

    def _binding_to_pb(self, value: Any, out: Any) -> None:
        # A cursor (at LIMIT/OFFSET, "LIMIT @c" / "OFFSET @c") travels in its
        # own field; plain bytes are a blob value to compare with.
        if isinstance(value, Cursor):
            out.cursor = value.value
        else:
            self.value_to_pb(value, False, out.value)

    # --- writes -------------------------------------------------------------

    def mutation_to_pb(self, mutation: Mutation) -> Any:
        pb = _MutationPb()
        if isinstance(mutation, Upsert):
            written = pb.insert if isinstance(mutation, Insert) else pb.update if isinstance(mutation, Update) else pb.upsert
            written.CopyFrom(self.entity_to_pb(mutation.entity))
            if mutation.property_mask is not None:
                # An empty mask would mean "write everything" to Datastore;
                # naming only __key__ keeps every stored property instead.
                pb.property_mask.paths.extend(mutation.property_mask or ("__key__",))
            for transform in mutation.transforms:
                self._transform_to_pb(transform, pb.property_transforms.add())
        else:
            pb.delete.CopyFrom(self.key_to_pb(mutation.key))
        return pb

    def _transform_to_pb(self, transform: Transform, item: Any) -> None:
        item.property = transform.name
        if isinstance(transform, Increment):
            self.value_to_pb(transform.amount, False, item.increment)
        elif isinstance(transform, (Maximum, Minimum)):
            self.value_to_pb(transform.value, False, getattr(item, type(transform).__name__.lower()))
        elif isinstance(transform, RequestTime):
            item.set_to_server_value = _REQUEST_TIME
        else:
            array = item.append_missing_elements if isinstance(transform, AppendMissingElements) else item.remove_all_from_array
            array.SetInParent()  # (no elements is still this transform)
            for element in transform.elements:
                self.value_to_pb(element, False, array.values.add())

    # --- requests read back: the server's direction ---------------------------

    def filter_from_pb(self, pb: Any) -> Filter:
        """A wire filter as a neutral one; IN and NOT IN values as tuples,
        as GQL makes them."""
        which = pb.WhichOneof("filter_type")
        if which == "composite_filter":
            composite = pb.composite_filter
            if composite.op not in (_CompositeFilterPb.AND, _CompositeFilterPb.OR):
                raise BadValueError(f"a composite filter needs the operator AND or OR, got {composite.op}")
            return CompositeFilter("AND" if composite.op == _CompositeFilterPb.AND else "OR", tuple(self.filter_from_pb(inner) for inner in composite.filters))
        if which == "property_filter":
            prop = pb.property_filter
            if prop.op not in _OPS_BACK:
                raise BadValueError(f"unknown property filter operator {prop.op} on {prop.property.name!r}")
            op = _OPS_BACK[prop.op]
            value, _ = self.value_from_pb(prop.value)
            if op in ("IN", "NOT_IN"):
                if not isinstance(value, list):
                    raise BadValueError(f"{op} on {prop.property.name!r} needs an array value")
                value = tuple(value)
            elif isinstance(value, list):
                raise BadValueError(f"an array value is only for IN and NOT_IN, not {op} on {prop.property.name!r}")
            return PropertyFilter(prop.property.name, op, value)
        raise BadValueError("a filter must be a composite or a property filter")

    def query_from_pb(self, pb: Any, namespace: str) -> Query:
        """A wire query in ``namespace`` (the request's partition) as a
        neutral one: a projection of ``__key__`` alone is keys-only."""
        if pb.HasField("find_nearest"):
            raise BadValueError("find_nearest (vector search) is not supported")
        if len(pb.kind) > 1:
            raise BadValueError(f"a query takes at most one kind, got {len(pb.kind)}")
        projection = tuple(item.property.name for item in pb.projection)
        keys_only = projection == ("__key__",)
        orders = []
        for order in pb.order:
            if order.direction not in (0, _PropertyOrderPb.ASCENDING, _PropertyOrderPb.DESCENDING):
                raise BadValueError(f"unknown sort direction {order.direction} on {order.property.name!r}")
            orders.append(Order(order.property.name, order.direction == _PropertyOrderPb.DESCENDING))
        return Query(
            kind=pb.kind[0].name if pb.kind else None,
            namespace=namespace,
            filter=self.filter_from_pb(pb.filter) if pb.HasField("filter") else None,
            order=tuple(orders),
            projection=() if keys_only else projection,
            distinct_on=tuple(item.name for item in pb.distinct_on),
            keys_only=keys_only,
            limit=pb.limit.value if pb.HasField("limit") else None,
            offset=pb.offset,
            start_cursor=bytes(pb.start_cursor) or None,
            end_cursor=bytes(pb.end_cursor) or None,
        )

    def aggregation_from_pb(self, pb: Any, namespace: str) -> AggregationQuery:
        """A wire aggregation query; an empty alias takes Datastore's
        default name (``AggregationQuery.aliases``)."""
        if not pb.HasField("nested_query"):
            raise BadValueError("an aggregation query needs a nested query")
        items = []
        for item in pb.aggregations:
            alias = item.alias or None
            which = item.WhichOneof("operator")
            if which == "count":
                if item.count.HasField("up_to"):
                    items.append(Aggregation.count_up_to(item.count.up_to.value, alias))
                else:
                    items.append(Aggregation.count(alias))
            elif which == "sum":
                items.append(Aggregation.sum(item.sum.property.name, alias))
            elif which == "avg":
                items.append(Aggregation.avg(item.avg.property.name, alias))
            else:
                raise BadValueError("an aggregation needs an operator: count, sum or avg")
        return AggregationQuery(self.query_from_pb(pb.nested_query, namespace), tuple(items))

    def gql_bindings_from_pb(self, pb: Any) -> dict[Any, Any]:
        """A ``GqlQuery``'s bindings as ``gds.gql.parse`` takes them: names
        as ``str`` keys, positions as ``int`` keys from 1; a cursor
        parameter as a ``Cursor``, an array value as a list."""
        bindings: dict[Any, Any] = {}
        for name, parameter in pb.named_bindings.items():
            bindings[name] = self._binding_from_pb(parameter)
        for position, parameter in enumerate(pb.positional_bindings, start=1):
            bindings[position] = self._binding_from_pb(parameter)
        return bindings

    def _binding_from_pb(self, parameter: Any) -> Any:
        if parameter.WhichOneof("parameter_type") == "cursor":
            return Cursor(bytes(parameter.cursor))
        return self.value_from_pb(parameter.value)[0]

    def mutation_from_pb(self, pb: Any) -> Mutation:
        """A wire mutation as a neutral one. Its key and values are checked
        by the gateway's commit rules, as anyone's are."""
        which = pb.WhichOneof("operation")
        if pb.WhichOneof("conflict_detection_strategy") is not None:
            raise BadValueError("conflict detection by base_version or update_time is not supported; use a transaction")
        if which == "delete":
            if pb.HasField("property_mask") or pb.property_transforms:
                raise BadValueError("a delete takes no property mask and no transforms")
            return Delete(self.key_from_pb(pb.delete))
        if which not in ("insert", "update", "upsert"):
            raise BadValueError("a mutation needs an operation: insert, update, upsert or delete")
        written = getattr(pb, which)
        if not written.HasField("key"):
            raise BadValueError(f"an entity to {which} needs a key")
        mask = None
        if pb.HasField("property_mask"):
            # The gateway's own codec sends an empty mask as __key__ alone.
            mask = tuple(path for path in pb.property_mask.paths if path != "__key__")
        transforms = [self._transform_from_pb(item) for item in pb.property_transforms]
        _refuse_wire_meanings(written)
        kind_of = Insert if which == "insert" else Update if which == "update" else Upsert
        return kind_of(self.entity_from_pb(written), property_mask=mask, transforms=tuple(transforms))

    def _transform_from_pb(self, item: Any) -> Transform:
        """A wire property transform as a neutral one; its operand is
        checked by the commit rules (``mutations.check_transforms``)."""
        kind, name = item.WhichOneof("transform_type"), item.property
        if kind is None:
            raise BadValueError(f"the property transform of {name!r} needs a transform type")
        if kind == "set_to_server_value":
            if item.set_to_server_value != _REQUEST_TIME:
                raise BadValueError(f"the property transform of {name!r} needs a server value: REQUEST_TIME")
            return RequestTime(name)
        if kind in ("append_missing_elements", "remove_all_from_array"):
            elements = [self.value_from_pb(value)[0] for value in getattr(item, kind).values]
            return (AppendMissingElements if kind == "append_missing_elements" else RemoveAllFromArray)(name, elements)
        if kind not in ("increment", "maximum", "minimum"):
            raise BadValueError(f"the property transform {kind} of {name!r} is not supported")
        number, _ = self.value_from_pb(getattr(item, kind))
        return Increment(name, number) if kind == "increment" else Maximum(name, number) if kind == "maximum" else Minimum(name, number)


def _meaning_to_pb(meaning: Meaning, pb: Any) -> None:
    """Put a property's meaning (``gateway._meanings``) on its value ``pb``."""
    if isinstance(meaning, tuple):
        for one, item in zip(meaning, pb.array_value.values):
            if one is not None:
                item.meaning = one
    else:
        pb.meaning = meaning


def _meaning_from_pb(pb: Any) -> Meaning | None:
    """A value's meaning as ``RawEntity.meanings`` keeps it: None for none,
    and for a projection's marker (``INDEX_VALUE``), which says how the
    value was read, not what it is. A list's meaning itself (which the
    emulator refuses) is its elements' where they have none."""
    if pb.WhichOneof("value_type") == "array_value":
        root = _one_meaning(pb)
        items = tuple(_one_meaning(item) or root for item in pb.array_value.values)
        return items if any(one is not None for one in items) else None
    return _one_meaning(pb)


def _one_meaning(pb: Any) -> int | None:
    meaning: int = pb.meaning
    return meaning if meaning and meaning != INDEX_VALUE else None


def _refuse_wire_meanings(entity_pb: Any) -> None:
    """Refuse, in a write, what the emulator refuses and ``RawEntity.meanings``
    cannot hold: a meaning on a list value itself (its elements' are kept)
    and the projection's mark (``INDEX_VALUE``), anywhere in the entity."""
    for name, value_pb in entity_pb.properties.items():
        _refuse_wire_meaning(name, value_pb)


def _refuse_wire_meaning(name: str, value_pb: Any) -> None:
    if value_pb.meaning == INDEX_VALUE:
        raise BadValueError(f"property {name!r}: meaning {INDEX_VALUE} marks a projection's value; a projected entity cannot be written")
    which = value_pb.WhichOneof("value_type")
    if which == "array_value":
        if value_pb.meaning:
            raise BadValueError(f"property {name!r}: a list value cannot specify a meaning (its elements can)")
        for item in value_pb.array_value.values:
            _refuse_wire_meaning(name, item)
    elif which == "entity_value":
        _refuse_wire_meanings(value_pb.entity_value)
