"""A gateway's runtime: what the counters of one process share on one
gateway (the count cache, the shard chooser, combined writes, the asyncio
slots), with the clock and the dice they use, given to it rather than
patched into modules; and ``CounterOptions``, one value for how a counter
writes and reads."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Hashable, Mapping

import pytest

from gds_counter import (
    AutoGrow,
    BadValueError,
    CounterOptions,
    CounterShardDS,
    GeneralCounter,
    RetryPolicy,
    aio,
    get_counts,
    open_gateway,
)
from gds_counter.counter import AffinityShards, RandomShards, Runtime, ShardChooser


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recording:
    """A shard chooser that always takes the last shard and records what it is told."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Hashable, object]] = []

    def take(self, counter: Hashable, shards: range) -> int:
        self.calls.append(("take", counter, shards))
        return shards[-1]

    def give_back(self, counter: Hashable, shard: int, error: BaseException | None) -> bool:
        self.calls.append(("give_back", counter, (shard, error)))
        return False

    def wrote(self, counter: Hashable, shard: int, found: int, stored: int) -> bool:
        self.calls.append(("wrote", counter, (shard, found, stored)))
        return False

    def seen(self, counter: Hashable, counts: Mapping[int, int], *, every: bool) -> None:
        self.calls.append(("seen", counter, (dict(counts), every)))


@pytest.fixture
def gateway():
    opened = open_gateway("memory://")
    yield opened
    opened.close()


def test_every_counter_object_of_a_gateway_shares_its_one_runtime(gateway):
    runtime = Runtime.of(gateway)
    assert Runtime.of(gateway) is runtime
    one, other = CounterShardDS("a", 1, gateway=gateway), GeneralCounter("b", gateway=gateway)
    assert one._runtime is runtime and other._runtime is runtime
    with open_gateway("memory://") as elsewhere:
        assert Runtime.of(elsewhere) is not runtime


def test_threads_asking_for_a_new_gateways_runtime_all_get_the_same_one(gateway):
    seen: list[Runtime] = []
    start = threading.Barrier(8)

    def ask() -> None:
        start.wait()
        seen.append(Runtime.of(gateway))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(seen) == 8 and len({id(runtime) for runtime in seen}) == 1


def test_the_asyncio_face_over_a_blocking_gateway_uses_the_blocking_ones_runtime(gateway):
    twin = aio.async_twin(gateway)
    assert Runtime.of(twin) is Runtime.of(gateway)


def test_an_installed_runtimes_clock_is_the_count_caches_clock(gateway):
    clock = Clock()
    Runtime(clock=clock).install(gateway)
    counter = CounterShardDS("cached", 1, gateway=gateway, cache=True)
    counter.add(2)
    assert counter.get_count() == 2
    clock.now += 59.0
    assert counter._shared_cache.get(counter._identity()) == 2
    clock.now += 2.0  # past the 60 s ttl on the runtime's clock: expired
    assert counter._shared_cache.get(counter._identity()) is None


def test_the_runtimes_dice_and_instance_decide_where_an_affinity_arc_starts(gateway):
    def first_shard(instance: int) -> int:
        with open_gateway("memory://") as fresh:
            runtime = Runtime(instance=instance, dice=random.Random(1)).install(fresh)
            return runtime.shards.take(("", "K", "c"), range(1, 21))

    firsts = [first_shard(n) for n in range(1, 5)]
    assert firsts == [first_shard(n) for n in range(1, 5)]  # the same instance number: the same start
    assert len(set(firsts)) == 4  # consecutive instances start apart


def test_a_counter_given_its_own_chooser_writes_where_it_says_and_reports_to_it(gateway):
    chooser = Recording()
    assert isinstance(chooser, ShardChooser)
    counter = CounterShardDS("mine", 1, 5, gateway=gateway, shards=chooser, strategy="transactional")
    assert counter.increment() == 1
    assert [count for _, count in counter.shards()[:5]] == [0, 0, 0, 0, 1]
    kinds = [kind for kind, _, _ in chooser.calls]
    assert kinds[:3] == ["take", "wrote", "give_back"] and "seen" in kinds
    [(shard, found, stored)] = [args for kind, _, args in chooser.calls if kind == "wrote"]
    assert (shard, found, stored) == (5, 0, 1)
    # The gateway's own chooser was not asked.
    assert Runtime.of(gateway).shards is not chooser


