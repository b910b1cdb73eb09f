"""How the embedded engine answers a query, as the index scan Datastore
would run for it: which keys SQL reads as candidates, which of them match,
and in which order they come back (``Scan``: the index's sort orders and
the rows an entity gives).

A query never scans its kind when a filter or sort order can use the index
table (``props``: one row per indexed value, one per list element), as
Datastore reads its indexes: SQL yields a superset of the matching keys, then
each candidate is checked in Python with Datastore's semantics. So filters and
sort orders only ever see indexed values, inequality filters span types
(``v < "b"`` also matches integers), and inequalities on one property must be
met by one list element.

Everything compares the byte encodings of ``_encoding``; a result row's
position in sort order is also its cursor.
"""

from __future__ import annotations

import datetime as _dt
import functools
import itertools
from collections import defaultdict
from typing import Any, Callable, Iterable, Iterator

import attrs

from gds_counter.errors import BadValueError
from gds_counter.gateway.embedded._encoding import (
    descendant_range,
    descending,
    escaped,
    index_entries,
    key_bytes,
    sortable,
)
from gds_counter.gateway.embedded._refusals import (
    check_filter,
    check_shape,
    composites,
    disjunctions,
)
from gds_counter.gateway.keys import Key
from gds_counter.gateway.query import (
    KEY_PROPERTY,
    CompositeFilter,
    Filter,
    Order,
    PropertyFilter,
    Query,
    conjuncts_of,
    leaves_of,
)
from gds_counter.gateway.values import EPOCH, RawEntity

_ONE_MICRO = _dt.timedelta(microseconds=1)

RANGE_OPS = {"<": bytes.__lt__, "<=": bytes.__le__, ">": bytes.__gt__, ">=": bytes.__ge__}
_SQL_OPS = {"=": "=", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "!=": "<>"}


@attrs.define
class Doc:
    """One candidate entity while a query evaluates it, with its index values
    computed once."""

    key_enc: bytes
    version: int
    entity: RawEntity
    _index: dict[str, list[tuple[bytes, Any]]] | None = None

    def values(self, name: str) -> list[tuple[bytes, Any]]:
        if self._index is None:
            self._index = defaultdict(list)
            for entry_name, enc, value in index_entries(self.entity):
                self._index[entry_name].append((enc, value))
        return self._index.get(name, [])

    def encodings(self, name: str) -> list[bytes]:
        if name == KEY_PROPERTY:
            return [self.key_enc]
        return [enc for enc, _ in self.values(name)]


@attrs.frozen
class Row:
    """One query result in sort order: its position (also its cursor) and
    the entity it returns."""

    position: tuple[bytes, ...]
    doc: Doc
    entity: RawEntity


# --- filters ----------------------------------------------------------------


#: The filters that are one index range on their property.
_INEQUALITY_OPS = (*RANGE_OPS, "!=", "NOT_IN")


def _filter_target(f: PropertyFilter) -> Any:
    """The filter's value, encoded (a frozenset for IN and NOT_IN)."""
    if f.op == "HAS_ANCESTOR":
        if f.name != KEY_PROPERTY or not isinstance(f.value, Key):
            raise BadValueError(f"HAS_ANCESTOR needs __key__ and a Key, got {f.name!r} {f.value!r}")
        return descendant_range(f.value)
    if f.name == KEY_PROPERTY:
        values = f.value if f.op in ("IN", "NOT_IN") else (f.value,)
        for value in values:
            if not isinstance(value, Key):
                raise BadValueError(f"filter on __key__ needs Key values, got {value!r}")
    encode = key_bytes if f.name == KEY_PROPERTY else sortable  # __key__ compares bare key encodings
    if f.op in ("IN", "NOT_IN"):
        if not isinstance(f.value, (tuple, list, set, frozenset)):
            raise BadValueError(f"{f.op} on {f.name!r} needs a tuple of values, got {f.value!r}")
        return frozenset(encode(v) for v in f.value)
    return encode(f.value)


