"""A neutral ``Query`` as a Firestore ``StructuredQuery``, and what its
answer means: results, and our opaque cursors in and out.

* The kind is ``from.collection_id`` with ``all_descendants`` under the
  root: a collection group over the whole database, as Datastore's kind
  query sees entities at any depth. ``HAS ANCESTOR k`` (an AND-ed
  conjunct) adds the document-name range ``k <= __name__ < k + "\\0"``
  (``k``'s last id with a NUL after it: the first name after every
  descendant of ``k``, names comparing segment by segment). Why not the
  parent ``k`` with ``all_descendants``: the emulator refuses it
  ("collection group queries are only allowed at the root parent"), and
  such a query would miss ``k`` itself, which Datastore's ancestor query
  returns when its kind matches; the range returns it, as Datastore does.
* Filters: ``=`` and ``!=`` on null or NaN are Firestore's unary filters;
  ``__key__`` is ``__name__`` (a reference value). Datastore's ``=`` on a
  list property matches any element; Firestore's equality compares the
  whole array (``array-contains`` is not what ``=`` says), so such a query
  finds nothing where Datastore finds the entity.
* Orders: the query is sent with Firestore's whole order spelled out (its
  explicit orders, then its inequality fields by name, then ``__name__``,
  in the direction of the last explicit order: Firestore's own implicit
  rule), so a cursor, which holds one value per order, is a point in a
  known order.
* Cursors: Firestore's cursor is values, not bytes. Ours are those values
  (the last result's, ``before=false``: just after it) serialized: opaque
  bytes as the neutral types want, valid for the query they came from. A
  keys-only or projection query also selects its order fields, so that the
  end cursor can be made; they are dropped from the results.
* Refused before anything is sent, with ``BadValueError`` naming the
  query: a kindless query (Firestore queries one collection id), a
  namespace (native mode has none: ``BadKeyError``), ``DISTINCT ON``, and
  an ancestor that is not an AND-ed conjunct of the filter. What the
  server itself refuses (some ``__key__`` ranges, inequalities it cannot
  serve without an index) comes back as its INVALID_ARGUMENT, a
  ``BadValueError`` naming the query too (``_gateway``).
* A projection returns a document that lacks a projected property (with
  the others); Datastore returns only entities holding every projected
  property, one result per list element. Results carry no index flags.
"""

from __future__ import annotations

from typing import Any

import attrs
from google.cloud.firestore_v1.types import query as _q

from gds_counter.errors import BadKeyError, BadValueError
from gds_counter.gateway._paths import parse
from gds_counter.gateway.firestore._codec import NAME_FIELD, DocumentCodec, field_path
from gds_counter.gateway.keys import Key
from gds_counter.gateway.query import KEY_PROPERTY, CompositeFilter, Filter, PropertyFilter, Query, leaves_of
from gds_counter.gateway.values import RawEntity

__all__ = ["QueryShape", "describe", "shape_query"]

_StructuredPb = _q.StructuredQuery.pb()
_CursorPb = _q.Cursor.pb()
_FieldFilterPb = _q.StructuredQuery.FieldFilter.pb()
_UnaryFilterPb = _q.StructuredQuery.UnaryFilter.pb()
_CompositeFilterPb = _q.StructuredQuery.CompositeFilter.pb()
_DirectionPb = _q.StructuredQuery.Direction

_OPS = {
    "=": _FieldFilterPb.EQUAL,
    "<": _FieldFilterPb.LESS_THAN,
    "<=": _FieldFilterPb.LESS_THAN_OR_EQUAL,
    ">": _FieldFilterPb.GREATER_THAN,
    ">=": _FieldFilterPb.GREATER_THAN_OR_EQUAL,
    "!=": _FieldFilterPb.NOT_EQUAL,
    "IN": _FieldFilterPb.IN,
    "NOT_IN": _FieldFilterPb.NOT_IN,
}
#: Operators Firestore counts as inequalities (each one's field is ordered by).
_INEQUALITIES = frozenset({"<", "<=", ">", ">=", "!=", "NOT_IN"})

#: What starts every cursor this gateway makes (a version, should it change).
_CURSOR_TAG = b"gdsfs1:"


def describe(query: Query) -> str:
    """How an error names a query."""
    return f"the query of kind {query.kind!r}" + (f" (filter {query.filter!r})" if query.filter is not None else "")


