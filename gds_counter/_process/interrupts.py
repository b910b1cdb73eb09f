"""Finishing what must be finished when an interrupt lands.

A Ctrl-C (in the main thread) or an exception sent to a thread
(``PyThreadState_SetAsyncExc``) can land between any two lines, also inside
an ``except`` or ``finally`` block and while waiting for a lock. The
machinery that hands work between threads (rounds, the group commit, the
connection pool) has a few steps that must run to their end whatever
lands, or other callers wait for ever: giving a connection back, answering
the callers of a round, releasing the process's write lock. Those steps
are written to be safe to run again, and run through this module.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import TracebackType
from typing import Callable

__all__ = ["TRIES", "locked", "own_again", "raise_again_soon", "release_if_held", "surely"]

log = logging.getLogger("gds_counter")

#: How many times a step is run again after interrupts cut it short.
TRIES = 3


def surely(step: Callable[[], None], tries: int = TRIES) -> BaseException | None:
    """Run ``step`` (safe to run again) to its end even if interrupts cut
    it short; return the first interrupt it absorbed, for the caller to
    raise (or ignore, when it is already raising one). Raises the last one
    when every try was cut short."""
    first: BaseException | None = None
    for attempt in range(tries):
        try:
            step()
            return first
        except BaseException as exc:  # noqa: B902  (an interrupt: handed to the caller)
            if attempt == tries - 1:
                raise
            first = first or exc
    return first  # pragma: no cover  (the loop returns or raises)


class locked:
    """``with locked(lock):`` takes ``lock`` even when an interrupt arrives
    while waiting for it (a plain ``with lock`` would then skip the block),
    and raises that interrupt once the block ran and the lock is released.

    ``lock`` is an ``RLock``: a signal's handler runs right after a call
    returns, so an interrupt may land after ``acquire()`` took the lock as
    well as while it waited, and only an ``RLock`` can tell which (taking a
    plain lock again would wait for ever on this very thread)."""

    __slots__ = ("_lock", "_pending")

    def __init__(self, lock: "threading.RLock") -> None:
        self._lock = lock
        self._pending: BaseException | None = None

    def __enter__(self) -> None:
        # Inline, not shared with ``own_again``: an interrupt as a helper's
        # call returned would leave the lock taken and the block skipped.
        while True:
            try:
                self._lock.acquire()
                return
            except BaseException as exc:  # noqa: B902  (interrupted: taken already, or not yet)
                self._pending = self._pending or exc
                if self._lock._is_owned():  # type: ignore[attr-defined]
                    return

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._lock.release()
        if exc is None and self._pending is not None:
            raise self._pending


def release_if_held(lock: "threading.RLock") -> None:
    """Release ``lock`` if this thread still holds it: an interrupt that
    lands as a ``with lock:`` block exits can skip the release (bpo-29988),
    and no one else could ever release it. Only an ``RLock`` knows its
    owner, which is why the locks this guards are ``RLock``s."""
    while lock._is_owned():  # type: ignore[attr-defined]
        lock.release()


def own_again(lock: "threading.RLock") -> None:
    """Take ``lock`` back if an interrupt left this thread without it
    where it must hold it: ``Condition.wait`` takes its lock back in a
    ``finally`` that a second interrupt can cut short, and the ``with``
    around the wait then released a lock it did not hold ("cannot release
    un-acquired lock", in place of the interrupt). Raises the first
    interrupt that landed while taking it, once it is held."""
    pending: BaseException | None = None
    while not lock._is_owned():  # type: ignore[attr-defined]
        try:
            lock.acquire()
        except BaseException as exc:  # noqa: B902  (taken already, or not yet: the loop asks)
            pending = pending or exc
    if pending is not None:
        raise pending


#: How long after the at-fork hooks an interrupt they absorbed is raised again.
AGAIN_AFTER_S = 0.05


def raise_again_soon(interrupt: BaseException) -> None:
    """Deliver ``interrupt`` again, where it was absorbed in code whose
    exceptions Python ignores (an at-fork hook: it prints "Exception ignored"
    and goes on). A ``KeyboardInterrupt`` in the main thread is a Ctrl-C:
    SIGINT is sent again ``AGAIN_AFTER_S`` later, from another thread, so
    that its handler runs once fork() has returned (tripped here, it would
    run inside the hooks, at Python's next check, and be ignored again).
    Anything else cannot be raised again from here, and is logged."""
    if isinstance(interrupt, KeyboardInterrupt) and threading.current_thread() is threading.main_thread():
        # A real signal, not ``_thread.interrupt_main``: it also wakes a wait the program is in by then.
        again = threading.Timer(AGAIN_AFTER_S, signal.pthread_kill, (threading.get_ident(), signal.SIGINT))
        again.daemon = True
        again.start()
    else:
        log.warning("what a fork() hook raised could not be raised again after the fork: %r", interrupt)
