"""Rounds: callers that ask for the same work while it runs join its next run.

Both ways this library lets callers of one process share work go by the
same rule, kept here once:

* ``shared_reads``: callers reading the same query at once share one read;
* combined writes (``counter._combined``, the one user above the storage
  layer): callers adding to the same counter at once have their amounts
  committed by one write.

Per key there is a *line*: at most ``running`` rounds run (one for reads,
two for writes), and at most one round is open (its work has not begun).
A caller joins the open round, or opens one and leads it: when as many
rounds run as may, the leader waits for one to end (its ``turn``); then it
starts the work with whoever joined by then, and answers them all
(``done``). A caller is therefore only ever served by work that began
after it arrived, which is what keeps a shared read strongly consistent and
a combined write's callers' amounts each in exactly one commit.

A caller with nothing of its key in flight never comes here: it goes
straight through (``counter._lone``), registered in its lines' ``alone``
while its work runs. A caller that arrives meanwhile opens the key's line
here, which counts that lone call as one of its running rounds until the
lone call reports its end (``Lines.alone_ended``). Once a round has served
more than its leader, the key is ``crowded``: its callers keep coming here
(where a leader lets the callers that are ready join it first) until
``CROWDED_ROUNDS`` rounds in a row served their leader alone. Without that, callers released together (by
one write, one read) split in two: the first went straight through alone,
the others formed the next round behind it (16 threads incrementing one
counter on a SQLite file: four times the reads per increment, and half the
increments a second).

The rounds' bookkeeping is the same for threads and for the tasks of one
event loop; only the waiting (a ``Gate`` or an ``asyncio.Event``)
and the locking (a real lock; one event loop needs none) differ.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from typing import Any, Callable, Generic, Hashable, Iterator, TypeVar, Union

from gds_counter._process import deadlines, forks
from gds_counter._process.interrupts import surely
from gds_counter.errors import Contention

R = TypeVar("R")

__all__ = [
    "SETTLE_WAITS", "SLICE", "Gate", "Line", "Lines", "LoopLines", "Round", "Seat", "ThreadLines", "as_async",
    "settling", "yield_thread",
]


class Gate:
    """What a thread waits on for its round: ``set``, ``clear`` and
    ``wait(timeout)`` as a ``threading.Event``'s, but safe wherever an
    interrupt lands.

    A ``threading.Event`` keeps its flag under a Condition's plain lock. A
    KeyboardInterrupt that lands as that lock is taken or released leaves
    it held (bpo-29988), and the round's next ``set()`` then waits for ever
    on it: a Ctrl-C every millisecond or so hung the memory gateway within
    a few hundred calls that way. Here the flag is a plain attribute, and
    the wake-up a lock that is held while the gate is shut: ``set`` releases
    it and never waits; ``wait`` takes it (with a timeout) and lets it go
    only if the flag is up. An interrupt between those leaves the gate shut
    with its flag up, which costs the other waiters at most one timeout:
    every waiter here waits in slices (``SLICE``) and looks at the flag."""

    __slots__ = ("_flag", "_shut")

    def __init__(self) -> None:
        self._flag = False
        self._shut = threading.Lock()
        self._shut.acquire()

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        _open(self._shut)

    def clear(self) -> None:
        self._flag = False
        self._shut.acquire(blocking=False)

    def wait(self, timeout: float) -> bool:
        """Whether the gate was opened within ``timeout`` seconds."""
        if self._flag:
            return True
        if self._shut.acquire(timeout=timeout) and self._flag:
            _open(self._shut)  # (left shut when the flag is down: opened by a clear() that raced a waiter)
        return self._flag


def _open(lock: threading.Lock) -> None:
    try:
        lock.release()
    except RuntimeError:  # open already (set twice, or set as a waiter let it go)
        pass


Event = Union[Gate, asyncio.Event]

#: The most times a round's leader lets ready callers join before it starts.
SETTLE_WAITS = 4

#: A key stays crowded (its callers come to the rounds) until this many of
#: its rounds in a row served their leader alone.
CROWDED_ROUNDS = 8

#: A thread waits for a round in slices of this many seconds, so that an
#: exception sent to it (``PyThreadState_SetAsyncExc``, which is only raised
#: while the thread runs Python code) reaches it while it waits.
SLICE = 0.05


class Seat:
    """One caller's place in a round: what it brought, and where it sits.

    Made before the caller enters the lines, and filled by ``Lines.join``
    in the same statements that seat it there, so that whatever interrupts
    the caller afterwards (KeyboardInterrupt, an exception sent to its
    thread, a task's cancellation), ``Lines.leave`` knows what it holds."""

    __slots__ = ("key", "amount", "line", "round", "leads", "wait")

    def __init__(self, key: Hashable, amount: Any = None) -> None:
        self.key = key
        self.amount = amount
        self.line: Line[Any] | None = None
        self.round: Round[Any] | None = None
        #: True for the caller that opened the round and does its work.
        self.leads = False
        #: The leader found as many rounds running as may: it waits first.
        self.wait = False


class Round(Generic[R]):
    """One run of one key's work: who joined it, and its outcome.

    Its state moves open -> ``started`` -> ``ended`` (or open -> ``ended``,
    abandoned); each move is one statement that calls nothing, which the
    interpreter never interrupts (an asynchronous exception or a signal is
    only raised where a call or a backward jump checks for one), so a round
    is never seen half moved."""

    __slots__ = ("turn", "done", "result", "error", "failed", "seats", "started", "sent", "ended")

    def __init__(self, turn: Event, done: Event) -> None:
        self.turn = turn  # set when the rounds running fell below the limit: its leader may start
        self.done = done  # set after ``ended``: its outcome is known
        self.result: R | None = None
        #: What the work raised, for the callers that joined it.
        self.error: BaseException | None = None
        #: True when the round did not serve its callers (its leader gave up,
        #: or the work failed for a reason of its own): each does its own.
        self.failed = False
        #: Who joined (the leader first): each brings its ``amount``.
        self.seats: list[Seat] = []
        self.started = False  # its work began: nobody joins or leaves it any more
        #: Set by the leader just before it hands the work over (a write
        #: sent): from then on a failure leaves the callers' outcome unknown.
        self.sent = False
        self.ended = False

    @property
    def waiting(self) -> int:
        """Callers that joined it besides its leader."""
        return max(len(self.seats) - 1, 0)

    @property
    def shares(self) -> list[Any]:
        """What each caller brought (a combined write's amounts)."""
        return [seat.amount for seat in self.seats]


class Line(Generic[R]):
    """One key's rounds: whether one runs, and the round still open to
    callers (its work has not begun). ``alone``: the key's lone call
    (``counter._lone``) ran when the line was opened, and is counted in
    ``running`` until it reports its end."""

    __slots__ = ("running", "next", "alone")

    def __init__(self, alone: bool = False) -> None:
        self.running = 1 if alone else 0  # rounds whose work has begun and not ended
        self.alone = alone
        self.next: Round[R] | None = None


class Lines(Generic[R]):
    """Which rounds run, per key. Callers hold the lock (a real one for
    threads; one event loop needs none) around every method."""

    def __init__(self, new_event: Callable[[], Event], running: int = 1) -> None:
        self.new_event = new_event
        #: How many rounds of one key may run at once.
        self.limit = running
        self.lines: dict[Hashable, Line[R]] = {}
        #: Per key, the token of the lone call running straight through
        #: (``counter._lone``); a line opened meanwhile counts it (``Line.alone``).
        self.alone: dict[Hashable, object] = {}
        #: Keys a recent round of which served more than its leader, and for
        #: how many rounds more: their callers come to the rounds, not
        #: straight through (see the module docstring).
        self.crowded: dict[Hashable, int] = {}

    def join(self, seat: Seat) -> Round[R]:
        """Seat the caller in its key's open round, or open one that it
        leads (``seat.leads``; ``seat.wait`` when it must wait for a running
        round to end first), and return that round. The seat records the
        round in the statement that puts it in the line: no moment has one
        without the other."""
        line = self.lines.get(seat.key)
        if line is None:  # (an idle line left here is harmless)
            # A lone call of this key running now is one of its running rounds.
            line = self.lines[seat.key] = Line(seat.key in self.alone)
        seat.line = line
        mine = line.next
        if mine is None:
            fresh: Round[R] = Round(self.new_event(), self.new_event())
            fresh.seats.append(seat)
            seat.leads, seat.wait = True, line.running >= self.limit
            line.next = seat.round = fresh
            return fresh
        seat.round = mine  # first: a seat in a round's seats always knows its round
        mine.seats.append(seat)
        return mine

    def may_start(self, seat: Seat) -> bool:
        """Whether the leader's round may start now (fewer rounds run than
        the limit); if not, its ``turn`` is cleared, to be set when one ends."""
        assert seat.line is not None and seat.round is not None
        if seat.line.running < self.limit:
            return True
        seat.round.turn.clear()
        return False

    def start(self, seat: Seat) -> None:
        """The leader begins its round's work: callers arriving from now on
        open the next round."""
        line, mine = seat.line, seat.round
        assert line is not None and mine is not None and line.next is mine
        line.next, line.running, mine.started = None, line.running + 1, True

    def abandon(self, seat: Seat) -> None:
        """The leader gave up before its round's work began: whoever joined
        does its own, newcomers open a round of their own."""
        line, mine = seat.line, seat.round
        assert line is not None and mine is not None
        if not mine.ended:
            line.next, mine.failed, mine.ended = (None if line.next is mine else line.next), True, True
        self._wake(seat)

    def finish(
        self, seat: Seat, result: R | None, *, failed: bool = False, error: BaseException | None = None,
    ) -> None:
        """A round's work ended: answer its callers, then let the round
        behind it start, or drop the line when none is open."""
        line, mine = seat.line, seat.round
        assert line is not None and mine is not None and mine.started
        if not mine.ended:
            mine.result, mine.failed, mine.error, mine.ended, line.running = (
                result, failed, error, True, line.running - 1
            )
            self._crowd(seat.key, mine.waiting)
        self._wake(seat)

    def _crowd(self, key: Hashable, joined: int) -> None:
        """A round of ``key`` that ``joined`` callers joined ended: the key
        is crowded for ``CROWDED_ROUNDS`` rounds more, or one round less."""
        if joined:
            self.crowded[key] = CROWDED_ROUNDS
        else:
            left = self.crowded.get(key, 0) - 1
            if left > 0:
                self.crowded[key] = left
            else:
                self.crowded.pop(key, None)

    def leave(self, seat: Seat, error: BaseException) -> None:
        """The caller leaves on ``error`` (an interrupt, a cancellation, its
        work's failure), at whatever point it was: the lines are left as if
        it had never come, or its round ended truthfully.

        * never seated, or its round already ended: nothing to undo;
        * a caller that joined a round not yet begun takes its seat (and
          amount) out: nothing of it is sent;
        * a leader whose round had not begun abandons it (the others do
          their own), one whose work began but was not handed over ends it
          as failed (the same), and one whose work was handed over (a write
          sent) ends it with ``error``: its callers' outcome is unknown.

        Safe to call again after an interruption of its own (``surely``)."""
        mine = seat.round
        if mine is None or seat.line is None:
            line = seat.line
            if line is not None and line.next is None and not line.running and self.lines.get(seat.key) is line:
                del self.lines[seat.key]
            return
        if mine.ended:
            self._wake(seat)
        elif not seat.leads:
            if not mine.started and seat in mine.seats:
                mine.seats.remove(seat)
        elif not mine.started:
            self.abandon(seat)
        elif not mine.sent:
            self.finish(seat, None, failed=True)
        else:
            self.finish(seat, None, error=error)

    def alone_ended(self, line: Line[R], key: Hashable) -> None:
        """The lone call of ``key`` that ``line`` counts as running ended
        (``counter._lone``, which calls this only when a line was opened
        meanwhile): the round behind it may start, or the line is dropped.
        Safe to call again."""
        if line.alone:
            line.alone, line.running = False, line.running - 1
        self._next(line, key)

    def _wake(self, seat: Seat) -> None:
        """After a round ended: the round behind it may start, a line with
        nothing in it is dropped, the round's callers are answered. Each
        step may be repeated (``leave`` does, after an interruption)."""
        line, mine = seat.line, seat.round
        assert line is not None and mine is not None
        self._next(line, seat.key)
        mine.done.set()

    def _next(self, line: Line[R], key: Hashable) -> None:
        """After a round (or a lone call) of ``line`` ended: the round
        behind it may start; a line with nothing in it is dropped."""
        behind = line.next
        if behind is not None:
            if line.running < self.limit:
                behind.turn.set()
        elif not line.running and self.lines.get(key) is line:
            del self.lines[key]


class ThreadLines(Generic[R]):
    """The lines of a process's threads, and the lock around them. Safe
    across ``fork()``: a child starts with none (the threads running the
    parent's rounds are not there). ``pid``, ``lines`` and ``lock`` are
    what ``get`` gives, readable without a call (``counter._lone`` reads
    them so that a lone call runs no code of this module)."""

    def __init__(self, running: int = 1) -> None:
        self._running = running
        self._reset()

    def _reset(self) -> None:
        self.pid = forks.here()
        self.lock = threading.Lock()
        self.lines: Lines[R] = Lines(Gate, self._running)

    def get(self) -> tuple[Lines[R], threading.Lock]:
        if not forks.owned_here(self.pid):
            self._reset()
        return self.lines, self.lock

    @staticmethod
    def lead(
        lines: Lines[R], lock: threading.Lock, seat: Seat, *, settle: bool, pause: Callable[[], None] | None = None,
    ) -> None:
        """A leader's way into its round (in the ``lines`` and under the
        ``lock`` that ``get`` gave it): wait for its turn, let the threads
        that are ready join first (``settle``: a ``pause()`` each time, by
        default ``yield_thread``), then start. The caller
        wraps this and its work in one ``try`` whose handler is
        ``Lines.leave``: an interrupt anywhere here abandons the round."""
        mine = seat.round
        assert mine is not None
        while True:
            with lock:
                if lines.may_start(seat):
                    break
            if deadlines.remaining(SLICE) <= 0:
                raise _out_of_time("the writes of this key ahead of it")
            threading_event(mine.turn).wait(SLICE)
        if settle:
            pause = pause or yield_thread
            for _ in settling(mine):
                pause()
        with lock:
            lines.start(seat)

    @staticmethod
    def await_end(mine: Round[Any], lines: Lines[R], lock: threading.Lock, seat: Seat) -> None:
        """A joiner's wait for its round's outcome, in slices (``SLICE``)
        so that an exception sent to the thread reaches it. Until the round
        starts, the wait ends at the caller's deadline (``_process.deadlines``): it
        leaves the round, nothing of it sent. Once started, the round's
        work is bounded by its leader's deadline, which came first."""
        while not mine.ended:
            if not mine.started and deadlines.remaining(SLICE) <= 0:
                with lock:
                    if not mine.started:
                        lines.leave(seat, TimeoutError())
                        raise _out_of_time("the round it joined")
            threading_event(mine.done).wait(SLICE)

    @staticmethod
    def leave(lines: Lines[R], lock: threading.Lock, seat: Seat, error: BaseException) -> None:
        """``Lines.leave`` under the lock, carried to its end (``surely``)."""

        def step() -> None:
            with lock:
                lines.leave(seat, error)

        surely(step)


class LoopLines(Generic[R]):
    """The lines of the tasks of each running event loop (an async gateway
    may serve several loops, one after the other or in several threads).
    Safe across ``fork()``: a child starts with none, and a free lock.
    ``pid`` and ``per_loop`` are readable without a call, as
    ``ThreadLines``'s are."""

    def __init__(self, running: int = 1) -> None:
        self._running = running
        self._reset()

    def _reset(self) -> None:
        self.pid = forks.here()
        self.per_loop: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Lines[R]]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self) -> Lines[R]:
        """The running loop's lines (its tasks need no lock around them)."""
        loop = asyncio.get_running_loop()
        if not forks.owned_here(self.pid):
            self._reset()
        with self._lock:
            lines = self.per_loop.get(loop)
            if lines is None:
                lines = self.per_loop[loop] = Lines(asyncio.Event, self._running)
            return lines

    @staticmethod
    async def lead(lines: Lines[R], seat: Seat, *, settle: bool) -> None:
        """A leader's way into its round, as ``ThreadLines.lead``, for a
        task (cancelled anywhere here, its ``leave`` abandons the round)."""
        mine = seat.round
        assert mine is not None
        while not lines.may_start(seat):
            await as_async(mine.turn).wait()
        if settle:
            for _ in settling(mine):
                await asyncio.sleep(0)
        lines.start(seat)

    @staticmethod
    async def await_end(mine: Round[Any]) -> None:
        """A joiner's wait for its round's outcome (a cancellation ends it)."""
        while not mine.ended:
            await as_async(mine.done).wait()

    @staticmethod
    def leave(lines: Lines[R], seat: Seat, error: BaseException) -> None:
        """``Lines.leave``, carried to its end (``surely``)."""
        surely(lambda: lines.leave(seat, error))


