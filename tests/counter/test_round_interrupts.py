"""An interrupt at any point of a round leaves the counter (or the query)
usable and every caller told the truth.

A round's callers hand work to one of them (its leader) and wait for it.
Today's rounds had steps outside any ``try``: a leader interrupted between
joining and starting, or after its write returned and before it answered,
left the round open (or counted as running) forever, and every later caller
of that key waited forever. Here a ``KeyboardInterrupt`` (for a thread) or a
``CancelledError`` (for a task) is raised at EVERY line the leader or a
joiner runs in the rounds' code, one line per run (a trace function raises
it, in that caller only), and then:

* no caller hangs, and later callers of the same key complete;
* every amount whose caller was told "counted" is stored exactly once, every
  amount whose caller got a not-stored error is not stored, and the others
  (``CommitUnknown``, the interrupt itself) are stored at most once;
* nothing is left in the lines.

Each caller adds its own power of 256, so the stored total says, digit by
digit, how many times each caller's amount was stored.
"""

from __future__ import annotations

import asyncio
import ctypes
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any, Callable, Iterable

import pytest

from gds_counter.counter import _combined as combined_module
from gds_counter.counter import _rounds as rounds
from gds_counter.counter import _shared_reads as shared_module
from gds_counter.counter._combined import AsyncCombinedWrites, CombinedWrites
from gds_counter.counter._shared_reads import AsyncSharedReads, SharedReads
from gds_counter.errors import CommitUnknown, GDSError

BOUND = 10  # seconds: a caller still waiting after this hangs

NAMES = ["first", "leader", "j1", "j2"]
LATER = ["after1", "after2"]
AMOUNT = {name: 256**i for i, name in enumerate(NAMES + LATER)}


def codes_of(module: Any, names: Iterable[str]) -> set[CodeType]:
    """The code objects of ``module``'s functions ``names`` (dotted for
    methods) that exist: the rounds' code may be laid out differently."""
    found = set()
    for name in names:
        target: Any = module
        for part in name.split("."):
            target = getattr(target, part, None)
        if target is not None:
            found.add(getattr(target, "__func__", target).__code__)
    return found


#: The code a round's callers run between joining and being answered (the
#: handler, ``Lines.leave``, is left out: an interrupt there is a second one).
ROUND_CODE = codes_of(rounds, [
    "Lines.join", "Lines.may_start", "Lines.start", "Lines.finish", "Lines.abandon", "Lines._wake", "settling",
    "ThreadLines.lead", "ThreadLines.await_end", "LoopLines.lead", "LoopLines.await_end",
]) | codes_of(combined_module, ["CombinedWrites.run", "AsyncCombinedWrites.run", "_joined"]) | codes_of(
    shared_module, ["SharedReads.run", "AsyncSharedReads.run"]
)


