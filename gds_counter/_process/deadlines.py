"""The caller's deadline, for storage waits the caller cannot see.

A retry policy's deadline bounds a counter's call (``gds.transaction.
retry_plan``), but one attempt can block inside the storage: the embedded
engine waits for another process's write lock up to its busy timeout (30 s),
and a commit queued in its group commit waits for the writers ahead of it.
Without the deadline those waits ran their full length, so a call with a
1 s deadline took 30 s behind a frozen lock holder. ``retry_plan`` states
the deadline here (a context variable: per thread and per asyncio task,
and carried into the asyncio face's worker threads), and the storage waits
at most ``remaining(its own bound)``.
"""

from __future__ import annotations

import contextvars
import time
from typing import Generator, TypeVar

T = TypeVar("T")
Y = TypeVar("Y")
S = TypeVar("S")

__all__ = ["bounded", "limit", "remaining", "restore"]

#: ``time.monotonic()`` by which the current call must end, or None.
_AT: contextvars.ContextVar[float | None] = contextvars.ContextVar("gds_counter_deadline", default=None)


def limit(at: float) -> contextvars.Token[float | None] | None:
    """Bound the current context's storage waits by ``at`` (monotonic
    seconds), or by the deadline already set when that is sooner; undo with
    ``restore``. None: a deadline as soon or sooner was set already, and
    nothing changed (a counter's call states its deadline first, and its
    retry loop's is then never sooner)."""
    current = _AT.get()
    if current is not None and current <= at:
        return None
    return _AT.set(at)


def restore(token: contextvars.Token[float | None] | None) -> None:
    """Undo ``limit``. (A plan resumed in another context, which the drivers
    never do, cannot reset its token: the deadline then simply lapses.)"""
    if token is None:
        return
    try:
        _AT.reset(token)
    except ValueError:
        _AT.set(token.old_value if token.old_value is not token.MISSING else None)


def bounded(work: Generator[Y, S, T], seconds: float | None) -> Generator[Y, S, T]:
    """The plan ``work``, its storage waits and its waits behind other
    callers ending ``seconds`` from now (None: unbounded). A counter's call
    states its retry policy's deadline this way from its start, so that
    time spent queued behind another caller's write or read counts too
    (counted from the first attempt alone, a call behind a stalled write
    took twice its deadline)."""
    token = limit(time.monotonic() + seconds) if seconds is not None else None
    try:
        return (yield from work)
    finally:
        restore(token)


def remaining(bound: float) -> float:
    """How long a storage wait of at most ``bound`` seconds may last now:
    ``bound``, or less when the caller's deadline comes sooner (0 once it
    has passed; the wait then tries once and gives up)."""
    at = _AT.get()
    if at is None:
        return bound
    return max(0.0, min(bound, at - time.monotonic()))
