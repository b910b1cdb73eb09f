"""Strategies under the conditions that make them differ: contention,
servers that ignore increment transforms, and shard growth."""

from __future__ import annotations

import uuid

import pytest

from gds_counter.counter import AutoGrow, CounterShardDS, GeneralCounter
from gds_counter.errors import Contention, TransformsIgnored
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gds import RetryPolicy

FAST_RETRY = RetryPolicy(attempts=3, initial=0.001, maximum=0.005)
#: Enough attempts that a random pick of 2 shards finds the free one (1 in 2**16 to miss).
PATIENT_RETRY = RetryPolicy(attempts=16, initial=0.001, maximum=0.002)


@pytest.fixture
def slow_gateway(tmp_path):
    """Datastore's one-write-per-entity-per-second limit, made extreme: each
    entity may be written once per 100 s, so a second write to a shard
    always conflicts."""
    gateway = EmbeddedGateway(str(tmp_path / "slow.sqlite3"), entity_writes_per_second=0.01)
    yield gateway
    gateway.close()


@pytest.mark.parametrize("strategy", ["transactional", "increment", "auto"])
def test_contention_is_raised_with_the_counter_and_attempts(slow_gateway, strategy):
    counter = CounterShardDS("Counter Test", 1, num_shards=1, gateway=slow_gateway, strategy=strategy, retry=FAST_RETRY)
    assert counter.increment() == 1
    with pytest.raises(Contention) as info:
        counter.increment(5)
    message = str(info.value)
    assert "Counter Test_1" in message and "3 attempts" in message and "NOT counted" in message
    assert info.value.attempts == 3
    assert counter.get_count() == 1  # nothing half-counted
    assert slow_gateway.stats["counter.retries"] == 2


def test_each_attempt_picks_a_fresh_shard(slow_gateway):
    # 2 shards, each writable once: the second increment succeeds only by
    # moving to the other shard on a retry.
    counter = CounterShardDS("Counter Test", 1, num_shards=2, gateway=slow_gateway, strategy="transactional",
                             retry=RetryPolicy(attempts=30, initial=0.001, maximum=0.002))
    assert counter.increment() == 1
    assert counter.increment() == 2
    assert sorted(count for _, count in counter.shards() if count) == [1, 1]


@pytest.mark.parametrize("strategy", ["auto-grow", "transactional"])
def test_auto_grow_grows_shards_and_loses_nothing(slow_gateway, strategy):
    # one growth step: the model would refuse a second write of the config too
    grow = AutoGrow(after_attempts=2, factor=64, max_shards=64)
    retry = RetryPolicy(attempts=8, initial=0.001, maximum=0.002)
    counter = CounterShardDS("Counter Test", 1, num_shards=1, gateway=slow_gateway, strategy=strategy,
                             retry=retry, auto_grow=grow)
    for expected in range(1, 13):
        assert counter.increment() == expected
    assert counter.num_shards > 1
    assert slow_gateway.stats["counter.grown"] >= 1
    # the growth is recorded, so a reader or writer in another process spreads as wide
    other = CounterShardDS("Counter Test", 1, num_shards=1, gateway=slow_gateway)
    assert other.get_count() == 12
    assert other.get_count(method="lookup") == 12  # reads the config entity, so learns the growth
    assert other.num_shards == counter.num_shards


def test_growth_stops_at_the_cap_and_then_raises(slow_gateway):
    counter = CounterShardDS("Counter Test", 1, num_shards=1, gateway=slow_gateway, strategy="auto-grow",
                             retry=PATIENT_RETRY, auto_grow=AutoGrow(after_attempts=1, max_shards=2))
    counter.add()
    counter.add()  # grew to 2
    with pytest.raises(Contention) as info:
        counter.add()
    assert "2 shards" in str(info.value) and "16 attempts" in str(info.value)
    assert counter.get_count() == 2


def test_a_contended_config_means_no_growth_but_no_loss(slow_gateway):
    counter = CounterShardDS("Counter Test", 1, num_shards=1, gateway=slow_gateway, strategy="auto-grow",
                             retry=PATIENT_RETRY, auto_grow=AutoGrow(after_attempts=1, max_shards=8))
    counter.add()
    with pytest.raises(Contention, match="NOT counted"):
        for _ in range(5):
            counter.add()  # grows to 2 once; the config cannot be written again for 100 s
    assert counter.num_shards == 2
    assert counter.get_count() == sum(count for _, count in counter.shards())
    assert counter.get_count() <= counter.num_shards


# --- servers that ignore increment transforms ---------------------------------


def test_increment_strategy_refuses_a_gateway_that_ignores_transforms(datastore_gateway):
    assert datastore_gateway.capabilities.applies_transforms is False
    counter = CounterShardDS("Counter Test", 1, gateway=datastore_gateway, strategy="increment")
    with pytest.raises(TransformsIgnored, match="nothing was counted"):
        counter.increment()
    assert counter.get_count() == 0
    assert datastore_gateway.stats.snapshot()["entity_writes"] == 0


