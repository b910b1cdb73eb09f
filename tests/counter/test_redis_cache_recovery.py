"""The shared cache (``counter.redis_cache``) when Redis forgets, stalls,
holds what is not a total, or is reached through a Unix socket, and in a
child forked while other threads use it: never a total that misses an add
whose call returned, and no call that waits on Redis for long."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from sizes import size

from gds_counter.counter import CounterShardDS, get_counts
from gds_counter.gateway import open_gateway

#: Seconds of forking while four threads use the cache (a child hung in
#: about one of every few dozen forks before the fix).
FORKING_S = size(2.0, 6.0)


#: A process of its own: the total of "Counter Test" 1 on the storage ``argv[1]``
#: with the cache ``argv[2]``, after adding ``argv[3]`` to it.
_ANOTHER_PROCESS = """
import sys
from gds_counter.counter import CounterShardDS
from gds_counter.gateway import open_gateway
gateway = open_gateway(sys.argv[1])
counter = CounterShardDS("Counter Test", 1, gateway=gateway, cache=sys.argv[2])
if int(sys.argv[3]):
    counter.add(int(sys.argv[3]))
print(counter.get_count())
gateway.close()
"""


def _in_another_process(storage_url: str, cache: str, add: int = 0) -> int:
    done = subprocess.run([sys.executable, "-c", _ANOTHER_PROCESS, storage_url, cache, str(add)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@pytest.fixture
def storage(tmp_path):
    gateway = open_gateway(f"sqlite:///{tmp_path / 'cache.sqlite3'}")
    yield gateway
    gateway.close()


def test_a_ticket_taken_before_redis_restarted_stores_nothing(redis_server, storage):
    """A reader took its ticket, Redis lost everything (a restart; an
    eviction or the epoch's expiry does the same), and a writer's add
    returned: the reader's total, read before that add, is not stored."""
    reader = CounterShardDS("Counter Test", 1, gateway=storage, cache=redis_server.url)
    writer = CounterShardDS("Counter Test", 1, gateway=storage, cache=redis_server.url)
    writer.add(1)
    cache, key = reader._cache, reader._identity()
    ticket = cache.reading(key)
    total = CounterShardDS("Counter Test", 1, gateway=storage).get_count()
    redis_server.stop()
    redis_server.start()
    writer.add(1)  # returned: every read that begins now must count it
    assert cache.store(key, total, ticket) is False
    assert reader.get_count() == 2


def test_a_redis_restored_from_a_snapshot_serves_no_total_it_held_before(persistent_redis_server, tmp_path):
    """Redis snapshotted a cached total (0), five adds returned, and Redis
    was killed and started again from the snapshot: the old total came back
    with its epoch and everything else the cache keeps. None of that is
    current (the adds after the snapshot are not in it), so another
    process reads 5 from storage, not 0; and after one more add, 6, not 1."""
    import redis

    url = f"sqlite:///{tmp_path / 'restored.sqlite3'}"
    gateway = open_gateway(url)
    try:
        counter = CounterShardDS("Counter Test", 1, gateway=gateway, cache=persistent_redis_server.url)
        assert counter.get_count() == 0  # cached in Redis
        redis.Redis.from_url(persistent_redis_server.url).save()
        for _ in range(5):
            counter.add(1)
        persistent_redis_server.stop()  # SIGKILL: what Redis held since the snapshot is gone
        persistent_redis_server.start()  # from the snapshot: the total 0 is back
        assert _in_another_process(url, persistent_redis_server.url) == 5
        assert _in_another_process(url, persistent_redis_server.url, add=1) == 6
        assert counter.get_count() == 6  # and in the process that cached the 0
    finally:
        gateway.close()


def test_for_ttl_after_a_restore_totals_are_read_from_storage_and_not_kept(persistent_redis_server, storage):
    """A write of unknown outcome after the snapshot left a doubt (no total
    kept for ttl: it may still land) that the restart lost, and nothing
    tells whether one did: so for ttl after a counter's keys came back from
    an earlier run of Redis, its total is read from storage every time."""
    import redis

    url = persistent_redis_server.url + "?ttl=1"
    counter = CounterShardDS("Counter Test", 1, gateway=storage, cache=url)
    counter.add(1)
    assert counter.get_count() == 1
    storage.stats.reset()
    assert counter.get_count() == 1 and storage.stats.snapshot()["rpcs"] == 0  # cached
    redis.Redis.from_url(persistent_redis_server.url).save()
    persistent_redis_server.stop()
    persistent_redis_server.start()
    assert counter.get_count() == 1
    storage.stats.reset()
    assert counter.get_count() == 1 and storage.stats.snapshot()["rpcs"] > 0  # not kept
    time.sleep(1.1)  # the ttl is over
    assert counter.get_count() == 1
    storage.stats.reset()
    assert counter.get_count() == 1 and storage.stats.snapshot()["rpcs"] == 0  # kept again


def test_redis_stalled_costs_one_timeout_not_one_per_counter(redis_server, storage):
    """After a Redis call fails, the cache is not tried again for its
    timeout, so reading many counters pays about one timeout, not two per
    counter (a bound on waiting, not a speed)."""
    url = redis_server.url + "?timeout=0.25"
    counters = [CounterShardDS("Counter Test", n, gateway=storage, cache=url) for n in range(40)]
    for counter in counters:
        counter.add(1)
    assert get_counts(counters) == [1] * 40  # cached
    redis_server.process.send_signal(signal.SIGSTOP)
    try:
        began = time.monotonic()
        assert get_counts(counters) == [1] * 40
        counters[0].add(1)
        assert counters[0].get_count() == 2
        waited = time.monotonic() - began
    finally:
        redis_server.process.send_signal(signal.SIGCONT)
    assert waited < 5, waited  # 40 counters x (get + ticket) x 0.25 s was 20 s
    time.sleep(0.3)
    assert counters[0].get_count() == 2  # the add Redis missed: its total was dropped when Redis came back
    assert get_counts(counters) == [2] + [1] * 39


def test_what_is_not_a_total_in_redis_is_read_from_storage(redis_server, storage):
    import redis

    counter = CounterShardDS("Counter Test", 1, gateway=storage, cache=redis_server.url)
    counter.add(3)
    assert counter.get_count() == 3
    plain = redis.Redis.from_url(redis_server.url)
    [name] = plain.keys("*:total")
    for garbage in (b"abc", b"1.5", b"99999999999999999999999"):
        plain.set(name, garbage)
        assert counter.get_count() == 3


def test_a_unix_socket_url_reaches_redis(tmp_path, storage):
    import shutil

    import redis

    socket_path = tmp_path / "redis.sock"
    server = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", "0", "--unixsocket", str(socket_path),
                               "--save", "", "--appendonly", "no", "--dir", str(tmp_path)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(unix_socket_path=str(socket_path), socket_timeout=0.5).ping()
                break
            except (redis.RedisError, OSError):
                assert time.monotonic() < deadline and server.poll() is None, "redis-server did not start"
                time.sleep(0.05)
        counter = CounterShardDS("Counter Test", 1, gateway=storage, cache=f"unix://{socket_path}?db=0&ttl=30")
        counter.add(2)
        assert counter.get_count() == 2
        storage.stats.reset()
        assert counter.get_count() == 2 and storage.stats.snapshot()["rpcs"] == 0  # from Redis, over the socket
    finally:
        server.kill()
        server.wait(10)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_children_forked_while_threads_use_the_cache_count_and_never_hang(redis_server, storage):
    """redis-py's pool lock may be held by a parent's thread at the fork:
    the child makes its own client, and its adds and reads work."""
    counter = CounterShardDS("Counter Test", 1, gateway=storage, cache=redis_server.url)
    stop = threading.Event()
    added = [0] * 4

    def busy(i: int) -> None:
        while not stop.is_set():
            counter.add(1)
            added[i] += 1
            counter.get_count()

    threads = [threading.Thread(target=busy, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    codes = []
    try:
        until = time.monotonic() + FORKING_S
        while time.monotonic() < until:
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    signal.alarm(10)  # a child stuck on a lock of the parent's dies of SIGALRM
                    counter.add(1)
                    counter.get_count()
                    code = 0
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
            codes.append(os.waitstatus_to_exitcode(status))
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert len(codes) >= 5 and codes == [0] * len(codes)
    assert counter.get_count() == CounterShardDS("Counter Test", 1, gateway=storage).get_count() == sum(added) + len(codes)
