"""The door of combined writes and shared reads (``counter._lone``): a call
with nothing of its key in flight goes straight through, and a caller that
arrives while it runs goes into the rounds, which count the lone call as a
running one. Everything the rounds promise holds at that hand-over:

* a caller is never combined into a write that began before it arrived,
  and the lone write is one of its counter's ``IN_FLIGHT`` writes;
* a reader arriving during a lone read is answered by a read that began
  after it asked (so it sees every amount acknowledged before its call);
* an interrupt (threads) or a cancellation (tasks) at any line of the lone
  call or of the caller arriving during it hangs nobody, misinforms nobody,
  and leaves nothing registered;
* a forked child does not wait for its parent's lone call; a caller waiting
  behind a stalled lone call gives up at its own deadline, nothing sent.

The steps are driven as a counter's plan drives them (``plan.run`` and
``plan.arun``); the scenarios reuse ``test_round_interrupts``'s injector.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from types import CodeType
from typing import Any, Callable

import pytest
import test_round_interrupts as rounds_test
from test_round_interrupts import (
    AMOUNT,
    BOUND,
    LATER,
    Injector,
    TaskInjector,
    check_accounting,
    codes_of,
    points_of,
    wait_until,
)

from gds_counter._process import deadlines  # noqa: E402
from gds_counter.counter import _lone as lone_module  # noqa: E402
from gds_counter.counter import _rounds  # noqa: E402
from gds_counter.counter._combined import AsyncCombinedWrites, CombinedWrites  # noqa: E402
from gds_counter.counter._lone import Combine, SharedRead  # noqa: E402
from gds_counter.counter._shared_reads import AsyncSharedReads, SharedReads  # noqa: E402
from gds_counter.errors import Contention  # noqa: E402
from gds_counter.gateway import plan  # noqa: E402

#: The door's code, and the rounds' code a lone call's end runs.
LONE_CODE = codes_of(lone_module, [
    "Combine.run", "Combine.arun", "SharedRead.run", "SharedRead.arun", "_take_back", "_thread_lines", "_loop_lines",
]) | codes_of(_rounds, ["Lines.alone_ended", "Lines._next"])


class AGateway:
    """Any gateway: the steps run their own plans on whatever the driver holds."""


def traced(code: set[CodeType]) -> Callable[[], None]:
    """Make the injectors of ``test_round_interrupts`` trace ``code`` too."""
    before = rounds_test.ROUND_CODE
    rounds_test.ROUND_CODE = before | code

    def undo() -> None:
        rounds_test.ROUND_CODE = before

    return undo


@pytest.fixture(autouse=True)
def lone_code_traced():
    undo = traced(LONE_CODE)
    yield
    undo()


def empty(lines: Any) -> bool:
    return lines.lines == {} and lines.alone == {}


# --- threads: writes -------------------------------------------------------------------


class Store:
    """A write that adds to a total; its first ``hold`` runs wait for ``gate``."""

    def __init__(self, hold: int = 1) -> None:
        self.total, self.runs, self.calls, self.hold = 0, 0, [], hold
        self.gate = threading.Event()
        self.lock = threading.Lock()

    def __call__(self, amount: int, callers: int) -> None:
        with self.lock:
            self.runs += 1
            self.calls.append((amount, callers))
            first = self.runs <= self.hold
        if first:
            assert self.gate.wait(BOUND)
        with self.lock:
            self.total += amount


def adder(combined: CombinedWrites, store: Store, amount: int) -> Callable[[], None]:
    def adding() -> plan.Plan[None]:
        def write(total: int, callers: int) -> plan.Plan[None]:
            return plan.call(lambda: store(total, callers))

        yield Combine(combined, AsyncCombinedWrites(), "counter", amount, write)

    return lambda: plan.run(adding(), AGateway())


def lone_scenario(role: str, at: tuple[CodeType, int] | None) -> tuple[Injector, dict[str, object], int]:
    """"first" writes straight through (held); "leader" arrives meanwhile and
    opens the next round, which may not start before the lone write ended
    (one write in flight); "j1" and "j2" join it; the write is let go.
    ``role``'s thread gets a KeyboardInterrupt at ``at``. Then two more."""
    combined, store = CombinedWrites(in_flight=1), Store()
    injector = Injector(at, KeyboardInterrupt)
    outcomes: dict[str, object] = {}

    def caller(name: str) -> threading.Thread:
        add = adder(combined, store, AMOUNT[name])

        def body() -> None:
            if name == role:
                sys.settrace(injector.global_trace)
            try:
                add()
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
    wait_until(lambda: store.runs == 1 or "first" in outcomes, "the lone write began")
    threads.append(caller("leader"))
    wait_until(lambda: next_round() is not None or store.runs > 1 or len(outcomes) >= 1, "the leader opened a round")
    threads += [caller("j1"), caller("j2")]
    wait_until(lambda: (next_round() is not None and next_round().waiting >= 2) or len(outcomes) >= 1, "two joined")
    store.gate.set()
    for thread in threads:
        thread.join(BOUND)
        assert not thread.is_alive(), f"{thread.name} hangs ({outcomes})"
    for thread in [caller(name) for name in LATER]:
        thread.join(BOUND)
        assert not thread.is_alive(), f"a later caller ({thread.name}) hangs after {role} was interrupted"
    assert outcomes["after1"] == "counted" and outcomes["after2"] == "counted", outcomes
    assert empty(combined.lines.get()[0]), combined.lines.get()[0].alone
    return injector, outcomes, store.total