def test_silently_ignored_transforms_lose_nothing(datastore_gateway):
    """The legacy emulator would let a masked increment REPLACE a shard; the
    gateway finds that out on a throwaway entity before any shard is sent one."""
    seed = CounterShardDS("Counter Test", 1, gateway=datastore_gateway, strategy="transactional")
    for _ in range(40):
        seed.add()  # most shards now hold a count that a replacing write would wipe
    counter = CounterShardDS("Counter Test", 1, gateway=datastore_gateway, strategy="increment")
    for _ in range(3):
        with pytest.raises(TransformsIgnored):
            counter.add()
    assert seed.get_count() == 40
    assert datastore_gateway.stats["transforms_ignored"] == 0  # never sent to real data


def test_auto_counts_exactly_with_transactions_where_transforms_are_ignored(datastore_gateway):
    seed = CounterShardDS("Counter Test", 1, gateway=datastore_gateway, strategy="transactional")
    for _ in range(40):
        seed.add()
    counter = CounterShardDS("Counter Test", 1, gateway=datastore_gateway)  # strategy "auto"
    datastore_gateway.stats.reset()
    results = [counter.increment() for _ in range(10)]
    assert results == list(range(41, 51))
    stats = datastore_gateway.stats.snapshot()
    assert stats["rpc.begin_transaction"] == 10 and datastore_gateway.stats["transforms_ignored"] == 0
    assert seed.get_count() == 50


def test_firestore_applies_increments_without_reading(firestore_gateway):
    counter = GeneralCounter("hits", gateway=firestore_gateway)  # ndb layout: count is indexed
    counter.increment()  # checked once
    firestore_gateway.stats.reset()
    for _ in range(5):
        counter.add()
    stats = firestore_gateway.stats.snapshot()
    assert stats["rpcs"] == 5 and stats["rpc.commit"] == 5  # one commit each, no reads
    assert counter.get_count() == 6


def test_on_firestore_auto_adds_with_one_commit_and_transactional_keeps_phps_flags(firestore_gateway):
    """The default writes a PHP-layout shard with one commit and no read; the
    server then stores ``count`` indexed (what the capability probe saw).
    ``transactional`` writes php-gds's flags exactly. PHP reads both alike."""
    assert firestore_gateway.capabilities.indexes_transformed is True
    fast = CounterShardDS("Fast", 1, gateway=firestore_gateway)
    exact = CounterShardDS("Exact", 1, gateway=firestore_gateway, strategy="transactional")
    fast.add(), exact.add()  # learn the config
    firestore_gateway.stats.reset()
    for _ in range(10):
        fast.add()
    assert firestore_gateway.stats.snapshot()["rpcs"] == firestore_gateway.stats["rpc.commit"] == 10
    for _ in range(10):
        exact.add()

    def flags(counter):
        keys = [counter.layout.shard_key(counter.name, n, counter.namespace) for n in range(1, 21)]
        return {raw.unindexed for raw in firestore_gateway.lookup(keys) if raw}

    assert flags(fast) == {frozenset()}
    assert flags(exact) == {frozenset({"count"})}
    assert fast.get_count() == exact.get_count() == 11


def _php_writes(emulator, warm_up) -> tuple[dict[str, int], set[frozenset[str]]]:
    """RPCs of 5 adds by a PHP-layout counter, and the index flags of the
    shards it wrote, on a fresh gateway that ``warm_up`` used first."""
    gw = emulator.gateway(namespace=f"t-{uuid.uuid4().hex}")
    try:
        warm_up(gw)
        counter = CounterShardDS("Counter Test", 1, gateway=gw)
        counter.add()  # learns the counter's config
        gw.stats.reset()
        for _ in range(5):
            counter.add()
        rpcs = {name: n for name, n in gw.stats.snapshot().items() if name.startswith("rpc")}
        keys = [counter.layout.shard_key(counter.name, n, counter.namespace) for n in range(1, 21)]
        flags = {raw.unindexed for raw in gw.lookup(keys) if raw is not None}
        assert counter.get_count() == 6
        return rpcs, flags
    finally:
        gw.close()


def test_a_php_counter_writes_the_same_whichever_layout_probed_the_gateway_first(firestore_emulator):
    after_ndb = _php_writes(firestore_emulator, lambda gw: GeneralCounter("hits", gateway=gw).add())
    after_php = _php_writes(firestore_emulator, lambda gw: CounterShardDS("Warm", 1, gateway=gw).add())
    assert after_ndb == after_php
    rpcs, flags = after_php
    assert rpcs["rpcs"] == rpcs["rpc.commit"] == 5  # one commit per add, whichever probed first


def test_building_stores_and_counters_asks_the_server_nothing(firestore_gateway):
    from gds_counter import Store

    Store("Book", firestore_gateway)
    CounterShardDS("Counter Test", 1, gateway=firestore_gateway)
    GeneralCounter("hits", gateway=firestore_gateway)
    assert firestore_gateway.stats["probe_rpcs"] == 0 and firestore_gateway.stats["rpcs"] == 0