def _value_test(op: str, target: Any) -> Callable[[bytes], bool]:
    if op == "=":
        return target.__eq__
    if op == "!=":
        return target.__ne__
    if op == "IN":
        return target.__contains__
    if op == "NOT_IN":
        return lambda enc: enc not in target
    if op == "HAS_ANCESTOR":
        low, high = target
        return lambda enc: low <= enc < high
    compare = RANGE_OPS[op]
    return lambda enc: compare(enc, target)


def compile_filter(f: Filter) -> Callable[[Doc], bool]:
    """``f`` as a predicate (``_compile``), where an equality (``=``, an
    ``IN`` value) whose value fails an inequality on the same property in
    the same disjunction matches nothing: that disjunction is one index
    range, and the value lies outside it. So ``l < 'x' AND l = 1.5`` finds
    nothing (a double sorts after every string), though a list ``['a',
    1.5]`` has a value meeting each filter; ``l > 5 AND l IN (1.5, 11)`` is
    ``l > 5 AND l = 11``. Measured on the Firestore emulator, ``!=`` and
    ``NOT IN`` included (tests/conformance/test_differential.py)."""
    groups = disjunctions(f) if _equality_meets_inequality(f) else None
    if groups is None:
        return _compile(f)
    tests = [_compile(CompositeFilter("AND", kept)) for kept in map(_possible, groups) if kept is not None]
    return lambda doc: any(test(doc) for test in tests)


def _equality_meets_inequality(f: Filter) -> bool:
    leaves = list(leaves_of(f))
    equal = {leaf.name for leaf in leaves if leaf.op in ("=", "IN")}
    return any(leaf.name in equal for leaf in leaves if leaf.op in _INEQUALITY_OPS)


def _possible(leaves: list[PropertyFilter]) -> list[PropertyFilter] | None:
    """One disjunction with each equality's values cut to those its
    property's inequalities admit; None when an equality keeps none."""
    tests: dict[str, list[Callable[[bytes], bool]]] = defaultdict(list)
    for leaf in leaves:
        if leaf.op in _INEQUALITY_OPS:
            tests[leaf.name].append(_value_test(leaf.op, _filter_target(leaf)))
    out = []
    for leaf in leaves:
        if leaf.op in ("=", "IN") and leaf.name in tests:
            encode = key_bytes if leaf.name == KEY_PROPERTY else sortable
            values = leaf.value if leaf.op == "IN" else (leaf.value,)
            admitted = tuple(v for v in values if all(test(encode(v)) for test in tests[leaf.name]))
            if not admitted:
                return None
            leaf = PropertyFilter(leaf.name, "IN", admitted) if leaf.op == "IN" else leaf
        out.append(leaf)
    return out


def _compile(f: Filter) -> Callable[[Doc], bool]:
    """A predicate with Datastore's semantics: a filter matches an entity if
    some indexed value matches; inequalities on one property inside an AND
    must all be met by the same value (they are one index range scan)."""
    if isinstance(f, PropertyFilter):
        test = _value_test(f.op, _filter_target(f))
        name = f.name
        return lambda doc: any(test(enc) for enc in doc.encodings(name))
    children = []
    ranges: dict[str, list[Callable[[bytes], bool]]] = defaultdict(list)
    for child in f.filters:
        if f.op == "AND" and isinstance(child, PropertyFilter) and child.op in RANGE_OPS:
            ranges[child.name].append(_value_test(child.op, _filter_target(child)))
        else:
            children.append(_compile(child))
    for name, tests in ranges.items():
        children.append(
            functools.partial(
                lambda doc, name, tests: any(all(t(enc) for t in tests) for enc in doc.encodings(name)),
                name=name,
                tests=tests,
            )
        )
    combine = any if f.op == "OR" else all
    return lambda doc: combine(child(doc) for child in children)


#: One disjunction of a filter with an OR: whether an entity matches it, and
#: the inequality tests its rows' list elements must pass, by property.
Branch = tuple[Callable[[Doc], bool], dict[str, list[Callable[[bytes], bool]]]]


