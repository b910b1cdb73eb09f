"""Aggregation queries: their rules, and how one is computed from the rows
of its query on a backend that has no aggregation of its own.

``BaseGateway.run_aggregation`` checks every ``AggregationQuery`` here
(``check_aggregation``) before any backend sees it; the base's default hook
then computes it with ``aggregate_rows`` through the gateway's own
``run_query``. That is how the embedded engine answers aggregations, so its
answers must be Datastore's. Measured on the Firestore emulator in Datastore
mode (the oracle; ``tests/conformance/test_aggregation.py`` compares the two):

* An aggregation reads index rows, not entities. ``SUM(p)``/``AVG(p)`` add
  ``p`` to the query's sort order (after its own orders and any inequality
  property; several aggregated properties in name order; in the direction
  of the last explicit order, else ascending). So an entity without an
  indexed ``p`` is no row, and a list is one row per element (per
  combination, for several lists), and ``LIMIT``/``OFFSET`` count rows in
  that order. ``COUNT(*)`` counts those rows; alone, it counts the query's
  rows (entities, unless an order, inequality or projection on a list
  property makes one row per element).
* Only numbers count: integers, doubles, and timestamps (the index keeps a
  timestamp as integer microseconds since the epoch, and the emulator sums
  that). Booleans, strings, blobs, keys, geopoints, embedded entities and
  null are rows that add nothing.
* ``SUM``: integers are summed exactly; the result is an integer if every
  value was one and the total fits in 64 bits, else a double. ``AVG`` is
  always a double (the total over the values counted), or null when no
  value counted. NaN anywhere gives NaN, ``inf`` and ``-inf`` together NaN.
* ``COUNT_UP_TO(n)`` is ``min(COUNT(*), n)``.
* An aggregated property that also has an ``=`` filter takes the filter's
  value (Datastore cannot project it); with ``IN``, the first listed value
  the entity holds.
* A query with a cursor is aggregated in its own order (a cursor is a
  position in it): each of its rows adds every indexed value it holds.

Datastore bills one entity read per started 1,000 index rows, at least one;
``billed_reads`` says how many.
"""

from __future__ import annotations

import datetime as _dt
import itertools
import math
from typing import Any, Callable, Iterable, Sequence

import attrs

from gds_counter._checks import INT64_MAX, INT64_MIN, check_int, is_int, utf8_size
from gds_counter.errors import BadValueError
from gds_counter.gateway.keys import RESERVED_NAME, Key
from gds_counter.gateway.query import (
    KEY_PROPERTY,
    MAX_AGGREGATIONS,
    Aggregation,
    AggregationQuery,
    CompositeFilter,
    Filter,
    Order,
    PropertyFilter,
    Query,
)
from gds_counter.gateway.values import EPOCH, MAX_PROPERTY_NAME_BYTES, RawEntity

__all__ = ["Totals", "aggregate_rows", "billed_reads", "check_aggregation", "row_query"]

#: Index rows Datastore bills as one entity read.
ROWS_PER_READ = 1000

_RANGES = ("<", "<=", ">", ">=", "!=", "NOT_IN")


# --- the rules, checked once for every backend ------------------------------------


