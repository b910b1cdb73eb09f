"""``EmbeddedGateway``: the gateway hooks over SQLite connections.

This module owns what is about running the engine rather than about data:
serializable transactions that read one snapshot and are checked at commit
(see ``_storage``), how a commit is written (alone under the process's
write lock, or in the group commit; what it writes is ``_commit_writes``'s),
and the stats every RPC records. A query's
batches (each shape compiled once, rows read in the query's order) are
``_query_batches``'s; connections (a bounded pool, safe across ``fork()``,
errors turned into ``Contention``/``GatewayError`` naming the file) live in
``_connections``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import weakref
from datetime import datetime
from typing import Any, Iterator

from gds_counter._process import deadlines
from gds_counter.errors import BadValueError, Contention
from gds_counter.gateway.base import BaseGateway
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.embedded._commit_writes import CommitWrites
from gds_counter.gateway.embedded._connections import BUSY_TIMEOUT_S, ConnectionPool, HeldLease, Lease
from gds_counter.gateway.embedded._encoding import Decodings, key_bytes
from gds_counter.gateway.embedded._group_commit import DEFAULT_WAIT_S, GroupCommit, for_another
from gds_counter.gateway.embedded._history import ensure_history, past
from gds_counter.gateway.embedded._metadata import metadata_batch
from gds_counter.gateway.embedded._projects import Projects, check_home, check_home_mutations, resolved
from gds_counter.gateway.embedded._query_batches import BATCH_SIZE, BatchRead, Compiled, QueryBatches, answer, explain
from gds_counter.gateway.embedded._storage import (
    SharedCopy,
    Transaction,
    allocate,
    commit_seq,
    reserve,
    write_transaction,
)
from gds_counter.gateway.keys import METADATA_KINDS, Key
from gds_counter.gateway.mutations import Mutation, Upsert
from gds_counter.gateway.query import Query, QueryResult, without_repeats
from gds_counter.gateway.values import RawEntity

# Logged under the package's name, as before the package was split by idea,
# so logging configuration that names it keeps matching.
log = logging.getLogger("gds_counter.gateway.embedded")

#: What this engine does, known from its own code (no probe needed): it
#: applies transforms and masks, keeps a transformed property's index flag as
#: sent, runs every filter, and runs aggregations (BaseGateway's default hook
#: computes them from the query's rows).
CAPABILITIES = Capabilities(applies_transforms=True, indexes_transformed=True, not_equal_in_or=True, aggregation=True)


__all__ = ["BATCH_SIZE", "BUSY_TIMEOUT_S", "CAPABILITIES", "EmbeddedGateway"]


class EmbeddedGateway(BaseGateway[Transaction], CommitWrites):
    """Cloud Datastore semantics on SQLite; see the package docstring.

    ``path`` None keeps the data in memory for the life of the gateway (one
    connection lent to one call at a time, since an in-memory database lives
    in its connection). A file is shared by threads (a bounded pool of
    connections) and processes (WAL, ``BEGIN IMMEDIATE`` commits), also
    across ``fork()``. Its path is made absolute here, once. ``read_only``
    opens the file read-only (SQLite's ``mode=ro``): reads work, writes
    raise ``GatewayError``. Any failure to open is a ``GDSError`` naming the
    path. ``project`` is what keys of other projects are told apart from
    (``projects``, ``_projects.Projects``).

    ``entity_writes_per_second`` turns on a teaching model of Datastore's
    sustained write limit on one entity (about one per second): a commit that
    writes an entity written less than ``1/rate`` seconds ago raises
    Contention. It is a model for demos, not a measurement of Datastore.

    ``history`` keeps the versions commits replace (``keep_history``), so
    that ``begin_transaction(read_only=True, read_time=...)`` reads the data
    as it was up to an hour ago; without it such a read is ``ReadTimeTooOld``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        namespace: str = "",
        *,
        entity_writes_per_second: float | None = None,
        read_only: bool = False,
        project: str | None = None,
        history: bool = False,
    ) -> None:
        if entity_writes_per_second is not None and entity_writes_per_second <= 0:
            raise BadValueError(f"entity_writes_per_second must be positive, got {entity_writes_per_second!r}")
        if history and read_only:
            raise BadValueError("history=True keeps the versions commits replace: a read-only gateway writes none")
        super().__init__(namespace, capabilities=CAPABILITIES)
        self.projects = Projects(project)
        if path is not None and os.fspath(path) == ":memory:":
            path = None  # SQLite's name for memory: one database, not one per connection
        # Absolute once, here: a later os.chdir must not move new connections to another file.
        self.path = os.path.abspath(os.fspath(path)) if path is not None else None
        self._min_write_gap = 1.0 / entity_writes_per_second if entity_writes_per_second else 0.0
        self._pool = ConnectionPool(self.path, read_only=read_only)  # opens the file now, so errors show at open
        # In memory: transactions that read the one connection at the current
        # commit, and need a copy of it before the next commit changes it.
        self._pinned: weakref.WeakValueDictionary[bytes, Transaction] = weakref.WeakValueDictionary()
        self._memory_seq = 0  # in memory: the last commit's number, known without asking (one connection)
        self._decodings = Decodings()  # stored texts this gateway decoded or wrote
        self._queries = QueryBatches(self.stats, self._decodings)
        self._group = GroupCommit()
        if history:
            self.keep_history()

    def keep_history(self) -> None:
        """Keep the versions commits replace for ``_history.HISTORY_S``, so
        that a read-only transaction can read at a past ``read_time``
        (``_history``). It costs every write of an existing entity a row
        (docs/architecture.md has the figures), so it is asked for:
        ``history=True``, or this; gds-counter serve does. A file keeps it
        from then on, for every gateway that writes it."""
        with self._db() as conn:
            ensure_history(conn)

    # -- connections -------------------------------------------------------

    def _db(self) -> Lease:
        """A connection for one call, with SQLite errors turned into ours."""
        return Lease(self._pool)

    def close(self) -> None:
        self._pool.close()

    # -- transactions --------------------------------------------------------

    def _begin(self, read_only: bool, read_time: datetime | None = None) -> Transaction:
        self._record("begin_transaction")
        txn = Transaction(os.urandom(16), read_only)
        if read_time is not None:
            # A past time: its reads run on a copy of the database rewound
            # to it (``_history.past``), the slow path.
            with self._db() as conn:
                txn.snapshot = past(conn, read_time)
            txn.copy = SharedCopy(txn.snapshot, 1)
            txn.seq = -1
            self.stats.bump("snapshot_copies")
        elif read_only:
            # A read-only transaction reads as of its begin, as on the
            # Firestore emulator (tests/conformance/test_transactions.py):
            # its snapshot is pinned now. A read-write one reads the newest
            # data at its first read, which its commit then checks.
            with self._snapshot(txn):
                pass
        return txn

    def _rollback(self, txn: Transaction) -> None:
        self._end(txn)
        self._record("rollback")

    def _end(self, txn: Transaction) -> None:
        """Release a finished transaction's snapshot."""
        self._pinned.pop(txn.token, None)
        copy, txn.snapshot, txn.copy = txn.copy, None, None
        if copy is not None:
            copy.release()
        if txn.conn is not None:
            conn, txn.conn = txn.conn, None
            self._pool.unhold(conn)

    @contextlib.contextmanager
    def _snapshot(self, txn: Transaction) -> Iterator[sqlite3.Connection]:
        """A connection reading ``txn``'s snapshot; the first read pins it."""
        if txn.snapshot is not None and self.path is not None:  # (a past read_time's copy)
            yield txn.snapshot
            return
        if self.path is None:
            with self._db() as main:
                if txn.snapshot is not None:
                    yield txn.snapshot
                    return
                if txn.seq is None:
                    txn.seq = self._memory_seq
                    self._pinned[txn.token] = txn
                yield main  # no commit since txn.seq: see _freeze_pinned
            return
        if txn.conn is None:
            txn.conn = self._pool.hold(txn)
        with HeldLease(self._pool, txn.conn) as conn:
            if txn.seq is None:
                conn.execute("BEGIN")  # a WAL read transaction: the snapshot of its first read
                txn.seq = commit_seq(conn)
            elif not conn.in_transaction:
                raise Contention("this transaction lost its snapshot; retry it", attempts=1)
            yield conn

    def _freeze_pinned(self, main: sqlite3.Connection, committing: Transaction | None) -> None:
        """In memory, before a commit changes the one connection: give every
        other transaction reading it a copy of the database as it is."""
        if not self._pinned:
            return  # (the usual case, and listing a WeakValueDictionary is not free)
        waiting = [t for t in self._pinned.values() if t is not committing and t.snapshot is None]
        self._pinned.clear()
        if waiting:
            copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
            main.backup(copy)
            self.stats.bump("snapshot_copies")
            shared = SharedCopy(copy, len(waiting))
            for txn in waiting:
                txn.snapshot, txn.copy = copy, shared

    # -- reads ---------------------------------------------------------------

    def _own_project(self) -> str:
        return self.projects.own()

    def _lookup(self, keys: list[Key], txn: Transaction | None) -> list[RawEntity | None]:
        check_home(keys, self._own_project(), "look up")  # (the gateway's own project was dropped by then)
        encoded = [key_bytes(key) for key in keys]
        found: dict[bytes, tuple[int, str]] = {}
        if encoded:
            marks = ", ".join("?" * len(encoded))  # distinct: BaseGateway.lookup removed repeats
            with self._db() if txn is None else self._snapshot(txn) as conn:
                # Read whole, in one call: a statement left part-read (an interrupt landing in a loop over
                # it, its frame kept by the traceback) holds its read snapshot on the pooled connection,
                # and every later write on that connection is refused, "database is locked".
                rows = conn.execute(
                    f"SELECT key_bytes, version, data FROM entities WHERE key_bytes IN ({marks})", encoded
                ).fetchall()
                found = {kb: (version, data) for kb, version, data in rows}
        out: list[RawEntity | None] = []
        for key, kb in zip(keys, encoded):
            version, data = found.get(kb, (0, None))
            if txn is not None:
                txn.saw(kb, version, key)
            out.append(self._decodings.load_entity(data, key) if data is not None else None)
        self._record("lookup", reads=len(keys))  # Datastore bills a missing key as a read
        return out

    def _run_query(self, query: Query, txn: Transaction | None) -> QueryResult:
        query = resolved(query, self._own_project())  # keys of other projects placed, or refused
        if query.filter is not None and (read := without_repeats(query.filter)) is not query.filter:
            query = query.replace(filter=read)  # a repeated filter once, as Datastore reads it
        if query.kind in METADATA_KINDS:  # made from the index (``_metadata``), outside any transaction
            with self._db() as conn:
                entities, cursors, cursor, more = metadata_batch(conn, query)
            self._record("run_query", reads=len(entities))
            return QueryResult(tuple(entities), cursor, more, cursors)
        compiled = self._queries.compiled(query)  # once for the batch and its cursors
        if txn is None:
            batch, last, more = self._read_batch(query, compiled)
            self._record("run_query", reads=len(batch))
            return self._queries.result(query, batch, last, more, compiled)
        with self._snapshot(txn) as conn:
            batch, last, more = self._queries.batch(conn, query, compiled)
        for row in batch:
            key = row.doc.entity.key
            assert key is not None  # a stored entity always has its key
            txn.saw(row.doc.key_enc, row.doc.version, key)
        if not txn.read_only:  # checked again at commit: a phantom changes the answer
            txn.queries.append((query, answer(batch, last, more)))
        self._record("run_query", reads=len(batch))
        return self._queries.result(query, batch, last, more, compiled)

    def _read_batch(self, query: Query, compiled: Compiled) -> BatchRead:
        with self._db() as conn:
            return self._queries.batch(conn, query, compiled)

    def explain_query(self, query: Query) -> str:
        """SQLite's plan for the SQL a query runs, so a workshop (and the
        index test) can see that a filter reads an index, not the whole kind."""
        query = resolved(query, self._own_project())
        with self._db() as conn:
            return explain(conn, query)

    # -- writes --------------------------------------------------------------

    def _allocate_ids(self, keys: list[Key]) -> list[Key]:
        check_home(keys, self._own_project(), "allocate ids for")  # another project's ids are not its own
        with self._db() as conn:
            ids = allocate(conn, len(keys))
        self._record("allocate_ids")
        return [key.completed(new_id) for key, new_id in zip(keys, ids)]

    def _reserve_ids(self, keys: list[Key]) -> None:
        check_home(keys, self._own_project(), "reserve ids for")
        with self._db() as conn, self._pool.write_lock, write_transaction(conn, conn.busy_timeout):  # (as _apply)
            reserve(conn, (key.id for key in keys if key.id is not None))
            conn.execute(self._pool.commit_statement(conn))
        self._record("reserve_ids")

    def _commit(self, mutations: list[Mutation], txn: Transaction | None) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
        check_home_mutations(mutations, self._own_project())
        try:
            if txn is not None and not mutations:
                results = []  # nothing to write: what it read was one snapshot, so nothing to check
            else:
                results = self._apply(mutations, txn)
        except Contention as exc:
            log.debug("commit aborted: %s", exc)
            self._record("commit")  # an aborted commit is still an RPC
            self.stats.bump("aborts")
            raise
        finally:
            if txn is not None:
                self._end(txn)
        upserts = len([m for m in mutations if isinstance(m, Upsert)])
        self._record("commit", writes=upserts, deletes=len(mutations) - upserts)
        return results

    def _apply(self, mutations: list[Mutation], txn: Transaction | None) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
        self._pool.let_a_fork_pass()  # before the write lock, which a writer in a loop would keep
        if txn is None and self.path is not None:
            results: list[tuple[Key | None, tuple[Any, ...] | None]] = self._group.commit(
                mutations, self._pool.write_lock, self._write_group, for_another,
                wait_s=deadlines.remaining(DEFAULT_WAIT_S),
            )
            return results
        held = txn.conn if txn is not None else None
        with HeldLease(self._pool, held) if held is not None else self._db() as conn:
            if held is not None and conn.in_transaction:
                conn.execute("ROLLBACK")  # end the snapshot: the write lock needs the newest data
            elif self.path is None:
                self._freeze_pinned(conn, txn)
            # This process's writers queue on a lock, each woken as the one
            # before commits, rather than in SQLite's busy handler, which
            # sleeps up to 100 ms between polls (16 writers: p99 0.4 s, was).
            # Other processes still meet there.
            with self._pool.write_lock:
                return self._write(conn, mutations, txn)