def test_random_shards_spread_the_writes_and_every_one_is_counted(gateway):
    counter = CounterShardDS("spread", 1, 4, gateway=gateway, shards=RandomShards(random.Random(7)))
    for _ in range(40):
        counter.add()
    assert counter.get_count() == 40
    written = dict(counter.shards())
    assert all(written[n] > 0 for n in range(1, 5)) and sum(written.values()) == 40


def _add_from_threads(counter: CounterShardDS, threads: int, each: int) -> None:
    start = threading.Barrier(threads)

    def add() -> None:
        start.wait()
        for _ in range(each):
            counter.add()

    running = [threading.Thread(target=add) for _ in range(threads)]
    for thread in running:
        thread.start()
    for thread in running:
        thread.join(30)


def test_without_combined_writes_each_thread_commits_its_own_amount(gateway):
    Runtime(combine_writes=False).install(gateway)
    counter = CounterShardDS("alone", 1, gateway=gateway)
    _add_from_threads(counter, 8, 20)
    assert counter.get_count() == 160
    assert gateway.stats.snapshot().get("counter.combined", 0) == 0


def test_with_combined_writes_threads_share_commits_and_nothing_is_lost(gateway):
    counter = CounterShardDS("together", 1, gateway=gateway, strategy="transactional")
    _add_from_threads(counter, 16, 20)
    assert counter.get_count() == 320
    assert gateway.stats.snapshot().get("counter.combined", 0) > 0


def test_asyncio_slots_are_per_event_loop_and_sized_by_the_gateway(gateway):
    twin = aio.ThreadedGateway(gateway, max_in_flight=3)
    runtime = Runtime.of(twin)

    async def slot() -> asyncio.Semaphore:
        return runtime.in_flight_slot(twin)

    first, second = asyncio.run(slot()), asyncio.run(slot())
    assert first is not second
    assert first._value == 3


def test_options_are_one_value_and_keywords_change_its_fields(gateway):
    base = CounterOptions(strategy="transactional", cache=True)
    counter = CounterShardDS("opt", 1, gateway=gateway, options=base, strategy="auto")
    assert counter.options == CounterOptions(strategy="auto", cache=True)
    assert base.strategy == "transactional"  # the value given is not changed
    assert GeneralCounter("opt", gateway=gateway, options=base).options is base


