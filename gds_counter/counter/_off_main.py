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
only its caller waits on. Nor is the worker started with
``threading.Thread.start``, whose wait for the new thread an interrupt can
cut short after the thread runs (a worker then served a queue nobody
used, for ever: a thread leaked at each such interrupt): the queue is
recorded first, then the worker launched by one C call
(``_thread.start_new_thread``), then counted; an interrupt between the
launch and the count makes the next call launch a second worker on the
same queue, which is harmless, and every launched worker is told to stop
with its owner.
"""

from __future__ import annotations

import _thread
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


def _stop(jobs: "queue.SimpleQueue[_Job | None]", launched: list[int]) -> None:
    """The owner is gone: one stop for each worker launched on ``jobs``
    (and one more, for a launch an interrupt kept from being counted)."""
    for _ in range(launched[0] + 1):
        jobs.put(None)


class OffMain:
    """``run(call, wait)``: ``call()`` in this thread, or, from the main
    thread, in this object's worker thread while the main thread waits."""

    def __init__(self, name: str) -> None:
        self._name = name
        #: The worker's queue; None until the main thread's first call (and
        #: again in a forked child, whose worker is not there).
        self._jobs: "queue.SimpleQueue[_Job | None] | None" = None
        #: How many workers serve ``_jobs`` (a list, shared with the finalizer).
        self._launched = [0]

    def forget_worker(self) -> None:
        """In a forked child: the parent's worker thread is not here."""
        self._jobs, self._launched = None, [0]

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
        """The queue a worker serves (only the main thread comes here: no
        lock needed); see the module's notes for the order of the steps."""
        jobs = self._jobs
        if jobs is None:
            jobs, launched = queue.SimpleQueue(), [0]
            self._jobs, self._launched = jobs, launched
            weakref.finalize(self, _stop, jobs, launched)  # the workers end with their owner
        if self._launched[0] == 0:
            _thread.start_new_thread(_serve, (jobs,))
            self._launched[0] += 1
        return jobs
