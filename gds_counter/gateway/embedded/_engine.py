"""``EmbeddedGateway``: the gateway hooks over SQLite connections.

This module owns what is about running the engine rather than about data:
one connection per thread on a file (one shared connection, behind a lock,
for an in-memory database, which lives in its connection), SQLite errors
turned into ``Contention``/``GatewayError``, optimistic transactions that
record what they read and are checked at commit, query batches that follow
the planner's rows, and the stats every RPC records.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
from typing import Any, Generator, Iterator

from gds_counter.errors import BadValueError, Contention, GatewayError
from gds_counter.gateway.base import BaseGateway
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.embedded._encoding import decode_cursor, encode_cursor, key_bytes, load_entity
from gds_counter.gateway.embedded._planner import Doc, Plan, Row, candidate_sql, compile_filter
from gds_counter.gateway.embedded._storage import SCHEMA, Transaction, allocate, check_unchanged, upsert
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Mutation, Upsert
from gds_counter.gateway.query import Query, QueryResult
from gds_counter.gateway.values import RawEntity

# Logged under the package's name, as before the package was split by idea,
# so logging configuration that names it keeps matching.
log = logging.getLogger("gds_counter.gateway.embedded")

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


class EmbeddedGateway(BaseGateway[Transaction]):
    """Cloud Datastore semantics on SQLite; see the package docstring.

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
        conn.executescript(SCHEMA)  # idempotent, so concurrent openers of one file agree
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

    def _begin(self, read_only: bool) -> Transaction:
        self._record("begin_transaction")
        return Transaction(os.urandom(16), read_only)

    def _rollback(self, txn: Transaction) -> None:
        self._record("rollback")

    # -- reads ---------------------------------------------------------------

    def _lookup(self, keys: list[Key], txn: Transaction | None) -> list[RawEntity | None]:
        encoded = [key_bytes(key) for key in keys]
        found: dict[bytes, tuple[int, str]] = {}
        if encoded:
            marks = ", ".join("?" * len(encoded))  # distinct: BaseGateway.lookup removed repeats
            with self._db() as conn:
                rows = conn.execute(f"SELECT key_bytes, version, data FROM entities WHERE key_bytes IN ({marks})", encoded)
                found = {kb: (version, data) for kb, version, data in rows}
        out: list[RawEntity | None] = []
        for key, kb in zip(keys, encoded):
            version, data = found.get(kb, (0, None))
            if txn is not None:
                txn.saw(kb, version, key)
            out.append(load_entity(data, key) if data is not None else None)
        self._record("lookup", reads=len(keys))  # Datastore bills a missing key as a read
        return out

    def _run_query(self, query: Query, txn: Transaction | None) -> QueryResult:
        plan = Plan.of(query)
        start = decode_cursor(query.start_cursor, plan.width) if query.start_cursor else None
        end = decode_cursor(query.end_cursor, plan.width) if query.end_cursor else None
        wanted = BATCH_SIZE if query.limit is None else min(query.limit, BATCH_SIZE)
        batch: list[Row] = []
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
                key = row.doc.entity.key
                assert key is not None  # a stored entity always has its key
                txn.saw(row.doc.key_enc, row.doc.version, key)
        self._record("run_query", reads=len(batch))
        return QueryResult(tuple(r.entity for r in batch), encode_cursor(last) if last is not None else None, more)

    def explain_query(self, query: Query) -> str:
        """SQLite's plan for the SQL a query runs, so a workshop (and the
        index test) can see that a filter reads an index, not the whole kind."""
        plan = Plan.of(query)
        sql, params = candidate_sql(query, plan, None)
        with self._db() as conn:
            return "\n".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))

    def _rows(self, conn: sqlite3.Connection, query: Query, plan: Plan, start: tuple[bytes, ...] | None) -> Generator[Row, None, None]:
        """Result rows after ``start`` in sort order. Key-ordered queries
        stream from SQLite and stop at the batch; other orders sort all the
        (index-narrowed) candidates for every batch, which is fine for
        filtered queries but makes following every batch of a large kind
        sorted by a property quadratic."""
        sql, params = candidate_sql(query, plan, start)
        matches = compile_filter(query.filter) if query.filter is not None else (lambda doc: True)
        cursor = conn.execute(sql, params)
        examined = 0
        try:
            docs = []
            for kb, version, data in cursor:
                examined += 1
                doc = Doc(kb, version, load_entity(data))
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
            ids = allocate(conn, len(keys))
        self._record("allocate_ids")
        return [key.completed(new_id) for key, new_id in zip(keys, ids)]

    def _commit(self, mutations: list[Mutation], txn: Transaction | None) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
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

    def _apply(self, mutations: list[Mutation], txn: Transaction | None) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
        with self._db() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                if txn is not None:
                    check_unchanged(conn, txn)
                seq = conn.execute("UPDATE meta SET value = value + 1 WHERE name = 'commit_seq' RETURNING value").fetchall()[0][0]
                partial = [m for m in mutations if isinstance(m, Upsert) and m.entity.key is not None and m.entity.key.is_partial]
                new_ids = iter(allocate(conn, len(partial)))
                results: list[tuple[Key | None, tuple[Any, ...] | None]] = []
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
                        results.append(upsert(conn, mutation, key, seq, now))
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
