"""Queries as data: what GQL parses into and what every gateway executes.

``Query`` is an ordinary query; ``AggregationQuery`` runs aggregations
(``COUNT``, ``COUNT_UP_TO``, ``SUM``, ``AVG``) over one and answers with an
``AggregationResult``, one value per alias.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Literal, Mapping, Sequence, Union

import attrs

from gds_counter._checks import INT64_MAX, INT64_MIN, check_text, is_int, utf8_size
from gds_counter.errors import BadValueError
from gds_counter.gateway.keys import Key, namespace_name
from gds_counter.gateway.values import MAX_INDEXED_STRING_BYTES, RawEntity

__all__ = [
    "leaves_of",
    "without_repeats",
    "AGGREGATION_KINDS",
    "KEY_PROPERTY",
    "MAX_AGGREGATIONS",
    "OPERATORS",
    "Aggregation",
    "AggregationQuery",
    "AggregationResult",
    "CompositeFilter",
    "Cursor",
    "Filter",
    "GqlSource",
    "Operator",
    "Order",
    "PropertyFilter",
    "Query",
    "QueryResult",
    "MAX_LIMIT", "check_query",
]

Operator = Literal["=", "<", "<=", ">", ">=", "!=", "IN", "NOT_IN", "HAS_ANCESTOR"]
OPERATORS: tuple[str, ...] = ("=", "<", "<=", ">", ">=", "!=", "IN", "NOT_IN", "HAS_ANCESTOR")

#: The pseudo-property that filters and orders by key.
KEY_PROPERTY = "__key__"


@attrs.frozen
class PropertyFilter:
    """``name op value``. For IN and NOT_IN, ``value`` is a tuple. For
    HAS_ANCESTOR, ``name`` is ``__key__`` and ``value`` a Key."""

    name: str
    op: str = attrs.field(validator=attrs.validators.in_(OPERATORS))
    value: Any


def _filters(filters: Iterable["Filter"]) -> tuple["Filter", ...]:
    return tuple(filters)


@attrs.frozen
class CompositeFilter:
    op: Literal["AND", "OR"] = attrs.field(validator=attrs.validators.in_(("AND", "OR")))
    filters: tuple["Filter", ...] = attrs.field(converter=_filters)


Filter = Union[PropertyFilter, CompositeFilter]


@attrs.frozen
class Order:
    name: str
    descending: bool = False


def leaves_of(f: Filter) -> Iterator[PropertyFilter]:
    """Every property filter in ``f``, OR branches included."""
    if isinstance(f, PropertyFilter):
        yield f
    else:
        for child in f.filters:
            yield from leaves_of(child)


def conjuncts_of(f: Filter | None) -> list[PropertyFilter]:
    """The property filters every result meets: ``f`` itself, or the
    property filters directly under a top-level AND (not in an OR branch)."""
    if isinstance(f, PropertyFilter):
        return [f]
    if isinstance(f, CompositeFilter) and f.op == "AND":
        return [c for c in f.filters if isinstance(c, PropertyFilter)]
    return []


def without_repeats(f: Filter) -> Filter:
    """``f`` with each AND's and OR's repeated children given once (the
    first), at every depth: the same filter twice means it once, and
    Datastore answers however many times it is repeated. Told apart by
    ``repr``, so ``1``, ``1.0`` and ``True`` stay three filters. A ``!=`` or
    ``NOT IN`` stays repeated: Datastore refuses a second one, even the same."""
    if isinstance(f, PropertyFilter):
        return f
    seen: set[str] = set()
    kept: list[Filter] = []
    for child in map(without_repeats, f.filters):
        shape = repr(child)
        if shape not in seen or any(leaf.op in ("!=", "NOT_IN") for leaf in leaves_of(child)):
            seen.add(shape)
            kept.append(child)
    return f if kept == list(f.filters) else CompositeFilter(f.op, tuple(kept))


def _orders(orders: Iterable[Order]) -> tuple[Order, ...]:
    return tuple(orders)


def _names(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(names)


@attrs.frozen
class Cursor:
    """A query cursor bound at a LIMIT or OFFSET position.

    Cursors and blobs are both bytes, but they mean different things (a
    place in the results versus a value to compare), and the Datastore API
    sends them differently, so the caller says which one is meant by
    wrapping cursors.
    """

    value: bytes = attrs.field(validator=attrs.validators.instance_of(bytes))


@attrs.frozen
class GqlSource:
    """The GQL text a query was parsed from, with its bindings, so a gateway
    that speaks GQL natively (Cloud Datastore) can send the text itself."""

    text: str
    named: tuple[tuple[str, Any], ...] = ()
    positional: tuple[Any, ...] = ()


@attrs.frozen
class Query:
    """A structured Datastore query; what GQL parses into and what every
    gateway executes.

    ``projection`` empty means whole entities; ``keys_only`` returns keys only
    (``SELECT __key__``). ``distinct_on`` lists the projected properties whose
    combination must be unique (``DISTINCT`` is ``distinct_on == projection``).
    ``start_cursor``/``end_cursor`` are opaque bytes issued by the same gateway.
    ``gql`` is set when the query came from GQL text and nothing was changed
    since; gateways may use it or ignore it.

    ``aggregated_rows`` marks the query a gateway without aggregations of its
    own reads to compute one (``_aggregation.row_query``). Its projection may
    name a property that an equality filters in an OR branch, which a query
    cannot project but Datastore still reads from that property's index to
    aggregate it; no other query sets it.
    """

    kind: str | None = attrs.field(default=None, converter=lambda kind: None if kind == "" else kind)  # "": kindless, as Datastore reads it
    namespace: str = attrs.field(default="", converter=namespace_name)
    filter: Filter | None = None
    order: tuple[Order, ...] = attrs.field(default=(), converter=_orders)
    projection: tuple[str, ...] = attrs.field(default=(), converter=_names)
    distinct_on: tuple[str, ...] = attrs.field(default=(), converter=_names)
    keys_only: bool = False
    limit: int | None = None
    offset: int = 0
    start_cursor: bytes | None = None
    end_cursor: bytes | None = None
    gql: GqlSource | None = attrs.field(default=None, eq=False)
    aggregated_rows: bool = False

    def replace(self, **changes: Any) -> "Query":
        """A copy with ``changes``; the GQL source is dropped because the
        text no longer describes the query."""
        changes.setdefault("gql", None)
        return attrs.evolve(self, **changes)


#: The largest LIMIT and OFFSET Datastore takes (32-bit; the Firestore
#: emulator: "The limit 2147483648 is too large.").
MAX_LIMIT = 2**31 - 1


def check_query(query: Query) -> None:
    """Refuse, before any backend sees ``query``, what no gateway could
    send: a LIMIT or OFFSET past ``MAX_LIMIT`` (the wire's field is 32
    bits), or a string that is not valid Unicode: its kind, the property
    names it filters, orders and projects by, and the strings it compares
    with (a key's strings are checked when the key is made, the namespace
    by ``namespace_name``). ``BaseGateway`` checks this, so each is a
    ``BadValueError`` naming the value on every gateway, not whichever
    encoder's ``ValueError`` or ``UnicodeEncodeError``."""
    for what, value in (("limit", query.limit), ("offset", query.offset)):
        if isinstance(value, int) and value > MAX_LIMIT:
            raise BadValueError(f"The {what} {value} is too large (Datastore takes at most {MAX_LIMIT}).")
    if query.kind is not None:
        _check_name(query.kind, "query kind")
    for order in query.order:
        if not isinstance(order, Order):
            raise BadValueError(f"an ORDER BY must be an Order, got {order!r}")
        _check_name(order.name, "ORDER BY property")
    for name in query.projection:
        _check_name(name, "projected property")
    if len(set(query.projection)) < len(query.projection):
        raise BadValueError(f"Cannot project a property multiple times: {list(query.projection)}")
    for name in query.distinct_on:
        _check_name(name, "DISTINCT ON property")
    for what, cursor in (("start", query.start_cursor), ("end", query.end_cursor)):
        if cursor is not None and not isinstance(cursor, bytes):
            raise BadValueError(f"a query's {what} cursor is the bytes a query result gave, got {type(cursor).__name__}")
    if query.filter is not None:
        _check_filter(query.filter)
    if query.gql is not None and isinstance(query.gql.text, str):
        check_text(query.gql.text, "GQL text")


