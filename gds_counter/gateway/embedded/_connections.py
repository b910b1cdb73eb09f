"""The embedded engine's connection pool: how a connection is opened and lent
to a call or held for a transaction, and how SQLite's failures become
gds_counter errors naming the file.

Each rule comes from a failure seen in practice (see the README's
Reliability section):

* **One path.** The gateway makes its path absolute once, when it is built,
  so a later ``os.chdir`` cannot send new connections to another file.
* **A bounded pool, not a connection per thread.** A call borrows a
  connection and gives it back, so a thousand short-lived threads use no
  more connections (two file descriptors each) than ever run at once, and
  never more than ``POOL_SIZE``: a call that finds them all lent waits.
* **Open by reading first.** The schema is created only when it is missing
  (in one transaction) and WAL switched on only when it is not on already,
  so a read-only file, or a reader that arrives while a writer holds the
  lock, opens without writing; all of it inside the error translation.
* **Every failure is a GDSError that names the path**, with the reason where
  it can be told: a directory, a missing or non-directory parent, not a
  database, deleted while open.
* **A transaction holds a connection for its snapshot** (a WAL read
  transaction) from its first read to its end. At most ``POOL_SIZE -
  RESERVED_FOR_CALLS`` do at once; beyond that one waits ``HOLD_WAIT_S``,
  then ends the oldest one's snapshot (a dropped one's first). A fork closes
  them with the idle ones. Either way that transaction raises ``Contention``.
* **A connection's life past its opening** (rolled back, dropped, checked
  before a commit, closed, and never carried across a fork) is
  ``_connection_life``'s, the base of ``ConnectionPool``: this module lends.
"""

from __future__ import annotations

import gc
import logging
import sqlite3
import threading
import time
import weakref
from types import TracebackType

from gds_counter._process import deadlines, forks
from gds_counter._process.interrupts import locked, own_again, release_if_held, surely
from gds_counter.errors import Contention, GatewayError
from gds_counter.gateway.embedded._connection_life import BUSY_TIMEOUT_S, ConnectionLife
from gds_counter.gateway.embedded._file_ids import FileId
from gds_counter.gateway.embedded._files import (
    Connection,
    close_connection,
    open_connection,
    translate,
)

log = logging.getLogger("gds_counter.gateway.embedded")

#: Connections one file gateway keeps at most (each holds two descriptors).
POOL_SIZE = 32

#: Connections kept for plain calls: open transactions hold at most the rest.
RESERVED_FOR_CALLS = 4

#: How long a transaction waits for a connection to hold when as many
#: transactions as allowed hold one, before it takes the oldest one's.
HOLD_WAIT_S = 2.0

#: How long a call waits at most for a connection when every one is lent
#: (less when its deadline comes sooner: ``_process.deadlines``); each
#: lender is bounded by the busy timeout, a memory database's lone
#: connection by the calls queued before it.
LEND_WAIT_S = 2 * BUSY_TIMEOUT_S + 15

#: A call waiting for a connection looks this often for one lost by a
#: lease that no longer exists (``_reclaim_lost``): nothing wakes it when
#: the garbage collector takes such a lease.
RECLAIM_SLICE_S = 0.5


