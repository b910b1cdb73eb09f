"""The optional TTL read cache: stale for at most ttl seconds, and only ever
showing increments that were committed."""

from __future__ import annotations

import pytest
from freezegun import freeze_time

from gds_counter.counter import CounterShardDS, CountCache, get_counts
from gds_counter.errors import BadValueError, Contention
from gds_counter.gateway import open_gateway
from gds_counter.gds import RetryPolicy


def test_cached_total_expires_after_the_ttl(gateway):
    with freeze_time("2024-01-01 12:00:00") as clock:
        cached = CounterShardDS("Counter Test", 1, gateway=gateway, cache=True)
        other = CounterShardDS("Counter Test", 1, gateway=gateway)  # no cache: another process
        other.add(3)
        assert cached.get_count() == 3
        other.add(4)
        gateway.stats.reset()
        assert cached.get_count() == 3  # served from the cache
        assert gateway.stats.snapshot()["rpcs"] == 0
        clock.tick(59)
        assert cached.get_count() == 3
        clock.tick(2)
        assert cached.get_count() == 7
        assert gateway.stats.snapshot()["rpcs"] == 1


def test_short_lived_counters_share_the_default_cache(gateway):
    CounterShardDS("Counter Test", 1, gateway=gateway, cache=True).increment(2)
    gateway.stats.reset()
    assert CounterShardDS("Counter Test", 1, gateway=gateway, cache=True).get_count() == 2
    assert gateway.stats.snapshot()["rpcs"] == 0


def test_committed_increments_update_the_cache(gateway):
    cache = CountCache(ttl=30)
    counter = CounterShardDS("Counter Test", 1, gateway=gateway, cache=cache)
    assert counter.get_count() == 0
    counter.add(5)
    assert counter.increment() == 6
    counter.add(2)
    gateway.stats.reset()
    assert counter.get_count() == 8
    assert gateway.stats.snapshot()["rpcs"] == 0
    counter.reset()
    assert counter.get_count() == 0


def test_a_failed_increment_never_reaches_the_cache(tmp_path):
    # One write per 100 s per entity: the second write to the one shard conflicts.
    from gds_counter.gateway.embedded import EmbeddedGateway

    gateway = EmbeddedGateway(str(tmp_path / "slow.sqlite3"), entity_writes_per_second=0.01)
    cache = CountCache()
    counter = CounterShardDS("Counter Test", 1, num_shards=1, gateway=gateway, cache=cache,
                             retry=RetryPolicy(attempts=2, initial=0.001))
    counter.add()
    assert counter.get_count() == 1
    with pytest.raises(Contention):
        counter.add(10)
    assert counter.get_count() == 1
    gateway.close()


def test_get_counts_uses_the_cache(gateway):
    with freeze_time("2024-01-01"):
        a = CounterShardDS("A", 1, gateway=gateway, cache=True)
        b = CounterShardDS("B", 1, gateway=gateway)
        a.add(1)
        b.add(2)
        assert get_counts([a, b]) == [1, 2]
        gateway.stats.reset()
        assert get_counts([a, b]) == [1, 2]
        assert gateway.stats.snapshot()["rpcs"] == 1  # b only


def test_cache_keys_keep_gateways_apart():
    one, two = open_gateway("memory://"), open_gateway("memory://")
    CounterShardDS("Counter Test", 1, gateway=one, cache=True).add(1)
    assert CounterShardDS("Counter Test", 1, gateway=one, cache=True).get_count() == 1
    assert CounterShardDS("Counter Test", 1, gateway=two, cache=True).get_count() == 0
    one.close()
    two.close()


@pytest.mark.parametrize("ttl", [0, -1, "60", True])
def test_bad_ttl(ttl):
    with pytest.raises(BadValueError):
        CountCache(ttl=ttl)


def test_fresh_databases_never_show_another_ones_cached_total():
    """The shared cache lives with its gateway: a new database, even one whose
    gateway object lands at a freed one's address, starts empty."""
    for i in range(50):
        gateway = open_gateway("memory://")
        counter = CounterShardDS("Counter Test", 1, gateway=gateway, cache=True)
        assert counter.get_count() == 0, f"database {i} showed a cached total"
        counter.add(i + 1)
        assert counter.get_count() == i + 1
        gateway.close()
        del counter, gateway