def test_a_caller_arriving_during_a_lone_write_waits_for_it_as_for_a_running_write_and_is_not_combined_into_it():
    injector, outcomes, total = lone_scenario("nobody", None)
    assert set(outcomes.values()) == {"counted"} and total == sum(AMOUNT.values())


@pytest.mark.parametrize("in_flight", [1, 2])
def test_the_lone_write_is_one_of_the_writes_in_flight(in_flight):
    """Two callers arrive while a lone write runs (every write held). With
    one write in flight allowed, neither starts before the lone write ended,
    and both are combined into the next; with two (the default), the first
    of them writes at once and the other waits, to write alone after."""
    combined, store = CombinedWrites(in_flight=in_flight), Store(hold=3)
    first = threading.Thread(target=adder(combined, store, 1))
    first.start()
    wait_until(lambda: store.runs == 1, "the lone write began")
    assert combined.lines.get()[0].lines == {}  # no round for it
    later = []
    for amount in (10, 100):
        later.append(threading.Thread(target=adder(combined, store, amount)))
        later[-1].start()
        wait_until(lambda: (line := combined.lines.get()[0].lines.get("counter")) is not None
                   and (line.next is not None or line.running == 2), f"the caller of {amount} came")
        time.sleep(0.02)
    assert store.runs == in_flight  # the lone write counts
    store.gate.set()
    for thread in [first, *later]:
        thread.join(BOUND)
    assert store.calls == ([(1, 1), (110, 2)] if in_flight == 1 else [(1, 1), (10, 1), (100, 1)])
    assert empty(combined.lines.get()[0])


@pytest.mark.parametrize("role", ["first", "leader"])
def test_a_thread_interrupted_at_any_line_of_the_hand_over_hangs_nobody_and_nobody_is_misinformed(role):
    """The lone caller at every line from its look at the lines to taking its
    registration back (its end reported to the line the others opened); the
    caller that arrived during it at every line from opening that line to
    its outcome."""
    dry, outcomes, total = lone_scenario(role, None)
    assert set(outcomes.values()) == {"counted"} and total == sum(AMOUNT.values())
    points = points_of(dry)
    assert len(points) >= 8, points
    failures = []
    for point in points:
        try:
            injector, outcomes, total = lone_scenario(role, point)
            assert injector.fired
            check_accounting(total, outcomes)
        except AssertionError as exc:
            failures.append(f"{point[0].co_qualname} line {point[1]}: {exc}")
    assert not failures, "\n".join(failures)


