"""Counters shared by threads, where reads and writes interleave: what a
reader is shown must always be a total that was true, the cache included;
a writer stuck in the lock must not stall everyone for minutes; and an
increment past 64 bits is raised, never silently saturated."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from freezegun import freeze_time

from gds_counter.counter import CountCache, CounterShardDS, GeneralCounter
from gds_counter.errors import BadValueError, Contention, CountSaturated
from gds_counter.gateway import open_gateway
from gds_counter.gateway.mutations import Upsert
from gds_counter.gds import RetryPolicy


def test_a_read_that_overlaps_another_threads_growth_still_reads_every_shard(tmp_path, tally):
    """Thread A's lookup returns the config (40 shards) and 20 shards; before
    A looks at the config, thread B learns the 40 on the same counter object.
    A must still read shards 21..40 itself, not conclude there is nothing more."""
    gateway = open_gateway(f"sqlite:///{tmp_path / 'race.sqlite3'}")
    grower = GeneralCounter("hits", gateway=gateway, strategy="transactional")
    grower.increase_shards(40)
    for _ in range(200):
        grower.add()
    shared = GeneralCounter("hits", num_shards=20, gateway=gateway)  # knows 20 until it reads the config
    real_lookup = gateway.lookup
    b_done = threading.Event()
    slowed: list[str] = []

    def lookup(keys, **kwargs):
        found = real_lookup(keys, **kwargs)
        if threading.current_thread().name == "A" and not slowed:
            slowed.append("A")
            assert b_done.wait(10)  # B reads and learns 40 meanwhile
        return found

    gateway.lookup = lookup  # type: ignore[method-assign]
    totals: dict[str, int] = {}
    a = threading.Thread(target=lambda: totals.update(A=shared.get_count(method="lookup")), name="A")
    a.start()
    while not slowed:
        time.sleep(0.001)
    totals["B"] = shared.get_count(method="lookup")
    b_done.set()
    a.join()
    tally.add("counter: a read overlapping another thread's growth", operations=200, faults_injected=1,
              increments_lost=200 - totals["A"])
    assert totals == {"A": 200, "B": 200}
    gateway.close()


def test_cached_totals_are_always_true_under_concurrent_writers_and_readers(tmp_path, tally):
    """8 writers and 4 readers on one cached counter: every total a reader is
    shown lies between the adds finished before its read began and the adds
    begun before it ended; one reader's totals never go backwards; and an
    ``increment()`` is never followed by a smaller ``get_count()``."""
    gateway = open_gateway(f"sqlite:///{tmp_path / 'cache.sqlite3'}")
    counter = CounterShardDS("Counter Test", 1, gateway=gateway, cache=CountCache(ttl=60), strategy="transactional")
    lock = threading.Lock()
    begun = finished = 0
    problems: list[str] = []
    stop = threading.Event()

    def writer() -> None:
        nonlocal begun, finished
        for _ in range(60):
            with lock:
                begun += 1
            total = counter.increment()
            with lock:
                finished += 1
            after = counter.get_count()
            if after < total:
                problems.append(f"increment() returned {total}, then get_count() showed {after}")

    def reader() -> None:
        last = 0
        while not stop.is_set():
            with lock:
                low = finished
            shown = counter.get_count()
            with lock:
                high = begun
            if not low <= shown <= high:
                problems.append(f"showed {shown} while between {low} and {high} adds were done")
            if shown < last:
                problems.append(f"went backwards from {last} to {shown}")
            last = shown

    writers = [threading.Thread(target=writer) for _ in range(8)]
    readers = [threading.Thread(target=reader) for _ in range(4)]
    for thread in readers + writers:
        thread.start()
    for thread in writers:
        thread.join()
    stop.set()
    for thread in readers:
        thread.join()
    final = counter.get_count()
    tally.add("counter: cache under 8 writers and 4 readers", operations=480, increments_lost=max(0, 480 - final),
              double_counts=sum("showed" in p for p in problems) + max(0, final - 480))
    assert problems == []
    assert final == 480 == counter.get_count(method="query")
    gateway.close()


def test_a_total_cached_under_frozen_time_expires_when_the_freeze_ends(gateway):
    cached = CounterShardDS("Counter Test", 1, gateway=gateway, cache=CountCache(ttl=60))
    other = CounterShardDS("Counter Test", 1, gateway=gateway)  # another process: no shared cache
    with freeze_time("2024-01-01 12:00:00"):
        other.add(3)
        assert cached.get_count() == 3
    other.add(4)
    assert cached.get_count() == 7  # the frozen clock's entry is not trusted on the real clock


@pytest.fixture
def gateway():
    gw = open_gateway("memory://")
    yield gw
    gw.close()


def test_a_writer_stuck_in_the_lock_costs_a_call_its_deadline_not_minutes(tmp_path, tally):
    """Another process holds SQLite's write lock and never lets go. Each
    attempt waits for the lock until the engine's busy timeout; the retry
    deadline stops new attempts, so one call raises ``Contention`` within the
    deadline plus one attempt, not after every attempt's wait."""
    path = tmp_path / "stuck.sqlite3"
    gateway = open_gateway(f"sqlite:///{path}")
    counter = CounterShardDS("Counter Test", 1, gateway=gateway, strategy="transactional")
    counter.add()
    from gds_counter.gateway.embedded import _connections

    original, _connections.BUSY_TIMEOUT_S = _connections.BUSY_TIMEOUT_S, 1.0  # a short wait per attempt, for the test
    try:
        fresh = open_gateway(f"sqlite:///{path}")
        slow = CounterShardDS("Counter Test", 1, gateway=fresh, strategy="transactional",
                              retry=RetryPolicy(attempts=50, initial=0.01, maximum=0.05, deadline=0.5))
        slow.get_count()  # the connection is made (with the short wait) before the lock is taken
    finally:
        _connections.BUSY_TIMEOUT_S = original
    stuck = sqlite3.connect(path, isolation_level=None)
    stuck.execute("BEGIN IMMEDIATE")  # a writer frozen inside the lock
    try:
        started = time.monotonic()
        with pytest.raises(Contention, match="deadline"):
            slow.add()
        elapsed = time.monotonic() - started
        assert elapsed < 0.5 + 2 * 1.0 + 1.0, elapsed  # deadline + at most one more attempt's wait, with slack
    finally:
        stuck.execute("ROLLBACK")
        stuck.close()
        fresh.close()
    tally.add("counter: a writer stuck in SQLite's lock (retry deadline)", operations=2, faults_injected=1,
              increments_lost=1 - counter.get_count())
    assert counter.get_count() == 1  # nothing half-counted
    gateway.close()