def _check_name(name: Any, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise BadValueError(f"{what} must be a non-empty string, got {name!r}")
    if RESERVED_NAME.match(name):
        raise BadValueError(f"{what} {name!r} is reserved (names of the form __x__ belong to Datastore)")
    if utf8_size(name, what) > MAX_PROPERTY_NAME_BYTES:
        raise BadValueError(f"{what} {name[:40]!r}... is over {MAX_PROPERTY_NAME_BYTES} bytes")


def check_aggregation(aggregation: Any) -> AggregationQuery:
    """Datastore's rules for an aggregation query, each error naming the
    value: one to five aggregations, ``COUNT_UP_TO`` a 64-bit count from 0,
    ``SUM``/``AVG`` of a property other than ``__key__`` that the query
    (not keys only) projects if it is a projection, aliases unique
    (defaults included) and not ``__x__``, the query's limit and offset."""
    if not isinstance(aggregation, AggregationQuery):
        raise BadValueError(f"run_aggregation needs an AggregationQuery, got {type(aggregation).__name__} {aggregation!r}")
    query = aggregation.query
    if not isinstance(query, Query):
        raise BadValueError(f"an aggregation runs over a Query, got {type(query).__name__} {query!r}")
    if query.limit is not None:
        check_int(query.limit, "query limit", low=0)
    check_int(query.offset, "query offset", low=0)
    count = len(aggregation.aggregations)
    if not 1 <= count <= MAX_AGGREGATIONS:
        raise BadValueError(f"an aggregation query has 1 to {MAX_AGGREGATIONS} aggregations, got {count}")
    for item in aggregation.aggregations:
        if not isinstance(item, Aggregation):
            raise BadValueError(f"aggregations are Aggregation values, got {type(item).__name__} {item!r}")
        if item.kind in ("COUNT", "COUNT_UP_TO"):
            if item.property is not None:
                raise BadValueError(f"{item.kind} counts whole rows; it takes no property (got {item.property!r})")
            if item.kind == "COUNT_UP_TO":
                check_int(item.up_to, "COUNT_UP_TO limit", low=0)
            elif item.up_to is not None:
                raise BadValueError(f"COUNT takes no limit (got {item.up_to!r}); use COUNT_UP_TO")
        else:
            if item.up_to is not None:
                raise BadValueError(f"{item.kind} takes no up_to (got {item.up_to!r})")
            if item.property == KEY_PROPERTY:
                raise BadValueError(f"{item.kind} cannot aggregate __key__")
            _check_name(item.property, f"{item.kind} property")
            # As the Firestore emulator refuses them:
            if query.keys_only or query.projection == (KEY_PROPERTY,):
                raise BadValueError(f"{item.kind}({item.property}) cannot run over a keys-only query: it has no values")
            if query.projection and item.property not in query.projection:
                raise BadValueError(
                    f"{item.kind}({item.property}): {item.property!r} is not in the projection of the query it runs over"
                )
        if item.alias is not None and item.alias != "":
            _check_name(item.alias, "aggregation alias")
    aliases = aggregation.aliases()
    for alias in aliases:
        if aliases.count(alias) > 1:
            raise BadValueError(
                f"aggregation alias {alias!r} is used twice (aggregations without an alias are named property_1, property_2, ...)"
            )
    return aggregation


def billed_reads(rows: int) -> int:
    """What Datastore bills for an aggregation over ``rows`` index rows."""
    return max(1, -(-rows // ROWS_PER_READ))


# --- the arithmetic ----------------------------------------------------------------


def _micros(moment: _dt.datetime) -> int:
    delta = moment - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _float_total(doubles: list[float], integers: int) -> float:
    if any(math.isnan(v) for v in doubles):
        return math.nan
    up, down = math.inf in doubles, -math.inf in doubles
    if up or down:
        return math.nan if up and down else math.inf if up else -math.inf
    try:
        total = math.fsum([*doubles, float(integers)])
    except OverflowError:  # a finite total that overflows on the way: IEEE-754 says inf
        total = float(integers)
        for value in doubles:
            total += value
    return total + 0.0  # never -0.0: Datastore starts its sums at 0


@attrs.define
class Totals:
    """The numbers one aggregated property has seen."""

    integers: int = 0
    doubles: list[float] = attrs.Factory(list)
    counted: int = 0

    def add(self, value: Any) -> None:
        if is_int(value):
            self.integers += value
        elif isinstance(value, float):
            self.doubles.append(value)
        elif isinstance(value, _dt.datetime):
            self.integers += _micros(value)
        else:
            return  # not a number: a row that adds nothing
        self.counted += 1

    def sum(self) -> int | float:
        if not self.doubles:
            return self.integers if INT64_MIN <= self.integers <= INT64_MAX else float(self.integers)
        return _float_total(self.doubles, self.integers)

    def avg(self) -> float | None:
        return None if not self.counted else float(self.sum()) / self.counted


# --- rows ----------------------------------------------------------------------------


def _conjuncts(flt: Filter | None) -> list[PropertyFilter]:
    if isinstance(flt, PropertyFilter):
        return [flt]
    if isinstance(flt, CompositeFilter) and flt.op == "AND":
        return [f for f in flt.filters if isinstance(f, PropertyFilter)]
    return []


def _aggregated(aggregation: AggregationQuery) -> list[str]:
    return sorted({a.property for a in aggregation.aggregations if a.property is not None})


def _fixed(aggregation: AggregationQuery) -> dict[str, PropertyFilter]:
    """Aggregated properties an ``=`` or ``IN`` filter fixes (the first one each)."""
    names = set(_aggregated(aggregation))
    fixed: dict[str, PropertyFilter] = {}
    for f in _conjuncts(aggregation.query.filter):
        if f.op in ("=", "IN") and f.name in names:
            fixed.setdefault(f.name, f)
    return fixed


def row_query(aggregation: AggregationQuery) -> Query:
    """The query whose results are the aggregation's rows.

    Without a cursor: a projection of every property that makes rows (its
    orders, its inequalities, its projection, the aggregated properties),
    sorted as Datastore sorts an aggregation (see the module docstring), so a
    list gives one row per element; keys only when nothing does. With a
    cursor: the query itself (a cursor is a position in its own order), as
    whole entities when values are needed. Only ``COUNT_UP_TO``: no more
    rows than the largest count asked for.
    """
    query = aggregation.query
    aggregated = _aggregated(aggregation)
    if query.start_cursor is not None or query.end_cursor is not None:
        rows = query.replace(keys_only=not aggregated and not query.projection)
    else:
        filters = _conjuncts(query.filter)
        equal = {f.name for f in filters if f.op in ("=", "IN")}
        direction = query.order[-1].descending if query.order else False
        orders = list(query.order)
        for name in [f.name for f in filters if f.op in _RANGES] + aggregated:
            if name != KEY_PROPERTY and name not in equal and all(o.name != name for o in orders):
                orders.append(Order(name, direction))
        projected = [o.name for o in orders] + list(query.projection)
        projection = tuple(dict.fromkeys(n for n in projected if n != KEY_PROPERTY and n not in equal))
        if projection:
            rows = query.replace(projection=projection, keys_only=False, order=tuple(orders))
        else:
            rows = query.replace(keys_only=True, projection=(), order=tuple(orders))
    if all(a.kind == "COUNT_UP_TO" for a in aggregation.aggregations):
        most = max(a.up_to or 0 for a in aggregation.aggregations)
        rows = rows.replace(limit=most if rows.limit is None else min(rows.limit, most))
    return rows


def indexed_values(entity: RawEntity, name: str) -> list[Any]:
    """The values an index on ``name`` holds for ``entity``: one per list
    element, none when unindexed, ``a.b`` inside an indexed embedded entity."""
    found: list[Any] = [entity]
    for segment in name.split("."):
        inner: list[Any] = []
        for holder in found:
            if isinstance(holder, RawEntity) and segment in holder.properties and segment not in holder.unindexed:
                value = holder.properties[segment]
                inner.extend(value if isinstance(value, list) else [value])
        found = inner
    return [v for v in found if not isinstance(v, RawEntity)]


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def aggregate_rows(
    aggregation: AggregationQuery,
    batches: Callable[[Query], Iterable[Sequence[RawEntity]]],
    lookup: Callable[[list[Key]], list[RawEntity | None]],
) -> tuple[tuple[tuple[str, Any], ...], int]:
    """The aggregation's values by alias, and the index rows read, from the
    rows ``batches(row_query(aggregation))`` yields; ``lookup`` reads the
    entities whose ``IN``-fixed value a projection cannot give."""
    names = _aggregated(aggregation)
    fixed = _fixed(aggregation)
    query = row_query(aggregation)
    from_entities = query.start_cursor is not None or query.end_cursor is not None
    totals = {name: Totals() for name in names}
    count = 0
    for batch in batches(query):
        choices = _choices(batch, fixed, lookup) if not from_entities else {}
        for row in batch:
            values = []
            for name in names:
                if name in fixed and not from_entities:
                    f = fixed[name]
                    values.append([f.value] if f.op == "=" else choices.get((row.key, name), []) if row.key is not None else [])
                elif from_entities and not query.projection:
                    values.append(indexed_values(row, name))
                else:
                    values.append([row.properties[name]] if name in row.properties else [])
            for combination in itertools.product(*values):
                count += 1
                for name, value in zip(names, combination):
                    totals[name].add(value)
    out: list[tuple[str, Any]] = []
    for alias, item in zip(aggregation.aliases(), aggregation.aggregations):
        if item.kind == "COUNT":
            out.append((alias, count))
        elif item.kind == "COUNT_UP_TO":
            out.append((alias, min(count, item.up_to or 0)))
        elif item.kind == "SUM":
            out.append((alias, totals[item.property or ""].sum()))
        else:
            out.append((alias, totals[item.property or ""].avg()))
    return tuple(out), count


def _choices(
    batch: Sequence[RawEntity],
    fixed: dict[str, PropertyFilter],
    lookup: Callable[[list[Key]], list[RawEntity | None]],
) -> dict[tuple[Key, str], list[Any]]:
    """For each row and ``IN``-fixed property, the first listed value the
    stored entity holds (a projection may not name that property)."""
    among = {name: f for name, f in fixed.items() if f.op == "IN"}
    keys = [row.key for row in batch if row.key is not None]
    if not among or not keys:
        return {}
    out: dict[tuple[Key, str], list[Any]] = {}
    for key, entity in zip(keys, lookup(keys)):
        for name, f in among.items():
            held = indexed_values(entity, name) if entity is not None else []
            out[(key, name)] = [v for v in f.value if any(_same(v, h) for h in held)][:1]
    return out
