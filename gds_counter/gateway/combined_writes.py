"""Amounts added to one counter at once, committed by one write.

Sixteen threads of one process incrementing one counter each paid a whole
attempt for their 1: on a locking server (Firestore in Datastore mode) a
begin, a lookup and a commit, and a wait for the lock whenever two of them
met on a shard. Here at most ``IN_FLIGHT`` writes of a counter run at once
(per process); callers that arrive while they run join the *next* write,
and when a running one ends, one of them (the leader) commits the sum of
their amounts in a single attempt, and every one of them gets that
attempt's outcome. Before it starts, a leader lets the callers that are
ready to run join (``rounds.settling``): the threads one write released
come back together. Alone (one thread), a caller writes at once.

Why that keeps "counted exactly once or raised": the amounts go into one
atomic commit, so each caller's amount was applied exactly when the commit
was. Every caller gets the commit's outcome: nothing raised means counted;
an error raised is the commit's own (``Contention`` and ``Unavailable``: not
counted; ``CommitUnknown``: unknown), copied for each caller so that no two
threads raise one object. An error that is not a ``GDSError`` (the leader
interrupted, say) leaves the joiners' outcome unknown, so they get
``CommitUnknown``. Every error of the write is every caller's outcome, a
``BadValueError`` included: a write is never sent again for its callers,
since only the write itself knows whether it reached the store (a shard
saturated at 64 bits, ``CountSaturated``, was written). The one refusal
that lets each caller write its own amount alone is made here, before
anything is sent: a sum of several amounts that does not fit in 64 bits.
(So near the 64-bit bound, callers whose amounts were combined may all be
told "not counted" where one of them alone would have fitted: true, and
they may try again.)

A caller is only ever combined into a write that began after it arrived,
so a read after its call returns sees its amount, as if it had written
alone. (``gds_counter.gateway.rounds`` keeps the rounds, as for shared
reads.) ``CombinedWrites`` is for threads, ``AsyncCombinedWrites`` for the
tasks of one event loop.
"""

from __future__ import annotations

import copy
import threading
import weakref
from typing import Any, Awaitable, Callable, Hashable

from gds_counter._checks import INT64_MAX, INT64_MIN
from gds_counter.errors import CommitUnknown, GDSError
from gds_counter.gateway.rounds import Line, LoopLines, Round, ThreadLines, as_async, per_gateway

__all__ = ["IN_FLIGHT", "AsyncCombinedWrites", "CombinedWrites", "async_combined_writes", "combined_writes"]

#: ``write(amount, callers)``: commit ``amount`` (the sum of ``callers``'
#: amounts) once, or raise.
Write = Callable[[int, int], None]
AsyncWrite = Callable[[int, int], Awaitable[None]]


def _joiners_error(error: BaseException) -> BaseException:
    """What a caller whose amount rode in another caller's failed write
    raises: a copy of the write's own error, or ``CommitUnknown`` when the
    write ended in something that says nothing about the commit."""
    if isinstance(error, GDSError):
        try:
            clone = copy.copy(error)
        except Exception:  # an error that cannot be copied: the same one
            return error
        clone.__traceback__ = None
        return clone
    return CommitUnknown(
        f"this amount was committed together with others by another caller, whose write ended in "
        f"{type(error).__name__}: {error}; it may or may not have been counted"
    )


#: Writes of one key in flight at once (per process, per event loop): one
#: commits while the next gathers callers. Two, not one, because a store
#: that groups commits itself (the embedded engine's group commit) then
#: has two to group, and a lock wait of one does not hold up the other
#: (measured, 4 processes x 4 threads on one SQLite file: 3,181 increments
#: a second with one in flight, 4,540 with two; the Firestore emulator
#: gained too). More in flight would mean fewer amounts per write.
IN_FLIGHT = 2


