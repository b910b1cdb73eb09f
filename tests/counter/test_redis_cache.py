"""The cache every process shares (``cache="redis://..."``,
``counter.redis_cache``), against a real redis-server: write-through across
processes, never a total that counts an uncommitted increment or misses
one whose call returned, and storage when Redis is gone."""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
import time
import uuid

import pytest
from sizes import size

from gds_counter.counter import CounterShardDS
from gds_counter.errors import BadValueError, CommitUnknown
from gds_counter.gateway import open_gateway
from gds_counter.testing import FaultyGateway


def _rpcs(gateway) -> int:
    return gateway.stats.snapshot()["rpcs"]


def _add_in_another_process(url: str, cache: str, target: str, amount: int, env: dict[str, str]) -> None:
    os.environ.update(env)
    gateway = open_gateway(url)
    CounterShardDS("Shared", target, gateway=gateway, cache=cache).add(amount)
    gateway.close()


@pytest.mark.parametrize("storage", ["sqlite", "firestore"])
def test_a_total_cached_in_one_process_has_anothers_increment_once_its_call_returned(storage, redis_server, tmp_path,
                                                                                     request):
    if storage == "sqlite":
        url, env = f"sqlite:///{tmp_path / 'shared.sqlite3'}", {}
    else:
        emulator = request.getfixturevalue("firestore_emulator")
        namespace = f"redis-{uuid.uuid4().hex[:8]}"
        url, env = f"datastore://{emulator.project}?namespace={namespace}", emulator.env
        os.environ.update(env)
    gateway = open_gateway(url)
    try:
        target = uuid.uuid4().hex[:8]
        counter = CounterShardDS("Shared", target, gateway=gateway, cache=redis_server.url)
        counter.add(2)
        assert counter.get_count() == 2  # read from storage, cached in Redis
        gateway.stats.reset()
        assert counter.get_count() == 2 and _rpcs(gateway) == 0  # from Redis
        ctx = multiprocessing.get_context("spawn")
        other = ctx.Process(target=_add_in_another_process, args=(url, redis_server.url, target, 5, env))
        other.start()
        other.join(120)
        assert other.exitcode == 0
        gateway.stats.reset()
        assert counter.get_count() == 7 and _rpcs(gateway) == 0  # the other process's add, written through
    finally:
        gateway.close()


def test_with_redis_killed_increments_count_and_reads_are_exact(redis_server, tmp_path, caplog):
    gateway = open_gateway(f"sqlite:///{tmp_path / 'down.sqlite3'}")
    try:
        counter = CounterShardDS("Counter Test", 1, gateway=gateway, cache=redis_server.url)
        counter.add(3)
        assert counter.get_count() == 3  # cached
        redis_server.stop()
        with caplog.at_level(logging.WARNING, logger="gds_counter.counter.redis_cache"):
            began = time.monotonic()
            counter.add(4)  # counted; the cache's failure is logged, never raised
            assert counter.increment() == 8
            assert counter.get_count() == 8  # from storage
            assert time.monotonic() - began < 30  # each Redis call gave up at its timeout (a bound, not a speed)
        assert "the shared cache" in caplog.text and "read from storage" in caplog.text
        redis_server.start()  # back, empty: it fills again from storage
        time.sleep(0.3)  # after a failed call the cache tries Redis again once its timeout (0.25 s) has passed
        assert counter.get_count() == 8
        gateway.stats.reset()
        assert counter.get_count() == 8 and _rpcs(gateway) == 0
    finally:
        gateway.close()


def test_a_write_redis_never_heard_the_end_of_drops_the_total_when_its_lease_ends(redis_server, tmp_path):
    """A writer that crashed between its commit and its update: the total
    it would have adjusted is dropped when its lease ends."""
    url = redis_server.url + "?lease=0.5"
    gateway = open_gateway(f"sqlite:///{tmp_path / 'lease.sqlite3'}")
    try:
        counter = CounterShardDS("Counter Test", 1, gateway=gateway, cache=url)
        counter.add(1)
        assert counter.get_count() == 1
        cache = counter._cache
        writing = cache.writing(counter._identity(), 5)
        writing.__enter__()  # announced; then "crashes": its end never comes
        CounterShardDS("Counter Test", 1, gateway=gateway).add(5)  # its commit, landed
        assert counter.get_count() == 1  # in flight: not returned, so not yet owed to readers
        time.sleep(0.7)
        assert counter.get_count() == 6  # the lease ended: dropped, read from storage
        assert cache.get(counter._identity()) is None  # and not kept for ttl (the write's end is unknown)
    finally:
        gateway.close()


def test_a_commit_of_unknown_outcome_drops_the_total(redis_server, tmp_path):
    inner = open_gateway(f"sqlite:///{tmp_path / 'unknown.sqlite3'}")
    try:
        failing = FaultyGateway(inner, script={"commit": ["DEADLINE_EXCEEDED"]})
        counter = CounterShardDS("Counter Test", 1, gateway=failing, cache=redis_server.url)
        reader = CounterShardDS("Counter Test", 1, gateway=inner, cache=redis_server.url)
        assert reader.get_count() == 0  # cached
        with pytest.raises(CommitUnknown):
            counter.add(9)  # applied, and the caller cannot know
        assert reader.get_count() == 9  # never the cached 0: dropped, read from storage
    finally:
        inner.close()


