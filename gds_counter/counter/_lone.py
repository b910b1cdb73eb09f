"""A lone call goes straight through; combining and sharing start when a
second caller overlaps.

Combined writes (``counter._combined``) and shared reads
(``counter._shared_reads``) are for callers of one counter that overlap in
a process (threads) or an event loop (tasks). A call with nothing of its
key in flight there has nobody to combine with or share with, yet it paid
for their rounds all the same (a line, a round, a seat, four takes of a
lock, and for a read a pause to let others join). Here it registers itself
as its key's *lone call* (``Lines.alone``: one look and one store under the
lines' lock), runs its own work at once, and takes its registration back:
it runs no code of the rounds. A caller that finds its key busy (a lone
call, or rounds) goes into the rounds as before, and so does one whose key
is still ``crowded`` (a recent round of it served several callers: see
``counter._rounds``), so that callers released together are not split into
a lone call and a round behind it. ``Combine`` and ``SharedRead`` are the
steps a counter's plan yields to ask for this.

What a caller that arrives during a lone call finds: the line it opens
counts the lone call as one of its running rounds (``Lines.join``), so

* a write is one of the ``IN_FLIGHT`` writes of its counter, lone or not,
  and the newcomer is never combined into it (it has no round to join, and
  it began before the newcomer arrived); its amount is committed by its own
  write and the lone caller gets its own write's outcome, as a round of one
  would have given it: exactly once, or an error that says so;
* a read: the newcomer's round begins only after the lone read ended (one
  read of a total runs at a time), so whatever answers it began after it
  asked, and a read after a call returned sees that call's amount; the
  lone read answers only its own caller.

When the lone call ends and a line was opened meanwhile, it reports its end
there (``Lines.alone_ended``): the round behind it may start. Nothing else
waits on a lone call, and a round waiting behind one waits in slices and
until its own deadline, as behind any running round.

Interrupts, cancellation, forks: the registration is made inside the
``try`` whose handler takes it back, and taking it back removes only this
call's own (its token is the step, made for this call) and is safe to run
again (``surely``), so an interrupt or a cancellation anywhere leaves no
registration behind to hold up later callers. The registrations live in the
lines of the process (``ThreadLines``) or of the event loop (``LoopLines``),
which a forked child starts afresh: the parent's lone calls are not the
child's.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Awaitable, Callable, Hashable

from gds_counter._process import forks
from gds_counter._process.interrupts import surely
from gds_counter.counter._combined import AsyncCombinedWrites, CombinedWrites
from gds_counter.counter._rounds import Lines, LoopLines, ThreadLines
from gds_counter.counter._shared_reads import AsyncSharedReads, SharedReads
from gds_counter.gateway import plan

__all__ = ["Combine", "HashedKey", "SharedRead"]


class HashedKey:
    """A key of the lines (a tuple naming a counter, its layout, its
    policy...), its hash worked out once: a lone call looks its key up a
    few times, and hashing the tuple walked the layout's and the policy's
    fields each time. Equal when the tuples are equal, so the same counter
    held by two objects still meets itself in the lines."""

    __slots__ = ("value", "_hash")

    def __init__(self, value: tuple[object, ...]) -> None:
        self.value, self._hash = value, hash(value)

    @classmethod
    def of(cls, value: tuple[object, ...]) -> "HashedKey | None":
        """The key of ``value``; None when a part of it cannot be hashed
        (a user's own strategy may not be: it then has no line)."""
        try:
            return cls(value)
        except TypeError:
            return None

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, HashedKey) and self._hash == other._hash and self.value == other.value)

    def __repr__(self) -> str:
        return f"HashedKey({self.value!r})"


def _thread_lines(holder: ThreadLines[Any]) -> tuple[Lines[Any], threading.Lock]:
    """``holder.get()``, without a call into the rounds unless this process
    was forked since (its child's first call starts its lines afresh)."""
    if not forks.owned_here(holder.pid):
        return holder.get()
    return holder.lines, holder.lock


def _loop_lines(holder: LoopLines[Any]) -> Lines[Any]:
    """``holder.get()`` (the running loop's lines), likewise: the rounds
    only make a loop's lines the first time, or in a forked child."""
    lines = holder.per_loop.get(asyncio.get_running_loop()) if forks.owned_here(holder.pid) else None
    return lines if lines is not None else holder.get()


def _take_back(lines: Lines[Any], key: Hashable, token: object) -> None:
    """The lone call ``token`` of ``key`` ended: if a line was opened
    meanwhile, it counted the call as running and hears of its end; then
    the registration goes. Only ``token``'s own, and safe to run again."""
    if lines.alone.get(key) is token:
        line = lines.lines.get(key)
        if line is not None:
            lines.alone_ended(line, key)
        del lines.alone[key]


