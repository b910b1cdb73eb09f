"""``Query`` and ``AggregationQuery`` back to GQL text, for ``gql.to_gql``.

Why every value becomes a binding: no value is ever pasted into the text,
so there is no quoting to get wrong and nothing to inject, and the text
round-trips through ``gql.parse`` with the same values (a ``Key`` stays a
``Key``, a ``bytes`` stays ``bytes``). Names are always backtick-quoted
(except ``__key__``), so a property called ``from`` or ``order`` needs no
special case. An aggregation always prints as ``AGGREGATE ... OVER (...)``,
the one form that can carry ORDER BY, LIMIT and OFFSET; ``COUNT_UP_TO``'s
count is the one number written out, because Datastore takes no binding there.
"""

from __future__ import annotations

from typing import Any

from gds_counter._checks import is_int
from gds_counter.errors import BadValueError, GQLError
from gds_counter.gateway import check_aggregation
from gds_counter.gateway.query import KEY_PROPERTY, Aggregation, AggregationQuery, Cursor, Filter, PropertyFilter, Query

__all__ = ["Printer"]

_PRINTED_OPS = {"NOT_IN": "NOT IN", "HAS_ANCESTOR": "HAS ANCESTOR"}


def _quote(name: Any) -> str:
    """Backtick-quote a name, so reserved words and odd characters print safely."""
    if not isinstance(name, str) or not name:
        raise GQLError(f"cannot print {name!r} as a GQL name (names are non-empty strings)")
    if name == KEY_PROPERTY:
        return name
    return "`" + name.replace("\\", "\\\\").replace("\n", "\\n").replace("`", "``") + "`"  # GQL takes no raw line break


class Printer:
    """Builds GQL text in which every value is a named binding, so no value
    is ever pasted into the text (no quoting bugs, no injection)."""

    def __init__(self) -> None:
        self.bindings: dict[str, Any] = {}

    def bind(self, value: Any, name: str | None = None) -> str:
        name = name or f"v{len(self.bindings) + 1}"
        while name in self.bindings:
            name = f"{name}_"
        self.bindings[name] = value
        return f"@{name}"

    def query(self, query: Query) -> str:
        words = ["SELECT", self.select(query)]
        if query.kind is not None:
            words += ["FROM", _quote(query.kind)]
        if query.filter is not None:
            words += ["WHERE", self.filter(query.filter, nested=False)]
        if query.order:
            orders = ", ".join(f"{_quote(o.name)} {'DESC' if o.descending else 'ASC'}" for o in query.order)
            words += ["ORDER BY", orders]
        words += self.paging(query)
        return " ".join(words)

    def aggregation(self, aggregation: AggregationQuery) -> str:
        try:
            check_aggregation(aggregation)
        except BadValueError as exc:
            raise GQLError(f"cannot print this aggregation: {exc}") from None
        items = ", ".join(self.aggregate(item) for item in aggregation.aggregations)
        return f"AGGREGATE {items} OVER ({self.query(aggregation.query)})"

    @staticmethod
    def aggregate(item: Aggregation) -> str:
        if item.kind == "COUNT":
            text = "COUNT(*)"
        elif item.kind == "COUNT_UP_TO":
            text = f"COUNT_UP_TO({item.up_to})"
        else:
            text = f"{item.kind}({_quote(item.property)})"
        return f"{text} AS {_quote(item.alias)}" if item.alias else text

    def select(self, query: Query) -> str:
        projection = ", ".join(_quote(name) for name in query.projection)
        distinct_on = ", ".join(_quote(name) for name in query.distinct_on)
        if query.keys_only:
            if query.projection:
                raise GQLError("a query cannot be keys_only and have a projection too")
            projection = KEY_PROPERTY
        if query.distinct_on and query.distinct_on == query.projection:
            return f"DISTINCT {projection}"
        prefix = f"DISTINCT ON ({distinct_on}) " if query.distinct_on else ""
        return prefix + (projection or "*")

    def filter(self, node: Filter, *, nested: bool) -> str:
        if isinstance(node, PropertyFilter):
            value = list(node.value) if node.op in ("IN", "NOT_IN") else node.value
            return f"{_quote(node.name)} {_PRINTED_OPS.get(node.op, node.op)} {self.bind(value)}"
        if not node.filters:
            raise GQLError(f"cannot print an empty {node.op} filter")
        inner = f" {node.op} ".join(self.filter(child, nested=True) for child in node.filters)
        return f"({inner})" if nested and len(node.filters) > 1 else inner

    def paging(self, query: Query) -> list[str]:
        for field in ("limit", "offset"):
            value = getattr(query, field)
            if value is not None and (not is_int(value) or value < 0):
                raise GQLError(f"cannot print {field}={value!r}: it must be a non-negative integer")
        words = []
        if query.limit is not None and query.end_cursor is not None:
            limit, end = self.bind(query.limit, "limit"), self.bind(Cursor(query.end_cursor), "end_cursor")
            words += ["LIMIT", f"FIRST({limit}, {end})"]
        elif query.limit is not None:
            words += ["LIMIT", self.bind(query.limit, "limit")]
        elif query.end_cursor is not None:
            words += ["LIMIT", self.bind(Cursor(query.end_cursor), "end_cursor")]
        if query.start_cursor is not None:
            words += ["OFFSET", self.bind(Cursor(query.start_cursor), "start_cursor")]
            if query.offset:
                words += ["+", self.bind(query.offset, "offset")]
        elif query.offset:
            words += ["OFFSET", self.bind(query.offset, "offset")]
        return words