class Injector:
    """A trace function for one caller: records the (code, line) pairs it
    runs in ``ROUND_CODE``, and raises ``error()`` when it reaches ``at``."""

    def __init__(self, at: tuple[CodeType, int] | None, error: Callable[[], BaseException]) -> None:
        self.at = at
        self.error = error
        self.seen: list[tuple[CodeType, int]] = []
        self.fired = False

    def global_trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code not in ROUND_CODE:
            return None
        if not self.mine():
            return None
        return self.local_trace

    def local_trace(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and self.mine():
            point = (frame.f_code, frame.f_lineno)
            self.seen.append(point)
            if not self.fired and point == self.at:
                self.fired = True
                raise self.error()
        return self.local_trace

    def mine(self) -> bool:
        return True


def check_accounting(total: int, outcomes: dict[str, object]) -> None:
    for name, outcome in outcomes.items():
        digit = (total // AMOUNT[name]) % 256
        if outcome == "counted":
            assert digit == 1, f"{name} was told counted, stored {digit} times ({outcomes})"
        elif isinstance(outcome, (CommitUnknown, KeyboardInterrupt, asyncio.CancelledError)):
            assert digit in (0, 1), f"{name} ({outcome!r}) stored {digit} times"
        elif isinstance(outcome, GDSError):
            assert digit == 0, f"{name} was told {outcome!r} (not stored) but was stored {digit} times"
        else:
            raise AssertionError(f"{name} ended in {outcome!r}")


# --- threads ---------------------------------------------------------------------


class Store:
    """A write that adds to a total; its first run waits for ``gate``."""

    def __init__(self) -> None:
        self.total = 0
        self.gate = threading.Event()
        self.runs = 0
        self.lock = threading.Lock()

    def __call__(self, amount: int, callers: int) -> None:
        with self.lock:
            self.runs += 1
            first = self.runs == 1
        if first:
            assert self.gate.wait(BOUND)
        with self.lock:
            self.total += amount


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"never: {what}")
        time.sleep(0.002)


def thread_scenario(role: str, at: tuple[CodeType, int] | None) -> tuple[Injector, dict[str, object], int]:
    """"first" writes alone (held); "leader" opens the next round and waits
    for its turn; "j1" and "j2" join it; the write is let go. ``role``'s
    thread gets a KeyboardInterrupt at ``at``. Then two more callers."""
    combined, store = CombinedWrites(in_flight=1), Store()
    injector = Injector(at, KeyboardInterrupt)
    outcomes: dict[str, object] = {}

    def caller(name: str) -> threading.Thread:
        def body() -> None:
            if name == role:
                sys.settrace(injector.global_trace)
            try:
                combined.run("counter", AMOUNT[name], store)
                outcomes[name] = "counted"
            except BaseException as exc:  # noqa: B902  (the outcome is what is checked)
                outcomes[name] = exc
            finally:
                sys.settrace(None)

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        return thread

    def next_round() -> Any:
        line = combined.lines.get()[0].lines.get("counter")
        return None if line is None else line.next

    threads = [caller("first")]
    wait_until(lambda: store.runs == 1, "the first write began")
    threads.append(caller("leader"))
    wait_until(lambda: next_round() is not None or "leader" in outcomes, "the leader opened a round")
    threads += [caller("j1"), caller("j2")]
    wait_until(lambda: (next_round() is not None and next_round().waiting >= 2) or len(outcomes) >= 1,
               "two joined")
    store.gate.set()
    for thread in threads:
        thread.join(BOUND)
        assert not thread.is_alive(), f"{thread.name} hangs ({outcomes})"
    later = [caller(name) for name in LATER]
    for thread in later:
        thread.join(BOUND)
        assert not thread.is_alive(), f"a later caller ({thread.name}) hangs after {role} was interrupted"
    assert outcomes["after1"] == "counted" and outcomes["after2"] == "counted", outcomes
    assert combined.lines.get()[0].lines == {}
    return injector, outcomes, store.total


def points_of(injector: Injector) -> list[tuple[CodeType, int]]:
    return list(dict.fromkeys(injector.seen))  # each line once, in the order first reached


@pytest.mark.parametrize("role", ["leader", "j1"])
def test_a_thread_interrupted_at_any_line_of_its_round_hangs_nobody_and_nobody_is_misinformed(role):
    """The leader at every line from joining to answering (before its turn,
    while settling and starting, around the write, while finishing), and a
    joiner at every line from joining to its outcome."""
    dry, outcomes, total = thread_scenario(role, None)
    assert set(outcomes.values()) == {"counted"} and total == sum(AMOUNT.values())
    points = points_of(dry)
    print(f"{role}: {len(points)} lines")
    assert len(points) >= 10, points  # the tracer reached the rounds' code
    failures = []
    for point in points:
        try:
            injector, outcomes, total = thread_scenario(role, point)
            assert injector.fired
            check_accounting(total, outcomes)
        except AssertionError as exc:
            failures.append(f"{point[0].co_qualname} line {point[1]}: {exc}")
    assert not failures, "\n".join(failures)


def test_a_joiner_waiting_for_a_write_can_be_interrupted_by_an_exception_sent_to_its_thread():
    """``PyThreadState_SetAsyncExc`` is only raised while the thread runs
    Python code: a joiner blocked in ``Event.wait()`` without a timeout
    would not see it until the write it waits for ends. It waits in slices,
    so it leaves at once; its write had not begun, so its amount is taken
    out and the others are unaffected."""
    combined, store = CombinedWrites(in_flight=1), Store()
    outcomes: dict[str, object] = {}

    def caller(name: str) -> threading.Thread:
        def body() -> None:
            try:
                combined.run("counter", AMOUNT[name], store)
                outcomes[name] = "counted"
            except BaseException as exc:  # noqa: B902
                outcomes[name] = exc

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        return thread

    first = caller("first")
    wait_until(lambda: store.runs == 1, "the first write began")
    others = [caller("leader"), caller("j1")]
    wait_until(lambda: combined.lines.get()[0].lines["counter"].next.waiting >= 1, "j1 joined")
    time.sleep(0.05)
    target = others[1]
    assert ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target.ident), ctypes.py_object(KeyboardInterrupt)) == 1
    target.join(2)
    left = not target.is_alive()
    store.gate.set()  # let everything end (before asserting: no thread is left blocked)
    for thread in [first, *others]:
        thread.join(BOUND)
    assert left, "the joiner did not leave while the write it waited for was running"
    assert isinstance(outcomes["j1"], KeyboardInterrupt)
    assert outcomes["first"] == "counted" and outcomes["leader"] == "counted"
    assert store.total == AMOUNT["first"] + AMOUNT["leader"]  # j1's amount was taken out


