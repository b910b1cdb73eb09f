"""The optional TTL read cache: stale for at most ttl seconds, only ever
showing increments that were committed, and never missing one this process
committed through the gateway it caches for."""

from __future__ import annotations

import pytest
from freezegun import freeze_time

from gds_counter.counter import CountCache, CounterShardDS, get_counts
from gds_counter.errors import BadValueError, CommitUnknown, Contention, GatewayError, Unavailable
from gds_counter.gateway import open_gateway
from gds_counter.gds import RetryPolicy


def test_cached_total_expires_after_the_ttl(tmp_path):
    """Writes the cache cannot see (another process's: here a gateway of
    its own on the same file) show once the cached total expires. (A
    counter object on the same gateway is not another process: its writes
    are seen at once, see below.)"""
    path = tmp_path / "ttl.sqlite3"
    gateway, elsewhere = open_gateway(f"sqlite:///{path}"), open_gateway(f"sqlite:///{path}")
    with freeze_time("2024-01-01 12:00:00") as clock:
        cached = CounterShardDS("Counter Test", 1, gateway=gateway, cache=True)
        other = CounterShardDS("Counter Test", 1, gateway=elsewhere)  # another process
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
    gateway.close()
    elsewhere.close()


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


# --- every write of the process is seen (issue 23, item 7) -------------------------


def test_a_cached_counter_sees_writes_of_counter_objects_without_a_cache(gateway):
    """The README promises that a cached total includes every increment
    the process committed. A counter object built without a cache (one per
    web request, say) writes through the same gateway: the shared cache of
    that gateway must see it, or the cached object shows the old total for
    up to a minute."""
    cached = CounterShardDS("Counter Test", 1, gateway=gateway, cache=True)
    assert cached.get_count() == 0  # now cached
    assert CounterShardDS("Counter Test", 1, gateway=gateway).increment() == 1
    assert cached.get_count() == 1
    CounterShardDS("Counter Test", 1, gateway=gateway).add(4)
    assert cached.get_count() == 5


def test_a_cached_counter_sees_a_reset_and_new_shards_from_another_object(gateway):
    """A reset by another counter object zeroes the total: the cached one
    must not go on showing the old total. Shards added by another object
    (``increase_shards``) and written there are in the cached total too."""
    cached = CounterShardDS("Counter Test", 1, gateway=gateway, cache=True)
    CounterShardDS("Counter Test", 1, gateway=gateway).add(5)
    assert cached.get_count() == 5
    CounterShardDS("Counter Test", 1, gateway=gateway).reset()
    assert cached.get_count() == 0
    wider = CounterShardDS("Counter Test", 1, num_shards=40, gateway=gateway)
    assert wider.increase_shards(40) == 40
    for _ in range(10):
        wider.add(1)
    assert cached.get_count() == 10
    assert CounterShardDS("Counter Test", 1, gateway=gateway).get_count() == 10


def test_counters_sharing_an_explicit_cache_see_each_others_writes(gateway):
    """What a ``CountCache`` passed explicitly promises: the writes of the
    counters built with it are in its totals at once (the writes of other
    counter objects, like other processes', after at most ``ttl``)."""
    cache = CountCache(ttl=30)
    reader = CounterShardDS("Counter Test", 1, gateway=gateway, cache=cache)
    assert reader.get_count() == 0
    CounterShardDS("Counter Test", 1, gateway=gateway, cache=cache).add(3)
    assert reader.get_count() == 3


# --- a write whose outcome is unknown drops the total (issue 23, item 6) -----------


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, GeneratorExit, CommitUnknown, GatewayError])
def test_a_write_that_may_have_landed_leaves_no_cached_total(interrupt):
    """A write left by an interrupt, a closed plan or an error that does not
    say "nothing stored" may still land (a worker thread goes on, a server
    applies a request whose caller left). Its counter's cached total must be
    dropped, and none kept while it may still land: the next reads go to
    storage."""
    with freeze_time("2024-01-01 12:00:00") as clock:
        cache = CountCache(ttl=60)
        cache.store("c", 7, cache.reading("c"))
        assert cache.get("c") == 7
        with pytest.raises(interrupt):
            with cache.writing("c", 1):
                raise interrupt("the caller left")
        assert cache.get("c") is None
        ticket = cache.reading("c")  # a read that began after the write was left
        assert not cache.store("c", 7, ticket)  # it may have missed the write's landing
        assert cache.get("c") is None
        clock.tick(61)
        assert cache.store("c", 8, cache.reading("c"))
        assert cache.get("c") == 8


@pytest.mark.parametrize("nothing_stored", [Contention, Unavailable])
def test_a_write_that_stored_nothing_keeps_the_cached_total(nothing_stored):
    """``Contention`` and ``Unavailable`` mean nothing was written: the
    cached total is still true and stays."""
    cache = CountCache(ttl=60)
    cache.store("c", 7, cache.reading("c"))
    with pytest.raises(nothing_stored):
        with cache.writing("c", 1):
            raise nothing_stored("not stored")
    assert cache.get("c") == 7
