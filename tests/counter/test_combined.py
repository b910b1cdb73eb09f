"""Callers of one counter in one process write it at most two attempts at a
time: the amounts that arrive while its writes run are committed together
by the next one (``counter._combined``), so sixteen threads pay for a
few commits, not sixteen, and do not wait on each other's locks. Exactly
once or raised still holds for each caller."""

from __future__ import annotations

import threading
import time

import pytest

from gds_counter.counter import CounterShardDS, Shard
from gds_counter.counter.runtime import Runtime
from gds_counter.counter.strategy import AUTO, TRANSACTIONAL, Strategy
from gds_counter.errors import Contention, CountSaturated, GDSError
from gds_counter.gds import RetryPolicy


class Blocking:
    """A strategy that records each attempt's amount, holds every attempt
    until released, and writes through ``inner`` (the transactional
    strategy unless told otherwise); ``ordered``: the attempts reach
    ``inner`` one at a time, in the order they began."""

    name = "blocking"

    def __init__(self, inner: Strategy = TRANSACTIONAL, *, ordered: bool = False) -> None:
        self.inner = inner
        self.ordered = ordered
        self.written = threading.Condition()
        self.finished = 0
        self.amounts: list[int] = []
        self.release = threading.Event()
        self.at_once = 0
        self.most_at_once = 0
        self.lock = threading.Lock()

    def add(self, shard: Shard, amount: int) -> None:
        with self.lock:
            turn = len(self.amounts)
            self.amounts.append(amount)
            self.at_once += 1
            self.most_at_once = max(self.most_at_once, self.at_once)
        try:
            assert self.release.wait(10)
            if not self.ordered:
                self.inner.add(shard, amount)
                return
            with self.written:
                assert self.written.wait_for(lambda: self.finished == turn, 10)
                try:
                    self.inner.add(shard, amount)
                finally:
                    self.finished += 1
                    self.written.notify_all()
        finally:
            with self.lock:
                self.at_once -= 1

    def started(self, count: int) -> None:
        for _ in range(2000):
            if len(self.amounts) >= count:
                return
            time.sleep(0.005)
        raise AssertionError(f"{count} attempts never started")


def waiting_to_join(gateway, count: int) -> None:
    """Wait until ``count`` callers wait to join the next write besides its
    leader (white box: not observable otherwise without timing)."""
    lines, _ = Runtime.of(gateway).combined.lines.get()
    for _ in range(2000):
        if any(line.next is not None and line.next.waiting >= count for line in list(lines.lines.values())):
            return
        time.sleep(0.005)
    raise AssertionError(f"{count} callers never joined")


def two_writing_then_joining(gateway, strategy: Blocking, first: list, later: list) -> None:
    """Start the callables ``first`` one by one until each one's write has
    begun, then ``later`` until all but one of them wait to join the next
    write; release the strategy and wait for everyone."""
    running = [threading.Thread(target=target) for target in first]
    for number, thread in enumerate(running, 1):
        thread.start()
        strategy.started(number)
    joining = [threading.Thread(target=target) for target in later]
    for thread in joining:
        thread.start()
    waiting_to_join(gateway, len(later) - 1)
    strategy.release.set()
    for thread in [*running, *joining]:
        thread.join(10)


def test_sixteen_callers_of_one_counter_are_three_writes_when_fourteen_arrive_during_the_first_two(memory_gateway):
    strategy = Blocking()
    counter = CounterShardDS("Counter Test", 1, 20, gateway=memory_gateway, strategy=strategy)
    two_writing_then_joining(memory_gateway, strategy, [lambda: counter.add(1), lambda: counter.add(10)],
                             [lambda: counter.add(2)] * 14)
    assert strategy.amounts == [1, 10, 28]
    assert strategy.most_at_once == 2
    assert counter.get_count() == 39
    assert memory_gateway.stats["entity_writes"] == 3
    assert memory_gateway.stats["counter.combined"] == 13  # the amounts that rode in another caller's write


def test_counter_objects_of_one_counter_written_the_same_way_are_combined(memory_gateway):
    """One object per request (the article's ``new CounterShardDS(...)``)
    still shares writes, when the counter and its settings are the same."""
    strategy = Blocking()

    def add() -> None:
        CounterShardDS("Counter Test", 1, 20, gateway=memory_gateway, strategy=strategy).add()

    two_writing_then_joining(memory_gateway, strategy, [add] * 2, [add] * 5)
    assert strategy.amounts == [1, 1, 5]
    other_counter = CounterShardDS("Counter Test", 2, 20, gateway=memory_gateway)
    assert other_counter._combining != CounterShardDS("Counter Test", 1, 20, gateway=memory_gateway)._combining


