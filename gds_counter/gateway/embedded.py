"""The embedded SQLite engine: the default storage, with no server and no account.

It exists so that workshops, tests and small apps get Cloud Datastore's
behaviour (value ordering, multi-valued properties, optimistic transactions,
cursors, namespaces) from one local file, and so that code written against it
keeps working when it moves to Datastore.

Storage layout (one SQLite file, WAL mode so readers never block the writer):

* ``entities(key_bytes PK, ns, kind, version, written_at, data)``: ``data`` is
  tagged JSON (lossless, never pickle); ``version`` is the number of the commit
  that last wrote the row. Commit numbers only grow, so a version never comes
  back after a delete and re-create, which is what optimistic transactions
  compare.
* ``props(ns, kind, name, value, key_bytes)``: one row per indexed value (one
  per list element), ``value`` encoded so that SQLite's byte comparison is
  Datastore's value ordering. Filters and sort orders therefore only ever see
  indexed values, as in Datastore, and a query reads candidate keys from this
  index instead of scanning its kind.
* ``meta``: the commit counter and the id allocator.

Value ordering follows what Datastore documents ("based on the internal
representations") and what both official emulators do (checked by hand):
null < integers and timestamps (one class, timestamps as microseconds since the
epoch, interleaved with integers) < booleans < byte strings and unicode strings
(one class, compared as bytes, strings as UTF-8, interleaved) < doubles <
geopoints < keys. Inequality filters span types (``v < "b"`` also matches
integers), and inequalities on one property must be met by one list element.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as _dt
import functools
import itertools
import json
import logging
import math
import os
import sqlite3
import struct
import threading
import time
from collections import defaultdict
from typing import Any, Callable, Iterable, Iterator

import attrs

from gds_counter._checks import INT64_MAX, INT64_MIN, is_int
from gds_counter.errors import BadValueError, Contention, GatewayError
from gds_counter.gateway.base import BaseGateway, TransactionState
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key, PathElement
from gds_counter.gateway.mutations import Delete, Mutation, Upsert
from gds_counter.gateway.query import (
    KEY_PROPERTY,
    CompositeFilter,
    Filter,
    Order,
    PropertyFilter,
    Query,
    QueryResult,
)
from gds_counter.gateway.values import EPOCH, Geopoint, RawEntity

log = logging.getLogger(__name__)

#: What this engine does, known from its own code (no probe needed): it
#: applies transforms and masks, keeps a transformed property's index flag as
#: sent, and runs every filter; it has no aggregation queries.
CAPABILITIES = Capabilities(applies_transforms=True, indexes_transformed=False, not_equal_in_or=True)

#: Results per batch: small enough that callers must follow cursors (as with
#: Datastore), large enough that following them is cheap.
BATCH_SIZE = 300

#: How long a writer waits for another process's write lock before giving up
#: with Contention. Commits are short, so a long wait means real overload.
BUSY_TIMEOUT_S = 30.0

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entities (
    key_bytes BLOB PRIMARY KEY,
    ns TEXT NOT NULL,
    kind TEXT NOT NULL,
    version INTEGER NOT NULL,
    written_at REAL NOT NULL,
    data TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entities_by_kind ON entities (ns, kind, key_bytes);
CREATE TABLE IF NOT EXISTS props (
    ns TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    value BLOB NOT NULL,
    key_bytes BLOB NOT NULL,
    PRIMARY KEY (ns, kind, name, value, key_bytes)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS props_by_key ON props (key_bytes);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('commit_seq', 0), ('next_id', 1);
"""

# --- order-preserving value encoding ---------------------------------------
#
# Every encoding is prefix-free (fixed width, or escaped and terminated), so
# inverting the bytes gives exactly the reverse order: that is how descending
# sort orders and cursors compare with plain byte comparison.

_NULL, _INT, _BOOL, _STR, _FLOAT, _GEO, _KEY = (bytes([c]) for c in (0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70))
_ONE_MICRO = _dt.timedelta(microseconds=1)
_INVERT = bytes(range(255, -1, -1))


