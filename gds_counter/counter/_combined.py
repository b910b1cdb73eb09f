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
come back together. Alone (one thread), a caller writes at once. A counter's
caller only comes here when another write of its counter is in flight: with
none, it writes straight through (``counter._lone``), and that write is one
of the ``IN_FLIGHT`` while it runs.

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
alone. (``gds_counter.counter._rounds`` keeps the rounds, as for shared
reads.) ``CombinedWrites`` is for threads, ``AsyncCombinedWrites`` for the
tasks of one event loop; a gateway's ``counter.runtime.Runtime`` holds one
of each. A counter's plan asks for one by yielding ``counter._lone.Combine``.
"""

from __future__ import annotations

import copy
import threading
from typing import Awaitable, Callable, Hashable

from gds_counter._checks import INT64_MAX, INT64_MIN
from gds_counter.counter._rounds import LoopLines, Round, Seat, ThreadLines, yield_thread
from gds_counter.errors import CommitUnknown, GDSError

__all__ = ["IN_FLIGHT", "AsyncCombinedWrites", "CombinedWrites"]

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
        f"{type(error).__name__}{': ' + str(error) if str(error) else ''}; it may or may not have been counted"
    )


#: Writes of one key in flight at once (per process, per event loop): one
#: commits while the next gathers callers. Two, not one, because a store
#: that groups commits itself (the embedded engine's group commit) then
#: has two to group, and a lock wait of one does not hold up the other
#: (measured, 4 processes x 4 threads on one SQLite file: 3,181 increments
#: a second with one in flight, 4,540 with two; the Firestore emulator
#: gained too). More in flight would mean fewer amounts per write. A write
#: that went straight through (``counter._lone``) is one of them: a line
#: opened while it runs counts it as running.
IN_FLIGHT = 2


def _other_threads() -> bool:
    return threading.active_count() > 1


class CombinedWrites:
    """See the module docstring: for threads (safe across ``fork()``).
    ``others()`` says whether other threads may be about to add (alone in
    its process, a leader writes at once), and ``pause`` is how a leader
    lets the threads that are ready run before it starts."""

    def __init__(
        self, in_flight: int = IN_FLIGHT, *, others: Callable[[], bool] = _other_threads,
        pause: Callable[[], None] = yield_thread,
    ) -> None:
        self.lines: ThreadLines[None] = ThreadLines(in_flight)
        self._others, self._pause = others, pause

    def run(self, key: Hashable, amount: int, write: Write) -> None:
        """Commit ``amount`` once, with the amounts of the callers of the
        same ``key`` that arrive while a write of it runs, or raise.

        Everything from joining to answering is inside one ``try`` whose
        handler is ``Lines.leave``: the seat is made before it and filled as
        the caller is seated, so an interrupt at any point (before the round
        starts, during the write, after it returned) leaves the line
        consistent and its other callers answered truthfully."""
        lines, lock = self.lines.get()
        seat = Seat(key, amount)
        try:
            with lock:
                mine = lines.join(seat)
            if not seat.leads:
                ThreadLines.await_end(mine, lines, lock, seat)
                return _joined(mine, lambda: write(amount, 1))
            # Let the threads about to add to the same counter (those one write
            # just released) join this write first; alone, write at once.
            ThreadLines.lead(lines, lock, seat, settle=not seat.wait and self._others(), pause=self._pause)
            shares = mine.shares  # started: nobody joins or leaves it any more
            total = sum(shares)
            if not INT64_MIN <= total <= INT64_MAX:  # only a sum of several amounts can pass 64 bits
                with lock:
                    lines.finish(seat, None, failed=True)  # nothing was sent: each writes its own
                return write(amount, 1)
            mine.sent = True  # before the call: a write sent is never taken for one that was not
            write(total, len(shares))
            with lock:
                lines.finish(seat, None)
            return None
        except BaseException as exc:
            ThreadLines.leave(lines, lock, seat, exc)
            raise


class AsyncCombinedWrites:
    """As ``CombinedWrites``, for the tasks of an event loop (one set of
    lines per running loop). A caller cancelled before its round's write
    began takes its amount out of it; once begun, its amount is the write's
    (counted or not with the others), as for a caller cancelled during its
    own commit. A leader cancelled before its write was sent abandons the
    round (its callers write their own); cancelled once it was sent, its
    callers' outcome is unknown (``CommitUnknown``)."""

    def __init__(self, in_flight: int = IN_FLIGHT) -> None:
        self.lines: LoopLines[None] = LoopLines(in_flight)

    async def run(self, key: Hashable, amount: int, write: AsyncWrite) -> None:
        lines = self.lines.get()
        seat = Seat(key, amount)
        try:
            mine = lines.join(seat)  # no await in between: the loop's one thread decides
            if not seat.leads:
                await LoopLines.await_end(mine)
                if mine.failed:
                    return await write(amount, 1)
                return _joined(mine, _nothing)
            await LoopLines.lead(lines, seat, settle=not seat.wait)
            shares = mine.shares
            total = sum(shares)
            if not INT64_MIN <= total <= INT64_MAX:  # only a sum of several amounts can pass 64 bits
                lines.finish(seat, None, failed=True)
                return await write(amount, 1)
            mine.sent = True
            await write(total, len(shares))
            lines.finish(seat, None)
            return None
        except BaseException as exc:
            LoopLines.leave(lines, seat, exc)
            raise


def _nothing() -> None:
    return None


def _joined(mine: Round[None], alone: Callable[[], None]) -> None:
    """A joiner's outcome once its round ended: its own write (``alone``)
    when the round did not serve it (nothing of it was sent), else the
    round's (nothing raised: counted; else its own copy of the error)."""
    if mine.failed:
        return alone()
    if mine.error is not None:
        raise _joiners_error(mine.error) from mine.error
    return None
