"""A counter's total, read once for the callers that ask for it together.

Sixteen writers of one counter each read its total right after their own
commit: sixteen runs of the same query over the same shards, each paying
the server for the query (and, on Datastore, for its entity reads) and the
client for decoding, copying and summing the same twenty entities. Here
they share instead: a read's leader first lets the threads (or tasks) that
are ready to run do so, and every caller that asks for the same total
before the read begins joins it; while it runs, callers join the *next*
read, which starts when the running one ends. Callers released together
(the writers of one group commit, the answers of one batch of RPCs) so
share one read, and get one integer, which needs no copy.

That keeps reads strongly consistent: a caller is only ever answered by a
read that began after the caller arrived, so it sees every commit that was
acknowledged before its call (its own included), exactly as if it had run
the query itself at that moment. A read that fails answers only its own
caller; the callers that joined it read for themselves.

Alone, a caller reads at once: sharing only changes anything when reads of
one total overlap. A counter's reader only comes here when another read of
its total is in flight: with none, it reads straight through
(``counter._lone``), and a reader arriving meanwhile waits for that read to
end before its own begins, as behind a running shared read. This is the
one layer that shares reads; the gateways do not (a Store's queries are
each their own). ``SharedReads`` is for threads, ``AsyncSharedReads`` for
the tasks of one event loop; a gateway's ``counter.runtime.Runtime`` holds
one of each, and a counter's plan asks for a shared read by yielding
``counter._lone.SharedRead``. The rounds' bookkeeping is
``gds_counter.counter._rounds``, shared with combined writes.
"""

from __future__ import annotations

from typing import Awaitable, Callable, Generic, Hashable, TypeVar

from gds_counter.counter._rounds import LoopLines, Seat, ThreadLines, yield_thread

R = TypeVar("R")

__all__ = ["AsyncSharedReads", "SharedReads"]


class SharedReads(Generic[R]):
    """See the module docstring: for threads (safe across ``fork()``: a
    child starts with no reads in flight). ``pause`` is how a leader lets
    the threads that are ready run before it starts (``yield_thread``)."""

    def __init__(self, *, pause: Callable[[], None] = yield_thread) -> None:
        self.lines: ThreadLines[R] = ThreadLines()
        self._pause = pause

    def run(self, key: Hashable, read: Callable[[], R]) -> tuple[R, bool]:
        """``read()``'s answer for ``key``, or the answer of a read of the
        same key that began after this call did; and whether it was another
        caller's (then it must be immutable: every sharer gets the object).

        From joining to answering it is one ``try`` whose handler is
        ``Lines.leave``: a leader interrupted anywhere abandons its round or
        ends it as failed, and its readers then read for themselves."""
        lines, lock = self.lines.get()
        seat = Seat(key)
        try:
            with lock:
                mine = lines.join(seat)
            if not seat.leads:
                ThreadLines.await_end(mine, lines, lock, seat)
                if mine.failed:
                    return read(), False  # its failure was its own: try once more alone
                return mine.result, True  # type: ignore[return-value]  # set with ended
            # Let the threads that are about to ask for the same read (the
            # writers one group commit just released) join it first.
            ThreadLines.lead(lines, lock, seat, settle=True, pause=self._pause)
            result = read()
            with lock:
                lines.finish(seat, result)
            return result, False
        except BaseException as exc:
            ThreadLines.leave(lines, lock, seat, exc)  # a read is never "sent": its readers read alone
            raise


class AsyncSharedReads(Generic[R]):
    """See the module docstring: for the tasks of an event loop (one set
    of lines per running loop)."""

    def __init__(self) -> None:
        self.lines: LoopLines[R] = LoopLines()

    async def run(self, key: Hashable, read: Callable[[], Awaitable[R]]) -> tuple[R, bool]:
        """As ``SharedReads.run``, awaited: ``await read()``'s answer for
        ``key`` or that of a read of it that began after this call did.
        A caller cancelled while it waits leaves the others unaffected; a
        leader cancelled at any await leaves its readers to read alone."""
        lines = self.lines.get()
        seat = Seat(key)
        try:
            mine = lines.join(seat)  # no await in between: the loop's one thread decides
            if not seat.leads:
                await LoopLines.await_end(mine)
                if mine.failed:
                    return await read(), False
                return mine.result, True  # type: ignore[return-value]  # set with ended
            # Let the tasks that are ready to ask for the same read (the answers
            # of one batch of commits arrive together) join it first.
            await LoopLines.lead(lines, seat, settle=True)
            result = await read()
            lines.finish(seat, result)
            return result, False
        except BaseException as exc:
            LoopLines.leave(lines, seat, exc)
            raise