def _branches(f: Filter | None) -> tuple[Branch, ...] | None:
    """For a filter with an OR and an inequality on a property: its
    disjunctions, each with its own element ranges. Datastore runs such a
    query as one index scan per disjunction and merges them, so an entity's
    rows on a sorted or projected list property are the elements that pass
    the ranges of a disjunction it matches (all of them, for a disjunction
    without an inequality on that property). None: ``_top_level_ranges``
    says it all (no OR, no such inequality, or too many disjunctions)."""
    if f is None or not any(c.op == "OR" for c in composites(f)) or not _inequality_names(f):
        return None
    groups = disjunctions(f)
    if groups is None:
        return None
    out = []
    for leaves in groups:
        match = compile_filter(leaves[0] if len(leaves) == 1 else CompositeFilter("AND", leaves))
        out.append((match, _top_level_ranges(CompositeFilter("AND", leaves))))
    return tuple(out)


def _top_level_ranges(f: Filter | None) -> dict[str, list[Callable[[bytes], bool]]]:
    """Inequalities that every result row must meet, by property: a row of a
    projection or a sort on that property uses only the list elements in range,
    as Datastore reads them from the index range. != and NOT_IN are index
    ranges too (the values on either side of the excluded ones), so
    ``tags != 'a'`` never projects or sorts by the element 'a'."""
    out: dict[str, list[Callable[[bytes], bool]]] = defaultdict(list)
    for child in conjuncts_of(f):
        if child.op in _INEQUALITY_OPS and child.name != KEY_PROPERTY:
            out[child.name].append(_value_test(child.op, _filter_target(child)))
    return out



def _inequality_names(f: Filter | None) -> set[str]:
    """Properties with an inequality anywhere in the filter (OR branches too):
    Datastore reads them from an index ordered by them, so a query without
    those sort orders still comes back in their order (by name), then key."""
    if isinstance(f, PropertyFilter):
        return {f.name} if f.op in _INEQUALITY_OPS and f.name != KEY_PROPERTY else set()
    if isinstance(f, CompositeFilter):
        return set().union(*(_inequality_names(child) for child in f.filters))
    return set()


def _key_filtered(f: Filter | None, projection: tuple[str, ...]) -> bool:
    """Whether the rows are ordered by ``__key__`` before the projected
    properties: a ``__key__`` inequality anywhere in the filter, or, for a
    projection, a ``__key__ =`` or ``IN`` too (the Firestore emulator reads
    such a projection in key order, and refuses to continue its cursor:
    "index data should not include primary key")."""
    ops = _INEQUALITY_OPS if not projection else (*_INEQUALITY_OPS, "=", "IN")
    return f is not None and any(leaf.name == KEY_PROPERTY and leaf.op in ops for leaf in leaves_of(f))


def projected(value: Any) -> Any:
    """A projected value as Datastore returns it from an index: a timestamp as
    integer microseconds since the epoch, a byte string that is valid UTF-8 as
    text (both share an index encoding with those types); the Store turns
    them back by the schema, the same way on every gateway."""
    if isinstance(value, _dt.datetime):
        return (value - EPOCH) // _ONE_MICRO
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


# --- candidate selection in SQL --------------------------------------------

#: Source ranks: lower is more selective. Rank-0 sources are intersected.
_EXACT, _RANGE, _NEGATED = 0, 1, 2


@attrs.frozen
class _Source:
    sql: str
    params: tuple[Any, ...]
    rank: int


#: Composite filters nested deeper than this narrow nothing through SQL (the
#: Python check still applies them): SQLite's parser overflowed on twenty
#: levels of alternating AND and OR, which Datastore answers.
_MAX_SQL_DEPTH = 6