# --- tasks -----------------------------------------------------------------------


class TaskInjector(Injector):
    def __init__(self, role: str, at: tuple[CodeType, int] | None) -> None:
        super().__init__(at, asyncio.CancelledError)
        self.role = role

    def mine(self) -> bool:
        try:
            task = asyncio.current_task()
        except RuntimeError:
            return False
        return task is not None and task.get_name() == self.role


def task_scenario(role: str, at: tuple[CodeType, int] | None) -> tuple[Injector, dict[str, object], int]:
    """The thread scenario, for the tasks of one event loop: ``role`` gets a
    CancelledError at ``at`` (as if cancelled there)."""
    combined = AsyncCombinedWrites(in_flight=1)
    injector = TaskInjector(role, at)
    outcomes: dict[str, object] = {}
    state = {"total": 0, "runs": 0}

    async def main() -> None:
        gate = asyncio.Event()

        async def store(amount: int, callers: int) -> None:
            state["runs"] += 1
            if state["runs"] == 1:
                await gate.wait()
            await asyncio.sleep(0)
            state["total"] += amount

        async def caller(name: str) -> None:
            try:
                await combined.run("counter", AMOUNT[name], store)
                outcomes[name] = "counted"
            except BaseException as exc:  # noqa: B902
                outcomes[name] = exc

        tasks = [asyncio.create_task(caller("first"), name="first")]
        await asyncio.sleep(0)
        for name in ["leader", "j1", "j2"]:
            tasks.append(asyncio.create_task(caller(name), name=name))
            await asyncio.sleep(0)
        gate.set()
        done, pending = await asyncio.wait(tasks, timeout=BOUND)
        assert not pending, f"{[t.get_name() for t in pending]} hang ({outcomes})"
        later = [asyncio.create_task(caller(name), name=name) for name in LATER]
        done, pending = await asyncio.wait(later, timeout=BOUND)
        assert not pending, f"a later caller hangs after {role} was cancelled"
        assert combined.lines.get().lines == {}

    sys.settrace(injector.global_trace)
    try:
        asyncio.run(main())
    finally:
        sys.settrace(None)
    assert outcomes["after1"] == "counted" and outcomes["after2"] == "counted", outcomes
    return injector, outcomes, state["total"]


@pytest.mark.parametrize("role", ["leader", "j1"])
def test_a_task_cancelled_at_any_line_of_its_round_hangs_nobody_and_nobody_is_misinformed(role):
    dry, outcomes, total = task_scenario(role, None)
    assert set(outcomes.values()) == {"counted"} and total == sum(AMOUNT.values())
    points = points_of(dry)
    print(f"{role}: {len(points)} lines")
    assert len(points) >= 8, points
    failures = []
    for point in points:
        try:
            injector, outcomes, total = task_scenario(role, point)
            assert injector.fired
            check_accounting(total, outcomes)
        except AssertionError as exc:
            failures.append(f"{point[0].co_qualname} line {point[1]}: {exc}")
    assert not failures, "\n".join(failures)


# --- shared reads ----------------------------------------------------------------


