"""``ForkSafePool``: the worker threads of the asyncio face, one set per process.

``ThreadedGateway`` runs the embedded engine's blocking calls in worker
threads. A plain ``concurrent.futures.ThreadPoolExecutor`` does not survive
``fork()``: the child inherits its bookkeeping but none of its threads. Its
idle count says a worker is ready, so a call submitted in the child waits in
the queue for ever (a gateway used once, then forked: the child's
``increment()`` timed out); and a lock another thread held at the fork stays
held in the child, so ``submit`` itself blocks the child's event loop, where
not even ``asyncio.wait_for`` can fire. Cancelling a call the parent had in
flight could block the same way, on the locks of its future.

So this pool keeps its executor per process. After a fork (a process id
check before the pool's lock is touched, which also covers forks that run
no Python hooks) the child starts with a fresh lock and no executor; the first call makes a new one. The
parent's executor, its queue and its futures are never touched in the child,
so work the parent had queued is never run twice: it is the parent's, and
only the parent's workers run it. (asyncio forgets the running loop in a
child, so no task of the parent's goes on in the child to wait for it.)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.thread  # now, not on first use: a fork then would find its import lock held
import threading
from typing import Any, Callable, TypeVar

from gds_counter._process import forks
from gds_counter.errors import GatewayError

__all__ = ["ForkSafePool"]

R = TypeVar("R")


def _copy_outcome(work: "concurrent.futures.Future[Any]", waiter: "asyncio.Future[Any]") -> None:
    """On the waiter's loop: hand the worker's outcome to the waiting task."""
    if waiter.done():  # cancelled meanwhile
        return
    if work.cancelled():
        waiter.cancel()
        return
    error = work.exception()
    if error is not None:
        waiter.set_exception(error)
    else:
        waiter.set_result(work.result())


class ForkSafePool:
    """At most ``max_workers`` blocking calls at once, awaited from any
    event loop; fresh threads, lock and queue in each process (see the
    module's notes). ``name`` says whose pool it is in error messages."""

    def __init__(self, max_workers: int, *, name: str, thread_name_prefix: str = "gds-aio") -> None:
        self.max_workers = max_workers
        self.name = name
        self._prefix = thread_name_prefix
        self._start_afresh()

    def _start_afresh(self) -> None:
        """This process's own state: nothing inherited is used again."""
        self._pid = forks.here()
        self._lock = threading.Lock()
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._closed = False

    def _current(self) -> concurrent.futures.ThreadPoolExecutor:
        """This process's executor, made on first use (under ``_lock``)."""
        if self._closed:
            raise GatewayError(f"{self.name} is closed; open a new gateway")
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(self.max_workers, thread_name_prefix=self._prefix)
        return self._executor

    async def run(self, function: Callable[[], R]) -> R:
        """``function()`` in a worker; its result or error. Cancelled before
        a worker took it, it never runs; after, it runs to its end (a thread
        cannot be stopped) and the caller is told ``CancelledError``."""
        if not forks.owned_here(self._pid):  # forked: never the parent's lock or executor
            self._after_fork()
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[R] = loop.create_future()
        with self._lock:
            work = self._current().submit(function)
        pid = self._pid

        def settle(done: "concurrent.futures.Future[Any]") -> None:  # in the worker (or here)
            try:
                loop.call_soon_threadsafe(_copy_outcome, done, waiter)
            except RuntimeError:  # the loop is closed: no one is waiting
                pass

        work.add_done_callback(settle)
        try:
            return await waiter
        except asyncio.CancelledError:
            if forks.owned_here(pid):  # never touch the parent's futures in a child
                work.cancel()
            raise

    def shutdown(self, wait: bool = True) -> None:
        """End this process's workers once their calls are done (waiting
        for that if ``wait``); later calls raise ``GatewayError``. An
        executor inherited from another process is left alone (its threads
        are not here)."""
        if not forks.owned_here(self._pid):
            self._after_fork()
        with self._lock:
            executor = self._executor
            self._executor, self._closed = None, True
        if executor is not None:
            executor.shutdown(wait=wait)

    def _after_fork(self) -> None:
        """In a child: start afresh. The parent's calls in flight stay the
        parent's: asyncio itself forgets the running loop in a child, so no
        task of the parent's goes on here to wait for them."""
        closed = self._closed
        self._start_afresh()
        self._closed = closed