def _hammer(url: str, cache: str, target: str, seconds: float, started, acked, failures) -> None:
    """Writers and readers of one process: every total a reader sees lies
    between the adds acknowledged before it read and the adds begun."""
    gateway = open_gateway(url)
    stop = time.monotonic() + seconds
    problems: list[str] = []

    def write() -> None:
        counter = CounterShardDS("Hammer", target, gateway=gateway, cache=cache)
        while time.monotonic() < stop:
            with started.get_lock():
                started.value += 1
            counter.add(1)
            with acked.get_lock():
                acked.value += 1

    def read() -> None:
        counter = CounterShardDS("Hammer", target, gateway=gateway, cache=cache)
        while time.monotonic() < stop:
            low = acked.value
            total = counter.get_count()
            high = started.value
            if not low <= total <= high:
                problems.append(f"read {total}, acknowledged before {low}, begun by the end {high}")

    threads = [threading.Thread(target=write) for _ in range(3)] + [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gateway.close()
    if problems:
        with failures.get_lock():
            failures.value += len(problems)
        print(problems[:5], flush=True)


@pytest.mark.slow
def test_readers_never_see_a_total_that_misses_a_returned_add_or_counts_an_unbegun_one(redis_server, tmp_path):
    url = f"sqlite:///{tmp_path / 'hammer.sqlite3'}"
    ctx = multiprocessing.get_context("spawn")
    started, acked, failures = ctx.Value("q", 0), ctx.Value("q", 0), ctx.Value("q", 0)
    target = uuid.uuid4().hex[:8]
    workers = [ctx.Process(target=_hammer, args=(url, redis_server.url, target, size(1.5, 4.0), started, acked, failures))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [worker.exitcode for worker in workers] == [0, 0]
    assert failures.value == 0
    gateway = open_gateway(url)
    try:
        assert CounterShardDS("Hammer", target, gateway=gateway).get_count() == acked.value > 0
    finally:
        gateway.close()


def test_two_storages_sharing_one_redis_never_share_a_total(redis_server, tmp_path):
    one, two = (open_gateway(f"sqlite:///{tmp_path / name}") for name in ("one.sqlite3", "two.sqlite3"))
    try:
        CounterShardDS("Counter Test", 1, gateway=one, cache=redis_server.url).add(1)
        CounterShardDS("Counter Test", 1, gateway=two, cache=redis_server.url).add(2)
        assert CounterShardDS("Counter Test", 1, gateway=one, cache=redis_server.url).get_count() == 1
        assert CounterShardDS("Counter Test", 1, gateway=two, cache=redis_server.url).get_count() == 2
        assert CounterShardDS("Counter Test", 1, gateway=one, cache=redis_server.url).get_count() == 1
    finally:
        one.close()
        two.close()


@pytest.mark.parametrize("bad", ["redis://", "http://localhost:6379", "redis://h:1/0?ttl=-1", "redis://h:1/0?lease=x",
                                 "redis://h:1/0?prefix=", 7, "redis://h:1/0?foo=bar", "redis://h:1/0?timeout=1e10",
                                 "redis://h:1/0?ttl=0.0001", "redis://h:1/0?lease=1e300", "redis://[::1/0",
                                 "redis://h:1/0?socket_timeout=-1", "redis://h:1/0?socket_connect_timeout=-1",
                                 "redis://h:1/0?socket_timeout=inf", "redis://h:1/0?socket_timeout=1e308",
                                 "redis://h:1/0?socket_timeout=0", "redis://h:1/0?decode_responses=true",
                                 "rediss://h:1/0?ssl_cert_reqs=garbage"])
def test_a_bad_cache_url_is_refused_before_anything_is_written(bad, memory_gateway):
    with pytest.raises(BadValueError, match="cache"):
        CounterShardDS("Counter Test", 1, gateway=memory_gateway, cache=bad)
    assert memory_gateway.stats.snapshot()["rpcs"] == 0


def test_a_writer_that_could_not_reach_redis_drops_the_total_when_it_next_can(redis_server, tmp_path):
    """Redis paused (SIGSTOP) around a write: the write counts, and this
    process's next call that reaches Redis drops the total it could not
    adjust, so no reader keeps the old one."""
    import signal

    gateway = open_gateway(f"sqlite:///{tmp_path / 'owed.sqlite3'}")
    try:
        url = redis_server.url + "?timeout=0.2"
        writer = CounterShardDS("Counter Test", 1, gateway=gateway, cache=url)
        writer.add(5)
        assert writer.get_count() == 5  # cached
        redis_server.process.send_signal(signal.SIGSTOP)
        try:
            writer.add(3)  # counted; Redis heard neither its start nor its end
        finally:
            redis_server.process.send_signal(signal.SIGCONT)
        other = CounterShardDS("Counter Test", 2, gateway=gateway, cache=url)
        time.sleep(0.25)  # after a failed call the cache tries Redis again once its timeout (0.2 s) has passed
        other.get_count()  # any call of this process that reaches Redis
        import redis

        plain = redis.Redis.from_url(redis_server.url)
        assert not [k for k in plain.keys("*Counter Test_1*:total")]  # the stale 5 is gone
        assert CounterShardDS("Counter Test", 1, gateway=gateway, cache=url).get_count() == 8
    finally:
        gateway.close()