def test_every_caller_of_a_combined_write_that_ran_out_of_retries_is_told_not_counted(memory_gateway):
    class Refusing:
        """Holds its first two attempts until released (they succeed); every
        later attempt conflicts."""

        name = "refusing"

        def __init__(self) -> None:
            self.calls = 0
            self.release = threading.Event()

        def add(self, shard: Shard, amount: int) -> None:
            self.calls += 1
            if self.calls <= 2:
                assert self.release.wait(10)
                return
            raise Contention(f"{shard} is taken (test)")

    strategy = Refusing()
    counter = CounterShardDS("Counter Test", 1, 20, gateway=memory_gateway, strategy=strategy,
                             retry=RetryPolicy(attempts=3, initial=0.001, maximum=0.001))
    outcomes: list[object] = []

    def add() -> None:
        try:
            counter.add()
            outcomes.append("counted")
        except Contention as exc:
            outcomes.append(exc)

    first = [threading.Thread(target=add) for _ in range(2)]
    for number, thread in enumerate(first, 1):
        thread.start()
        for _ in range(2000):
            if strategy.calls >= number:
                break
            time.sleep(0.005)
    others = [threading.Thread(target=add) for _ in range(4)]
    for thread in others:
        thread.start()
    waiting_to_join(memory_gateway, 3)
    strategy.release.set()
    for thread in [*first, *others]:
        thread.join(10)
    assert outcomes.count("counted") == 2
    refused = [o for o in outcomes if isinstance(o, Contention)]
    assert len(refused) == 4
    for exc in refused:
        assert "was NOT counted" in str(exc) and "the amounts of 4 callers, combined" in str(exc)
        assert exc.attempts == 3
    assert strategy.calls == 2 + 3  # one write for the four, tried three times


def test_a_combined_write_past_the_64_bit_bound_saturates_and_is_not_sent_again(memory_gateway):
    """One shard at 2**63-4; two writes of 1 run, two callers of 1 arrive
    meanwhile and are combined. Their sum (2) would take the shard to 2**63:
    the store saturates at 2**63-1, as Datastore's increment does, so both
    are told it WAS written and may have been cut short (``CountSaturated``),
    and neither amount is written again, one by one. (The embedded engine
    refused such a sum before it followed the Firestore emulator; a
    re-send after a refusal once counted an amount its caller was told was
    not.)"""
    counter = CounterShardDS("Counter Test", 1, 1, gateway=memory_gateway, strategy="transactional")
    counter.add(2**63 - 4)
    strategy = Blocking(AUTO, ordered=True)  # a server-side increment on memory://
    blocked = CounterShardDS("Counter Test", 1, 1, gateway=memory_gateway, strategy=strategy)
    outcomes: list[object] = []

    def add() -> None:
        try:
            blocked.add(1)
            outcomes.append("counted")
        except GDSError as exc:
            outcomes.append(exc)

    two_writing_then_joining(memory_gateway, strategy, [add, add], [add, add])
    assert strategy.amounts == [1, 1, 2]
    assert outcomes.count("counted") == 2
    saturated = [o for o in outcomes if o != "counted"]
    assert len(saturated) == 2 and all(type(o) is CountSaturated for o in saturated), saturated
    assert counter.get_count() == 2**63 - 1  # the two acknowledged, and the saturated write cut short by 1


def test_a_combined_write_that_saturates_tells_every_caller_it_was_written(memory_gateway):
    """The same, one step lower: the sum of the two combined callers takes
    the shard exactly to 2**63-1. It was written, so all of its callers get
    ``CountSaturated`` (never ``BadValueError``) and nothing is sent again."""
    counter = CounterShardDS("Counter Test", 1, 1, gateway=memory_gateway, strategy="transactional")
    counter.add(2**63 - 5)
    strategy = Blocking(AUTO, ordered=True)
    blocked = CounterShardDS("Counter Test", 1, 1, gateway=memory_gateway, strategy=strategy)
    outcomes: list[object] = []

    def add() -> None:
        try:
            blocked.add(1)
            outcomes.append("counted")
        except GDSError as exc:
            outcomes.append(exc)

    two_writing_then_joining(memory_gateway, strategy, [add, add], [add, add])
    assert strategy.amounts == [1, 1, 2]
    saturated = [o for o in outcomes if isinstance(o, CountSaturated)]
    assert outcomes.count("counted") == 2 and len(saturated) == 2, outcomes
    assert counter.get_count() == 2**63 - 1


@pytest.mark.parametrize("strategy", ["transactional", "increment"])
def test_sixteen_threads_count_exactly_and_each_sees_a_total_with_its_own_amount(memory_gateway, strategy):
    counter = CounterShardDS("Counter Test", 1, 20, gateway=memory_gateway, strategy=strategy)
    seen: list[list[int]] = [[] for _ in range(16)]

    def writer(mine: list[int]) -> None:
        for _ in range(50):
            mine.append(counter.increment())

    threads = [threading.Thread(target=writer, args=(mine,)) for mine in seen]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.get_count() == 800
    for mine in seen:  # each total includes the caller's own increments so far
        assert len(mine) == 50 and all(a < b for a, b in zip(mine, mine[1:])) and mine[0] >= 1
    assert max(max(mine) for mine in seen) == 800