def _escaped(raw: bytes) -> bytes:
    return raw.replace(b"\x00", b"\x00\xff") + b"\x00\x01"


def _i64(number: int) -> bytes:
    return (number + 2**63).to_bytes(8, "big")


def _f64(number: float) -> bytes:
    if math.isnan(number):
        return bytes(8)  # below -inf, as Datastore sorts NaN
    (bits,) = struct.unpack(">Q", struct.pack(">d", number + 0.0))  # -0.0 == 0.0
    bits = bits ^ 0xFFFF_FFFF_FFFF_FFFF if bits >> 63 else bits | 1 << 63
    return bits.to_bytes(8, "big")


def _micros(moment: _dt.datetime) -> int:
    return (moment - EPOCH) // _ONE_MICRO


def key_bytes(key: Key) -> bytes:
    """A key's sortable encoding: namespace, then path elements (kind, then
    ids before names, ids numerically, names bytewise). A key's encoding minus
    its last byte is a prefix of every descendant's, which makes HAS_ANCESTOR
    a range scan."""
    out = [_escaped(key.namespace.encode())]
    for element in key.path:
        out.append(b"\x02" + _escaped(element.kind.encode()))
        if element.id is not None:
            out.append(b"\x01" + element.id.to_bytes(8, "big"))
        elif element.name is not None:
            out.append(b"\x02" + _escaped(element.name.encode()))
        else:
            out.append(b"\x00")
    out.append(b"\x01")
    return b"".join(out)


def _descendant_range(ancestor: Key) -> tuple[bytes, bytes]:
    """[low, high) of the encodings of ``ancestor`` and all its descendants."""
    stem = key_bytes(ancestor)[:-1]
    return stem, stem + b"\x03"


def sortable(value: Any) -> bytes:
    """Encode one indexed value so that bytes order is Datastore's order."""
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return _BOOL + (b"\x01" if value else b"\x00")
    if isinstance(value, int):
        return _INT + _i64(value)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise BadValueError(f"naive datetime {value!r} cannot be compared; give it a timezone")
        return _INT + _i64(_micros(value))
    if isinstance(value, str):
        return _STR + _escaped(value.encode("utf-8"))
    if isinstance(value, bytes):
        return _STR + _escaped(value)
    if isinstance(value, float):
        return _FLOAT + _f64(value)
    if isinstance(value, Geopoint):
        return _GEO + _f64(value.latitude) + _f64(value.longitude)
    if isinstance(value, Key):
        return _KEY + key_bytes(value)
    raise BadValueError(f"a {type(value).__name__} ({value!r}) cannot be indexed, filtered or sorted on")


def _descending(encoded: bytes) -> bytes:
    return encoded.translate(_INVERT)


# --- lossless serialisation (tagged JSON) ----------------------------------


def _key_to_json(key: Key) -> list[Any]:
    return [key.namespace, [[e.kind, e.id_or_name] for e in key.path]]


def _key_from_json(data: list[Any]) -> Key:
    namespace, path = data
    return Key(
        tuple(PathElement(kind, name=ident) if isinstance(ident, str) else PathElement(kind, id=ident) for kind, ident in path),
        namespace,
    )