@pytest.mark.parametrize(
    "make, named",
    [
        (lambda gw: CounterShardDS("x", 1, gateway=gw, strategi="auto"), "'strategi'"),
        (lambda gw: GeneralCounter("x", gateway=gw, options={"cache": True}), "options must be a CounterOptions"),
        (lambda gw: CounterShardDS("x", 1, gateway=gw, shards=object()), "shards must be a ShardChooser"),
        (lambda gw: Runtime(shards=object()), "shards must be a ShardChooser"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(gateway, make, named):
    with pytest.raises(BadValueError, match=named):
        make(gateway)
    assert gateway.stats.snapshot().get("entity_writes", 0) == 0


def test_the_asyncio_face_takes_the_same_options():
    async def main() -> None:
        async with aio.open_gateway("memory://") as gateway:
            counter = aio.CounterShardDS("opt", 1, gateway=gateway, options=CounterOptions(shards=RandomShards()))
            assert await counter.increment() == 1
            with pytest.raises(BadValueError, match="'cahce'"):
                aio.GeneralCounter("x", gateway=gateway, cahce=True)

    asyncio.run(main())


def test_affinity_is_the_default_chooser(gateway):
    assert isinstance(Runtime.of(gateway).shards, AffinityShards)


class Broken(Recording):
    """A chooser of the user's own that misbehaves in one of its methods."""

    def __init__(self, where: str, shard: object = None) -> None:
        super().__init__()
        self.where, self.shard = where, shard

    def take(self, counter: Hashable, shards: range) -> int:
        if self.where == "take":
            raise RuntimeError("no shard for you")
        if self.where == "range":
            return self.shard  # type: ignore[return-value]
        return super().take(counter, shards)

    def give_back(self, counter: Hashable, shard: int, error: BaseException | None) -> bool:
        if self.where == "give_back":
            raise RuntimeError("cannot take it back")
        return super().give_back(counter, shard, error)

    def wrote(self, counter: Hashable, shard: int, found: int, stored: int) -> bool:
        if self.where == "wrote":
            raise RuntimeError("cannot learn")
        return super().wrote(counter, shard, found, stored)

    def seen(self, counter: Hashable, counts: Mapping[int, int], *, every: bool) -> None:
        if self.where == "seen":
            raise RuntimeError("cannot see")
        super().seen(counter, counts, every=every)


@pytest.mark.parametrize(
    "chooser, named",
    [
        (Broken("take"), "failed to choose a shard"),
        (Broken("range", shard=21), "chose shard 21"),
        (Broken("range", shard=0), "chose shard 0"),
        (Broken("range", shard=True), "chose shard True"),
        (Broken("range", shard="1"), "chose shard '1'"),
    ],
)
def test_a_chooser_that_fails_or_picks_outside_the_counter_writes_nothing(gateway, chooser, named):
    counter = CounterShardDS("refused", 1, gateway=gateway, shards=chooser, strategy="transactional")
    with pytest.raises(BadValueError, match=named):
        counter.add()
    assert gateway.stats.snapshot().get("entity_writes", 0) == 0
    assert CounterShardDS("refused", 1, gateway=gateway).get_count() == 0


@pytest.mark.parametrize("where", ["give_back", "wrote", "seen"])
def test_a_chooser_that_fails_after_the_commit_changes_no_outcome(gateway, where, caplog):
    counter = CounterShardDS("kept", 1, gateway=gateway, shards=Broken(where), strategy="transactional")
    assert counter.increment() == 1
    assert counter.increment(2) == 3
    assert CounterShardDS("kept", 1, gateway=gateway).get_count() == 3
    assert "shard chooser" in caplog.text


@pytest.mark.parametrize(
    "build, named",
    [
        (lambda: CounterOptions(cache="yes"), "cache must be"),
        (lambda: CounterOptions(cache=1), "cache must be"),
        (lambda: CounterOptions(auto_grow=5), "auto_grow must be"),
        (lambda: CounterOptions(retry=5), "retry must be a RetryPolicy"),
        (lambda: CounterOptions(strategy="AUTO"), "unknown counter strategy 'AUTO'"),
        (lambda: CounterOptions(shards=RandomShards), "shards must be a ShardChooser instance"),
        (lambda: AutoGrow(factor=2.5), "AutoGrow.factor must be an int"),
        (lambda: AutoGrow(factor=1), "AutoGrow.factor must be at least 2"),
        (lambda: AutoGrow(after_attempts=1.5), "AutoGrow.after_attempts must be an int"),
        (lambda: RetryPolicy(attempts=1.5), "RetryPolicy.attempts must be an int"),
        (lambda: RetryPolicy(attempts=True), "RetryPolicy.attempts must be an int"),
        (lambda: RetryPolicy(deadline="5"), "RetryPolicy.deadline must be"),
        (lambda: RetryPolicy(initial=-1), "RetryPolicy.initial must be"),
        (lambda: RetryPolicy(initial=float("nan")), "RetryPolicy.initial must be"),
        (lambda: RetryPolicy(maximum=0.001, initial=0.01), "must not be below initial"),
        (lambda: RetryPolicy(multiplier=0.5), "RetryPolicy.multiplier must be at least 1"),
        (lambda: Runtime(clock=5), "clock must be"),
        (lambda: Runtime(dice=5), "dice must be a random.Random"),
        (lambda: Runtime(instance="a"), "instance must be an int"),
        (lambda: Runtime().install(5), "a runtime is installed on a gateway"),
        (lambda: get_counts(5), "get_counts takes an iterable"),
    ],
)
def test_each_option_is_checked_when_it_is_built_and_named_in_the_error(build, named):
    with pytest.raises(BadValueError, match=named):
        build()
