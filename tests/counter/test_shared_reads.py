"""``SharedReads`` (threads) and ``AsyncSharedReads`` (tasks): callers of
one read that arrive together share it, and never one that began before
they arrived (that is what keeps an increment's total strongly
consistent). A counter's plan asks for one with the ``SharedRead`` step,
which both drivers run."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from gds_counter.counter._lone import SharedRead
from gds_counter.counter._shared_reads import AsyncSharedReads, SharedReads
from gds_counter.gateway import plan


class Reads:
    """A read function whose runs block until released, numbered in order."""

    def __init__(self) -> None:
        self.started: list[threading.Event] = [threading.Event() for _ in range(4)]
        self.release: list[threading.Event] = [threading.Event() for _ in range(4)]
        self.fail: set[int] = set()
        self.runs = 0
        self.lock = threading.Lock()

    def __call__(self) -> int:
        with self.lock:
            n = self.runs
            self.runs += 1
        self.started[n].set()
        assert self.release[n].wait(10)
        if n in self.fail:
            raise RuntimeError(f"read {n} failed")
        return n


def call(shared: SharedReads[int], read: Reads, out: dict[str, object], name: str) -> threading.Thread:
    def run() -> None:
        try:
            out[name] = shared.run("q", read)
        except RuntimeError as exc:
            out[name] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def joined(shared: SharedReads[int], count: int) -> None:
    """Wait until ``count`` callers wait for the next round (white box: the
    round's waiters are not observable otherwise without timing)."""

    for _ in range(1000):
        line = shared.lines.get()[0].lines.get("q")
        if line is not None and line.next is not None and line.next.waiting >= count:
            return
        time.sleep(0.005)
    raise AssertionError("callers did not join")


def test_callers_arriving_during_a_read_share_the_next_one_not_the_running_one():
    shared: SharedReads[int] = SharedReads()
    read, out = Reads(), {}
    first = call(shared, read, out, "first")
    assert read.started[0].wait(10)
    second = call(shared, read, out, "second")  # arrives while read 0 runs: must not get read 0
    third = call(shared, read, out, "third")
    joined(shared, 1)  # "third" waits for the round "second" will run
    read.release[0].set()
    first.join(10)
    assert out["first"] == (0, False)
    assert read.started[1].wait(10)
    read.release[1].set()
    for thread in (second, third):
        thread.join(10)
    assert sorted([out["second"], out["third"]]) == [(1, False), (1, True)]
    assert read.runs == 2


def test_a_failed_shared_read_lets_each_joined_caller_read_alone():
    shared: SharedReads[int] = SharedReads()
    read, out = Reads(), {}
    read.fail.add(1)
    first = call(shared, read, out, "first")
    assert read.started[0].wait(10)
    second = call(shared, read, out, "second")
    third = call(shared, read, out, "third")
    joined(shared, 1)
    read.release[0].set()
    assert read.started[1].wait(10)
    read.release[1].set()  # the shared read fails: its runner raises, the other reads itself
    assert read.started[2].wait(10)
    read.release[2].set()
    for thread in (first, second, third):
        thread.join(10)
    results = sorted([out["second"], out["third"]], key=str)
    assert isinstance(results[1], RuntimeError) and str(results[1]) == "read 1 failed"
    assert results[0] == (2, False)


def test_alone_a_caller_reads_at_once_and_nothing_is_kept():
    shared: SharedReads[int] = SharedReads()
    assert shared.run("q", lambda: 7) == (7, False)
    assert shared.run("q", lambda: 8) == (8, False)
    with pytest.raises(ZeroDivisionError):
        shared.run("q", lambda: 1 // 0)
    assert shared.lines.get()[0].lines == {}


@pytest.mark.parametrize("bringing", [0, 2, 10])
def test_a_leader_waits_again_while_each_wait_brings_another_caller_to_join(bringing):
    """The callers one group commit releases reach the read one after
    another: the leader waits once, then again for as long as the last wait
    brought a caller, up to SETTLE_WAITS; everyone who came shares its one
    read."""
    from gds_counter.counter import _rounds as rounds

    read = Reads()
    read.release[0].set()
    out: dict[str, object] = {}
    threads: list[threading.Thread] = []
    waits: list[float] = []

    def wait_for_joiner() -> None:
        waits.append(0)
        if len(waits) <= bringing:
            threads.append(call(shared, read, out, f"joiner {len(waits)}"))
            for _ in range(2000):
                line = shared.lines.get()[0].lines["q"]
                if line.next is not None and line.next.waiting >= len(waits):
                    return
                threading.Event().wait(0.005)
            raise AssertionError("the caller did not join")

    shared: SharedReads[int] = SharedReads(pause=wait_for_joiner)
    assert shared.run("q", read) == (0, False)
    for thread in threads:
        thread.join(10)
    assert waits == [0] * min(bringing + 1, rounds.SETTLE_WAITS)
    assert out == {f"joiner {n}": (0, True) for n in range(1, len(threads) + 1)}
    assert read.runs == 1


# --- the same rules for the tasks of one event loop ---------------------------------


class AsyncReads:
    """An async read whose runs wait until released, numbered in order."""

    def __init__(self) -> None:
        self.started: list[asyncio.Event] = [asyncio.Event() for _ in range(4)]
        self.release: list[asyncio.Event] = [asyncio.Event() for _ in range(4)]
        self.fail: set[int] = set()
        self.runs = 0

    async def __call__(self) -> int:
        n = self.runs
        self.runs += 1
        self.started[n].set()
        await self.release[n].wait()
        if n in self.fail:
            raise RuntimeError(f"read {n} failed")
        return n


async def settle() -> None:
    """Let every ready task run until it waits (a few loop iterations)."""
    for _ in range(10):
        await asyncio.sleep(0)


def test_tasks_arriving_during_a_read_share_the_next_one_not_the_running_one():
    async def main() -> None:
        shared: AsyncSharedReads[int] = AsyncSharedReads()
        read = AsyncReads()
        first = asyncio.create_task(shared.run("q", read))
        await settle()
        assert read.started[0].is_set()
        later = [asyncio.create_task(shared.run("q", read)) for _ in range(3)]  # arrive while read 0 runs
        await settle()
        assert read.runs == 1  # they wait: none may be answered by read 0
        read.release[0].set()
        assert await first == (0, False)
        await settle()
        assert read.started[1].is_set()
        read.release[1].set()
        answers = await asyncio.gather(*later)
        assert sorted(answers) == [(1, False), (1, True), (1, True)]
        assert read.runs == 2
        assert shared.lines.get().lines == {}  # nothing kept once all are answered

    asyncio.run(main())


def test_tasks_ready_together_share_one_read_that_begins_after_all_of_them_asked():
    async def main() -> None:
        shared: AsyncSharedReads[int] = AsyncSharedReads()
        read = AsyncReads()
        together = [asyncio.create_task(shared.run("q", read)) for _ in range(5)]
        await settle()
        assert read.runs == 1
        read.release[0].set()
        assert sorted(await asyncio.gather(*together)) == [(0, False)] + [(0, True)] * 4

    asyncio.run(main())


def test_a_failed_shared_read_fails_only_its_runner_and_a_cancelled_waiter_leaves_the_rest_alone():
    async def main() -> None:
        shared: AsyncSharedReads[int] = AsyncSharedReads()
        read = AsyncReads()
        read.fail.add(1)
        first = asyncio.create_task(shared.run("q", read))
        await settle()
        runner, joined, cancelled = (asyncio.create_task(shared.run("q", read)) for _ in range(3))
        await settle()
        cancelled.cancel()
        read.release[0].set()
        await settle()
        read.release[1].set()  # the shared read fails: its runner raises, the one that joined reads alone
        await settle()
        read.release[2].set()
        results = await asyncio.gather(first, runner, joined, cancelled, return_exceptions=True)
        assert results[0] == (0, False)
        assert isinstance(results[1], RuntimeError) and str(results[1]) == "read 1 failed"
        assert results[2] == (2, False)
        assert isinstance(results[3], asyncio.CancelledError)
        assert read.runs == 3

    asyncio.run(main())


def test_a_leader_cancelled_before_its_read_leaves_nothing_behind():
    async def main() -> None:
        shared: AsyncSharedReads[int] = AsyncSharedReads()
        read = AsyncReads()
        leader = asyncio.create_task(shared.run("q", read))
        await asyncio.sleep(0)  # it has joined and yields once before reading
        leader.cancel()
        with pytest.raises(asyncio.CancelledError):
            await leader
        assert read.runs == 0
        assert shared.lines.get().lines == {}

    asyncio.run(main())


def test_each_event_loop_has_lines_of_its_own():
    shared: AsyncSharedReads[int] = AsyncSharedReads()

    async def once(value: int) -> tuple[int, bool]:
        async def read() -> int:
            return value

        return await shared.run("q", read)

    assert asyncio.run(once(1)) == (1, False)
    assert asyncio.run(once(2)) == (2, False)


# --- on the official emulator, through the Datastore gateways ----------------------------


@pytest.mark.emulator
# --- SharedRead: the step a counter's plan yields, on both drivers ---------------------


class AGateway:
    """Any gateway: the step runs its read plan on whatever the driver holds."""


def test_plans_that_read_one_total_during_a_read_share_the_next_one_on_the_blocking_driver():
    shared: SharedReads[int] = SharedReads()
    tasks: AsyncSharedReads[int] = AsyncSharedReads()
    read, out, sharers = Reads(), {}, []

    def ask(name: str, key: str = "total") -> threading.Thread:
        def total() -> plan.Plan[int]:
            answer: int = yield SharedRead(shared, tasks, key, lambda: plan.call(read), lambda: sharers.append(name))
            return answer

        def run() -> None:
            out[name] = plan.run(total(), AGateway())

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    first = ask("first")
    assert read.started[0].wait(10)
    later = [ask("second"), ask("third")]  # arrive while read 0 runs: not answered by it
    lines, _ = shared.lines.get()
    for _ in range(1000):  # white box: both joined the next round
        line = lines.lines.get("total")
        if line is not None and line.next is not None and line.next.waiting >= 1:
            break
        time.sleep(0.005)
    read.release[0].set()
    first.join(10)
    assert read.started[1].wait(10)
    read.release[1].set()
    for thread in later:
        thread.join(10)
    assert out == {"first": 0, "second": 1, "third": 1}
    assert read.runs == 2 and len(sharers) == 1  # one of the two answers was the other's read
    read.release[2].set()
    ask("other total", "another total").join(10)  # another key is another line: it reads for itself
    assert out["other total"] == 2


def test_tasks_ready_together_run_a_shared_total_read_once_on_the_async_driver():
    """The first of five tasks finds no read of the total in flight and reads
    straight through (``counter._lone``); the four that arrive while it runs
    share one read, which begins after it ended."""

    async def main() -> None:
        shared: SharedReads[int] = SharedReads()
        tasks: AsyncSharedReads[int] = AsyncSharedReads()
        read, sharers = AsyncReads(), []

        def total() -> plan.Plan[int]:
            answer: int = yield SharedRead(shared, tasks, "total", lambda: plan.awaiting(read), lambda: sharers.append(1))
            return answer

        together = [asyncio.create_task(plan.arun(total(), AGateway())) for _ in range(5)]
        await settle()
        assert read.runs == 1  # the others wait: none may be answered by read 0
        read.release[0].set()
        await settle()
        assert read.runs == 2
        read.release[1].set()
        assert await asyncio.gather(*together) == [0, 1, 1, 1, 1]
        assert len(sharers) == 3
        assert tasks.lines.get().lines == {} and tasks.lines.get().alone == {}

    asyncio.run(main())