def _to_json(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value  # json keeps int and float apart, and writes inf/nan
    if isinstance(value, bytes):
        return {"b": base64.b64encode(value).decode("ascii")}
    if isinstance(value, _dt.datetime):
        return {"t": _micros(value)}
    if isinstance(value, Key):
        return {"k": _key_to_json(value)}
    if isinstance(value, Geopoint):
        return {"g": [value.latitude, value.longitude]}
    if isinstance(value, RawEntity):
        return {"e": _entity_to_json(value)}
    if isinstance(value, list):
        return [_to_json(item) for item in value]
    raise BadValueError(f"cannot store a {type(value).__name__} ({value!r})")


def _from_json(data: Any) -> Any:
    if isinstance(data, list):
        return [_from_json(item) for item in data]
    if not isinstance(data, dict):
        return data
    ((tag, inner),) = data.items()
    if tag == "b":
        return base64.b64decode(inner)
    if tag == "t":
        return EPOCH + _dt.timedelta(microseconds=inner)
    if tag == "k":
        return _key_from_json(inner)
    if tag == "g":
        return Geopoint(*inner)
    if tag == "e":
        return _entity_from_json(inner)
    raise GatewayError(f"corrupt stored value with unknown tag {tag!r}")


def _entity_to_json(entity: RawEntity) -> dict[str, Any]:
    return {
        "k": _key_to_json(entity.key) if entity.key is not None else None,
        "p": {name: _to_json(value) for name, value in entity.properties.items()},
        "u": sorted(entity.unindexed),
    }


def _entity_from_json(data: dict[str, Any]) -> RawEntity:
    key = _key_from_json(data["k"]) if data["k"] is not None else None
    return RawEntity(key, {name: _from_json(v) for name, v in data["p"].items()}, frozenset(data["u"]))


def _dump(entity: RawEntity) -> str:
    return json.dumps(_entity_to_json(entity), separators=(",", ":"))


def _load(text: str) -> RawEntity:
    return _entity_from_json(json.loads(text))


def _index_entries(entity: RawEntity, prefix: str = "") -> Iterator[tuple[str, bytes, Any]]:
    """(name, encoding, value) of every value a Datastore index holds: one per
    list element, none for unindexed properties, and an indexed embedded
    entity's own indexed properties as ``outer.inner``."""
    for name, value in entity.properties.items():
        if name in entity.unindexed:
            continue
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, RawEntity):
                yield from _index_entries(item, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}", sortable(item), item


# --- cursors ----------------------------------------------------------------

_CURSOR_MAGIC = b"GDSC1"


def _encode_cursor(position: tuple[bytes, ...]) -> bytes:
    return _CURSOR_MAGIC + b"".join(len(part).to_bytes(4, "big") + part for part in position)


def _decode_cursor(cursor: bytes, size: int) -> tuple[bytes, ...]:
    if not isinstance(cursor, bytes) or not cursor.startswith(_CURSOR_MAGIC):
        raise BadValueError(f"cursor {cursor!r} was not issued by the embedded gateway")
    parts, at = [], len(_CURSOR_MAGIC)
    while at < len(cursor):
        length = int.from_bytes(cursor[at : at + 4], "big")
        parts.append(cursor[at + 4 : at + 4 + length])
        at += 4 + length
    if at != len(cursor) or len(parts) != size:
        raise BadValueError("cursor does not belong to this query (different sort orders or projection)")
    return tuple(parts)


# --- filters ----------------------------------------------------------------

_RANGE_OPS = {"<": bytes.__lt__, "<=": bytes.__le__, ">": bytes.__gt__, ">=": bytes.__ge__}
_SQL_OPS = {"=": "=", "<": "<", "<=": "<=", ">": ">", ">=": ">=", "!=": "<>"}


@attrs.define
class _Doc:
    """One candidate entity while a query evaluates it, with its index values
    computed once."""

    key_enc: bytes
    version: int
    entity: RawEntity
    _index: dict[str, list[tuple[bytes, Any]]] | None = None

    def values(self, name: str) -> list[tuple[bytes, Any]]:
        if self._index is None:
            self._index = defaultdict(list)
            for entry_name, enc, value in _index_entries(self.entity):
                self._index[entry_name].append((enc, value))
        return self._index.get(name, [])

    def encodings(self, name: str) -> list[bytes]:
        if name == KEY_PROPERTY:
            return [self.key_enc]
        return [enc for enc, _ in self.values(name)]


def _filter_target(f: PropertyFilter) -> Any:
    """The filter's value, encoded (a frozenset for IN and NOT_IN)."""
    if f.op == "HAS_ANCESTOR":
        if f.name != KEY_PROPERTY or not isinstance(f.value, Key):
            raise BadValueError(f"HAS_ANCESTOR needs __key__ and a Key, got {f.name!r} {f.value!r}")
        return _descendant_range(f.value)
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
    compare = _RANGE_OPS[op]
    return lambda enc: compare(enc, target)


