"""Identical reads that arrive together, answered by one read.

Sixteen writers of one counter each read its total right after their own
commit: sixteen runs of the same query over the same shards, each paying
the server for the query (and, on Datastore, for its entity reads) and the
client for decoding the same twenty entities. Here they queue instead:
while one read of a query runs, every caller that arrives for the same
query joins the *next* read, which starts when the running one ends and
answers all of them.

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
bookkeeping (``_Lines``) is the same for both, only the waiting differs.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from typing import Any, Awaitable, Callable, Generic, Hashable, TypeVar, Union

from gds_counter.gateway.query import QueryResult
from gds_counter.gateway.values import RawEntity

R = TypeVar("R")

__all__ = ["AsyncSharedReads", "SharedReads", "own_copy", "own_result"]

_Event = Union[threading.Event, asyncio.Event]


class _Round(Generic[R]):
    """The next read of one query: who joined it, and its answer."""

    __slots__ = ("turn", "done", "result", "failed", "waiting")

    def __init__(self, turn: _Event, done: _Event) -> None:
        self.turn = turn  # set when the read before it ended: run now
        self.done = done  # set when its answer (or failure) is known
        self.result: R | None = None
        self.failed = False
        self.waiting = 0  # callers that joined it and wait for its answer


class _Line(Generic[R]):
    """One query's reads: a read runs, and maybe a round waits behind it."""

    __slots__ = ("next",)

    def __init__(self) -> None:
        self.next: _Round[R] | None = None


class _Lines(Generic[R]):
    """Which reads run, per key; the decisions both kinds of waiting share.
    Callers hold ``lock`` (a real lock for threads, none needed in one
    event loop) around ``join`` and ``finish``."""

    def __init__(self, new_event: Callable[[], _Event]) -> None:
        self.new_event = new_event
        self.lines: dict[Hashable, _Line[R]] = {}

    def join(self, key: Hashable) -> tuple[_Line[R], _Round[R] | None, bool]:
        """The caller's line, the round it belongs to (None: read at once,
        nothing runs) and whether it leads that round (runs its read)."""
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = _Line()
            return line, None, True
        mine = line.next
        if mine is None:
            mine = line.next = _Round(self.new_event(), self.new_event())
            return line, mine, True
        mine.waiting += 1
        return line, mine, False

    def finish(self, key: Hashable, line: _Line[R]) -> None:
        """A read of ``line`` ended (its round, if any, already answered):
        let the round behind it run, or drop the line when none waits."""
        following = line.next
        if following is None or following.done.is_set():  # none, or abandoned before its turn
            del self.lines[key]
        else:
            line.next = None  # closed: callers arriving from now on wait for the read after it
            following.turn.set()

    @staticmethod
    def answer(mine: _Round[R] | None, result: R | None, *, failed: bool) -> None:
        if mine is not None:
            mine.result, mine.failed = result, failed
            mine.done.set()


class SharedReads(Generic[R]):
    """See the module docstring: for threads. Safe across ``fork()``: a
    child starts with no reads in flight (the threads running them are not
    there)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._lines: _Lines[R] = _Lines(threading.Event)

    def run(self, key: Hashable, read: Callable[[], R]) -> tuple[R, bool]:
        """``read()``'s answer for ``key``, or the answer of a read of the
        same key that began after this call did; and whether it was another
        caller's (then the caller must not hand out the same mutable objects
        twice: ``own_result``)."""
        if self._pid != os.getpid():
            self._reset()
        lines = self._lines
        with self._lock:
            line, mine, leads = lines.join(key)
        if mine is not None and not leads:
            mine.done.wait()
            if mine.failed:
                return read(), False  # its failure was its own: try once more alone
            return mine.result, True  # type: ignore[return-value]  # set with done
        if mine is not None:
            try:
                mine.turn.wait()
            except BaseException:  # interrupted before its turn: its callers read alone
                lines.answer(mine, None, failed=True)
                raise
        try:
            result = read()
        except BaseException:
            lines.answer(mine, None, failed=True)
            with self._lock:
                lines.finish(key, line)
            raise
        lines.answer(mine, result, failed=False)
        with self._lock:
            lines.finish(key, line)
        return result, False


class AsyncSharedReads(Generic[R]):
    """See the module docstring: for the tasks of an event loop, one set of
    lines per running loop (an async gateway may serve several loops, one
    after the other or in several threads)."""

    def __init__(self) -> None:
        self._per_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Lines[R]]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def _lines(self) -> _Lines[R]:
        loop = asyncio.get_running_loop()
        with self._lock:
            lines = self._per_loop.get(loop)
            if lines is None:
                lines = self._per_loop[loop] = _Lines(asyncio.Event)
            return lines

    async def run(self, key: Hashable, read: Callable[[], Awaitable[R]]) -> tuple[R, bool]:
        """As ``SharedReads.run``, awaited: ``await read()``'s answer for
        ``key`` or that of a read of it that began after this call did.
        A caller cancelled while it waits leaves the others unaffected."""
        lines = self._lines()
        line, mine, leads = lines.join(key)  # no await in between: the loop's one thread decides
        if mine is not None and not leads:
            await _async(mine.done).wait()
            if mine.failed:
                return await read(), False
            return mine.result, True  # type: ignore[return-value]  # set with done
        if mine is not None:
            try:
                await _async(mine.turn).wait()
            except BaseException:  # cancelled before its turn: its callers read alone
                lines.answer(mine, None, failed=True)
                raise
        try:
            result = await read()
        except BaseException:
            lines.answer(mine, None, failed=True)
            lines.finish(key, line)
            raise
        lines.answer(mine, result, failed=False)
        lines.finish(key, line)
        return result, False


def _async(event: _Event) -> asyncio.Event:
    assert isinstance(event, asyncio.Event)  # AsyncSharedReads' lines make only these
    return event


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