@pytest.mark.parametrize("name", ["memory", "sqlite", "firestore", "memory+aio", "firestore+aio"])
def test_an_increment_that_would_pass_64_bits_raises_naming_the_shard(make_gateway, name, tally):
    """Exactly or raised, and the error's class says whether it was stored:
    the embedded engine refuses before writing (``BadValueError``, the shard
    unchanged); Datastore saturates at 2**63-1 without an error, which the
    counter reports as ``CountSaturated`` (written, cut short)."""
    any_gateway = make_gateway(name)
    counter = CounterShardDS("Counter Test", 1, num_shards=1, gateway=any_gateway, strategy="increment")
    key = counter.layout.shard_key(counter.name, 1, counter.namespace)
    any_gateway.commit([Upsert(counter.layout.shard_entity(counter.name, 1, 2**63 - 2, counter.namespace))])
    with pytest.raises((BadValueError, CountSaturated), match="Counter Test_1_1") as raised:
        counter.add(5)
    [stored] = any_gateway.lookup([key])
    if isinstance(raised.value, CountSaturated):
        assert stored.properties["count"] == 2**63 - 1  # written, saturated, and reported as written
    else:
        assert stored.properties["count"] == 2**63 - 2  # refused: nothing written
    transactional = CounterShardDS("Counter Test", 1, num_shards=1, gateway=any_gateway, strategy="transactional")
    with pytest.raises(BadValueError, match=r"Counter Test_1_1.*64 bits"):
        transactional.add(5)
    tally.add("counter: increments past 64 bits (embedded, Firestore emulator)", operations=2, hostile_inputs=2)