def _compile(f: Filter) -> Callable[[_Doc], bool]:
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
        if f.op == "AND" and isinstance(child, PropertyFilter) and child.op in _RANGE_OPS:
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


def _top_level_ranges(f: Filter | None) -> dict[str, list[Callable[[bytes], bool]]]:
    """Inequalities that every result row must meet, by property: a row of a
    projection or a sort on that property uses only the list elements in range,
    as Datastore reads them from the index range. != and NOT_IN are index
    ranges too (the values on either side of the excluded ones), so
    ``tags != 'a'`` never projects or sorts by the element 'a'."""
    direct = [f] if isinstance(f, PropertyFilter) else list(f.filters) if isinstance(f, CompositeFilter) and f.op == "AND" else []
    out: dict[str, list[Callable[[bytes], bool]]] = defaultdict(list)
    for child in direct:
        if isinstance(child, PropertyFilter) and child.op in (*_RANGE_OPS, "!=", "NOT_IN") and child.name != KEY_PROPERTY:
            out[child.name].append(_value_test(child.op, _filter_target(child)))
    return out


def _equality_names(f: Filter | None) -> set[str]:
    direct = [f] if isinstance(f, PropertyFilter) else list(f.filters) if isinstance(f, CompositeFilter) and f.op == "AND" else []
    return {c.name for c in direct if isinstance(c, PropertyFilter) and c.op in ("=", "IN")}


# --- candidate selection in SQL --------------------------------------------

#: Source ranks: lower is more selective. Rank-0 sources are intersected.
_EXACT, _RANGE, _NEGATED = 0, 1, 2


@attrs.frozen
class _Source:
    sql: str
    params: tuple[Any, ...]
    rank: int


def _source(f: Filter, ns: str, kind: str | None) -> _Source | None:
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
    children = [_source(child, ns, kind) for child in f.filters]
    if f.op == "OR":
        if not children or any(c is None for c in children):
            return None
        return _compound("UNION", children, max(c.rank for c in children))  # type: ignore[union-attr]
    usable = [c for c in children if c is not None]
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


# --- transactions -------------------------------------------------------------


@attrs.define
class _Transaction(TransactionState):
    #: key encoding -> (version read, 0 if absent; the key, for messages)
    reads: dict[bytes, tuple[int, Key]] = attrs.field(factory=dict)

    def saw(self, key_enc: bytes, version: int, key: Key) -> None:
        self.reads.setdefault(key_enc, (version, key))  # the first read is what the caller acted on


@attrs.frozen
class _Row:
    """One query result in sort order: its position (also its cursor) and
    the entity it returns."""

    position: tuple[bytes, ...]
    doc: _Doc
    entity: RawEntity