def _take_back_locked(lines: Lines[Any], lock: threading.Lock, key: Hashable, token: object) -> None:
    """``_take_back`` under the threads' lock, carried to its end (``surely``)."""

    def step() -> None:
        with lock:
            _take_back(lines, key, token)

    surely(step)


class Combine(plan.Step):
    """A plan's request to commit ``amount`` by running ``write(total,
    callers)``: straight through, ``write(amount, 1)``, when no other write
    of ``key`` is in flight (and ``key`` is not crowded); else with the amounts of the callers of the
    same ``key`` that arrive while a write of that key runs, in ``threads``
    (blocking driver) or ``tasks`` (async driver), every one of them getting
    that one write's outcome. For writes that add, where one commit of the
    sum is the same as a commit of each amount."""

    __slots__ = ("threads", "tasks", "key", "amount", "write")

    def __init__(
        self, threads: CombinedWrites, tasks: AsyncCombinedWrites, key: Hashable, amount: int,
        write: Callable[[int, int], "plan.Plan[None]"],
    ) -> None:
        self.threads, self.tasks, self.key, self.amount, self.write = threads, tasks, key, amount, write

    def run(self, drive: Callable[["plan.Plan[Any]"], Any]) -> None:
        lines, lock = _thread_lines(self.threads.lines)
        key = self.key
        try:
            with lock:  # registered, and known to be, in one line: an interrupt sees both or neither
                alone = key not in lines.lines and key not in lines.crowded and lines.alone.setdefault(key, self) is self
            if alone:
                drive(self.write(self.amount, 1))
                with lock:
                    _take_back(lines, key, self)
                return
        except BaseException:
            if lines.alone.get(key) is self:
                _take_back_locked(lines, lock, key, self)
            raise
        write = self.write
        self.threads.run(key, self.amount, lambda total, callers: drive(write(total, callers)))

    async def arun(self, adrive: Callable[["plan.Plan[Any]"], Awaitable[Any]]) -> None:
        lines, key = _loop_lines(self.tasks.lines), self.key
        if key in lines.lines or key in lines.alone or key in lines.crowded:
            write = self.write
            await self.tasks.run(key, self.amount, lambda total, callers: adrive(write(total, callers)))
            return
        try:  # no await since the look: the loop's one thread decided
            lines.alone[key] = self
            await adrive(self.write(self.amount, 1))
            _take_back(lines, key, self)
        except BaseException:
            surely(lambda: _take_back(lines, key, self))
            raise


class SharedRead(plan.Step):
    """A plan's request for ``read()``'s answer (an immutable value: a
    counter's total): straight through when no other read of ``key`` is in
    flight (and ``key`` is not crowded), else shared with the callers asking for the same ``key`` at the
    same time in ``threads`` (blocking driver) or ``tasks`` (async driver).
    ``shared()`` is called for each answer that was another caller's read
    (a counter counts it as ``shared_reads``)."""

    __slots__ = ("threads", "tasks", "key", "read", "shared")

    def __init__(
        self, threads: "SharedReads[Any]", tasks: "AsyncSharedReads[Any]", key: Hashable,
        read: Callable[[], "plan.Plan[Any]"], shared: Callable[[], None],
    ) -> None:
        self.threads, self.tasks, self.key, self.read, self.shared = threads, tasks, key, read, shared

    def run(self, drive: Callable[["plan.Plan[Any]"], Any]) -> Any:
        lines, lock = _thread_lines(self.threads.lines)
        key = self.key
        try:
            with lock:  # registered, and known to be, in one line: an interrupt sees both or neither
                alone = key not in lines.lines and key not in lines.crowded and lines.alone.setdefault(key, self) is self
            if alone:
                result = drive(self.read())
                with lock:
                    _take_back(lines, key, self)
                return result
        except BaseException:
            if lines.alone.get(key) is self:
                _take_back_locked(lines, lock, key, self)
            raise
        read = self.read
        result, shared = self.threads.run(key, lambda: drive(read()))
        if shared:
            self.shared()
        return result

    async def arun(self, adrive: Callable[["plan.Plan[Any]"], Awaitable[Any]]) -> Any:
        lines, key = _loop_lines(self.tasks.lines), self.key
        if key in lines.lines or key in lines.alone or key in lines.crowded:
            read = self.read
            result, shared = await self.tasks.run(key, lambda: adrive(read()))
            if shared:
                self.shared()
            return result
        try:  # no await since the look: the loop's one thread decided
            lines.alone[key] = self
            result = await adrive(self.read())
            _take_back(lines, key, self)
            return result
        except BaseException:
            surely(lambda: _take_back(lines, key, self))
            raise
