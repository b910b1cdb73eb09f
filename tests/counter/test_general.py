"""The Google article's general counter: same engine, ndb's data layout."""

from __future__ import annotations

import pytest

from gds_counter.counter import NDB_GENERAL, GeneralCounter
from gds_counter.errors import BadValueError
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity


def test_ndb_layout_key_names_and_properties(any_gateway):
    counter = GeneralCounter("hits", gateway=any_gateway)
    for _ in range(60):
        counter.add()
    ns = any_gateway.namespace
    keys = [Key.of("GeneralCounterShard", f"shard-hits-{i}", namespace=ns) for i in range(20)]
    found = [raw for raw in any_gateway.lookup(keys) if raw is not None]
    assert found and sum(raw.properties["count"] for raw in found) == 60
    for raw in found:
        assert raw.properties.keys() == {"count"}
        assert raw.unindexed == frozenset()  # ndb's IntegerProperty is indexed
    assert any_gateway.lookup([Key.of("GeneralCounterShard", "shard-hits-20", namespace=ns)]) == [None]
    assert counter.get_count() == 60


def test_increase_shards_records_the_config_entity(gateway):
    counter = GeneralCounter("hits", gateway=gateway)
    assert counter.increase_shards(30) == 30
    [config] = gateway.lookup([Key.of("GeneralCounterShardConfig", "hits")])
    assert config.properties == {"num_shards": 30}
    with pytest.raises(BadValueError, match="30.*12|12.*30"):
        counter.increase_shards(12)
    for _ in range(200):
        counter.add()
    assert {shard for shard, count in counter.shards() if count} - set(range(20))  # used 20..29 too
    assert GeneralCounter("hits", gateway=gateway).get_count() == 200


def test_reads_data_written_by_python2_ndb(gateway):
    """What the article's ndb code leaves behind: a config with 4 shards and
    0-based shard names."""
    gateway.commit(
        [Upsert(RawEntity(Key.of("GeneralCounterShardConfig", "legacy"), {"num_shards": 4}))]
        + [Upsert(RawEntity(Key.of("GeneralCounterShard", f"shard-legacy-{i}"), {"count": i + 1})) for i in range(4)]
    )
    counter = GeneralCounter("legacy", gateway=gateway)
    assert counter.get_count() == 10
    for _ in range(20):
        counter.add(5)
    # writes stay within the 4 shards the config names, where ndb's get_count reads
    ndb_view = gateway.lookup([Key.of("GeneralCounterShard", f"shard-legacy-{i}") for i in range(4)])
    assert sum(raw.properties["count"] for raw in ndb_view) == 110
    assert counter.get_count() == 110
    assert counter.num_shards == 4


def test_a_fresh_process_writes_where_the_config_says(gateway):
    gateway.commit([Upsert(RawEntity(Key.of("GeneralCounterShardConfig", "small"), {"num_shards": 2}))])
    counter = GeneralCounter("small", gateway=gateway)  # has not read anything yet
    for _ in range(30):
        counter.add()
    assert {shard for shard, count in counter.shards() if count} <= {0, 1}
    with pytest.raises(BadValueError, match="from 20 to 5"):
        GeneralCounter("no-config", gateway=gateway).increase_shards(5)  # ndb's default is 20


def test_counters_are_created_on_the_fly_and_kept_apart(gateway):
    a, b = GeneralCounter("a", gateway=gateway), GeneralCounter("b", gateway=gateway)
    a.increment(2)
    b.increment(3)
    assert (a.get_count(), b.get_count()) == (2, 3)
    with pytest.raises(BadValueError, match="''"):
        GeneralCounter("", gateway=gateway)


def test_layout_is_data():
    assert NDB_GENERAL.shard_name("hits", 0) == "shard-hits-0"
    assert list(NDB_GENERAL.shard_numbers(3)) == [0, 1, 2]
    assert NDB_GENERAL.config_kind == "GeneralCounterShardConfig"
    assert NDB_GENERAL.default_shards == 20
