"""PHP and Python writing the same counter, one after the other.

``php_increment`` is a literal port of the article's PHP ``increment()``:
pick a random shard 1..20, fetch it by name, add 1 or create it with 1,
upsert with no transaction, then ``getCount()`` by query. It writes raw
entities exactly as php-gds does (``count`` excluded from indexes).
"""

from __future__ import annotations

import random

import pytest

from gds_counter.counter import CounterShardDS
from gds_counter.gateway.base import run_query_all
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.query import PropertyFilter, Query
from gds_counter.gateway.values import RawEntity
from gds_counter.testing import GATEWAY_NAMES

KIND = "IK_CounterShardEntity"
NUM_SHARDS = 20


def php_get_count(gateway, target: str) -> int:
    query = Query(kind=KIND, namespace=gateway.namespace, filter=PropertyFilter("target", "=", target))
    return sum(int(shard.properties["count"]) for shard in run_query_all(gateway, query))


def php_increment(gateway, target_type, target_id) -> int:
    target = f"{target_type}_{target_id}"
    shard_num = random.randint(1, NUM_SHARDS)
    key = Key.of(KIND, f"{target}_{shard_num}", namespace=gateway.namespace)
    [shard] = gateway.lookup([key])
    if shard is not None:
        count = int(shard.properties["count"]) + 1
    else:
        count = 1
    gateway.commit([Upsert(RawEntity(key, {"target": target, "count": count}, frozenset({"count"})))])
    return php_get_count(gateway, target)


# The legacy Datastore emulator ignores transforms, so "increment" is not a
# way to count there (test_strategies shows it refusing instead of losing).
INTEROP_CASES = [
    (gateway, strategy)
    for gateway in GATEWAY_NAMES
    for strategy in ("auto", "transactional", "increment")
    if (gateway, strategy) != ("datastore", "increment")
]


@pytest.mark.parametrize("any_gateway, strategy", INTEROP_CASES, indirect=["any_gateway"])
def test_php_and_python_increments_add_up(any_gateway, strategy):
    ours = CounterShardDS("Counter Test", 1, gateway=any_gateway, strategy=strategy)
    expected = 0
    for i in range(60):
        expected += 1
        if i % 3 == 0:
            assert php_increment(any_gateway, "Counter Test", 1) == expected
        else:
            assert ours.increment() == expected
    assert ours.get_count() == ours.get_count(method="query") == php_get_count(any_gateway, "Counter Test_1") == 60


def _php_writes_shards(gateway, target: str, counts: dict[int, int]) -> None:
    """Shards as the article's PHP ``increment()`` leaves them on php-gds:
    key name ``{target}_{n}``, ``target`` indexed, ``count`` unindexed, and
    no config entity anywhere (PHP records its NUM_SHARDS nowhere)."""
    gateway.commit([
        Upsert(RawEntity(Key.of(KIND, f"{target}_{n}", namespace=gateway.namespace),
                         {"target": target, "count": count}, frozenset({"count"})))
        for n, count in counts.items()
    ])


@pytest.mark.parametrize("any_gateway", GATEWAY_NAMES, indirect=True)
def test_a_default_reader_sees_every_shard_a_php_writer_with_40_shards_wrote(any_gateway):
    """The article: NUM_SHARDS "can be increased but never decreased". A PHP
    app at 40 shards wrote 1..40; the port with default arguments must read
    it all, and its increment must return the total plus one."""
    counts = {n: n % 7 + 1 for n in range(1, 41)}
    _php_writes_shards(any_gateway, "Counter Test_1", counts)
    counter = CounterShardDS("Counter Test", 1, gateway=any_gateway)
    any_gateway.stats.reset()
    assert counter.get_count() == sum(counts.values())
    assert any_gateway.stats.snapshot()["rpcs"] == 1  # the article's one query
    assert php_get_count(any_gateway, "Counter Test_1") == sum(counts.values())
    assert counter.increment() == sum(counts.values()) + 1
    assert dict(counter.shards())[40] == counts[40]


def test_php_sees_shards_that_python_grew(gateway):
    ours = CounterShardDS("Counter Test", 1, gateway=gateway, strategy="transactional")
    ours.increase_shards(60)
    for _ in range(200):
        ours.add()
    # PHP reads by query on target, so it sees shards 21..60 as well
    assert php_get_count(gateway, "Counter Test_1") == 200
    # ...and a Python reader built with the article's 20 shards sees them too
    fresh = CounterShardDS("Counter Test", 1, gateway=gateway)
    assert fresh.get_count() == 200
    assert fresh.get_count(method="lookup") == 200  # through the config entity Python records
    assert fresh.num_shards == 60
    # PHP keeps writing 1..20, which every reader covers
    for _ in range(10):
        php_increment(gateway, "Counter Test", 1)
    assert CounterShardDS("Counter Test", 1, gateway=gateway).get_count() == 210