def test_a_counter_whose_round_served_several_callers_stays_in_the_rounds_for_a_while():
    """Callers released together (by one write, one read) arrive one after
    another: had the first gone straight through, the rest would have
    formed a round behind it, two writes (or reads) where the rounds'
    leader, letting the ready ones join first, makes one. So once a round
    served more than its leader, the counter's callers go into the rounds
    until ``CROWDED_ROUNDS`` rounds in a row served their leader alone;
    then straight through again."""
    combined, store = CombinedWrites(in_flight=1), Store()
    first = threading.Thread(target=adder(combined, store, 1))
    first.start()
    wait_until(lambda: store.runs == 1, "the lone write began")
    later = [threading.Thread(target=adder(combined, store, 1)) for _ in range(2)]
    for thread in later:
        thread.start()
    wait_until(lambda: (line := combined.lines.get()[0].lines.get("counter")) is not None
               and line.next is not None and line.next.waiting >= 1, "both wait for the next write")
    store.gate.set()
    for thread in [first, *later]:
        thread.join(BOUND)
    assert store.calls == [(1, 1), (2, 2)]
    lines = combined.lines.get()[0]
    assert lines.crowded == {"counter": _rounds.CROWDED_ROUNDS}
    rounds_seen = []
    for _ in range(_rounds.CROWDED_ROUNDS + 2):
        rounds_seen.append("counter" in lines.crowded)
        adder(combined, store, 1)()
    assert rounds_seen == [True] * _rounds.CROWDED_ROUNDS + [False, False]
    assert store.total == 3 + _rounds.CROWDED_ROUNDS + 2 and empty(lines) and lines.crowded == {}