@attrs.frozen
class QueryShape:
    """What is sent for a query, and how to read its answer."""

    parent: str
    structured: Any
    #: Each order's path members (None: ``__name__``): the cursor's values.
    orders: tuple[tuple[str, ...] | None, ...]
    #: The top-level properties a result keeps (None: all of them).
    keep: frozenset[str] | None

    def entity(self, codec: DocumentCodec, document: Any) -> RawEntity:
        entity = codec.entity_from_pb(document)
        if self.keep is not None:
            entity = RawEntity(entity.key, {k: v for k, v in entity.properties.items() if k in self.keep})
        return entity

    def cursor_after(self, document: Any) -> bytes:
        """Our cursor just after ``document``, in this query's order."""
        cursor = _CursorPb(before=False)
        for members in self.orders:
            value = cursor.values.add()
            if members is None:
                value.reference_value = document.name
                continue
            found = _field(document.fields, members)
            if found is None:
                value.null_value = 0  # (a document without an ordered field is not a result)
            else:
                value.CopyFrom(found)
        return _CURSOR_TAG + cursor.SerializeToString()


def _field(fields: Any, members: tuple[str, ...]) -> Any:
    holder = fields
    for member in members[:-1]:
        if member not in holder or holder[member].WhichOneof("value_type") != "map_value":
            return None
        holder = holder[member].map_value.fields
    return holder[members[-1]] if members[-1] in holder else None


def _cursor_of(raw: bytes, what: str, query: Query) -> Any:
    if not raw.startswith(_CURSOR_TAG):
        raise BadValueError(f"{describe(query)}: its {what} cursor was not made by a Firestore gateway")
    try:
        return _CursorPb.FromString(raw[len(_CURSOR_TAG):])
    except Exception as exc:  # protobuf's DecodeError: the bytes were changed
        raise BadValueError(f"{describe(query)}: its {what} cursor is damaged ({exc})") from None


def shape_query(codec: DocumentCodec, query: Query, *, select: bool = True, summed: tuple[str, ...] = ()) -> QueryShape:
    """``query`` as a ``StructuredQuery`` under its parent (module
    docstring); ``select=False`` for an aggregation, which projects nothing
    and is sent with its own orders only, and under an ancestor ordered by
    the ``summed`` fields too (so a count beside a sum there counts the
    documents that have them)."""
    if query.namespace:
        raise BadKeyError(f"{describe(query)} is in namespace {query.namespace!r}; Firestore in native mode has no namespaces")
    if query.kind is None:
        raise BadValueError(
            "a kindless query cannot run on Firestore in native mode: a query names one collection id (a kind)"
        )
    if query.distinct_on:
        raise BadValueError(f"{describe(query)} has DISTINCT ON {list(query.distinct_on)}, which Firestore does not run")
    ancestor, rest = _split_ancestor(query)
    pb = _StructuredPb()
    selector = pb.from_.add()
    selector.collection_id = query.kind
    selector.all_descendants = True
    if ancestor is not None:
        name = codec.name_of(ancestor)
        below = [_name_filter(_FieldFilterPb.GREATER_THAN_OR_EQUAL, name), _name_filter(_FieldFilterPb.LESS_THAN, name + "\0")]
        both = pb.where.composite_filter
        both.op = _CompositeFilterPb.AND
        for part in below:
            both.filters.add().field_filter.CopyFrom(part)
        if rest is not None:
            _filter_to_pb(codec, rest, both.filters.add())
    elif rest is not None:
        _filter_to_pb(codec, rest, pb.where)
    if select:
        orders = _effective_orders(query, rest)
    else:
        # An aggregation makes no cursor, and Firestore refuses to sum or
        # average a field after __name__, which an ancestor's range orders
        # by: its own orders, then (under an ancestor) the summed fields.
        orders = [(o.name, o.descending) for o in query.order]
        if ancestor is not None:
            last = orders[-1][1] if orders else False
            orders += [(name, last) for name in dict.fromkeys(summed) if name not in {n for n, _ in orders}]
    for path, descending in orders:
        item = pb.order_by.add()
        item.field.field_path = NAME_FIELD if path == KEY_PROPERTY else field_path(path)
        item.direction = _DirectionPb.DESCENDING if descending else _DirectionPb.ASCENDING
    keep: frozenset[str] | None = None
    if select and (query.keys_only or query.projection):
        shown = () if query.keys_only else query.projection
        keep = frozenset(parse(name)[0] for name in shown)
        wanted = dict.fromkeys([*shown, *(path for path, _ in orders if path != KEY_PROPERTY)])
        for name in wanted or (KEY_PROPERTY,):
            pb.select.fields.add().field_path = field_path(name)
    if query.limit is not None:
        pb.limit.value = query.limit
        pb.limit.SetInParent()
    if query.offset:
        pb.offset = query.offset
    if query.start_cursor:
        pb.start_at.CopyFrom(_cursor_of(query.start_cursor, "start", query))
    if query.end_cursor:
        pb.end_at.CopyFrom(_cursor_of(query.end_cursor, "end", query))
    members = tuple(None if path == KEY_PROPERTY else tuple(parse(path)) for path, _ in orders)
    return QueryShape(codec.root, pb, members, keep)