class ConnectionPool(ConnectionLife):
    """The connections of one embedded gateway; see the module docstring.

    ``path`` None is an in-memory database, which lives in its one
    connection: the pool then lends that connection to one call at a time
    and keeps it across a fork (the child gets its own copy of the memory).
    """

    def __init__(self, path: str | None, *, read_only: bool = False, size: int = POOL_SIZE) -> None:
        self.path = path
        self.read_only = read_only
        self.where = path or "memory"
        self._size = 1 if path is None else size
        self._fresh_thread_state()
        self._idle: list[Connection] = []
        #: Connections closed or abandoned on their way back (``_put_back``):
        #: never counted twice, never lent again.
        self._retired: "weakref.WeakSet[Connection]" = weakref.WeakSet()
        self._held_cap = max(1, self._size - RESERVED_FOR_CALLS)
        self._count = 0  # connections that exist for this process: idle, lent, being opened
        self._pid = forks.here()
        self._closed = False
        self._refused: str | None = None  # why this process must not use the file at all
        self._file: FileId | None = None  # the file the gateway opened, once it is open
        # Registered before the first connection is opened, so that a fork
        # in another thread meanwhile waits for it.
        self._calling.opening = True
        self._count = self._opening = 1
        forks.register(self)
        try:
            first = self._connect(create=True)
        except BaseException:
            with self._lock:
                self._closed = True
                self._count = self._opening = 0
                self._cond.notify_all()
            self._calling.opening = False
            forks.forget(self)
            raise
        with self._lock:
            self._opening = 0
            self._idle.append(first)
            self._cond.notify_all()
        self._calling.opening = False

    # -- opening -----------------------------------------------------------

    def _connect(self, *, create: bool) -> Connection:
        """A new connection, ready to use, to the very file first opened;
        none in a child this thread forked while about to open it (a
        signal's handler): SQLite's own locks may be held there by the
        parent's threads, which the child does not have, for ever."""
        if self._refused:
            raise GatewayError(self._refused)
        # In memory no other connection can hold a lock: no busy handler (``write_transaction``).
        conn, found = open_connection(
            self.path, read_only=self.read_only, create=create, known=self._file,
            busy_timeout=BUSY_TIMEOUT_S if self.path is not None else 0.0,
        )
        if self._file is None:
            self._file = found
        return conn

    # -- lending -----------------------------------------------------------

    def connection(self) -> Lease:
        """A connection for one call (``with pool.connection() as conn:``),
        with SQLite errors turned into ours."""
        return Lease(self)

    def let_a_fork_pass(self) -> None:
        """Before a call takes the pool's lock or the write lock: while a
        fork is pending, wait for it outside both (bounded by the call's
        deadline), so that the forking thread gets them. A holder of the
        write lock passes, as it passes ``_forking``: the fork waits for its
        call in progress."""
        if not self._no_fork_pending.is_set() and not self.write_lock._is_owned():  # type: ignore[attr-defined]
            self._no_fork_pending.wait(deadlines.remaining(LEND_WAIT_S))

    def _acquire(self, owner: object | None = None, into: "Lease | None" = None, collected: bool = False) -> Connection:
        """A connection lent to this thread (or held for ``owner``). An
        interrupt at any line gives back what was taken (a connection, or
        the place reserved to open one): a place lost shrinks the pool for
        good, and a stuck ``_opening`` makes every later fork refuse its child.
        ``OwnLeaseKept`` (unless ``collected``): every connection is lent,
        one of them to this thread; the caller collects garbage, outside the
        lock, and asks again (see ``OwnLeaseKept``)."""
        me = threading.get_ident()
        conn: Connection | None = None
        reserved = opened = False
        self.let_a_fork_pass()
        try:
            with self._lock:
                if owner is None and self._idle and forks.owned_here(self._pid) and not (
                    self._forking or self._closed or self._refused
                ):
                    # No call between taking it and lending it: an interrupt (a
                    # signal's handler runs after a call returns) cannot lose it.
                    conn = self._idle[-1]  # the usual case, checked by the loop below otherwise
                    del self._idle[-1]
                    self._lent[conn] = (me, weakref.ref(into))
                    if into is not None:
                        into._conn = conn  # before returning: see Lease.__enter__
                    return conn
                deadline: float | None = None
                until: float | None = None
                while True:
                    self._check_usable()
                    if self._forking and not self.write_lock._is_owned():  # type: ignore[attr-defined]  # holder passes: docs/reliability.md
                        self._wait()
                    elif owner is not None and not self._reclaim_forgotten():
                        deadline = deadline or time.monotonic() + HOLD_WAIT_S
                        if time.monotonic() < deadline or not self._evict_oldest():
                            self._wait(max(deadline - time.monotonic(), 0.01))
                    elif self._idle:
                        conn = self._idle[-1]  # no call in between: see above
                        del self._idle[-1]
                        break
                    elif self._count < self._size:
                        # A fork waits for ``_opening`` too (opening runs inside SQLite),
                        # unless this thread forks: it says so first.
                        self._calling.opening = True
                        self._count, self._opening, reserved = self._count + 1, self._opening + 1, True
                        break
                    elif not self._reclaim_lost():
                        if not collected and any(thread == me for thread, _ in self._lent.values()):
                            raise OwnLeaseKept(self.where)  # (nothing taken yet: nothing to give back)
                        until = until or time.monotonic() + deadlines.remaining(LEND_WAIT_S)
                        if (left := until - time.monotonic()) <= 0:
                            raise Contention(
                                f"every connection to {self.where} ({self._size}) stayed in use by other calls "
                                "until this call's deadline; nothing was written", attempts=1,
                            )
                        self._wait(min(left, RECLAIM_SLICE_S))
                if conn is not None:
                    self._take(conn, owner, me, into)
                    if into is not None:
                        into._conn = conn
                    return conn
            conn, opened = self._connect(create=False), True
            with self._lock:
                if self._refused:  # this thread forked while it opened (a signal's handler): refused in the
                    forks.abandon(conn)  # child, whose SQLite state is the parent's, copied mid-call: never closed
                    conn = None
                    raise GatewayError(self._refused)
                self._opening, reserved = self._opening - 1, False
                self._take(conn, owner, me, into)
                if into is not None:
                    into._conn = conn
                self._cond.notify_all()
            self._calling.opening = False
            return conn
        except BaseException:
            self._give_back(conn, owner, reserved, opened)
            self._calling.opening = False
            raise

    def _give_back(self, conn: Connection | None, owner: object | None, reserved: bool, opened: bool) -> None:
        """Undo an ``_acquire`` an exception ended, under the lock however taken."""
        with locked(self._lock):
            if self._refused:  # a place reserved before the fork that refused this process (this thread
                reserved = False  # forked, from a signal's handler): the child's counts started without it
            if reserved:
                self._opening -= 1
            if conn is not None:
                # The caller never got it (``_acquire`` raised), lent or not.
                self._lent.pop(conn, None)
                if owner is not None:
                    self._held.pop(conn, None)
                if opened and (self._closed or not forks.owned_here(self._pid)):
                    self._count -= 1
                    close_connection(conn)
                elif conn not in self._idle:  # (interrupted before it was taken out of the idle list)
                    self._idle.append(conn)
                reserved = False
            if reserved:
                self._count -= 1
            self._cond.notify_all()

    def _take(self, conn: Connection, owner: object | None, me: int, into: object) -> None:
        if owner is None:
            self._lent[conn] = (me, weakref.ref(into))
        else:
            self._held[conn] = weakref.ref(owner)

    def _wait(self, timeout: float | None = None) -> None:
        """Wait for a connection to come back, or for a fork to finish (under the lock)."""
        self._waiting += 1
        try:
            self._cond.wait(timeout)
        finally:
            own_again(self._lock)
            self._waiting -= 1

    def hold(self, owner: object) -> Connection:
        """A connection for the transaction ``owner`` until ``unhold``; each
        call on it goes through ``HeldLease``. File pools only."""
        assert self.path is not None
        try:
            return self._acquire(owner)
        except OwnLeaseKept:
            gc.collect()
            return self._acquire(owner, collected=True)

    def unhold(self, conn: Connection) -> None:
        """The transaction holding ``conn`` ended: its snapshot is rolled
        back and the connection goes back to the pool; at the end of the
        call on it that still runs, if one does. (An asyncio task cancelled
        during its transaction's read rolls the transaction back while the
        read goes on in a worker thread: given back at once, the connection
        was lent to another call while the read began its snapshot on it,
        and every write on it then failed, "cannot start a transaction
        within a transaction".)"""
        with self._lock:
            if self._held.pop(conn, None) is None:
                return  # taken already (evicted, closed at a fork): not counted any more
            lent = self._lent.get(conn)
            if lent is not None and lent[1]() is not None:
                self._unheld.add(conn)  # ``HeldLease._give_back`` gives it back
                return
            self._lent.pop(conn, None)  # (a lease that died with it: nothing runs on it)
        _surely_release(self, conn)

    def _reclaim_lost(self) -> bool:
        """Take back the connections lent through a lease that no longer
        exists (under the lock); whether one was. A lease gives its
        connection back as its ``with`` block exits, but an interrupt that
        lands as the block is entered (bpo-29988) skips the exit, and one
        that lands on each try of the release gives up: the connection then
        stayed lent to no one, and a memory pool, which has one, waited for
        it for ever. Once the lease is gone nobody can use the connection
        any more, so it goes back, its unfinished transaction rolled back
        (nothing of it was acknowledged: ``COMMIT`` had not returned)."""
        lost = [conn for conn, (_, lease) in self._lent.items() if lease() is None]
        for conn in lost:
            # Logged later, outside the lock (``Lease.__enter__``): a logging
            # handler's lock that an interrupt left held would hold this one too.
            self._reclaimed += 1
            # Out of ``_lent`` only once it is somewhere else: an interrupt
            # on the way leaves it lent to no one, to be taken back again.
            self._unheld.discard(conn)  # (its transaction ended during the lost call: given back here)
            if conn not in self._held:  # (else its transaction still holds it)
                if forks.owned_here(conn.pid) and not self._closed and (self._rolled_back(conn) or self.path is None):
                    if conn not in self._idle:  # (a memory database lives in its connection: never dropped)
                        self._idle.append(conn)
                elif conn.dropped is None:
                    self._drop(conn, "a call lost it to an interrupt")
            del self._lent[conn]
        return bool(lost)

    def _log_reclaimed(self) -> None:
        count, self._reclaimed = self._reclaimed, 0
        log.warning("%d call(s) on %s ended without giving their connection back (interrupted); taken back", count, self.where)

    def _reclaim_forgotten(self) -> bool:
        """Give back the connections of transactions no one references any
        more (a token dropped without an end); whether one may now be held."""
        for conn, owner in list(self._held.items()):
            if owner() is None and conn not in self._lent:
                del self._held[conn]
                if forks.owned_here(conn.pid) and not self._closed and self._rolled_back(conn):
                    self._idle.append(conn)
                else:
                    self._drop(conn, "its transaction was forgotten")
        return len(self._held) < self._held_cap

    def _evict_oldest(self) -> bool:
        """End the snapshot of the oldest open transaction not in a call."""
        for conn in self._held:
            if conn not in self._lent:
                del self._held[conn]
                self._drop(conn, f"over {self._held_cap} transactions were open at once; this was the oldest")
                log.warning("ended the oldest open transaction's snapshot on %s: over %d open at once", self.where, self._held_cap)
                return True
        return False

    def _release(self, conn: Connection) -> None:
        """Give ``conn`` back: one try, which ``_surely_release`` repeats
        when an interrupt cuts it short (``locked`` takes the lock even if
        one lands while waiting; ``_put_back`` may run again)."""
        with locked(self._lock):
            self._put_back(conn)

    def _put_back(self, conn: Connection) -> None:
        """``_release`` under the lock: into ``_idle``, or closed and no
        longer counted, or abandoned (a parent's), once however often it
        runs; only then out of ``_lent``."""
        if conn not in self._idle and conn not in self._retired:
            if not forks.owned_here(conn.pid):
                forks.abandon(conn)  # a parent's connection: never closed here
                self._retired.add(conn)
            elif self._closed or (conn.in_transaction and not self._rolled_back(conn) and self.path is not None):
                # Closed under the lock, so that a fork never copies a close half done.
                close_connection(conn)
                self._retired.add(conn)
                self._count -= 1
            else:
                self._idle.append(conn)
        self._lent.pop(conn, None)
        if self._waiting:
            self._cond.notify_all()


