"""The embedded engine's candidate keys, read in SQL through the index.

A query never scans its kind when a filter or sort order can use the index
table (``props``: one row per indexed value, one per list element), as
Datastore reads its indexes: the SQL here yields a superset of the matching
keys (the most selective index, several intersected, an OR's united), and
``_filter_check`` then checks each candidate. ``sql_is_exact`` says when
no check is needed. ``_scans.Scan`` says what order the SQL reads in.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import attrs

from gds_counter.gateway.embedded._encoding import STABLE_ENCODING, escaped
from gds_counter.gateway.embedded._filter_check import filter_target
from gds_counter.gateway.keys import Key
from gds_counter.gateway.query import KEY_PROPERTY, CompositeFilter, Filter, PropertyFilter, Query

if TYPE_CHECKING:
    from gds_counter.gateway.embedded._scans import Scan

_SQL_OPS = {"=": "=", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "!=": "<>"}


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
        target = filter_target(f)
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
        # One value's rows name each key once (the primary key ends in it), already in key order:
        # no DISTINCT, so SQLite reads them straight from the index, without sorting (a counter's target query).
        distinct = "" if f.op == "=" else "DISTINCT "
        return _Source(f"SELECT {distinct}key_bytes FROM props WHERE {scope_sql} AND name = ? AND value {condition}", (*scope, f.name, *values), rank)
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
    order_key = "e.key_bytes"
    if source is not None:
        order_key = "c.key_bytes"  # (equal to e's: in the source's order, which SQLite may already read in)
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
            sql += f" AND {order_key} {'<' if is_descending else '>'} ?"
            params += (start[-1],)
        sql += f" ORDER BY {order_key} {'DESC' if is_descending else 'ASC'}"
    return sql, params


def sql_is_exact(f: Filter | None) -> bool:
    """Whether the keys ``candidate_sql`` reads for ``f`` are exactly the
    entities ``compile_filter(f)`` matches (the index SQL of ``_source``,
    read here), so that no candidate needs the Python check: an equality on one property or on ``__key__`` (an index
    lookup of that very encoding), or an AND of such (SQL intersects them),
    with values of a type whose encoding never changed (``STABLE_ENCODING``)."""
    if isinstance(f, PropertyFilter):
        return f.op == "=" and isinstance(f.value, STABLE_ENCODING) and (f.name != KEY_PROPERTY or isinstance(f.value, Key))
    return isinstance(f, CompositeFilter) and f.op == "AND" and bool(f.filters) and all(sql_is_exact(c) for c in f.filters)
