"""``CombinedWrites`` (threads) and ``AsyncCombinedWrites`` (tasks): the
amounts callers add under one key while a write of it runs are committed by
the next write, as their sum, and every one of those callers gets that
write's outcome: counted, or the same error (its own copy), or, when the
write ended in something that says nothing about the commit, CommitUnknown.
A caller is never combined into a write that began before it arrived. Two
writes of a key run at once by default; the tests of what callers are told
run one at a time (``in_flight=1``), which changes nothing there."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from typing import Any

import pytest

from gds_counter._process import deadlines
from gds_counter.counter._combined import AsyncCombinedWrites, CombinedWrites
from gds_counter.errors import BadValueError, CommitUnknown, Contention, CountSaturated

INT64_MAX = 2**63 - 1


class Writes:
    """A write function whose runs block until released, recorded in order
    as ``(amount, callers)``; ``fail[n]`` is what run ``n`` raises."""

    def __init__(self, runs: int = 8) -> None:
        self.started = [threading.Event() for _ in range(runs)]
        self.release = [threading.Event() for _ in range(runs)]
        self.fail: dict[int, BaseException] = {}
        self.calls: list[tuple[int, int]] = []
        self.lock = threading.Lock()

    def __call__(self, amount: int, callers: int) -> None:
        with self.lock:
            n = len(self.calls)
            self.calls.append((amount, callers))
        self.started[n].set()
        assert self.release[n].wait(10)
        if n in self.fail:
            raise self.fail[n]


def add(combined: CombinedWrites, write: Writes, amount: int, out: dict[Any, object], name: Any) -> threading.Thread:
    def run() -> None:
        try:
            combined.run("counter", amount, write)
            out[name] = "counted"
        except BaseException as exc:  # noqa: B902  (recorded for the test to check)
            out[name] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def joined(combined: CombinedWrites, count: int) -> None:
    """Wait until ``count`` callers wait in the next round besides its
    leader (white box: not observable otherwise without timing)."""
    for _ in range(2000):
        line = combined.lines.get()[0].lines.get("counter")
        if line is not None and line.next is not None and line.next.waiting >= count:
            return
        time.sleep(0.005)
    raise AssertionError(f"{count} callers never joined")


def release_all(write: Writes) -> None:
    for event in write.release:
        event.set()


def first_then_together(combined: CombinedWrites, write: Writes, later: dict[Any, int]) -> dict[Any, object]:
    """Run "first" (adding 1) until its write has begun, then the callers
    ``later`` (name: amount) until they all wait for the next write;
    release every write, and return what each caller ended in."""
    out: dict[Any, object] = {}
    first = add(combined, write, 1, out, "first")
    assert write.started[0].wait(10)
    threads = [add(combined, write, amount, out, name) for name, amount in later.items()]
    joined(combined, len(later) - 1)
    release_all(write)
    for thread in [first, *threads]:
        thread.join(10)
    return out


def test_alone_a_caller_writes_its_own_amount_at_once_and_nothing_is_kept():
    combined = CombinedWrites()
    write = Writes()
    release_all(write)
    combined.run("counter", 5, write)
    combined.run("counter", -2, write)
    assert write.calls == [(5, 1), (-2, 1)]
    assert combined.lines.get()[0].lines == {}


def test_two_writes_run_at_once_and_callers_arriving_meanwhile_are_combined_into_the_next():
    combined, write, out = CombinedWrites(), Writes(), {}
    running = [add(combined, write, 1, out, "first")]
    assert write.started[0].wait(10)
    running.append(add(combined, write, 10, out, "second"))
    assert write.started[1].wait(10)  # the second did not wait for the first
    later = [add(combined, write, amount, out, amount) for amount in (2, 3, 4, 5)]
    joined(combined, 3)  # the leader of the next round and three more
    assert write.calls == [(1, 1), (10, 1)]  # nobody joined a write that had begun
    write.release[1].set()  # either running write ending lets the next one start
    assert write.started[2].wait(10)
    assert write.calls[2] == (14, 4)
    release_all(write)
    for thread in [*running, *later]:
        thread.join(10)
    assert len(write.calls) == 3
    assert out == {"first": "counted", "second": "counted", 2: "counted", 3: "counted", 4: "counted", 5: "counted"}
    assert combined.lines.get()[0].lines == {}


def test_each_caller_of_a_failed_write_raises_its_own_copy_of_the_error():
    combined, write = CombinedWrites(in_flight=1), Writes()
    write.fail[1] = Contention("shard 3 of CounterShard 'c' kept conflicting", attempts=7)
    out = first_then_together(combined, write, {n: 1 for n in range(3)})
    assert out["first"] == "counted"
    errors = [out[n] for n in range(3)]
    assert all(isinstance(e, Contention) and e.attempts == 7 and "kept conflicting" in str(e) for e in errors)
    assert len({id(e) for e in errors}) == 3  # three objects: no two threads raise one
    assert write.calls == [(1, 1), (3, 3)]


def test_a_write_that_ends_in_something_else_leaves_its_joiners_unknown():
    """KeyboardInterrupt in the leader (or a bug in a strategy) says nothing
    about whether the commit was applied: the others get CommitUnknown, the
    leader its own exception."""
    combined, write = CombinedWrites(in_flight=1), Writes()
    write.fail[1] = RuntimeError("strategy bug")
    out = first_then_together(combined, write, {n: 1 for n in range(3)})
    outcomes = [out[n] for n in range(3)]
    assert sum(isinstance(o, RuntimeError) for o in outcomes) == 1  # the leader of the round
    unknown = [o for o in outcomes if isinstance(o, CommitUnknown)]
    assert len(unknown) == 2 and all("may or may not have been counted" in str(o) for o in unknown)


@pytest.mark.parametrize(
    "error",
    [
        BadValueError("adding 9 to shard 1 would pass 64 bits; nothing was written"),
        CountSaturated("the increment of shard 1 by 9 WAS written, and the shard now holds 9223372036854775807"),
    ],
    ids=["refused", "saturated"],
)
def test_a_write_that_raised_is_never_sent_again_for_its_callers(error):
    """Only the write knows whether it reached the store (a saturated shard
    was written; its error is not a ``BadValueError`` but another write
    could mistake one): its error is every caller's outcome, and no amount
    of it is written again. (Today's code wrote each amount again after a
    ``BadValueError``, so one that had been stored counted twice.)"""
    combined, write = CombinedWrites(in_flight=1), Writes()
    write.fail[1] = error
    out = first_then_together(combined, write, {amount: amount for amount in (2, 3, 4)})
    assert write.calls == [(1, 1), (9, 3)]
    assert all(type(out[amount]) is type(error) and str(out[amount]) == str(error) for amount in (2, 3, 4))


def test_amounts_whose_sum_passes_64_bits_are_written_one_by_one():
    combined, write = CombinedWrites(in_flight=1), Writes()
    out = first_then_together(combined, write, {n: INT64_MAX - 5 for n in range(2)})
    assert write.calls == [(1, 1), (INT64_MAX - 5, 1), (INT64_MAX - 5, 1)]
    assert set(out.values()) == {"counted"}


@pytest.mark.parametrize("bringing", [0, 2, 10])
def test_a_leader_lets_ready_callers_join_before_it_writes(bringing):
    """The threads one write released come back together: a leader that did
    not wait for a running write pauses (lets ready threads run) once, then
    again while each pause brought a caller (up to SETTLE_WAITS), and writes
    their amounts with its own."""
    from gds_counter.counter import _rounds as rounds

    threads: list[threading.Thread] = []
    pauses: list[int] = []
    write, out = Writes(), {}

    def pause_for_joiner() -> None:
        pauses.append(0)
        if len(pauses) <= bringing:
            threads.append(add(combined, write, 1, out, len(pauses)))
            joined(combined, len(pauses))

    combined = CombinedWrites(others=lambda: True, pause=pause_for_joiner)  # another thread might add
    release_all(write)
    combined.run("counter", 100, write)
    for thread in threads:
        thread.join(10)
    joiners = min(bringing, rounds.SETTLE_WAITS)
    assert len(pauses) == min(bringing + 1, rounds.SETTLE_WAITS)
    assert write.calls[0] == (100 + joiners, 1 + joiners)


def test_a_thread_alone_in_its_process_writes_without_waiting():
    pauses: list[int] = []
    combined, write = CombinedWrites(others=lambda: False, pause=lambda: pauses.append(0)), Writes()
    release_all(write)
    combined.run("counter", 3, write)
    assert pauses == [] and write.calls == [(3, 1)]


def test_keys_are_combined_separately():
    combined, write = CombinedWrites(), Writes()
    release_all(write)
    other = Writes()
    release_all(other)
    combined.run("a", 1, write)
    combined.run("b", 2, other)
    assert write.calls == [(1, 1)] and other.calls == [(2, 1)]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() (POSIX)")
def test_a_forked_child_writes_at_once_though_its_parent_was_writing():
    combined, write, out = CombinedWrites(in_flight=1), Writes(), {}
    first = add(combined, write, 1, out, "first")
    assert write.started[0].wait(10)
    pid = os.fork()
    if pid == 0:  # the child: the parent's running write is not here
        calls: list[tuple[int, int]] = []
        try:
            combined.run("counter", 4, lambda amount, callers: calls.append((amount, callers)))
            os._exit(0 if calls == [(4, 1)] else 1)
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    write.release[0].set()
    first.join(10)
    assert os.waitstatus_to_exitcode(status) == 0


# --- tasks -------------------------------------------------------------------


def test_tasks_arriving_while_two_writes_run_are_combined_into_the_next_one():
    combined = AsyncCombinedWrites()
    calls: list[tuple[int, int]] = []

    async def main() -> None:
        running = [asyncio.Event() for _ in range(3)]
        release = [asyncio.Event() for _ in range(3)]

        async def write(amount: int, callers: int) -> None:
            n = len(calls)
            calls.append((amount, callers))
            running[n].set()
            await release[n].wait()

        first = asyncio.create_task(combined.run("c", 1, write))
        await running[0].wait()
        second = asyncio.create_task(combined.run("c", 10, write))
        await running[1].wait()
        later = [asyncio.create_task(combined.run("c", amount, write)) for amount in (2, 3, 4)]
        for _ in range(5):
            await asyncio.sleep(0)
        assert calls == [(1, 1), (10, 1)]
        release[0].set()
        await running[2].wait()
        for event in release:
            event.set()
        await asyncio.gather(first, second, *later)
        assert combined.lines.get().lines == {}

    asyncio.run(main())
    assert calls == [(1, 1), (10, 1), (9, 3)]


def test_a_task_cancelled_before_its_write_began_takes_its_amount_out():
    combined = AsyncCombinedWrites(in_flight=1)
    calls: list[tuple[int, int]] = []

    async def main() -> None:
        release = asyncio.Event()

        async def write(amount: int, callers: int) -> None:
            calls.append((amount, callers))
            if len(calls) == 1:
                await release.wait()

        first = asyncio.create_task(combined.run("c", 1, write))
        await asyncio.sleep(0)
        leader = asyncio.create_task(combined.run("c", 10, write))
        joiner = asyncio.create_task(combined.run("c", 100, write))
        stays = asyncio.create_task(combined.run("c", 1000, write))
        await asyncio.sleep(0)
        joiner.cancel()
        await asyncio.sleep(0)
        release.set()
        await asyncio.gather(first, leader, stays)
        with pytest.raises(asyncio.CancelledError):
            await joiner

    asyncio.run(main())
    assert calls == [(1, 1), (1010, 2)]


def test_a_task_whose_combined_write_failed_raises_its_own_copy():
    combined = AsyncCombinedWrites(in_flight=1)

    async def main() -> list[BaseException | None]:
        release = asyncio.Event()
        runs = [0]

        async def write(amount: int, callers: int) -> None:
            runs[0] += 1
            if runs[0] == 1:
                await release.wait()
                return
            raise Contention("kept conflicting", attempts=3)

        first = asyncio.create_task(combined.run("c", 1, write))
        await asyncio.sleep(0)
        later = [asyncio.create_task(combined.run("c", 1, write)) for _ in range(3)]
        await asyncio.sleep(0)
        release.set()
        await first
        return list(await asyncio.gather(*later, return_exceptions=True))

    errors = asyncio.run(main())
    assert all(isinstance(e, Contention) and e.attempts == 3 for e in errors)
    assert len({id(e) for e in errors}) == 3


def add_within(
    combined: CombinedWrites, write: Writes, amount: int, out: dict[Any, object], name: Any, seconds: float,
) -> threading.Thread:
    """``add`` in a call whose deadline is ``seconds`` away (as a counter's
    retry policy sets it for the whole call), recording how long it took."""

    def run() -> None:
        token = deadlines.limit(time.monotonic() + seconds)
        started = time.monotonic()
        try:
            combined.run("counter", amount, write)
            out[name] = "counted"
        except BaseException as exc:  # noqa: B902  (recorded for the test to check)
            out[name] = exc
        finally:
            out[(name, "seconds")] = time.monotonic() - started
            deadlines.restore(token)

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_leader_waiting_behind_a_stalled_write_gives_up_at_its_deadline_having_sent_nothing():
    """The write ahead stalls (its storage frozen): the next round's leader
    waits for its turn only until its own deadline, then raises
    ``Contention`` saying nothing was sent, and its amount is never written.
    (It waited without end, then ran a whole deadline of its own: twice.)"""
    combined, write, out = CombinedWrites(in_flight=1), Writes(), {}
    stalled = add(combined, write, 1, out, "stalled")
    assert write.started[0].wait(10)
    waiting = add_within(combined, write, 7, out, "waiting", 0.3)
    waiting.join(10)
    assert isinstance(out["waiting"], Contention) and "nothing of it was sent" in str(out["waiting"])
    assert out[("waiting", "seconds")] < 5  # its deadline, not the stalled write's
    release_all(write)
    stalled.join(10)
    assert write.calls == [(1, 1)]
    assert combined.lines.get()[0].lines == {}


def test_a_joiner_leaves_a_round_that_has_not_begun_at_its_deadline_and_the_round_goes_on_without_it():
    combined, write, out = CombinedWrites(in_flight=1), Writes(), {}
    stalled = add(combined, write, 1, out, "stalled")
    assert write.started[0].wait(10)
    leader = add_within(combined, write, 10, out, "leader", 30)
    joined(combined, 0)
    joiner = add_within(combined, write, 5, out, "joiner", 0.3)
    joiner.join(10)
    assert isinstance(out["joiner"], Contention) and "nothing of it was sent" in str(out["joiner"])
    release_all(write)
    for thread in (stalled, leader):
        thread.join(10)
    assert out["leader"] == "counted"
    assert write.calls == [(1, 1), (10, 1)]  # the joiner's 5 is in no write
