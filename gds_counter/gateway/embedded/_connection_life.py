"""How a pooled connection ends, and what a fork does to a pool: the part of
``_connections`` that is about a connection's life after it is opened rather
than about lending it (``ConnectionPool`` is this class and the lending).
Apart, because lending is the hot path every call runs, while this runs when
something ends: a transaction's snapshot, the gateway, the process's
ownership of its connections at a fork. Each rule comes from a failure seen
in practice:

* **No connection crosses a fork.** SQLite keeps its POSIX lock bookkeeping
  in process memory. A child inherits that bookkeeping but not the locks, so
  its connections, old or new, hold no lock the parent can see: a parent
  that then closes its gateway (or exits) believes it is the last user,
  checkpoints and deletes the ``-wal`` file while the child still commits
  into it. So, through ``_process.forks``, every pool waits for the
  calls in progress and closes its connections in the parent just before
  ``fork()`` (never in the child, where closing one could release the
  parent's locks); parent and child each open new ones on first use. A child
  forked while a call was in progress, or by a fork that ran no Python hooks
  while connections were open, is refused with ``GatewayError`` rather than
  allowed to write, and the connections it inherited are never closed.
* **A commit checks its file.** Before ``COMMIT`` the path must still name
  the file the gateway opened, and the ``-wal`` file must still be the one
  the connection writes into; otherwise the commit is rolled back and
  raised, instead of being acknowledged into a file no one will read.
* **Closing** closes the idle connections now and the lent ones when their
  calls end; a transaction's snapshot that is ended under it raises
  ``Contention`` at its next call.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
import weakref

from gds_counter._process import forks, interrupts
from gds_counter.errors import GatewayError
from gds_counter.gateway.embedded._file_ids import FileId, file_id
from gds_counter.gateway.embedded._files import Connection, close_connection, file_gone

log = logging.getLogger("gds_counter.gateway.embedded")

#: How long a writer waits for another process's write lock before giving up
#: with Contention. Commits are short, so a long wait means real overload.
BUSY_TIMEOUT_S = 30.0

#: How long ``fork()`` waits for calls in progress to finish (each is bounded
#: by the busy timeout) before it gives the child a gateway that refuses work.
FORK_DRAIN_S = 2 * BUSY_TIMEOUT_S + 5


class ConnectionLife:
    """A pool's connections past their opening: rolled back, dropped,
    checked before a commit, closed, and left behind at a fork (the
    ``_process.forks`` hooks). ``ConnectionPool`` holds the state declared
    here and lends the connections."""

    path: str | None
    where: str
    _idle: list[Connection]
    _count: int
    _pid: forks.Owner
    _closed: bool
    _refused: str | None
    _file: FileId | None

    # -- the state of this process's threads (``_fresh_thread_state``) --------
    #: Taken directly on the hot path; waits go through ``_cond``. An RLock:
    #: it knows its owner, which ``_process.interrupts.locked`` asks after an interrupt.
    _lock: threading.RLock
    _cond: threading.Condition
    #: This process's write transactions, one at a time (EmbeddedGateway._apply);
    #: an RLock knows its owner (``interrupts.release_if_held``).
    write_lock: threading.RLock
    #: connection -> the thread using it, and the lease it is lent through
    #: (a lease that died without giving it back: ``_reclaim_lost``)
    _lent: dict[Connection, tuple[int, weakref.ref[object]]]
    #: connection -> the transaction holding it (see ``hold``), oldest first
    _held: dict[Connection, weakref.ref[object]]
    #: Connections whose transaction ended while a call on it still ran
    #: (``unhold``): that call's lease gives them back as it ends.
    _unheld: set[Connection]
    _opening: int  # connections being opened now, outside the lock
    _waiting: int  # threads waiting in _acquire
    _reclaimed: int  # connections ``_reclaim_lost`` took back, not yet logged
    _forking: bool
    #: Whether the fork in progress was made inside this pool's own code.
    _fork_inside: bool
    _fork_trouble: str | None  # why a child of the fork in progress must not write
    #: Cleared from just before a fork takes the pool's lock until the
    #: fork is done: new calls wait for it outside the lock. The lock is
    #: not fair, and a thread that calls in a tight loop took it back
    #: again and again before the forking thread woke (a fork took
    #: minutes behind a lone writer that no longer paused between calls).
    _no_fork_pending: threading.Event
    #: Per thread: whether it is opening a connection (outside the lock),
    #: so that a fork this very thread makes (from a signal's handler)
    #: does not wait for its own opening.
    _calling: threading.local

    def _fresh_thread_state(self) -> None:
        """Set up the state that belongs to this process's threads afresh:
        no lock held, nothing lent, held or being opened, no fork pending.
        The one place it is made, both when the pool is built and in a
        forked child (whose parent's other threads do not exist there), so
        that a new field cannot be forgotten in one of them."""
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self.write_lock = threading.RLock()
        self._lent = {}
        self._held = {}
        self._unheld = set()
        self._opening = self._waiting = self._reclaimed = 0
        self._forking = self._fork_inside = False
        self._fork_trouble = None
        self._no_fork_pending = threading.Event()
        self._no_fork_pending.set()
        self._calling = threading.local()

    def _reclaim_lost(self) -> bool:
        """The pool's (``ConnectionPool._reclaim_lost``): a fork takes back lost leases first."""
        raise NotImplementedError

    def _drop(self, conn: Connection, why: str) -> None:
        conn.dropped = why
        self._count -= 1
        close_connection(conn)
        self._cond.notify_all()

    def _check_usable(self) -> None:
        """Raise when this process may not use the pool (called under the lock)."""
        if self._closed:
            raise GatewayError(f"the embedded gateway on {self.where} is closed")
        self._notice_hookless_fork()
        if self._refused:
            raise GatewayError(self._refused)

    def _notice_hookless_fork(self) -> None:
        """After a fork that ran no Python at-fork hooks (a fork made in C;
        ``os.fork`` always runs them), refuse the file if connections to it
        were open: they are the parent's (called under the lock)."""
        if not forks.owned_here(self._pid):
            pid = forks.here()
            if self.path is None:
                for conn in self._idle:
                    conn.pid = pid  # the child's own copy of the memory
            elif self._count:
                self._refused = (
                    f"this process (pid {pid}) inherited open connections to {self.path} from process "
                    f"{self._pid} through a fork that ran no Python at-fork hooks; SQLite cannot be used "
                    "safely on both sides of such a fork: open the database in a process started without it"
                )
                forks.abandon(*self._idle)
                self._idle.clear()
            self._pid = pid

    @staticmethod
    def _rolled_back(conn: Connection) -> bool:
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")
        return not conn.in_transaction

    # -- checks --------------------------------------------------------------

    def check_file(self, conn: Connection) -> None:
        """Raise GatewayError unless a commit on ``conn`` would land in the
        file the path names; called inside the write transaction, just
        before ``COMMIT``."""
        if self.path is None:
            return
        found = file_id(self.path)
        if found != self._file:
            raise GatewayError(file_gone(self.path, found, "this commit was not written, as no one could ever read it"))
        if conn.wal_path is not None and file_id(conn.wal_path) != conn.wal:
            raise GatewayError(
                f"{conn.wal_path}, the write-ahead log this connection commits into, was deleted or replaced by "
                "another connection (was the database opened across a fork?); this commit was not written"
            )

    def commit_statement(self, conn: Connection) -> str:
        """``"COMMIT"``, for ``conn`` to run at once (on the same line:
        nothing between the check and the commit). In a child that this
        thread forked inside the write transaction (a signal's handler),
        GatewayError instead: the child's copy of the transaction would be
        written into the same log at the same place as the parent's, and
        the parent's commit, acknowledged, was lost."""
        if not forks.owned_here(conn.pid):
            raise GatewayError(
                f"this process (pid {forks.here()}) was forked in the middle of a commit on {self.where}; "
                "the parent goes on with it, and this copy of it was not written"
            )
        return "COMMIT"

    # -- ending --------------------------------------------------------------

    def close(self) -> None:
        """Close the idle connections (and those that open transactions hold
        between calls) now, and the lent ones when their calls end."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._close_unused(f"the embedded gateway on {self.where} was closed")
            self._cond.notify_all()
        forks.forget(self)

    # -- fork ----------------------------------------------------------------

    def _before_fork(self) -> None:
        """In the parent, just before fork(): wait for calls in progress,
        close every connection, and keep the lock until the fork is done.

        A fork this thread makes from inside a call on this pool (a signal's
        handler runs between any two lines) cannot wait for that call: the
        child is refused the file instead. When the call was inside the
        pool's own code (its lock held), the pool's state is half changed,
        so nothing of it is touched either.

        The wait for other threads' calls lasts as long as they do (each is
        bounded by its deadline, at most ``FORK_DRAIN_S``). An interrupt
        (Ctrl-C) ends the wait: the fork goes on, its child is refused the
        file, and the interrupt is raised in the parent after the fork
        (``_process.forks``), where Python would have ignored it."""
        self._no_fork_pending.clear()  # new calls wait outside the lock: this thread gets it
        inside = self._lock._is_owned()  # type: ignore[attr-defined]
        self._lock.acquire()
        self._fork_trouble = None
        if self._closed:
            return
        if inside:
            self._fork_trouble = "the process forked in the middle of a call on it"
            self._fork_inside = True
            return
        self._notice_hookless_fork()
        self._reclaim_lost()
        interrupted: BaseException | None = None
        if getattr(self._calling, "opening", False) or threading.get_ident() in (
            thread for thread, _ in self._lent.values()
        ):
            self._fork_trouble = "the process forked in the middle of a call on it"
        else:
            self._forking = True
            deadline = time.monotonic() + FORK_DRAIN_S
            self._waiting += 1  # so that each call that ends wakes this thread
            try:
                while (self._lent or self._opening) and (left := deadline - time.monotonic()) > 0:
                    self._cond.wait(left)
            except BaseException as exc:  # noqa: B902  (Ctrl-C while the fork waits: it stops waiting)
                interrupted = exc
                with contextlib.suppress(BaseException):
                    interrupts.own_again(self._lock)  # (the wait's own re-take can be cut short)
            finally:
                self._waiting -= 1
            if self._lent or self._opening:
                self._fork_trouble = (
                    "the process forked while another thread was in a call on it (the fork's wait for that call "
                    "was interrupted)" if interrupted is not None else
                    f"the process forked while another thread had been in a call on it for {FORK_DRAIN_S:.0f} s"
                )
        if self.path is not None:
            self._close_unused("the process forked while this transaction was open, which ends its snapshot; retry it")
        if interrupted is not None:
            raise interrupted  # (``_process.forks`` raises it again once the fork is done)

    def _close_unused(self, why: str) -> None:
        """Close every idle connection, and drop those held for transactions
        but not in a call now (``why`` is what their transactions are told);
        under the lock."""
        for conn in self._idle:
            close_connection(conn)
        self._count -= len(self._idle)
        self._idle.clear()
        for conn in [c for c in self._held if c not in self._lent]:
            del self._held[conn]
            self._drop(conn, why)

    def _after_fork_in_parent(self) -> None:
        self._forking = self._fork_inside = False
        self._fork_trouble = None
        self._cond.notify_all()
        self._lock.release()
        self._no_fork_pending.set()

    def _after_fork_in_child(self) -> None:
        trouble, inside = self._fork_trouble, self._fork_inside
        lent, held = list(self._lent), list(self._held)  # (none, unless a call was in progress at the fork)
        self._fresh_thread_state()  # the parent's other threads do not exist here
        if self._closed or forks.owned_here(self._pid):
            return
        forks.abandon(*lent)  # the parent's, in use at the fork: never closed here
        forks.abandon(*(c for c in held if c not in lent))
        self._pid = forks.here()
        if self.path is None:
            for conn in self._idle:
                conn.pid = self._pid  # the child's own copy of the memory
        else:
            self._count = 0  # the idle ones were closed before the fork
            forks.abandon(*self._idle)  # (none, unless the file was refused already, or the fork was inside)
            if not inside:  # else the call under way in this thread is part way through the list: it finds
                self._idle.clear()  # the parent's connection, which Lease refuses, as ``_refused`` refuses the rest
        if trouble is not None:
            self._refused = (
                f"{self.where} cannot be used in this process (pid {self._pid}): {trouble}, so its SQLite "
                "state was copied mid-call; open the database in a process started without such a fork"
            )