def read_scenario(role: str, at: tuple[CodeType, int] | None, face: str) -> tuple[Injector, dict[str, object]]:
    """"first" reads alone (held); "leader" opens the next read, "j1" and
    "j2" join it; ``role`` is interrupted at ``at``. Reads are safe to
    repeat, so every caller not interrupted must get an answer (its own
    read's or a read that began after it asked), and later readers too."""
    outcomes: dict[str, object] = {}
    reads = {"begun": 0}

    if face == "threads":
        shared: Any = SharedReads()
        injector = Injector(at, KeyboardInterrupt)
        gate = threading.Event()

        def read() -> int:
            reads["begun"] += 1
            number = reads["begun"]
            if number == 1:
                assert gate.wait(BOUND)
            return number

        def caller(name: str) -> threading.Thread:
            def body() -> None:
                if name == role:
                    sys.settrace(injector.global_trace)
                try:
                    outcomes[name] = shared.run("q", read)[0]
                except BaseException as exc:  # noqa: B902
                    outcomes[name] = exc
                finally:
                    sys.settrace(None)

            thread = threading.Thread(target=body, name=name, daemon=True)
            thread.start()
            return thread

        def next_round() -> Any:
            line = shared.lines.get()[0].lines.get("q")
            return None if line is None else line.next

        threads = [caller("first")]
        wait_until(lambda: reads["begun"] == 1, "the first read began")
        threads.append(caller("leader"))
        wait_until(lambda: next_round() is not None or "leader" in outcomes, "the leader opened a round")
        threads += [caller("j1"), caller("j2")]
        wait_until(lambda: (next_round() is not None and next_round().waiting >= 2) or len(outcomes) >= 1,
                   "two joined")
        gate.set()
        for thread in threads + [caller(name) for name in LATER]:
            thread.join(BOUND)
            assert not thread.is_alive(), f"{thread.name} hangs ({outcomes})"
        assert shared.lines.get()[0].lines == {}
    else:
        ashared: Any = AsyncSharedReads()
        injector = TaskInjector(role, at)

        async def main() -> None:
            agate = asyncio.Event()

            async def aread() -> int:
                reads["begun"] += 1
                number = reads["begun"]
                if number == 1:
                    await agate.wait()
                await asyncio.sleep(0)
                return number

            async def caller(name: str) -> None:
                try:
                    outcomes[name] = (await ashared.run("q", aread))[0]
                except BaseException as exc:  # noqa: B902
                    outcomes[name] = exc

            tasks = [asyncio.create_task(caller("first"), name="first")]
            await asyncio.sleep(0)
            for name in ["leader", "j1", "j2"]:
                tasks.append(asyncio.create_task(caller(name), name=name))
                await asyncio.sleep(0)
            agate.set()
            _, pending = await asyncio.wait(tasks, timeout=BOUND)
            assert not pending, f"{[t.get_name() for t in pending]} hang ({outcomes})"
            _, pending = await asyncio.wait([asyncio.create_task(caller(n), name=n) for n in LATER], timeout=BOUND)
            assert not pending, f"a later reader hangs after {role} was cancelled"
            assert ashared.lines.get().lines == {}

        sys.settrace(injector.global_trace)
        try:
            asyncio.run(main())
        finally:
            sys.settrace(None)
    for name, outcome in outcomes.items():
        if name == role and injector.fired:
            assert isinstance(outcome, (KeyboardInterrupt, asyncio.CancelledError)), (name, outcome)
        else:
            assert isinstance(outcome, int) and (name == "first" or outcome >= 2), (name, outcome, outcomes)
    return injector, outcomes


@pytest.mark.parametrize("face", ["threads", "tasks"])
@pytest.mark.parametrize("role", ["leader", "j1"])
def test_a_reader_interrupted_at_any_line_of_its_read_hangs_no_other_reader(role, face):
    dry, outcomes = read_scenario(role, None, face)
    points = points_of(dry)
    assert len(points) >= 8, points
    failures = []
    for point in points:
        try:
            injector, _ = read_scenario(role, point, face)
            assert injector.fired
        except AssertionError as exc:
            failures.append(f"{point[0].co_qualname} line {point[1]}: {exc}")
    assert not failures, "\n".join(failures)