class CombinedWrites:
    """See the module docstring: for threads (safe across ``fork()``)."""

    def __init__(self, in_flight: int = IN_FLIGHT) -> None:
        self._lines: ThreadLines[None] = ThreadLines(in_flight)

    def run(self, key: Hashable, amount: int, write: Write) -> None:
        """Commit ``amount`` once, with the amounts of the callers of the
        same ``key`` that arrive while a write of it runs, or raise."""
        lines, lock = self._lines.get()
        with lock:
            line, mine, leads, wait = lines.join(key)
            mine.shares.append(amount)
        if not leads:
            mine.done.wait()
            if mine.failed:
                return write(amount, 1)
            if mine.error is not None:
                raise _joiners_error(mine.error) from mine.error
            return None
        # Let the threads about to add to the same counter (those one write
        # just released) join this write first; alone, write at once.
        ThreadLines.lead(lines, lock, key, line, mine, wait=wait, settle=not wait and threading.active_count() > 1)
        shares = list(mine.shares)  # started: nobody joins it any more
        total = sum(shares)
        if not INT64_MIN <= total <= INT64_MAX:  # only a sum of several amounts can pass 64 bits
            with lock:
                lines.finish(key, line, mine, None, failed=True)
            return write(amount, 1)
        try:
            write(total, len(shares))
        except BaseException as exc:
            with lock:
                lines.finish(key, line, mine, None, error=exc)
            raise
        with lock:
            lines.finish(key, line, mine, None)
        return None


class AsyncCombinedWrites:
    """As ``CombinedWrites``, for the tasks of an event loop (one set of
    lines per running loop). A caller cancelled before its round's write
    began takes its amount out of it; once begun, its amount is the write's
    (counted or not with the others), as for a caller cancelled during its
    own commit."""

    def __init__(self, in_flight: int = IN_FLIGHT) -> None:
        self._lines: LoopLines[None] = LoopLines(in_flight)

    async def run(self, key: Hashable, amount: int, write: AsyncWrite) -> None:
        lines = self._lines.get()
        line, mine, leads, wait = lines.join(key)  # no await in between: the loop's one thread decides
        mine.shares.append(amount)
        if not leads:
            try:
                await as_async(mine.done).wait()
            except BaseException:
                _leave(line, mine, amount)
                raise
            if mine.failed:
                return await write(amount, 1)
            if mine.error is not None:
                raise _joiners_error(mine.error) from mine.error
            return None
        await LoopLines.lead(lines, key, line, mine, wait=wait, settle=not wait)
        shares = list(mine.shares)
        total = sum(shares)
        if not INT64_MIN <= total <= INT64_MAX:  # only a sum of several amounts can pass 64 bits
            lines.finish(key, line, mine, None, failed=True)
            return await write(amount, 1)
        try:
            await write(total, len(shares))
        except BaseException as exc:
            lines.finish(key, line, mine, None, error=exc)
            raise
        lines.finish(key, line, mine, None)
        return None


def _leave(line: Line[None], mine: Round[None], amount: int) -> None:
    """A joiner cancelled while it waits: out of its round if that has not
    begun (then its amount is not written)."""
    if line.next is mine:
        mine.shares.remove(amount)
        mine.waiting -= 1


_per_gateway: "weakref.WeakKeyDictionary[Any, CombinedWrites]" = weakref.WeakKeyDictionary()
_async_per_gateway: "weakref.WeakKeyDictionary[Any, AsyncCombinedWrites]" = weakref.WeakKeyDictionary()


def combined_writes(gateway: Any) -> CombinedWrites:
    """The combined writes of a blocking ``gateway``'s plans (``plan.Combine``)."""
    return per_gateway(_per_gateway, gateway, CombinedWrites)


def async_combined_writes(gateway: Any) -> AsyncCombinedWrites:
    """``combined_writes`` for an async gateway's plans (per event loop)."""
    return per_gateway(_async_per_gateway, gateway, AsyncCombinedWrites)
