"""Bad input fails before anything is written, naming the bad value; stored
data that breaks the layout fails naming the entity."""

from __future__ import annotations

import pytest

from gds_counter.counter import CounterShardDS, GeneralCounter
from gds_counter.errors import BadKeyError, BadValueError, CorruptDataError
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity
from gds_counter.gds import RetryPolicy


@pytest.mark.parametrize(
    "args, named",
    [
        ((None, 1), "None"),
        (("", 1), "''"),
        (("Counter Test", None), "None"),
        (("Counter Test", ""), "''"),
        (("Counter Test", True), "True"),
        (("Counter Test", 1.5), "1.5"),
        ((["x"], 1), "['x']"),
    ],
)
def test_bad_targets(gateway, args, named):
    with pytest.raises(BadValueError) as info:
        CounterShardDS(*args, gateway=gateway)
    assert named in str(info.value)
    assert gateway.stats.snapshot()["entity_writes"] == 0


@pytest.mark.parametrize("num_shards", [0, -3, True, "20", 2.0])
def test_bad_shard_counts(gateway, num_shards):
    with pytest.raises(BadValueError) as info:
        CounterShardDS("Counter Test", 1, num_shards, gateway=gateway)
    assert repr(num_shards) in str(info.value) or str(num_shards) in str(info.value)


@pytest.mark.parametrize("amount", [True, False, 1.0, "1", None, 2**63])
def test_bad_amounts(gateway, amount):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    for call in (counter.increment, counter.add, counter.decrement):
        with pytest.raises(BadValueError) as info:
            call(amount)
        assert str(amount) in str(info.value)
    assert gateway.stats.snapshot()["entity_writes"] == 0


def test_unknown_strategy_and_read_method(gateway):
    with pytest.raises(BadValueError, match="'fast'"):
        CounterShardDS("Counter Test", 1, gateway=gateway, strategy="fast")
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    with pytest.raises(BadValueError, match="'scan'"):
        counter.get_count(method="scan")
    with pytest.raises(BadValueError, match="cannot be queried"):
        GeneralCounter("hits", gateway=gateway).get_count(method="query")


def test_shrinking_shards_names_both_numbers(gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    counter.increase_shards(30)
    gateway.stats.reset()
    with pytest.raises(BadValueError) as info:
        counter.increase_shards(25)
    assert "30" in str(info.value) and "25" in str(info.value)
    assert gateway.stats.snapshot()["entity_writes"] == 0
    with pytest.raises(BadValueError, match="from 20 to 10"):
        CounterShardDS("Fresh", 1, gateway=gateway).increase_shards(10)
    # another process's counter object learns the recorded 30 and refuses too
    with pytest.raises(BadValueError, match="30"):
        CounterShardDS("Counter Test", 1, gateway=gateway).increase_shards(21)
    assert counter.increase_shards(30) == 30  # same number: fine


def test_too_long_target_is_refused_before_writing(gateway):
    with pytest.raises(BadKeyError, match="1500"):
        CounterShardDS("x" * 1600, 1, gateway=gateway)
    assert gateway.stats.snapshot()["entity_writes"] == 0


def _put_shard(gateway, name: str, count, target: str = "Counter Test_1") -> Key:
    key = Key.of("IK_CounterShardEntity", name, namespace=gateway.namespace)
    gateway.commit([Upsert(RawEntity(key, {"target": target, "count": count}, frozenset({"count"})))])
    return key


def test_decimal_string_from_old_php_is_read_as_an_integer(any_gateway):
    _put_shard(any_gateway, "Counter Test_1_3", "41")
    counter = CounterShardDS("Counter Test", 1, gateway=any_gateway, strategy="transactional")
    assert counter.get_count() == 41
    assert counter.get_count(method="query") == 41
    assert dict(counter.shards())[3] == 41


@pytest.mark.parametrize("bad", [2.5, "forty", [1, 2], b"7"])
def test_shard_that_is_not_an_integer_names_the_shard(gateway, bad):
    _put_shard(gateway, "Counter Test_1_7", bad)
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    for read in (counter.get_count, lambda: counter.get_count(method="query"), counter.shards):
        with pytest.raises(CorruptDataError, match="Counter Test_1_7"):
            read()


def test_corrupt_shard_stops_a_transactional_increment_before_writing(gateway):
    _put_shard(gateway, "Counter Test_1_1", 1.5)
    counter = CounterShardDS("Counter Test", 1, num_shards=1, gateway=gateway, strategy="transactional")
    with pytest.raises(CorruptDataError, match="Counter Test_1_1"):
        counter.add()
    assert gateway.lookup([Key.of("IK_CounterShardEntity", "Counter Test_1_1")])[0].properties["count"] == 1.5


def test_corrupt_config_names_the_config(gateway):
    key = Key.of("IK_CounterShardConfig", "Counter Test_1", namespace=gateway.namespace)
    gateway.commit([Upsert(RawEntity(key, {"num_shards": -4}))])
    with pytest.raises(CorruptDataError, match="Counter Test_1"):
        CounterShardDS("Counter Test", 1, gateway=gateway).get_count(method="lookup")  # the config's reader


def test_bad_retry_policy(gateway):
    with pytest.raises(BadValueError, match="RetryPolicy"):
        CounterShardDS("Counter Test", 1, gateway=gateway, retry=3)
    CounterShardDS("Counter Test", 1, gateway=gateway, retry=RetryPolicy(attempts=2))
