"""Running a library's blocking call where no interrupt can land.

A signal's handler (Ctrl-C's ``KeyboardInterrupt``, or any exception a
handler raises) runs in the main thread only, between any two of its
bytecodes: inside a third-party client's code too, which is not written to
survive it (redis-py, interrupted in its reconnect while holding the
``logging`` module's lock, left that lock held for ever; interrupted in a
read, it handed a half-read connection to the next caller). So a call made
from the main thread is run by a worker thread of the owner (made at the
first such call, made again after a fork), and the main thread only waits
for it: an interrupt lands in the wait, and the call itself completes or
fails in the worker. Calls from other threads (a web server's request
threads) are made directly, at no cost.

No lock is taken on the main thread's side that an interrupt could leave
held: the jobs go through a ``queue.SimpleQueue`` (C code, no Python-level
lock), and each job tells it is done by releasing a lock of its own that
only its caller waits on.
"""

from __future__ import annotations

import queue
import threading
import weakref
from typing import Any, Callable, TypeVar

__all__ = ["OffMain"]

T = TypeVar("T")


class _Job:
    """One call handed to the worker; ``done`` is released once it ran."""

    __slots__ = ("call", "done", "result", "error")

    def __init__(self, call: Callable[[], Any]) -> None:
        self.call: Callable[[], Any] | None = call
        self.done = threading.Lock()
        self.done.acquire()
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            assert self.call is not None  # (run once)
            self.result = self.call()
        except BaseException as exc:  # noqa: B902  (handed to the caller, which raises it)
            self.error = exc
        finally:
            self.call = None  # (nothing kept alive by a finished job)
            self.done.release()


def _serve(jobs: "queue.SimpleQueue[_Job | None]") -> None:
    """The worker: run the jobs in turn until told to stop (None)."""
    while True:
        job = jobs.get()
        if job is None:
            return
        job.run()


class OffMain:
    """``run(call, wait)``: ``call()`` in this thread, or, from the main
    thread, in this object's worker thread while the main thread waits."""

    def __init__(self, name: str) -> None:
        self._name = name
        #: The worker's queue; None until the main thread's first call (and
        #: again in a forked child, whose worker is not there).
        self._jobs: "queue.SimpleQueue[_Job | None] | None" = None

    def forget_worker(self) -> None:
        """In a forked child: the parent's worker thread is not here."""
        self._jobs = None

    def run(self, call: Callable[[], T], wait: float | None) -> T:
        """What ``call()`` returns or raises. From the main thread: run by
        the worker; ``TimeoutError`` when it has not finished within ``wait``
        seconds (None: no bound but the call's own), and an interrupt that lands while waiting is raised here
        while the call goes on to its end in the worker (the caller must
        assume either outcome of the call)."""
        if threading.current_thread() is not threading.main_thread():
            return call()
        job = _Job(call)
        self._worker().put(job)
        if not job.done.acquire(timeout=-1 if wait is None else wait):
            raise TimeoutError(f"{self._name}: no answer within {wait} s")
        if job.error is not None:
            raise job.error
        result: T = job.result
        return result

    def _worker(self) -> "queue.SimpleQueue[_Job | None]":
        jobs = self._jobs
        if jobs is None:  # only the main thread comes here: no lock needed
            jobs = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(jobs,), name=self._name, daemon=True).start()
            self._jobs = jobs
            weakref.finalize(self, jobs.put, None)  # the worker ends with its owner
        return jobs
