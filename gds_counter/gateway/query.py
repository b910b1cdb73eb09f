"""Queries as data: what GQL parses into and what every gateway executes."""

from __future__ import annotations

from typing import Any, Iterable, Literal, Union

import attrs

from gds_counter.gateway.keys import namespace_name
from gds_counter.gateway.values import RawEntity

__all__ = [
    "KEY_PROPERTY",
    "OPERATORS",
    "CompositeFilter",
    "Cursor",
    "Filter",
    "GqlSource",
    "Operator",
    "Order",
    "PropertyFilter",
    "Query",
    "QueryResult",
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
    """

    kind: str | None = None
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

    def replace(self, **changes: Any) -> "Query":
        """A copy with ``changes``; the GQL source is dropped because the
        text no longer describes the query."""
        changes.setdefault("gql", None)
        return attrs.evolve(self, **changes)


@attrs.frozen
class QueryResult:
    """One batch of results.

    ``entities`` holds RawEntity objects (with only the projected properties
    for projections; with empty properties for keys-only queries).
    ``end_cursor`` resumes after the last result; ``more_results`` is False
    when the query (or its limit) is exhausted.
    """

    entities: tuple[RawEntity, ...]
    end_cursor: bytes | None
    more_results: bool

