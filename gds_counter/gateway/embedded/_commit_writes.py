"""What a commit writes inside SQLite's write transaction, for
``EmbeddedGateway``: its transaction's reads validated (nothing it read
changed since its snapshot), a commit number taken and the mutations applied
(``_storage``'s rows), the teaching model of the entity write rate, and
``COMMIT`` with the truth about a failure (nothing written, or
``CommitUnknown``); several callers' commits in one transaction for the
group commit, each in a savepoint.

Apart from ``_engine``, which holds the gateway's hooks and decides *how* a
commit is written (alone under the process's write lock, or queued in the
group commit), because this is *what* is written once the write transaction
is begun, the same either way. It is a base class of ``EmbeddedGateway``
(whose state it declares) so that the gateway's hooks and these steps stay
one object.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any

from gds_counter.errors import AlreadyExists, CommitUnknown, Contention, GDSError, NotFound
from gds_counter.gateway.embedded._connections import Connection, ConnectionPool, Lease
from gds_counter.gateway.embedded._encoding import Decodings, key_bytes
from gds_counter.gateway.embedded._group_commit import Batch
from gds_counter.gateway.embedded._history import PRUNE_EVERY, history_kept, keep_deleted, prune
from gds_counter.gateway.embedded._query_batches import QueryBatches, answer
from gds_counter.gateway.embedded._storage import (
    Stopped,
    Transaction,
    allocate,
    check_exists,
    check_unchanged,
    commit_seq,
    stored_texts,
    upsert,
    upserted_keys,
    write_transaction,
)
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Mutation, Upsert
from gds_counter.gateway.stats import Stats

__all__ = ["CommitWrites"]


class CommitWrites:
    """A commit's steps inside the write transaction; ``EmbeddedGateway``
    is the one subclass and holds the state declared here."""

    path: str | None
    stats: Stats
    _pool: ConnectionPool
    _queries: QueryBatches
    _decodings: Decodings
    #: In memory: the last commit's number, known without asking (one connection).
    _memory_seq: int
    #: The entity write rate model's least gap between two writes (0: off).
    _min_write_gap: float

    def _db(self) -> Lease:
        """``EmbeddedGateway._db``: a connection for one call."""
        raise NotImplementedError

    def _write(
        self, conn: Connection, mutations: list[Mutation], txn: Transaction | None
    ) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
        """One write transaction: validate ``txn``'s reads, apply the
        mutations, commit (or roll back on any error)."""
        with write_transaction(conn, conn.busy_timeout):
            results, stopped = self._write_within(conn, mutations, txn)
        if stopped is not None:
            raise stopped
        return results

    def _write_within(
        self, conn: Connection, mutations: list[Mutation], txn: Transaction | None, batch: Batch | None = None
    ) -> tuple[list[tuple[Key | None, tuple[Any, ...] | None]], GDSError | None]:
        """``_write`` in the write transaction already begun on ``conn``: the
        results, and the error of a commit without a transaction that
        stopped part way (``Stopped``), raised once the part is committed."""
        stopped: GDSError | None = None
        try:
            seq, results = self._mutate(conn, mutations, txn)
        except Stopped as stop:
            seq, results, stopped = stop.seq, [], stop.error
        self._pool.check_file(conn)  # never acknowledge a commit into a deleted file
        self._commit_now(conn, batch)
        if self.path is None:
            self._memory_seq = seq
        return results, stopped

    def _commit_now(self, conn: Connection, batch: Batch | None) -> None:
        """``COMMIT``, with the truth about a failure: while SQLite keeps the
        transaction open, nothing was written (it is rolled back and the
        error raised as it is); once the transaction has ended without
        ``COMMIT`` returning, the data may be durable (an I/O error after
        the log was written, say), so ``CommitUnknown``, never an error that
        a retry would answer by counting it again. ``batch`` (the group
        commit's) records the same for the other callers."""
        if batch is not None:
            batch.sent = True
        try:
            conn.execute(self._pool.commit_statement(conn))  # (not in a child forked inside this transaction)
        except sqlite3.Error as exc:
            if conn.in_transaction:
                if batch is not None:
                    batch.sent = False
                raise
            raise CommitUnknown(
                f"COMMIT on {self._pool.where} failed after it began ({exc}); the commit may or may not be stored"
            ) from exc
        except BaseException:
            if batch is not None and conn.in_transaction:
                batch.sent = False  # interrupted before COMMIT ran: rolled back, nothing written
            raise
        if batch is not None:
            batch.durable = True

    def _write_group(self, take: Batch) -> None:
        """Several callers' commits in one write transaction (``_group_commit``):
        each in a savepoint, rolled back alone if it raises; results are
        handed out only once the transaction committed. The batch is taken
        (``take()``) once the file's write lock is held, so the commits that
        queued while another process held it join (4 processes x 4 threads:
        2 commits per transaction, each waiting 2 ms for the lock, was)."""
        with self._db() as conn, write_transaction(conn, conn.busy_timeout):
            batch = take()
            if len(batch) == 1:
                batch[0].results, batch[0].error = self._write_within(conn, batch[0].mutations, None, take)
                return
            stored = stored_texts(conn, upserted_keys(batch))
            # One commit number each, taken at once (a failed one leaves a gap).
            last = conn.execute("UPDATE meta SET value = value + ? WHERE name = 'commit_seq' RETURNING value", (len(batch),)).fetchall()[0][0]
            for seq, request in enumerate(batch, start=last - len(batch) + 1):
                # One mutation checks everything before it writes: nothing to undo.
                undo = len(request.mutations) > 1
                if undo:
                    conn.execute("SAVEPOINT one_commit")
                    before = dict(stored)
                try:
                    # Handed out only once COMMIT returned (GroupCommit).
                    request.results = self._mutate(conn, request.mutations, None, seq, stored)[1]
                except Stopped as stop:
                    request.error = stop.error  # the mutations before it stay written
                except sqlite3.Error:
                    raise  # the file, not this commit: the whole transaction fails
                except Exception as exc:
                    if undo:
                        conn.execute("ROLLBACK TO one_commit")
                        stored = before
                    request.error = exc
                if undo:
                    conn.execute("RELEASE one_commit")
            self._pool.check_file(conn)  # never acknowledge a commit into a deleted file
            self._commit_now(conn, take)
        self.stats.bump("grouped_commits", len(batch))
        self.stats.bump("group_transactions")

    def _mutate(
        self,
        conn: Connection,
        mutations: list[Mutation],
        txn: Transaction | None,
        seq: int | None = None,
        stored: dict[bytes, str | None] | None = None,
    ) -> tuple[int, list[tuple[Key | None, tuple[Any, ...] | None]]]:
        """Inside a write transaction: validate ``txn``'s reads, take a commit
        number (unless given one) and apply the mutations; the number and the
        results. A single mutation raises before it writes anything.
        ``stored``: what the rows of some keys hold, read ahead and kept up
        to date (``stored_texts``)."""
        if txn is not None and txn.seq is not None:
            self._validate(conn, txn)
        if seq is None and self.path is None:
            seq = self._memory_seq + 1  # (nothing reads the counter in memory's ``meta``: one connection knows it)
        elif seq is None:
            seq = conn.execute("UPDATE meta SET value = value + 1 WHERE name = 'commit_seq' RETURNING value").fetchall()[0][0]
        partial = len([m for m in mutations if isinstance(m, Upsert) and m.entity.key is not None and m.entity.key.is_partial])
        new_ids = iter(allocate(conn, partial) if partial else ())
        results: list[tuple[Key | None, tuple[Any, ...] | None]] = []
        now = time.time()
        kept: bool | None = None  # whether the database keeps history (``_history``), once asked
        if seq % PRUNE_EVERY == 0 and history_kept(conn):
            prune(conn, now)
        rate = self._min_write_gap
        for mutation in mutations:
            if isinstance(mutation, Delete):
                if rate:
                    self._check_write_rate(conn, mutation.key, now)
                kb = key_bytes(mutation.key)
                if kept is None:
                    kept = history_kept(conn)
                if kept:
                    keep_deleted(conn, kb, now)
                conn.execute("DELETE FROM entities WHERE key_bytes = ?", (kb,))
                conn.execute("DELETE FROM props WHERE key_bytes = ?", (kb,))
                if stored is not None:
                    stored[kb] = None
                results.append((mutation.key, None))
            else:
                key = mutation.entity.key
                assert key is not None  # checked by BaseGateway.commit
                key = key.completed(next(new_ids)) if key.is_partial else key
                written = len(results) if txn is None else 0  # (a transaction writes all or nothing)
                try:
                    check_exists(conn, mutation, key, stored, written)
                except (AlreadyExists, NotFound) as exc:
                    if not written:
                        raise
                    raise Stopped(exc, seq) from None
                if rate:
                    self._check_write_rate(conn, key, now)
                results.append(upsert(conn, mutation, key, seq, now, self._decodings, stored))
        return seq, results

    def _validate(self, conn: sqlite3.Connection, txn: Transaction) -> None:
        """Under the write lock: Contention unless what ``txn`` read in its
        snapshot is what it would read now (nothing committed since, or
        every entity and every query's answer unchanged)."""
        if (self._memory_seq if self.path is None else commit_seq(conn)) == txn.seq:
            return
        check_unchanged(conn, txn)
        for query, answered in txn.queries:
            if answer(*self._queries.batch(conn, query)) != answered:
                raise Contention(f"the results of a query on {query.kind!r} changed since this transaction ran it", attempts=1)

    def _check_write_rate(self, conn: sqlite3.Connection, key: Key, now: float) -> None:
        """The teaching model of the entity write rate (when it is on)."""
        row = conn.execute("SELECT written_at FROM entities WHERE key_bytes = ?", (key_bytes(key),)).fetchone()
        if row is not None and now - row[0] < self._min_write_gap:
            self.stats.bump("write_rate_aborts")
            raise Contention(f"{key} was written {now - row[0]:.3f}s ago; the model allows one write per {self._min_write_gap:.3f}s")

