"""Aggregation queries: their rules, and how one is computed from the rows
of its query on a backend that has no aggregation of its own.

``BaseGateway.run_aggregation`` checks every ``AggregationQuery`` here
(``check_aggregation``) before any backend sees it; the base's default hook
then computes it with ``aggregate_rows`` through the gateway's own
``run_query``. That is how the embedded engine answers aggregations, so its
answers must be Datastore's. Measured on the Firestore emulator in Datastore
mode (the oracle; ``tests/conformance/test_aggregation.py`` compares the two):

* An aggregation reads index rows, not entities. ``SUM(p)``/``AVG(p)`` add
  ``p`` to what the query projects, so the rows come in the order the query
  would give that projection: its own orders, then DISTINCT ON, its
  inequalities, ``__key__`` after a key inequality, then the projected
  properties by name, in the direction of the last explicit order. So an
  entity without an indexed ``p`` is no row, and a list is one row per
  element (per combination, for several lists), and ``LIMIT``/``OFFSET``
  and cursors (points in that order) count rows in it. A kindless query is
  aggregated the same way. ``COUNT(*)`` counts those rows; alone, it counts
  the query's rows (entities, unless an order, inequality or projection on
  a list property makes one row per element).
* Only numbers count: integers, doubles, and timestamps (the index keeps a
  timestamp as integer microseconds since the epoch, and the emulator sums
  that). Booleans, strings, blobs, keys, geopoints, embedded entities and
  null are rows that add nothing.
* ``SUM``: integers are summed exactly; the result is an integer if every
  value was one and the total fits in 64 bits, else a double. ``AVG`` is
  always a double (the total over the values counted), or null when no
  value counted. NaN anywhere gives NaN, ``inf`` and ``-inf`` together NaN.
* ``COUNT_UP_TO(n)`` is ``min(COUNT(*), n)``.
* An aggregated property that also has an AND-ed ``=`` filter takes the
  filter's value (Datastore cannot project it); with ``IN``, the first
  listed value the entity holds. One with an equality only in an OR branch
  is read from its index rows like any other property
  (``Query.aggregated_rows``).

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
    Order,
    PropertyFilter,
    Query,
    conjuncts_of,
    leaves_of,
)
from gds_counter.gateway.values import MAX_PROPERTY_NAME_BYTES, RawEntity, epoch_micros, index_values

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
                raise BadValueError(f"Aggregations are not supported for the property: __key__ ({item.kind})")
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
                f"Aggregation aliases contain duplicate alias: {alias}. (Aggregations without an alias are named "
                "property_1, property_2, ...)"
            )
    return aggregation


def billed_reads(rows: int) -> int:
    """What Datastore bills for an aggregation over ``rows`` index rows."""
    return max(1, -(-rows // ROWS_PER_READ))


# --- the arithmetic ----------------------------------------------------------------


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
            self.integers += epoch_micros(value)
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


def _aggregated(aggregation: AggregationQuery) -> list[str]:
    return sorted({a.property for a in aggregation.aggregations if a.property is not None})


def _fixed(aggregation: AggregationQuery) -> dict[str, PropertyFilter]:
    """Aggregated properties that an AND-ed equality makes unprojectable,
    each with the ``=`` or ``IN`` conjunct that fixes its value (the first
    one)."""
    names = set(_aggregated(aggregation))
    fixed: dict[str, PropertyFilter] = {}
    for f in conjuncts_of(aggregation.query.filter):
        if f.op in ("=", "IN") and f.name in names:
            fixed.setdefault(f.name, f)
    return fixed


def row_query(aggregation: AggregationQuery) -> Query:
    """The query whose results are the aggregation's rows: the query itself,
    projecting what makes rows (its orders, its inequalities, and when it
    is not a projection already, its DISTINCT ON and the aggregated
    properties), so a list gives one row per element, as the Firestore
    emulator counts them, projection or not; keys only when nothing does.

    No sort order is added here: the engine's scan implies the orders as
    for any projection (DISTINCT ON, the inequalities, ``__key__`` for a key
    inequality, then the projected properties by name, in the direction of
    the last explicit order), which is the order the Firestore emulator
    aggregates in, LIMIT, OFFSET and cursors included (a cursor is a point
    in that order). A property an AND-ed equality fixes is not projected
    (Datastore cannot project it); ``_fixed`` supplies its value. One that
    an equality names only in an OR branch is projected all the same: its
    index rows are the aggregation's (``Query.aggregated_rows``). Only
    ``COUNT_UP_TO``: no more rows than the largest count asked for.
    """
    query = aggregation.query
    leaves = list(leaves_of(query.filter)) if query.filter is not None else []
    equal = {f.name for f in conjuncts_of(query.filter) if f.op in ("=", "IN")}
    made = [o.name for o in query.order] + [f.name for f in leaves if f.op in _RANGES]
    shown = () if query.keys_only else query.projection
    if not shown and not query.keys_only:
        made += [*query.distinct_on, *_aggregated(aggregation)]
    extra = tuple(dict.fromkeys(n for n in made if n != KEY_PROPERTY and n not in equal and n not in shown))
    in_branches = bool(set(extra) & {f.name for f in leaves if f.op in ("=", "IN")})
    if extra:
        rows = query.replace(projection=(*shown, *extra), keys_only=False, aggregated_rows=in_branches)
    elif shown or query.keys_only:
        rows = query
    else:
        rows = query.replace(keys_only=True)
    fixed = list(_fixed(aggregation))
    if fixed:
        # A summed property an AND-ed equality fixes cannot be projected,
        # but its index rows are still what is read: ordered by it, after
        # DISTINCT ON and the inequalities, as the emulator reads them
        # (an IN's values in order; a cursor compared with it first).
        ranges = [f.name for f in conjuncts_of(query.filter) if f.op in _RANGES and f.name != KEY_PROPERTY]
        named = {o.name for o in query.order}
        descending = query.order[-1].descending if query.order else False
        added = [n for n in dict.fromkeys([*query.distinct_on, *ranges, *fixed]) if n not in named]
        rows = rows.replace(order=(*query.order, *(Order(n, descending) for n in added)))
    if all(a.kind == "COUNT_UP_TO" for a in aggregation.aggregations):
        most = max(a.up_to or 0 for a in aggregation.aggregations)
        rows = rows.replace(limit=most if rows.limit is None else min(rows.limit, most))
    return rows


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


def aggregate_rows(
    aggregation: AggregationQuery,
    batches: Callable[[Query], Iterable[Sequence[RawEntity]]],
    lookup: Callable[[list[Key]], list[RawEntity | None]],
) -> tuple[tuple[tuple[str, Any], ...], int]:
    """The aggregation's values by alias, and the index rows read, from the
    rows ``batches(row_query(aggregation))`` yields; ``lookup`` reads the
    entities whose value a projection cannot give (``_choices``)."""
    names = _aggregated(aggregation)
    fixed = _fixed(aggregation)
    query = row_query(aggregation)
    totals = {name: Totals() for name in names}
    count = 0
    for batch in batches(query):
        choices = _choices(batch, fixed, lookup)
        for row in batch:
            values = []
            for name in names:
                if name not in fixed:
                    values.append([row.properties[name]] if name in row.properties else [])
                elif fixed[name].op == "=":
                    values.append([fixed[name].value])
                else:
                    values.append(choices.get((row.key, name), []) if row.key is not None else [])
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
    """For each row and ``IN``-fixed property (which a projection cannot
    give): the first listed value the stored entity holds."""
    among = {name: f for name, f in fixed.items() if f.op == "IN"}
    keys = [row.key for row in batch if row.key is not None]
    if not among or not keys:
        return {}
    out: dict[tuple[Key, str], list[Any]] = {}
    for key, entity in zip(keys, lookup(keys)):
        for name, f in among.items():
            held = [v for n, v in index_values(entity) if n == name] if entity is not None else []
            out[(key, name)] = [v for v in f.value if any(_same(v, h) for h in held)][:1]
    return out
