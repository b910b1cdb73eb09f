"""Identical reads that arrive together, answered by one read.

Sixteen writers of one counter each read its total right after their own
commit: sixteen runs of the same query over the same shards, each paying
the server for the query (and, on Datastore, for its entity reads) and the
client for decoding the same twenty entities. Here they share instead: a
read's leader first lets the threads (or tasks) that are ready to run do
so, and every caller that asks for the same query before the read begins
joins it; while it runs, callers join the *next* read, which starts when
the running one ends. Callers released together (the writers of one group
commit, the answers of one batch of RPCs) so share one read.

That keeps reads strongly consistent: a caller is only ever answered by a
read that began after the caller arrived, so it sees every commit that was
acknowledged before its call (its own included), exactly as if it had run
the query itself at that moment. A read that fails answers only its own
caller; the callers that joined it run the query themselves.

Alone, a caller reads at once, as before: sharing only changes anything
when reads of one query overlap. Reads in a transaction never go through
it (they read their transaction's own snapshot).

``SharedReads`` is for threads (the blocking gateways), ``AsyncSharedReads``
for tasks of one event loop (the async Datastore gateway); the rounds'
bookkeeping is ``gds_counter.gateway._rounds``, shared with combined writes.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Generic, Hashable, TypeVar

from gds_counter.gateway._rounds import LoopLines, Seat, ThreadLines, yield_thread
from gds_counter.gateway.query import QueryResult
from gds_counter.gateway.values import RawEntity

R = TypeVar("R")

__all__ = ["AsyncSharedReads", "SharedReads", "own_copy", "own_result"]


class SharedReads(Generic[R]):
    """See the module docstring: for threads (safe across ``fork()``: a
    child starts with no reads in flight). ``pause`` is how a leader lets
    the threads that are ready run before it starts (``yield_thread``)."""

    def __init__(self, *, pause: Callable[[], None] = yield_thread) -> None:
        self._lines: ThreadLines[R] = ThreadLines()
        self._pause = pause

    def run(self, key: Hashable, read: Callable[[], R]) -> tuple[R, bool]:
        """``read()``'s answer for ``key``, or the answer of a read of the
        same key that began after this call did; and whether it was another
        caller's (then the caller must not hand out the same mutable objects
        twice: ``own_result``).

        From joining to answering it is one ``try`` whose handler is
        ``Lines.leave``: a leader interrupted anywhere abandons its round or
        ends it as failed, and its readers then read for themselves."""
        lines, lock = self._lines.get()
        seat = Seat(key)
        try:
            with lock:
                mine = lines.join(seat)
            if not seat.leads:
                ThreadLines.await_end(mine)
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
        self._lines: LoopLines[R] = LoopLines()

    async def run(self, key: Hashable, read: Callable[[], Awaitable[R]]) -> tuple[R, bool]:
        """As ``SharedReads.run``, awaited: ``await read()``'s answer for
        ``key`` or that of a read of it that began after this call did.
        A caller cancelled while it waits leaves the others unaffected; a
        leader cancelled at any await leaves its readers to read alone."""
        lines = self._lines.get()
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


def own_result(result: QueryResult) -> QueryResult:
    """A query batch another caller holds too, with entities of its own."""
    return QueryResult(tuple(own_copy(entity) for entity in result.entities), result.end_cursor, result.more_results)


def own_copy(entity: RawEntity) -> RawEntity:
    """A copy of a result another caller holds too: its own dicts and lists
    (every other value is immutable)."""
    properties = dict(entity.properties)
    for name, value in properties.items():
        if isinstance(value, (list, RawEntity)):
            properties[name] = _own_value(value)  # an existing key: the dict does not change size
    return RawEntity(entity.key, properties, entity.unindexed)


def _own_value(value: Any) -> Any:
    if isinstance(value, list):
        return [_own_value(item) for item in value]
    if isinstance(value, RawEntity):
        return own_copy(value)
    return value
