"""Group commit: one process's concurrent non-transactional commits to a
file, written in one SQLite transaction.

A commit to a file waits for its fsync (``synchronous = FULL``), and this
process's writers take the write lock one at a time. So while one commit
holds the lock, the others queue behind it; the writer that gets the lock
next writes every commit queued by then, each in its own savepoint, in one
transaction with one fsync, and answers each. That is what databases call
group commit. Every commit keeps its meaning:

* **Atomic and isolated on its own**: each runs in a savepoint, in arrival
  order, with its own commit number (entity versions), exactly as if it had
  committed alone at that point of the order. One that raises (a bad value,
  an overflow, the write-rate model's Contention) is rolled back to its
  savepoint and raised to its own caller only.
* **Acknowledged only when durable**: every caller returns after the
  transaction's ``COMMIT`` (and its fsync) returned; if the transaction
  fails, nothing in it was written and every caller in it raises.

Transactions (which hold a snapshot and are validated) and in-memory
databases (no fsync to share) commit alone.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

__all__ = ["GroupCommit", "Request"]


class Request:
    """One caller's commit: its mutations, then its results or error.

    ``woken`` is a lock taken from the start and released when the request
    is done, or when its caller is to write next: the caller waits by
    acquiring it. (A ``threading.Event`` builds a Condition per commit and
    notifies through it, a measurable share of a commit's CPU.) It is
    released at most once per wait: a caller woken to write goes on to
    write its own request, and ``GroupCommit._write`` releases each written
    request once, after its caller took the lock back or never waited."""

    __slots__ = ("mutations", "done", "results", "error", "woken")

    def __init__(self, mutations: Any) -> None:
        self.mutations = mutations
        self.done = False
        self.results: Any = None
        self.error: BaseException | None = None
        self.woken = threading.Lock()
        self.woken.acquire()


class GroupCommit:
    """The commits queued for one file's write lock (see the module
    docstring). Safe across ``fork()``: a child starts with an empty queue.

    One caller at a time is the writer; the others wait on their own event,
    not on the write lock. A writer that is done wakes the callers it wrote
    and hands the writing to the first caller still queued. (When every
    caller queued on the write lock, the ones already written took it one
    by one just to see that they were done, each behind the next group's
    whole transaction.)"""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._queue: list[Request] = []
        self._writing = False

    def commit(
        self,
        mutations: Any,
        write_lock: threading.Lock,
        write: Callable[[Callable[[], list[Request]]], None],
        failed: Callable[[BaseException], BaseException],
    ) -> Any:
        """Queue ``mutations``; unless a writer before has already written
        them, become the writer and, under ``write_lock``, ``write(take)``:
        ``take()`` hands it every request queued by then (the writer calls
        it once it holds the file's lock), and it sets each one's results
        once committed, or its own error. When ``write`` raises (nothing
        was written), this caller raises that and every other caller in the
        batch ``failed(that)``, an error of its own. Returns this one's
        results or raises its error."""
        if self._pid != os.getpid():
            self._reset()
        request = Request(mutations)
        with self._lock:
            self._queue.append(request)
            writes = not self._writing
            self._writing = True
        if not writes:
            request.woken.acquire()
        if not request.done:
            self._write(request, write_lock, write, failed)
        if request.error is not None:
            raise request.error
        return request.results

    def _take(self) -> list[Request]:
        with self._lock:
            batch, self._queue = self._queue, []
        return batch

    def _write(
        self,
        request: Request,
        write_lock: threading.Lock,
        write: Callable[[Callable[[], list[Request]]], None],
        failed: Callable[[BaseException], BaseException],
    ) -> None:
        batch: list[Request] = []

        def take() -> list[Request]:
            batch[:] = self._take()
            return batch

        try:
            with write_lock:
                try:
                    write(take)
                except BaseException as exc:
                    if not batch:  # failed before taking (the file stayed locked): so do the queued ones
                        take()
                    for queued in batch:
                        if queued is not request and queued.error is None:
                            queued.error = failed(exc)
                    raise
        finally:
            with self._lock:
                for queued in batch:
                    queued.done = True
                    queued.woken.release()
                if self._queue:
                    self._queue[0].woken.release()  # the next writer
                else:
                    self._writing = False