def _name_filter(op: int, name: str) -> Any:
    found = _FieldFilterPb()
    found.field.field_path = NAME_FIELD
    found.op = op
    found.value.reference_value = name
    return found


def _split_ancestor(query: Query) -> tuple[Key | None, Filter | None]:
    """The ancestor (an AND-ed ``HAS_ANCESTOR``) and the rest of the filter."""
    flt = query.filter
    if flt is None:
        return None, None
    top = [flt] if isinstance(flt, PropertyFilter) else list(flt.filters) if flt.op == "AND" else []
    ancestors = [f for f in top if isinstance(f, PropertyFilter) and f.op == "HAS_ANCESTOR"]
    if sum(1 for leaf in leaves_of(flt) if leaf.op == "HAS_ANCESTOR") > len(ancestors):
        raise BadValueError(
            f"{describe(query)}: HAS ANCESTOR inside an OR cannot run on Firestore (an ancestor is a range "
            "of document names AND-ed with the rest of the filter)"
        )
    if len({f.value for f in ancestors}) > 1:
        raise BadValueError(f"{describe(query)} names two different ancestors; this gateway runs one per query")
    if not ancestors:
        return None, flt
    rest = [f for f in top if f not in ancestors]
    remaining: Filter | None = None if not rest else rest[0] if len(rest) == 1 else CompositeFilter("AND", tuple(rest))
    return ancestors[0].value, remaining


def _effective_orders(query: Query, flt: Filter | None) -> list[tuple[str, bool]]:
    """Firestore's order for ``query``: its explicit orders, then each
    inequality field not ordered by (by name), then ``__name__``, in the
    direction of the last explicit order."""
    orders = [(order.name, order.descending) for order in query.order]
    named = {name for name, _ in orders}
    last = orders[-1][1] if orders else False
    unequal = set()
    for leaf in leaves_of(flt) if flt is not None else ():
        if leaf.op in _INEQUALITIES:  # (``!=`` null and NaN too: IS_NOT_NULL, IS_NOT_NAN)
            unequal.add(leaf.name)
    orders += [(name, last) for name in sorted(unequal - named, key=field_path)]
    if KEY_PROPERTY not in named:
        orders.append((KEY_PROPERTY, last))
    return orders


def _is_special(value: Any) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _filter_to_pb(codec: DocumentCodec, flt: Filter, out: Any) -> None:
    if isinstance(flt, CompositeFilter):
        if len(flt.filters) == 1:
            _filter_to_pb(codec, flt.filters[0], out)
            return
        composite = out.composite_filter
        composite.op = _CompositeFilterPb.AND if flt.op == "AND" else _CompositeFilterPb.OR
        for part in flt.filters:
            _filter_to_pb(codec, part, composite.filters.add())
        return
    path = field_path(flt.name)
    if flt.op in ("=", "!=") and _is_special(flt.value):
        unary = out.unary_filter
        unary.field.field_path = path
        if flt.value is None:
            unary.op = _UnaryFilterPb.IS_NULL if flt.op == "=" else _UnaryFilterPb.IS_NOT_NULL
        else:
            unary.op = _UnaryFilterPb.IS_NAN if flt.op == "=" else _UnaryFilterPb.IS_NOT_NAN
        return
    field = out.field_filter
    field.field.field_path = path
    field.op = _OPS[flt.op]
    if flt.op in ("IN", "NOT_IN"):
        field.value.array_value.SetInParent()
        for item in flt.value:
            codec.value_to_pb(item, field.value.array_value.values.add(), name=flt.name, in_array=True)
    else:
        codec.value_to_pb(flt.value, field.value, name=flt.name)