def _check_name(name: object, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise BadValueError(f"a {what} must be a non-empty string, got {name!r}")
    check_text(name, what)


#: Composite filters nested deeper than this are refused (GQL's parentheses
#: stop at 64 too): a deeper tree would exhaust Python's stack or SQLite's
#: parser before meaning anything.
MAX_FILTER_DEPTH = 64


def _check_filter(node: object, depth: int = 1) -> None:
    """The filter's shape as Datastore takes it (the Firestore emulator's
    rules: a composite has at least one sub-filter, IN and NOT IN a
    non-empty list, a key filter a complete key, an ancestor a key) and
    its values."""
    if isinstance(node, CompositeFilter):
        if not node.filters:
            raise BadValueError(f"a composite filter must have at least one sub-filter: {node!r}")
        if depth > MAX_FILTER_DEPTH:
            raise BadValueError(f"composite filters are nested more than {MAX_FILTER_DEPTH} deep")
        for inner in node.filters:
            _check_filter(inner, depth + 1)
    elif isinstance(node, PropertyFilter):
        _check_name(node.name, "filtered property")
        if node.op in ("IN", "NOT_IN") and (not isinstance(node.value, (list, tuple)) or not node.value):
            raise BadValueError(f"{node.op} requires an non-empty ArrayValue. ({node.op} on {node.name!r} got {node.value!r})")
        if node.op == "HAS_ANCESTOR" and not isinstance(node.value, Key):
            raise BadValueError(f"HAS_ANCESTOR needs a Key, got {type(node.value).__name__} {node.value!r}")
        if node.name == KEY_PROPERTY:
            for key in node.value if isinstance(node.value, (list, tuple)) else (node.value,):
                if isinstance(key, Key) and key.is_partial:
                    raise BadValueError(f"a filter on __key__ needs a complete key, got {key}")
        _check_filter_value(node.name, node.value)
    else:
        raise BadValueError(f"a query's filter must be a PropertyFilter or CompositeFilter, got {node!r}")


def _check_filter_value(name: str, value: object) -> None:
    if isinstance(value, str):
        size = utf8_size(value, f"filter on {name!r}: string")
        if size > MAX_INDEXED_STRING_BYTES:
            raise BadValueError(
                f"filter on {name!r}: a string of {size} bytes ({value[:20]!r}...) is longer than "
                f"the {MAX_INDEXED_STRING_BYTES} bytes an index holds: no indexed value can equal or bound it"
            )
    elif isinstance(value, bytes) and len(value) > MAX_INDEXED_STRING_BYTES:
        raise BadValueError(
            f"filter on {name!r}: {len(value)} bytes ({value[:20]!r}...) is longer than the "
            f"{MAX_INDEXED_STRING_BYTES} bytes an index holds: no indexed value can equal or bound it"
        )
    elif is_int(value) and not INT64_MIN <= value <= INT64_MAX:
        raise BadValueError(f"filter on {name!r}: {value} is outside the 64-bit integers Datastore stores")
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_filter_value(name, item)
    elif isinstance(value, RawEntity):
        for inner, item in value.properties.items():
            _check_name(inner, f"filter on {name!r}: property name")
            _check_filter_value(name, item)


@attrs.frozen
class QueryResult:
    """One batch of results.

    ``entities`` holds RawEntity objects (with only the projected properties
    for projections; with empty properties for keys-only queries).
    ``end_cursor`` resumes after the last result; ``more_results`` is False
    when the query (or its limit) is exhausted. ``cursors``, when the
    backend gives them (the embedded engine does; None otherwise), holds the
    cursor after each entity, in order: ``cursors[i]`` resumes right after
    ``entities[i]``, as each EntityResult's cursor does on Datastore (a
    client that filters results itself pages by them). A batch is equal to
    another with the same entities and end cursor, whatever its ``cursors``.
    """

    entities: tuple[RawEntity, ...]
    end_cursor: bytes | None
    more_results: bool
    cursors: Sequence[bytes] | None = attrs.field(default=None, eq=False)



# --- aggregations ---------------------------------------------------------------

AGGREGATION_KINDS: tuple[str, ...] = ("COUNT", "COUNT_UP_TO", "SUM", "AVG")

#: Datastore runs one to five aggregations per query.
MAX_AGGREGATIONS = 5


@attrs.frozen
class Aggregation:
    """One aggregation: ``COUNT(*)``, ``COUNT_UP_TO(up_to)``, ``SUM(property)``
    or ``AVG(property)``, named ``alias`` in the result.

    ``alias`` None takes Datastore's default name, ``property_1``,
    ``property_2``... counted over the aggregations without an alias, in
    order (``AggregationQuery.aliases``). The rules on the other fields are
    checked by ``BaseGateway.run_aggregation``, once for every backend.
    """

    kind: str = attrs.field(validator=attrs.validators.in_(AGGREGATION_KINDS))
    property: str | None = None
    up_to: int | None = None
    alias: str | None = None

    @classmethod
    def count(cls, alias: str | None = None) -> "Aggregation":
        return cls("COUNT", alias=alias)

    @classmethod
    def count_up_to(cls, up_to: int, alias: str | None = None) -> "Aggregation":
        return cls("COUNT_UP_TO", up_to=up_to, alias=alias)

    @classmethod
    def sum(cls, name: str, alias: str | None = None) -> "Aggregation":
        return cls("SUM", property=name, alias=alias)

    @classmethod
    def avg(cls, name: str, alias: str | None = None) -> "Aggregation":
        return cls("AVG", property=name, alias=alias)


def _aggregations(aggregations: Iterable[Aggregation]) -> tuple[Aggregation, ...]:
    return tuple(aggregations)


@attrs.frozen
class AggregationQuery:
    """Aggregations over the results of ``query`` (GQL's ``SELECT COUNT(*)
    ...`` and ``AGGREGATE ... OVER (...)``).

    ``gql`` is set when it came from GQL text and nothing was changed since;
    gateways may use it or ignore it.
    """

    query: Query
    aggregations: tuple[Aggregation, ...] = attrs.field(converter=_aggregations)
    gql: GqlSource | None = attrs.field(default=None, eq=False)

    def aliases(self) -> tuple[str, ...]:
        """The result names in order: each alias, or Datastore's default
        ``property_N`` (N counting the aggregations without an alias)."""
        out = []
        unnamed = 0
        for aggregation in self.aggregations:
            if aggregation.alias:
                out.append(aggregation.alias)
            else:
                unnamed += 1
                out.append(f"property_{unnamed}")
        return tuple(out)

    def replace(self, **changes: Any) -> "AggregationQuery":
        """A copy with ``changes``; the GQL source is dropped because the
        text no longer describes the query."""
        changes.setdefault("gql", None)
        return attrs.evolve(self, **changes)


@attrs.frozen(eq=False)
class AggregationResult(Mapping[str, Any]):
    """One value per alias, in the aggregations' order: an ``int`` for
    ``COUNT`` and ``COUNT_UP_TO``; for ``SUM`` an ``int`` when every value
    summed was an integer and the total fits in 64 bits, else a ``float``;
    for ``AVG`` a ``float``, or None when there was nothing to average.
    It compares equal to any mapping with the same items (a ``dict``)."""

    pairs: tuple[tuple[str, Any], ...]

    def __getitem__(self, alias: str) -> Any:
        for name, value in self.pairs:
            if name == alias:
                return value
        raise KeyError(alias)

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self.pairs)

    def __len__(self) -> int:
        return len(self.pairs)