def test_a_lone_write_that_failed_leaves_nothing_registered():
    combined = CombinedWrites()

    def failing(total: int, callers: int) -> plan.Plan[None]:
        raise Contention("shard 1 kept conflicting (test)", attempts=3)
        yield  # pragma: no cover

    def adding() -> plan.Plan[None]:
        yield Combine(combined, AsyncCombinedWrites(), "counter", 1, failing)

    with pytest.raises(Contention):
        plan.run(adding(), AGateway())
    assert empty(combined.lines.get()[0])


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() (POSIX)")
def test_a_forked_child_writes_at_once_though_its_parent_was_in_a_lone_write():
    combined, store = CombinedWrites(in_flight=1), Store()
    first = threading.Thread(target=adder(combined, store, 1))
    first.start()
    wait_until(lambda: store.runs == 1, "the lone write began")
    pid = os.fork()
    if pid == 0:  # the child: the parent's lone write is not here
        calls: list[tuple[int, int]] = []

        def child_write(total: int, callers: int) -> plan.Plan[None]:
            return plan.call(lambda: calls.append((total, callers)))

        def adding() -> plan.Plan[None]:
            yield Combine(combined, AsyncCombinedWrites(), "counter", 4, child_write)

        try:
            plan.run(adding(), AGateway())
            os._exit(0 if calls == [(4, 1)] else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    store.gate.set()
    first.join(BOUND)
    assert os.waitstatus_to_exitcode(status) == 0


# --- threads: reads ---------------------------------------------------------------------


def reader(shared: SharedReads[int], read: Callable[[], int], sharers: list[int]) -> Callable[[], int]:
    def reading() -> plan.Plan[int]:
        total: int = yield SharedRead(shared, AsyncSharedReads(), "q", lambda: plan.call(read), lambda: sharers.append(1))
        return total

    return lambda: plan.run(reading(), AGateway())


def test_a_reader_arriving_during_a_lone_read_is_answered_by_a_read_that_began_after_it_asked():
    shared: SharedReads[int] = SharedReads()
    gate, began, sharers, out = threading.Event(), [], [], {}

    def read() -> int:
        began.append(len(began))
        if len(began) == 1:
            assert gate.wait(BOUND)
        return len(began)

    def call(name: str) -> threading.Thread:
        thread = threading.Thread(target=lambda: out.__setitem__(name, reader(shared, read, sharers)()))
        thread.start()
        return thread

    first = call("first")
    wait_until(lambda: len(began) == 1, "the lone read began")
    later = [call("second"), call("third")]
    wait_until(lambda: (line := shared.lines.get()[0].lines.get("q")) is not None and line.next is not None
               and line.next.waiting >= 1, "both wait for the next read")
    assert len(began) == 1  # one read of a total at a time: they wait for the lone one to end
    gate.set()
    for thread in [first, *later]:
        thread.join(BOUND)
    assert out == {"first": 1, "second": 2, "third": 2} and len(sharers) == 1
    assert empty(shared.lines.get()[0])


def test_a_reader_behind_a_stalled_lone_read_gives_up_at_its_deadline_having_read_nothing():
    shared: SharedReads[int] = SharedReads()
    gate, began, out = threading.Event(), [], {}

    def read() -> int:
        began.append(1)
        assert gate.wait(BOUND)
        return 7

    stalled = threading.Thread(target=reader(shared, read, []))
    stalled.start()
    wait_until(lambda: len(began) == 1, "the lone read began")

    def waiting() -> None:
        token = deadlines.limit(time.monotonic() + 0.3)
        started = time.monotonic()
        try:
            out["waiting"] = reader(shared, read, [])()
        except Contention as exc:
            out["waiting"] = exc
        finally:
            out["seconds"] = time.monotonic() - started
            deadlines.restore(token)

    behind = threading.Thread(target=waiting)
    behind.start()
    behind.join(BOUND)
    assert isinstance(out["waiting"], Contention) and "nothing of it was sent" in str(out["waiting"])
    assert out["seconds"] < 5 and len(began) == 1
    gate.set()
    stalled.join(BOUND)
    assert empty(shared.lines.get()[0])


def read_scenario(role: str, at: tuple[CodeType, int] | None) -> tuple[Injector, dict[str, object]]:
    """"first" reads straight through (held), "second" and "third" arrive
    meanwhile; ``role`` is interrupted at ``at``. Every reader not
    interrupted gets an answer that began after it asked, later ones too."""
    shared: SharedReads[int] = SharedReads()
    injector = Injector(at, KeyboardInterrupt)
    gate, began, outcomes = threading.Event(), [], {}

    def read() -> int:
        began.append(1)
        if len(began) == 1:
            assert gate.wait(BOUND)
        return len(began)

    asked_after: dict[str, int] = {}

    def caller(name: str) -> threading.Thread:
        call = reader(shared, read, [])
        asked_after[name] = len(began)  # reads begun before it asks: its answer must be a later one

        def body() -> None:
            if name == role:
                sys.settrace(injector.global_trace)
            try:
                outcomes[name] = call()
            except BaseException as exc:  # noqa: B902
                outcomes[name] = exc
            finally:
                sys.settrace(None)

        thread = threading.Thread(target=body, name=name, daemon=True)
        thread.start()
        return thread

    threads = [caller("first")]
    wait_until(lambda: len(began) == 1 or "first" in outcomes, "the lone read began")
    threads += [caller("second"), caller("third")]
    time.sleep(0.02)
    gate.set()
    for thread in threads + [caller(name) for name in LATER]:
        thread.join(BOUND)
        assert not thread.is_alive(), f"{thread.name} hangs ({outcomes})"
    for name, outcome in outcomes.items():
        if name == role and injector.fired:
            assert isinstance(outcome, KeyboardInterrupt), (name, outcome)
        else:
            assert isinstance(outcome, int) and outcome > asked_after[name], (name, outcomes)
    assert empty(shared.lines.get()[0])
    return injector, outcomes


def test_a_lone_reader_interrupted_at_any_line_hangs_no_other_reader():
    dry, _ = read_scenario("first", None)
    points = points_of(dry)
    assert len(points) >= 6, points
    failures = []
    for point in points:
        try:
            injector, _ = read_scenario("first", point)
            assert injector.fired
        except AssertionError as exc:
            failures.append(f"{point[0].co_qualname} line {point[1]}: {exc}")
    assert not failures, "\n".join(failures)


# --- tasks -----------------------------------------------------------------------------


def task_scenario(role: str, at: tuple[CodeType, int] | None) -> tuple[Injector, dict[str, object], int]:
    """The thread scenario for the tasks of one event loop: ``role`` gets a
    CancelledError at ``at`` (as if cancelled there)."""
    tasks = AsyncCombinedWrites(in_flight=1)
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

        def write(total: int, callers: int) -> plan.Plan[None]:
            return plan.awaiting(lambda: store(total, callers))

        async def caller(name: str) -> None:
            def adding() -> plan.Plan[None]:
                yield Combine(CombinedWrites(), tasks, "counter", AMOUNT[name], write)

            try:
                await plan.arun(adding(), AGateway())
                outcomes[name] = "counted"
            except BaseException as exc:  # noqa: B902
                outcomes[name] = exc

        running = [asyncio.create_task(caller("first"), name="first")]
        await asyncio.sleep(0)
        for name in ["leader", "j1", "j2"]:
            running.append(asyncio.create_task(caller(name), name=name))
            await asyncio.sleep(0)
        gate.set()
        _, pending = await asyncio.wait(running, timeout=BOUND)
        assert not pending, f"{[t.get_name() for t in pending]} hang ({outcomes})"
        _, pending = await asyncio.wait([asyncio.create_task(caller(n), name=n) for n in LATER], timeout=BOUND)
        assert not pending, f"a later caller hangs after {role} was cancelled"
        assert empty(tasks.lines.get())

    sys.settrace(injector.global_trace)
    try:
        asyncio.run(main())
    finally:
        sys.settrace(None)
    assert outcomes["after1"] == "counted" and outcomes["after2"] == "counted", outcomes
    return injector, outcomes, state["total"]


@pytest.mark.parametrize("role", ["first", "leader"])
def test_a_task_cancelled_at_any_line_of_the_hand_over_hangs_nobody_and_nobody_is_misinformed(role):
    dry, outcomes, total = task_scenario(role, None)
    assert set(outcomes.values()) == {"counted"} and total == sum(AMOUNT.values())
    points = points_of(dry)
    assert len(points) >= 5, points
    failures = []
    for point in points:
        try:
            injector, outcomes, total = task_scenario(role, point)
            assert injector.fired
            check_accounting(total, outcomes)
        except AssertionError as exc:
            failures.append(f"{point[0].co_qualname} line {point[1]}: {exc}")
    assert not failures, "\n".join(failures)


def test_a_task_arriving_during_a_lone_read_is_answered_by_a_read_that_began_after_it_asked():
    async def main() -> None:
        tasks: AsyncSharedReads[int] = AsyncSharedReads()
        gate, began, sharers = asyncio.Event(), [], []

        async def read() -> int:
            began.append(1)
            if len(began) == 1:
                await gate.wait()
            return len(began)

        def reading() -> plan.Plan[int]:
            total: int = yield SharedRead(SharedReads(), tasks, "q", lambda: plan.awaiting(read), lambda: sharers.append(1))
            return total

        first = asyncio.create_task(plan.arun(reading(), AGateway()))
        await asyncio.sleep(0)
        later = [asyncio.create_task(plan.arun(reading(), AGateway())) for _ in range(3)]
        for _ in range(10):
            await asyncio.sleep(0)
        assert len(began) == 1
        gate.set()
        assert await first == 1
        assert await asyncio.gather(*later) == [2, 2, 2] and len(sharers) == 2
        assert empty(tasks.lines.get())

    asyncio.run(main())