def _source(f: Filter, ns: str, kind: str | None, depth: int = 0) -> _Source | None:
    """SQL that yields a superset of the matching keys through an index, or
    None when the filter cannot narrow the kind (then the caller scans it)."""
    scope_sql = "ns = ?" + (" AND kind = ?" if kind is not None else "")
    scope = (ns, kind) if kind is not None else (ns,)
    if isinstance(f, PropertyFilter):
        target = _filter_target(f)
        if f.op == "HAS_ANCESTOR":
            return _Source(f"SELECT key_bytes FROM entities WHERE {scope_sql} AND key_bytes >= ? AND key_bytes < ?", (*scope, *target), _EXACT)
        rank = _EXACT if f.op in ("=", "IN") else _NEGATED if f.op in ("!=", "NOT_IN") else _RANGE
        if f.op in ("IN", "NOT_IN"):
            marks = ", ".join("?" * len(target))
            condition, values = f"{'NOT IN' if f.op == 'NOT_IN' else 'IN'} ({marks})", tuple(sorted(target))
        else:
            condition, values = f"{_SQL_OPS[f.op]} ?", (target,)
        if f.name == KEY_PROPERTY:
            return _Source(f"SELECT key_bytes FROM entities WHERE {scope_sql} AND key_bytes {condition}", (*scope, *values), rank)
        return _Source(f"SELECT DISTINCT key_bytes FROM props WHERE {scope_sql} AND name = ? AND value {condition}", (*scope, f.name, *values), rank)
    if depth >= _MAX_SQL_DEPTH:
        return None
    children = [_source(child, ns, kind, depth + 1) for child in f.filters]
    usable = [c for c in children if c is not None]
    if f.op == "OR":
        if not children or len(usable) < len(children):
            return None  # a branch the index cannot narrow makes the whole OR a scan
        return _compound("UNION", usable, max(c.rank for c in usable))
    if not usable:
        return None
    exact = [c for c in usable if c.rank == _EXACT]
    if exact:
        return _compound("INTERSECT", exact, _EXACT)
    return min(usable, key=lambda c: c.rank)


def _compound(op: str, parts: list[_Source], rank: int) -> _Source:
    if len(parts) == 1:
        return parts[0]
    sql = f" {op} ".join(f"SELECT key_bytes FROM ({p.sql})" for p in parts)
    return _Source(sql, tuple(itertools.chain.from_iterable(p.params for p in parts)), rank)


def candidate_sql(query: Query, scan: Scan, start: tuple[bytes, ...] | None) -> tuple[str, tuple[Any, ...]]:
    """SQL for (key_bytes, version, data) of every entity that may match
    ``query``: read through the most selective index, or the kind's (or the
    namespace's) key range when no filter can use one."""
    ns, kind = query.namespace, query.kind
    source = _source(query.filter, ns, kind) if query.filter is not None else None
    if source is None and scan.first_property is not None:
        # Entities lacking the sorted property are not in its index, so the index is the candidate set.
        source = _source(PropertyFilter(scan.first_property, ">=", None), ns, kind)
    columns = "SELECT e.key_bytes, e.version, e.data"
    if source is not None:
        sql = f"{columns} FROM ({source.sql}) AS c CROSS JOIN entities AS e ON e.key_bytes = c.key_bytes WHERE 1"
        params: tuple[Any, ...] = source.params
    else:
        low = escaped(ns.encode())
        sql = f"{columns} FROM entities AS e WHERE e.ns = ? AND e.key_bytes >= ? AND e.key_bytes < ?"
        params = (ns, low, low[:-1] + b"\x02")
        if kind is not None:
            sql += " AND e.kind = ?"
            params += (kind,)
    if scan.streams:
        is_descending = bool(scan.orders) and scan.orders[0].descending
        if start is not None:
            sql += f" AND e.key_bytes {'<' if is_descending else '>'} ?"
            params += (start[-1],)
        sql += f" ORDER BY e.key_bytes {'DESC' if is_descending else 'ASC'}"
    return sql, params


# --- result rows ------------------------------------------------------------


