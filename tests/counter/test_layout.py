"""The PHP article's data layout, checked where it is stored: through the
gateway on every backend, and through Google's own client on the emulators."""

from __future__ import annotations

import pytest

from gds_counter.counter import PHP_ARTICLE, CounterShardDS, CounterShardEntity
from gds_counter.gateway.keys import Key
from gds_counter.gds import Store

KIND = "IK_CounterShardEntity"


def _write_every_shard(counter: CounterShardDS, rounds: int = 3) -> None:
    """Random shards: write until every one of the 20 holds something."""
    for _ in range(2000):
        if all(count for _, count in counter.shards()[:20]):
            return
        for _ in range(20 * rounds):
            counter.add()
    pytest.fail("20 shards were not all written")


def _count_flags(gateway, strategy: str) -> frozenset[str]:
    """php-gds writes ``count`` unindexed. So does every path here, except a
    server-side increment (the default where it applies) on a server that
    indexes what a transform wrote: documented in the README."""
    caps = gateway.capabilities
    transformed = strategy == "auto" and caps.applies_transforms
    return frozenset() if transformed and caps.indexes_transformed else frozenset({"count"})


@pytest.mark.parametrize("strategy", ["auto", "transactional"])
def test_shards_are_stored_exactly_as_php_stores_them(any_gateway, strategy):
    counter = CounterShardDS("Counter Test", 1, gateway=any_gateway, strategy=strategy)
    _write_every_shard(counter)
    ns = any_gateway.namespace
    keys = [Key.of(KIND, f"Counter Test_1_{n}", namespace=ns) for n in range(1, 21)]
    stored = any_gateway.lookup(keys)
    assert all(raw is not None for raw in stored)
    for raw in stored:
        assert raw.key.kind == KIND
        assert set(raw.properties) == {"target", "count"}  # no shard_num
        assert raw.properties["target"] == "Counter Test_1"
        assert type(raw.properties["count"]) is int
        assert raw.unindexed == _count_flags(any_gateway, strategy)  # target indexed, count (normally) not
    assert sum(raw.properties["count"] for raw in stored) == counter.get_count()
    # nothing outside 1..20: shard 0 and 21 do not exist
    outside = [Key.of(KIND, f"Counter Test_1_{n}", namespace=ns) for n in (0, 21)]
    assert any_gateway.lookup(outside) == [None, None]


@pytest.mark.parametrize("strategy", ["auto", "transactional"])
@pytest.mark.parametrize("emulator", ["datastore", "firestore"])
def test_google_client_sees_the_php_layout(emulator, strategy, request, monkeypatch):
    from google.cloud import datastore

    gateway = request.getfixturevalue(f"{emulator}_gateway")
    emu = request.getfixturevalue(f"{emulator}_emulator")
    counter = CounterShardDS("Counter Test", 1, gateway=gateway, strategy=strategy)
    _write_every_shard(counter)
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", emu.host)
    client = datastore.Client(project=emu.project, namespace=gateway.namespace)
    entities = list(client.query(kind=KIND).fetch())
    names = sorted(entity.key.name for entity in entities)
    assert names == sorted(f"Counter Test_1_{n}" for n in range(1, 21))
    for entity in entities:
        assert entity.kind == KIND
        assert set(entity) == {"target", "count"}
        assert entity["target"] == "Counter Test_1"
        assert isinstance(entity["count"], int)
        assert entity.exclude_from_indexes == set(_count_flags(gateway, strategy))
    # PHP's read path, the indexed target filter, finds them all
    query = client.query(kind=KIND)
    query.add_filter(filter=datastore.query.PropertyFilter("target", "=", "Counter Test_1"))
    assert sum(e["count"] for e in query.fetch()) == counter.get_count() == counter.get_count(method="query")


def test_entity_class_matches_the_php_class():
    shard = CounterShardEntity("Counter Test_1", 7, 3)
    assert shard.get_kind() == KIND == CounterShardEntity.kind()
    assert shard.get_key_name() == "Counter Test_1_7"
    assert shard.get_data() == {"target": "Counter Test_1", "count": 3}
    schema = CounterShardEntity.schema()
    assert schema.is_indexed("target") and not schema.is_indexed("count")
    assert {p.type.value for p in schema.get_properties().values()} == {"string", "integer"}


def test_kind_prefix_is_honoured(gateway, monkeypatch):
    class DevShard(CounterShardEntity):
        KIND_PFX = "dev_"

    assert DevShard.kind() == "dev_IK_CounterShardEntity"
    counter = CounterShardDS("Counter Test", 1, store=Store(DevShard, gateway))
    counter.increment(4)
    counter.increase_shards(25)
    assert counter.layout.shard_kind == "dev_IK_CounterShardEntity"
    assert counter.layout.config_kind == "dev_IK_CounterShardConfig"
    found = [raw for raw in gateway.lookup([counter.layout.shard_key(counter.name, n, counter.namespace) for n in range(1, 26)]) if raw is not None]
    assert [raw.key.kind for raw in found] == ["dev_IK_CounterShardEntity"]
    assert gateway.lookup([Key.of("dev_IK_CounterShardConfig", "Counter Test_1")])[0].properties == {"num_shards": 25}
    # the unprefixed kind is untouched
    assert CounterShardDS("Counter Test", 1, gateway=gateway).get_count() == 0
    # and so is a prefix set on the base class, as PHP code edits the constant
    monkeypatch.setattr(CounterShardEntity, "KIND_PFX", "test_")
    assert CounterShardDS("a", 1, gateway=gateway).layout.shard_kind == "test_IK_CounterShardEntity"


def test_store_of_another_kind_is_refused(gateway):
    from gds_counter.errors import BadValueError

    with pytest.raises(BadValueError, match="'Book'"):
        CounterShardDS("a", 1, store=Store("Book", gateway))


def test_layout_is_data():
    assert PHP_ARTICLE.shard_name("Counter Test_1", 20) == "Counter Test_1_20"
    assert list(PHP_ARTICLE.shard_numbers(20)) == list(range(1, 21))
    assert PHP_ARTICLE.with_prefix("x_").with_prefix("y_").shard_kind == "y_IK_CounterShardEntity"


def test_target_strings_follow_php_even_when_they_collide(gateway):
    # ("a_b", 1) and ("a", "b_1") are the same PHP target "a_b_1": one counter.
    CounterShardDS("a_b", 1, gateway=gateway).increment(2)
    assert CounterShardDS("a", "b_1", gateway=gateway).get_count() == 2
