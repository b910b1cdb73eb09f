"""What reads cost (counted by the gateway's Stats) and what they see."""

from __future__ import annotations

import pytest

from gds_counter.counter import CounterShardDS, GeneralCounter, get_counts
from gds_counter.errors import BadValueError


def test_get_count_is_one_rpc_for_twenty_shards(any_gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=any_gateway)
    for _ in range(30):
        counter.add()
    for method, rpc in (("auto", "rpc.run_query"), ("query", "rpc.run_query"), ("lookup", "rpc.lookup")):
        any_gateway.stats.reset()
        assert counter.get_count(method=method) == 30
        stats = any_gateway.stats.snapshot()
        assert stats["rpcs"] == stats[rpc] == 1, method


def test_the_ndb_layout_reads_by_lookup_its_writers_follow_the_config(gateway):
    counter = GeneralCounter("hits", gateway=gateway)
    counter.add(3)
    gateway.stats.reset()
    assert counter.get_count() == 3
    assert gateway.stats.snapshot()["rpc.lookup"] == gateway.stats.snapshot()["rpcs"] == 1
    with pytest.raises(BadValueError, match="no target property"):
        counter.get_count(method="query")


def test_increment_returns_the_total_with_one_read_after_the_write(gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway, strategy="increment")
    counter.increment()  # the first server-side increment on a gateway is checked once
    gateway.stats.reset()
    assert counter.increment() == 2
    assert counter.increment(5) == 7
    stats = gateway.stats.snapshot()
    assert stats["rpc.commit"] == 2 and stats["rpc.run_query"] == 2 and stats["rpcs"] == 4


def test_add_reads_nothing(gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway, strategy="increment")
    counter.add()
    gateway.stats.reset()
    assert counter.add(3) is None
    assert gateway.stats.snapshot()["rpcs"] == 1  # one commit, no read


def test_get_counts_reads_many_counters_in_one_rpc(any_gateway):
    counters = [CounterShardDS("Page", n, gateway=any_gateway) for n in range(1, 31)]
    named = GeneralCounter("hits", gateway=any_gateway)
    for n, counter in enumerate(counters, start=1):
        counter.add(n)
    named.add(7)
    any_gateway.stats.reset()
    assert get_counts([*counters, named]) == [*range(1, 31), 7]
    assert any_gateway.stats.snapshot()["rpcs"] == 1


def test_query_method_runs_the_articles_query(gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    counter.add(4)
    gateway.stats.reset()
    assert counter.get_count(method="query") == 4
    assert gateway.stats.snapshot()["rpc.run_query"] >= 1
    assert gateway.stats.snapshot().get("rpc.lookup", 0) == 0


def test_a_reader_with_fewer_shards_sees_a_writer_with_more(gateway):
    writer = CounterShardDS("Counter Test", 1, num_shards=50, gateway=gateway, strategy="transactional")
    for _ in range(150):
        writer.add()
    assert max(shard for shard, count in writer.shards() if count) > 20  # really beyond 20
    reader = CounterShardDS("Counter Test", 1, num_shards=5, gateway=gateway)
    assert reader.get_count() == 150
    # PHP's default writer (20 shards) is always covered by a small reader
    CounterShardDS("Other", 1, gateway=gateway).add(9)
    assert CounterShardDS("Other", 1, num_shards=1, gateway=gateway).get_count() == 9


def test_a_reader_learns_grown_shards_once(gateway):
    grower = CounterShardDS("Counter Test", 1, gateway=gateway)
    grower.increase_shards(40)
    for _ in range(120):
        grower.add()
    reader = CounterShardDS("Counter Test", 1, gateway=gateway)
    gateway.stats.reset()
    assert reader.get_count(method="lookup") == 120
    assert gateway.stats.snapshot()["rpcs"] == 2  # learned 40 from the config, read the rest
    gateway.stats.reset()
    assert reader.get_count(method="lookup") == 120
    assert gateway.stats.snapshot()["rpcs"] == 1
    gateway.stats.reset()
    assert reader.get_count() == 120  # the query needs no config: one RPC from the start
    assert gateway.stats.snapshot()["rpcs"] == 1


def test_shards_breakdown_and_reset(gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    for _ in range(25):
        counter.add()
    rows = counter.shards()
    assert [shard for shard, _ in rows] == list(range(1, 21))
    assert sum(count for _, count in rows) == 25
    counter.reset()
    assert counter.shards() == [(n, 0) for n in range(1, 21)]
    assert counter.get_count() == 0
    assert counter.increment() == 1


def test_decrement(gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    counter.increment(3)
    assert counter.decrement() == 2
    assert counter.decrement(5) == -3


@pytest.mark.parametrize("strategy", ["auto", "transactional", "increment", "auto-grow"])
def test_every_strategy_counts(gateway, strategy):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway, strategy=strategy)
    assert [counter.increment() for _ in range(5)] == [1, 2, 3, 4, 5]
    assert counter.increment(10) == 15