def _out_of_time(behind: str) -> Contention:
    return Contention(
        f"the call's deadline passed while it waited for {behind} in this process; nothing of it was sent",
        attempts=0,
    )


def yield_thread() -> None:
    """Let the threads that are ready run before this one goes on."""
    time.sleep(0)


def settling(mine: Round[Any]) -> Iterator[None]:
    """The leader's waits before its round starts (each lets the threads
    or tasks that are ready run: ``time.sleep(0)``, about 25 us of CPU and
    90 us of time, or ``asyncio.sleep(0)``): one, then another as long as
    the last one brought a caller to join, up to ``SETTLE_WAITS``. Callers
    released together (by one group commit, one round) arrive one after
    another; a single wait let the first few join and left the rest to
    another round (16 threads reading a total: 0.19 reads per increment
    with one wait, 0.14 with up to four)."""
    joined = -1
    for _ in range(SETTLE_WAITS):
        if mine.waiting == joined:
            return
        joined = mine.waiting
        yield


def threading_event(event: Event) -> Gate:
    """An event of lines made for threads (``Lines(Gate)``)."""
    assert isinstance(event, Gate)
    return event


def as_async(event: Event) -> asyncio.Event:
    """An event of lines made for tasks (``Lines(asyncio.Event)``)."""
    assert isinstance(event, asyncio.Event)
    return event