@attrs.frozen
class Scan:
    """The index scan a query amounts to: how it turns a matching entity
    into ordered result rows.

    The sort orders are the query's, then the ones Datastore adds: the
    DISTINCT ON properties, the inequality properties (by name), then the
    projected properties (by name), each in the
    direction of the last order. A row's position is (one component per sort
    order, the key, then the values of the projected and DISTINCT ON
    properties): it sorts the rows, breaks ties by key in the direction of
    the last sort order (as Datastore does), and is the cursor.
    """

    orders: tuple[Order, ...]
    projection: tuple[str, ...]
    keys_only: bool
    distinct_on: tuple[str, ...]
    ranges: dict[str, list[Callable[[bytes], bool]]]
    branches: tuple[Branch, ...] | None = None
    #: For whole entities in ascending key order (a counter's total, a
    #: kind's scan): how many times a row's position repeats its key, the
    #: whole of the position (``key_row``); None for any other scan, whose
    #: rows ``rows`` makes. Worked out once per scan.
    key_width: int | None = attrs.field(
        init=False, eq=False, default=attrs.Factory(lambda self: self._key_width(), takes_self=True)
    )

    @classmethod
    def of(cls, query: Query) -> Scan:
        check_filter(query.filter)
        check_shape(query)
        # keys only is the projection of __key__ alone: other projected names go (as the wire sends it)
        projection = () if query.keys_only else tuple(p for p in query.projection if p != KEY_PROPERTY)
        keys_only = query.keys_only or (bool(query.projection) and not projection)
        equalities = {leaf.name for leaf in leaves_of(query.filter) if leaf.op in ("=", "IN")} if query.filter is not None else set()
        for name in set(projection) & equalities:  # anywhere in the filter, OR branches too (as Datastore refuses)
            if not (query.aggregated_rows and all(c.name != name or c.op not in ("=", "IN") for c in conjuncts_of(query.filter))):
                raise BadValueError(f"cannot project property {name!r} that has an equality filter")
        for name in set(query.distinct_on) & equalities:  # also for DISTINCT ON with *: "Cannot use group by ..."
            raise BadValueError(f"cannot use DISTINCT ON property {name!r} that has an equality filter")
        orders = list(query.order)
        for at, order in enumerate(orders):
            if order.name not in query.distinct_on and not set(query.distinct_on) <= {o.name for o in orders[:at]}:
                raise BadValueError("all DISTINCT ON properties must be ordered before any other sort order")
        descending_last = bool(orders) and orders[-1].descending
        implied = [*query.distinct_on, *sorted(_inequality_names(query.filter))]
        if _key_filtered(query.filter, projection):
            implied.append(KEY_PROPERTY)  # then by key, before the projected properties (as the emulator does)
        implied += sorted(projection)  # Datastore reads the projected properties' index (by name)
        for name in implied:
            if name not in {o.name for o in orders}:
                orders.append(Order(name, descending_last))
        return cls(tuple(orders), projection, keys_only, query.distinct_on, _top_level_ranges(query.filter), _branches(query.filter))

    @property
    def row_properties(self) -> tuple[str, ...]:
        """The properties whose values make a row: the projected ones, then
        DISTINCT ON properties of a whole-entity query."""
        return self.projection + tuple(n for n in self.distinct_on if n not in self.projection)

    @property
    def key_descending(self) -> bool:
        """Ties break by key in the last sort order's direction."""
        return bool(self.orders) and self.orders[-1].descending and self.orders[-1].name != KEY_PROPERTY

    @property
    def width(self) -> int:
        return len(self.orders) + 1 + len(self.row_properties)

    @property
    def streams(self) -> bool:
        """Key order only, one row per entity: SQLite's key order is the answer."""
        return not self.row_properties and all(o.name == KEY_PROPERTY for o in self.orders[:1]) and len(self.orders) <= 1

    def _key_width(self) -> int | None:
        if not self.streams or any(o.descending for o in self.orders):
            return None
        return len(self.orders) + 1

    def key_row(self, doc: Doc) -> Row:
        """``doc``'s one row under a scan with a ``key_width``, made without
        ``rows``' general machinery (a counter's total reads twenty)."""
        assert self.key_width is not None
        return Row((doc.key_enc,) * self.key_width, doc, RawEntity(doc.entity.key) if self.keys_only else doc.entity)

    @property
    def first_property(self) -> str | None:
        names = [o.name for o in self.orders if o.name != KEY_PROPERTY]
        return names[0] if names else None

    def _candidates(self, doc: Doc, name: str) -> list[tuple[bytes, Any]]:
        """The values of ``name`` this entity has rows for, in the index's
        ranges (see ``_top_level_ranges`` and ``_branches``)."""
        if self.branches is None:
            ranges = [self.ranges.get(name, [])]
        else:
            ranges = [tests.get(name, []) for match, tests in self.branches if match(doc)]
        seen: set[bytes] = set()
        out = []
        for enc, v in doc.values(name):  # an index holds a repeated list element once
            if enc not in seen and any(all(t(enc) for t in tests) for tests in ranges):
                seen.add(enc)
                out.append((enc, v))
        return out

    def rows(self, doc: Doc) -> Iterator[Row]:
        """One row per entity, or one per combination of projected values;
        none if the entity lacks an indexed value for a sort or projection."""
        key = doc.entity.key
        names = self.row_properties
        if not names:
            # One row per entity, none of its values in it (a counter's
            # total reads twenty such rows): no combinations to make.
            position = self._position(doc, {})
            if position is not None:
                yield Row(position, doc, RawEntity(key) if self.keys_only else doc.entity)
            return
        choices = [self._candidates(doc, name) for name in names]
        for combo in itertools.product(*choices):
            chosen = dict(zip(names, combo))
            position = self._position(doc, chosen)
            if position is None:
                return  # not in a sort order's index: not a result
            if self.projection:
                entity = RawEntity(key, {name: projected(chosen[name][1]) for name in self.projection})
            elif self.keys_only:
                entity = RawEntity(key)
            else:
                entity = doc.entity
            yield Row(position + tuple(enc for enc, _ in combo), doc, entity)

    def _position(self, doc: Doc, chosen: dict[str, tuple[bytes, Any]]) -> tuple[bytes, ...] | None:
        """Where a row sorts, before its projected values: each sort order's
        value (the row's ``chosen`` one, else the least, or greatest when
        descending, of the entity's indexed values), then the key; None
        when the entity is not in a sort order's index."""
        position = []
        for order in self.orders:
            if order.name == KEY_PROPERTY:
                enc = doc.key_enc
            elif order.name in chosen:
                enc = chosen[order.name][0]
            else:
                values = [e for e, _ in self._candidates(doc, order.name)]
                if not values:
                    return None
                enc = max(values) if order.descending else min(values)
            position.append(descending(enc) if order.descending else enc)
        position.append(descending(doc.key_enc) if self.key_descending else doc.key_enc)
        return tuple(position)

    def first_of_each(self, rows: Iterable[Row]) -> list[Row]:
        seen: set[tuple[bytes, ...]] = set()
        out = []
        offset = len(self.orders) + 1
        names = self.row_properties
        for row in rows:
            group = tuple(row.position[offset + names.index(n)] for n in self.distinct_on)
            if group not in seen:
                seen.add(group)
                out.append(row)
        return out


#: Filter values whose index encoding never changed (floats, geopoints and
#: timestamps may meet rows an older release indexed with another encoding).
_STABLE_VALUES = (str, bytes, int, Key, type(None))


def sql_is_exact(f: Filter | None) -> bool:
    """Whether the keys ``candidate_sql`` reads for ``f`` are exactly the
    entities ``compile_filter(f)`` matches (the index SQL of ``_source``,
    read here), so that no candidate needs the Python check: an equality on one property or on ``__key__`` (an index
    lookup of that very encoding), or an AND of such (SQL intersects them),
    with values of a type whose encoding never changed."""
    if isinstance(f, PropertyFilter):
        return f.op == "=" and isinstance(f.value, _STABLE_VALUES) and (f.name != KEY_PROPERTY or isinstance(f.value, Key))
    return isinstance(f, CompositeFilter) and f.op == "AND" and bool(f.filters) and all(sql_is_exact(c) for c in f.filters)