class OwnLeaseKept(Exception):
    """Every connection of the pool is lent, one of them to the thread
    asking. That lease may be one this thread left, kept alive only by a
    reference cycle: an interrupt in its ``__exit__`` before the connection
    went back, whose traceback holds its frames, which hold the lease.
    ``_reclaim_lost`` takes a connection back only once its lease is gone,
    so on ``memory://`` (one connection) the thread's next call waited for
    the garbage collector, or 30 s, then raised ``Contention`` (the fresh
    user's SIGALRM run: at its 472nd interrupt). So the caller collects
    garbage once, outside the pool's lock (a finalizer may take other
    locks), and asks again; a lease still in use stays its caller's."""


class HeldLease:
    """One call on a transaction's connection (``ConnectionPool.hold``), lent
    like any other (a fork waits for it); Contention if it was taken away."""

    __slots__ = ("_pool", "_conn", "__weakref__")

    def __init__(self, pool: ConnectionPool, conn: Connection) -> None:
        self._pool, self._conn = pool, conn

    def __enter__(self) -> Connection:
        pool, conn = self._pool, self._conn
        try:
            return self._lend(pool, conn)
        except BaseException:
            release_if_held(pool._lock)  # (as in Lease.__enter__)
            if (lent := pool._lent.get(conn)) is not None and lent[1]() is self:  # interrupted as ``_lend`` returned
                self._give_back()
            raise

    def _lend(self, pool: ConnectionPool, conn: Connection) -> Connection:
        with pool._lock:
            while True:
                pool._check_usable()
                if conn.dropped is not None:
                    raise Contention(f"this transaction lost its snapshot: {conn.dropped}", attempts=1)
                if pool._forking or (conn in pool._lent and not pool._reclaim_lost()):
                    pool._wait()
                    continue
                pool._lent[conn] = (threading.get_ident(), weakref.ref(self))
                return conn

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._give_back()
        if isinstance(exc, sqlite3.Error):
            raise translate(exc, self._pool.where) from exc

    def _give_back(self) -> None:
        pool, conn = self._pool, self._conn
        try:
            with locked(pool._lock):
                if conn in pool._unheld:  # its transaction ended during this call (``unhold``)
                    pool._put_back(conn)  # rolled back, into the pool; out of ``_lent``
                    pool._unheld.discard(conn)
                pool._lent.pop(conn, None)
                if pool._waiting:
                    pool._cond.notify_all()
        finally:
            release_if_held(pool._lock)  # (as in Lease.__enter__)