class EmbeddedGateway(BaseGateway[_Transaction]):
    """Cloud Datastore semantics on SQLite; see the module docstring.

    ``path`` None keeps the data in memory for the life of the gateway (one
    connection shared by every thread behind a lock, since an in-memory
    database lives in its connection). A file is shared by threads (one
    connection each) and processes (WAL, ``BEGIN IMMEDIATE`` commits).

    ``entity_writes_per_second`` turns on a teaching model of Datastore's
    sustained write limit on one entity (about one per second): a commit that
    writes an entity written less than ``1/rate`` seconds ago raises
    Contention. It is a model for demos, not a measurement of Datastore.
    """

    def __init__(self, path: str | os.PathLike[str] | None, namespace: str = "", *, entity_writes_per_second: float | None = None) -> None:
        if entity_writes_per_second is not None and entity_writes_per_second <= 0:
            raise BadValueError(f"entity_writes_per_second must be positive, got {entity_writes_per_second!r}")
        super().__init__(namespace, capabilities=CAPABILITIES)
        self.path = os.fspath(path) if path is not None else None
        self._min_write_gap = 1.0 / entity_writes_per_second if entity_writes_per_second else 0.0
        self._lock = threading.RLock()  # guards the shared memory connection and the bookkeeping below
        self._local = threading.local()
        self._connections: list[sqlite3.Connection] = []
        self._closed = False
        self._memory = self._open() if self.path is None else None
        if self.path is not None:
            self._thread_connection()  # create the schema now, so errors show at open

    # -- connections -------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path or ":memory:", timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        if self.path is not None:
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = FULL")  # a commit that returned survives a power cut
        conn.executescript(_SCHEMA)  # idempotent, so concurrent openers of one file agree
        with self._lock:
            self._connections.append(conn)
        return conn

    def _thread_connection(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._open()
        return conn

    @contextlib.contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A connection for this thread, with SQLite errors turned into ours."""
        if self._closed:
            raise GatewayError("the embedded gateway is closed")
        guard = self._lock if self._memory is not None else contextlib.nullcontext()
        with guard:
            conn = self._memory or self._thread_connection()
            try:
                yield conn
            except sqlite3.OperationalError as exc:
                if "locked" in str(exc) or "busy" in str(exc):
                    raise Contention(f"database {self.path!r} stayed locked by other writers: {exc}") from exc
                raise GatewayError(f"SQLite failed on {self.path or 'memory'}: {exc}") from exc
            except sqlite3.Error as exc:
                raise GatewayError(f"SQLite failed on {self.path or 'memory'}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for conn in self._connections:
                conn.close()
            self._connections.clear()

    # -- transactions --------------------------------------------------------

    def _begin(self, read_only: bool) -> _Transaction:
        self._record("begin_transaction")
        return _Transaction(os.urandom(16), read_only)

    def _rollback(self, txn: _Transaction) -> None:
        self._record("rollback")

    # -- reads ---------------------------------------------------------------

    def _lookup(self, keys: list[Key], txn: _Transaction | None) -> list[RawEntity | None]:
        encoded = [key_bytes(key) for key in keys]
        found: dict[bytes, tuple[int, str]] = {}
        if encoded:
            marks = ", ".join("?" * len(set(encoded)))
            with self._db() as conn:
                rows = conn.execute(f"SELECT key_bytes, version, data FROM entities WHERE key_bytes IN ({marks})", tuple(set(encoded)))
                found = {kb: (version, data) for kb, version, data in rows}
        out: list[RawEntity | None] = []
        for key, kb in zip(keys, encoded):
            version, data = found.get(kb, (0, None))
            if txn is not None:
                txn.saw(kb, version, key)
            out.append(_load(data) if data is not None else None)
        self._record("lookup", reads=len(keys))  # Datastore bills a missing key as a read
        return out

    def _run_query(self, query: Query, txn: _Transaction | None) -> QueryResult:
        plan = _Plan.of(query)
        start = _decode_cursor(query.start_cursor, plan.width) if query.start_cursor else None
        end = _decode_cursor(query.end_cursor, plan.width) if query.end_cursor else None
        wanted = BATCH_SIZE if query.limit is None else min(query.limit, BATCH_SIZE)
        batch: list[_Row] = []
        last = start
        more = False
        with self._db() as conn:
            rows = self._rows(conn, query, plan, start)
            try:
                skip = query.offset
                for row in rows:
                    if end is not None and row.position > end:
                        break
                    if len(batch) == wanted:
                        more = query.limit is None or query.limit > wanted
                        break
                    last = row.position
                    if skip:
                        skip -= 1
                    else:
                        batch.append(row)
            finally:
                rows.close()
        if txn is not None:
            for row in batch:
                txn.saw(row.doc.key_enc, row.doc.version, row.doc.entity.key)  # type: ignore[arg-type]
        self._record("run_query", reads=len(batch))
        return QueryResult(tuple(r.entity for r in batch), _encode_cursor(last) if last is not None else None, more)

    def explain_query(self, query: Query) -> str:
        """SQLite's plan for the SQL a query runs, so a workshop (and the
        index test) can see that a filter reads an index, not the whole kind."""
        plan = _Plan.of(query)
        sql, params = self._candidate_sql(query, plan, None)
        with self._db() as conn:
            return "\n".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))

    def _candidate_sql(self, query: Query, plan: "_Plan", start: tuple[bytes, ...] | None) -> tuple[str, tuple[Any, ...]]:
        ns, kind = query.namespace, query.kind
        source = _source(query.filter, ns, kind) if query.filter is not None else None
        if source is None and plan.first_property is not None:
            # Entities lacking the sorted property are not in its index, so the index is the candidate set.
            source = _source(PropertyFilter(plan.first_property, ">=", None), ns, kind)
        columns = "SELECT e.key_bytes, e.version, e.data"
        if source is not None:
            sql = f"{columns} FROM ({source.sql}) AS c CROSS JOIN entities AS e ON e.key_bytes = c.key_bytes WHERE 1"
            params: tuple[Any, ...] = source.params
        else:
            low = _escaped(ns.encode())
            sql = f"{columns} FROM entities AS e WHERE e.ns = ? AND e.key_bytes >= ? AND e.key_bytes < ?"
            params = (ns, low, low[:-1] + b"\x02")
            if kind is not None:
                sql += " AND e.kind = ?"
                params += (kind,)
        if plan.streams:
            descending = bool(plan.orders) and plan.orders[0].descending
            if start is not None:
                sql += f" AND e.key_bytes {'<' if descending else '>'} ?"
                params += (start[-1],)
            sql += f" ORDER BY e.key_bytes {'DESC' if descending else 'ASC'}"
        return sql, params

    def _rows(self, conn: sqlite3.Connection, query: Query, plan: "_Plan", start: tuple[bytes, ...] | None) -> Iterator[_Row]:
        """Result rows after ``start`` in sort order. Key-ordered queries
        stream from SQLite and stop at the batch; other orders sort all the
        (index-narrowed) candidates for every batch, which is fine for
        filtered queries but makes following every batch of a large kind
        sorted by a property quadratic."""
        sql, params = self._candidate_sql(query, plan, start)
        matches = _compile(query.filter) if query.filter is not None else (lambda doc: True)
        cursor = conn.execute(sql, params)
        examined = 0
        try:
            docs = []
            for kb, version, data in cursor:
                examined += 1
                doc = _Doc(kb, version, _load(data))
                if not matches(doc):
                    continue
                if plan.streams:
                    yield from plan.rows(doc)
                else:
                    docs.append(doc)
            if plan.streams:
                return
            rows = sorted((row for doc in docs for row in plan.rows(doc)), key=lambda r: r.position)
            if plan.distinct_on:
                rows = plan.first_of_each(rows)
            for row in rows:
                if start is None or row.position > start:
                    yield row
        finally:
            cursor.close()
            self.stats.bump("rows_examined", examined)

    # -- writes --------------------------------------------------------------

    def _allocate_ids(self, keys: list[Key]) -> list[Key]:
        with self._db() as conn:
            ids = _allocate(conn, len(keys))
        self._record("allocate_ids")
        return [key.completed(new_id) for key, new_id in zip(keys, ids)]

    def _commit(self, mutations: list[Mutation], txn: _Transaction | None) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
        try:
            results = self._apply(mutations, txn)
        except Contention as exc:
            log.debug("commit aborted: %s", exc)
            self._record("commit")  # an aborted commit is still an RPC
            self.stats.bump("aborts")
            raise
        upserts = sum(isinstance(m, Upsert) for m in mutations)
        self._record("commit", writes=upserts, deletes=len(mutations) - upserts)
        return results

    def _apply(self, mutations: list[Mutation], txn: _Transaction | None) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
        with self._db() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if txn is not None:
                    _check_unchanged(conn, txn)
                seq = conn.execute("UPDATE meta SET value = value + 1 WHERE name = 'commit_seq' RETURNING value").fetchall()[0][0]
                partial = [m for m in mutations if isinstance(m, Upsert) and m.entity.key is not None and m.entity.key.is_partial]
                new_ids = iter(_allocate(conn, len(partial)))
                results = []
                now = time.time()
                for mutation in mutations:
                    if isinstance(mutation, Delete):
                        self._check_write_rate(conn, mutation.key, now)
                        kb = key_bytes(mutation.key)
                        conn.execute("DELETE FROM entities WHERE key_bytes = ?", (kb,))
                        conn.execute("DELETE FROM props WHERE key_bytes = ?", (kb,))
                        results.append((mutation.key, None))
                    else:
                        key = mutation.entity.key
                        assert key is not None  # checked by BaseGateway.commit
                        key = key.completed(next(new_ids)) if key.is_partial else key
                        self._check_write_rate(conn, key, now)
                        results.append(_upsert(conn, mutation, key, seq, now))
                conn.execute("COMMIT")
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
        return results

    def _check_write_rate(self, conn: sqlite3.Connection, key: Key, now: float) -> None:
        if not self._min_write_gap:
            return
        row = conn.execute("SELECT written_at FROM entities WHERE key_bytes = ?", (key_bytes(key),)).fetchone()
        if row is not None and now - row[0] < self._min_write_gap:
            self.stats.bump("write_rate_aborts")
            raise Contention(f"{key} was written {now - row[0]:.3f}s ago; the model allows one write per {self._min_write_gap:.3f}s")


def _check_unchanged(conn: sqlite3.Connection, txn: _Transaction) -> None:
    for kb, (version, key) in txn.reads.items():
        row = conn.execute("SELECT version FROM entities WHERE key_bytes = ?", (kb,)).fetchone()
        if (row[0] if row else 0) != version:
            raise Contention(f"{key} changed since this transaction read it", attempts=1)


def _scatter(sequence: int) -> int:
    """Spread sequential numbers over a wide range (bit reversal, a bijection),
    so that allocated ids, like Datastore's, do not collide with small ids
    that callers pick by hand."""
    return int(f"{sequence:052b}"[::-1], 2)


def _allocate(conn: sqlite3.Connection, count: int) -> list[int]:
    if not count:
        return []
    end = conn.execute("UPDATE meta SET value = value + ? WHERE name = 'next_id' RETURNING value", (count,)).fetchall()[0][0]
    if end >= 2**52:
        raise GatewayError("the id allocator is exhausted")
    return [_scatter(n) for n in range(end - count, end)]


def _upsert(conn: sqlite3.Connection, mutation: Upsert, key: Key, seq: int, now: float) -> tuple[Key, tuple[Any, ...]]:
    entity = mutation.entity
    if mutation.property_mask is None:
        properties = dict(entity.properties)
        unindexed = set(entity.unindexed) & set(properties)
    else:
        row = conn.execute("SELECT data FROM entities WHERE key_bytes = ?", (key_bytes(key),)).fetchone()
        old = _load(row[0]) if row else RawEntity(key)
        properties, unindexed = dict(old.properties), set(old.unindexed)
        for name in mutation.property_mask:
            unindexed.discard(name)
            if name in entity.properties:
                properties[name] = entity.properties[name]
                if name in entity.unindexed:
                    unindexed.add(name)
            else:
                properties.pop(name, None)  # in the mask but not the entity: Datastore removes it
    transform_results = []
    for transform in mutation.transforms:
        current = properties.get(transform.name, 0)
        if not is_int(current):
            raise BadValueError(f"cannot increment {transform.name!r} of {key}: stored value {current!r} is not an integer")
        total = current + transform.amount
        if not INT64_MIN <= total <= INT64_MAX:
            raise BadValueError(f"incrementing {transform.name!r} of {key} to {total} overflows 64 bits")
        properties[transform.name] = total
        (unindexed.add if transform.name in entity.unindexed else unindexed.discard)(transform.name)
        transform_results.append(total)
    stored = RawEntity(key, properties, frozenset(unindexed & set(properties)))
    kb = key_bytes(key)
    conn.execute(
        "INSERT OR REPLACE INTO entities (key_bytes, ns, kind, version, written_at, data) VALUES (?, ?, ?, ?, ?, ?)",
        (kb, key.namespace, key.kind, seq, now, _dump(stored)),
    )
    conn.execute("DELETE FROM props WHERE key_bytes = ?", (kb,))
    conn.executemany(
        "INSERT OR IGNORE INTO props (ns, kind, name, value, key_bytes) VALUES (?, ?, ?, ?, ?)",
        [(key.namespace, key.kind, name, enc, kb) for name, enc, _ in _index_entries(stored)],
    )
    return key, tuple(transform_results)


# --- query planning ---------------------------------------------------------


@attrs.frozen
class _Plan:
    """How a query turns a matching entity into ordered result rows.

    A row's position is (one component per sort order, the key, then the
    projected values): it sorts the rows, breaks ties by key ascending, and
    is the cursor.
    """

    orders: tuple[Order, ...]
    projection: tuple[str, ...]
    keys_only: bool
    distinct_on: tuple[str, ...]
    ranges: dict[str, list[Callable[[bytes], bool]]]

    @classmethod
    def of(cls, query: Query) -> "_Plan":
        projection = tuple(p for p in query.projection if p != KEY_PROPERTY)
        keys_only = query.keys_only or (bool(query.projection) and not projection)
        orders = query.order
        if projection and not orders:
            orders = tuple(Order(name) for name in projection)  # Datastore reads the projected properties' index
        for name in set(projection) & _equality_names(query.filter):
            raise BadValueError(f"cannot project property {name!r} that has an equality filter")
        missing = set(query.distinct_on) - set(projection)
        if missing:
            raise BadValueError(f"distinct_on {sorted(missing)} must be projected properties")
        return cls(orders, projection, keys_only, query.distinct_on, _top_level_ranges(query.filter))

    @property
    def width(self) -> int:
        return len(self.orders) + 1 + len(self.projection)

    @property
    def streams(self) -> bool:
        """Key order only, one row per entity: SQLite's key order is the answer."""
        return not self.projection and all(o.name == KEY_PROPERTY for o in self.orders[:1]) and len(self.orders) <= 1

    @property
    def first_property(self) -> str | None:
        names = [o.name for o in self.orders if o.name != KEY_PROPERTY]
        return names[0] if names else None

    def _candidates(self, doc: _Doc, name: str) -> list[tuple[bytes, Any]]:
        tests = self.ranges.get(name, ())
        return [(enc, v) for enc, v in doc.values(name) if all(t(enc) for t in tests)]

    def rows(self, doc: _Doc) -> Iterator[_Row]:
        """One row per entity, or one per combination of projected values;
        none if the entity lacks an indexed value for a sort or projection."""
        key = doc.entity.key
        choices = [self._candidates(doc, name) for name in self.projection]
        for combo in itertools.product(*choices):
            chosen = dict(zip(self.projection, combo))
            position = []
            for order in self.orders:
                if order.name == KEY_PROPERTY:
                    enc = doc.key_enc
                elif order.name in chosen:
                    enc = chosen[order.name][0]
                else:
                    values = [e for e, _ in self._candidates(doc, order.name)]
                    if not values:
                        return  # not in this property's index: not a result
                    enc = max(values) if order.descending else min(values)
                position.append(_descending(enc) if order.descending else enc)
            position.append(doc.key_enc)
            position.extend(enc for enc, _ in combo)
            if self.projection:
                entity = RawEntity(key, {name: value for name, (_, value) in chosen.items()})
            elif self.keys_only:
                entity = RawEntity(key)
            else:
                entity = doc.entity
            yield _Row(tuple(position), doc, entity)

    def first_of_each(self, rows: Iterable[_Row]) -> list[_Row]:
        seen: set[tuple[bytes, ...]] = set()
        out = []
        offset = len(self.orders) + 1
        for row in rows:
            group = tuple(row.position[offset + self.projection.index(n)] for n in self.distinct_on)
            if group not in seen:
                seen.add(group)
                out.append(row)
        return out
