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
bookkeeping is ``gds_counter.gateway.rounds``, shared with combined writes.
"""

from __future__ import annotations

import contextvars
import weakref
from typing import Any, Awaitable, Callable, Generic, Hashable, TypeVar

from gds_counter.gateway.query import QueryResult
from gds_counter.gateway.rounds import LoopLines, Seat, ThreadLines, per_gateway
from gds_counter.gateway.values import RawEntity

R = TypeVar("R")

__all__ = ["AsyncSharedReads", "SharedReads", "async_shared_reads", "own_copy", "own_result", "shared_reads"]

#: True while this thread leads a shared read, after it let the threads
#: ready to join do so: a shared read nested in it (the counter's total
#: read sharing the gateway's query) need not let them again. Each wait
#: (``time.sleep(0)``) costs about 25 us of CPU and 90 us of time.
_settled: contextvars.ContextVar[bool] = contextvars.ContextVar("gds_counter_shared_read_settled", default=False)


class SharedReads(Generic[R]):
    """See the module docstring: for threads (safe across ``fork()``: a
    child starts with no reads in flight)."""

    def __init__(self) -> None:
        self._lines: ThreadLines[R] = ThreadLines()

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
            ThreadLines.lead(lines, lock, seat, settle=seat.wait or not _settled.get())
            result = _read_settled(read)
            with lock:
                lines.finish(seat, result)
            return result, False
        except BaseException as exc:
            ThreadLines.leave(lines, lock, seat, exc)  # a read is never "sent": its readers read alone
            raise


def _read_settled(read: Callable[[], R]) -> R:
    """``read()``, with ``_settled`` set around it. A function of its own
    because a ``try`` nested in ``SharedReads.run``'s own would begin with
    an instruction (3.11's ``NOP`` for the inner ``try:``) that the outer
    handler does not cover: an exception raised there (by a trace
    function) would skip ``Lines.leave`` and leave the round running."""
    settled = _settled.set(True)
    try:
        return read()
    finally:
        _settled.reset(settled)


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


_per_gateway: "weakref.WeakKeyDictionary[Any, SharedReads[Any]]" = weakref.WeakKeyDictionary()
_async_per_gateway: "weakref.WeakKeyDictionary[Any, AsyncSharedReads[Any]]" = weakref.WeakKeyDictionary()


def shared_reads(gateway: Any) -> "SharedReads[Any]":
    """The lines of reads a blocking ``gateway``'s plans share
    (``plan.Shared``); they go with the gateway."""
    return per_gateway(_per_gateway, gateway, SharedReads)


def async_shared_reads(gateway: Any) -> "AsyncSharedReads[Any]":
    """``shared_reads`` for an async gateway's plans (per event loop)."""
    return per_gateway(_async_per_gateway, gateway, AsyncSharedReads)


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