class Lease:
    """One call's use of a pooled connection (not ``contextlib``: every read pays for it)."""

    __slots__ = ("_pool", "_conn", "__weakref__")

    def __init__(self, pool: ConnectionPool) -> None:
        self._pool = pool

    def __enter__(self) -> Connection:
        # ``_acquire`` records the connection here before it returns: an
        # interrupt as it returns (where a signal's handler runs) would
        # otherwise leave the connection lent to no one, for good.
        # All of it in the ``try``: an interrupt after ``_acquire`` skips ``__exit__``, and a kept
        # traceback (a REPL's ``sys.last_traceback``) keeps the lease alive for ``_reclaim_lost``.
        self._conn: Connection | None = None
        try:
            try:
                conn = self._pool._acquire(into=self)
            except OwnLeaseKept:
                gc.collect()
                conn = self._pool._acquire(into=self, collected=True)
            if not forks.owned_here(conn.pid):  # lent by a call this thread forked inside (a signal's handler)
                self._pool._check_usable()  # the child is refused the file
            if self._pool._reclaimed:
                self._pool._log_reclaimed()
            return conn
        except BaseException:
            # An interrupt that lands as a ``with pool._lock`` is entered can
            # leave the lock held (bpo-29988); nothing outside the pool holds it.
            release_if_held(self._pool._lock)
            if self._conn is not None:
                _surely_release(self._pool, self._conn)
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._conn is not None:
            _surely_release(self._pool, self._conn)
        if isinstance(exc, sqlite3.Error):
            raise translate(exc, self._pool.where) from exc


def _surely_release(pool: ConnectionPool, conn: Connection) -> None:
    """``pool._release(conn)`` carried to its end, even when interrupts land
    on the way into it, while waiting for the lock or half way (a connection
    left lent shrinks the pool until every call waits; a memory pool has
    one); then the first interrupt is raised."""
    pending = surely(lambda: pool._release(conn))
    release_if_held(pool._lock)  # (kept by an interrupt as a ``with`` took it: nothing outside the pool holds it)
    if pending is not None:
        raise pending
