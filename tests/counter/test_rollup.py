"""Rollups (``gds_counter.counter.rollup``): ``get_count(max_age=S)`` is a
total at most S seconds old that costs one entity read whatever the shard
count, written back by at most one reader per stale generation; an exact
read stays exact; the shards are never touched."""

from __future__ import annotations

import datetime as dt
import logging
import math
import multiprocessing
import os
import threading
import time
import uuid

import pytest
from freezegun import freeze_time
from sizes import size

from gds_counter.counter import CounterShardDS, GeneralCounter, TotalAsOf, get_counts
from gds_counter.counter.rollup import ROLLUP_BATCH, totals_as_of_plan
from gds_counter.errors import BadValueError
from gds_counter.gateway import open_gateway, plan
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.query import PropertyFilter, Query
from gds_counter.testing import FaultyGateway


def _rollup_writes(gateway) -> int:
    """Rollup commits since the stats were reset: each writes its claim and
    its rollup (exact reads write nothing)."""
    return gateway.stats.snapshot()["entity_writes"] // 2


def test_a_fresh_rollup_is_one_rpc_and_one_entity_read(any_gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=any_gateway)
    for _ in range(30):
        counter.add()
    first = counter.get_count_as_of(max_age=60)
    assert (first.total, first.from_rollup) == (30, False)  # no rollup yet: read exactly, rolled up
    any_gateway.stats.reset()
    again = counter.get_count_as_of(max_age=60)
    assert again == TotalAsOf(30, first.as_of, True)
    stats = any_gateway.stats.snapshot()
    assert stats["rpcs"] == stats["rpc.lookup"] == 1 and stats["entity_reads"] == 1


def test_get_count_without_max_age_stays_exact_and_reads_the_shards(gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    counter.add(2)
    assert counter.get_count(max_age=3600) == 2
    counter.add(5)
    assert counter.get_count(max_age=3600) == 2  # the rollup, as old as allowed
    assert counter.get_count() == 7  # exact: the shards
    exact = counter.get_count_as_of()
    assert (exact.total, exact.from_rollup) == (7, False)
    assert counter.get_count(max_age=0) == 7  # too old for 0 s: read exactly, rolled up
    assert counter.get_count(max_age=3600) == 7


def test_the_rollup_is_a_kind_of_its_own_and_alters_no_shard(gateway):
    """PHP's target query and ndb's key reads see the shards exactly as before."""
    php = CounterShardDS("Counter Test", 1, gateway=gateway)
    ndb = GeneralCounter("hits", gateway=gateway)
    php.add(4)
    ndb.add(6)
    layout = php.layout
    before = plan.run(plan.query_all(Query(layout.shard_kind)), gateway)
    php.get_count(max_age=60)
    ndb.get_count(max_age=60)
    after = plan.run(plan.query_all(Query(layout.shard_kind)), gateway)
    assert after == before
    by_target = Query(layout.shard_kind, filter=PropertyFilter("target", "=", php.name))
    assert sum(e.properties["count"] for e in plan.run(plan.query_all(by_target), gateway)) == 4
    rollups = plan.run(plan.query_all(Query(layout.rollup_kind)), gateway)
    assert [(e.key.name, e.properties["total"]) for e in rollups] == [(php.name, 4)]
    assert ndb.get_count() == 6 and ndb.get_count(max_age=60) == 6


def test_max_age_is_checked_before_anything_is_read(gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    gateway.stats.reset()
    for bad in (-1, float("nan"), "60", True, None.__class__):
        with pytest.raises(BadValueError, match="max_age"):
            counter.get_count(max_age=bad)
    with pytest.raises(BadValueError, match="max_age"):
        get_counts([counter], max_age=-0.5)
    assert gateway.stats.snapshot()["rpcs"] == 0


def test_staleness_follows_the_clock(gateway):
    counter = GeneralCounter("hits", gateway=gateway)
    with freeze_time("2026-01-01 12:00:00", tick=False) as clock:
        counter.add(1)
        first = counter.get_count_as_of(max_age=10)
        assert first.as_of == dt.datetime(2026, 1, 1, 12, tzinfo=dt.timezone.utc) and not first.from_rollup
        counter.add(1)
        clock.tick(10)
        assert counter.get_count_as_of(max_age=10) == TotalAsOf(1, first.as_of, True)  # 10 s old: allowed
        clock.tick(0.001)
        late = counter.get_count_as_of(max_age=10)
        assert (late.total, late.from_rollup, late.as_of - first.as_of) == (2, False, dt.timedelta(seconds=10.001))
        clock.tick(-60)  # a rollup "from the future" (another host's clock): not trusted either way
        assert counter.get_count_as_of(max_age=10).from_rollup is False


def test_refreshers_of_one_stale_rollup_write_it_once(any_gateway):
    gateway = any_gateway
    """Readers that find the same stale rollup all read the shards, and
    only the first commit of its claim writes; nobody waits on a lock."""
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    counter.add(3)
    counter.get_count(max_age=0)
    counter.add(4)
    seen: list[TotalAsOf] = []
    barrier = threading.Barrier(8)

    def read_stale() -> None:
        barrier.wait()
        seen.append(CounterShardDS("Counter Test", 1, gateway=gateway).get_count_as_of(max_age=30))

    counter.add(1)
    gateway.stats.reset()
    with freeze_time(dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=60), tick=True):
        threads = [threading.Thread(target=read_stale) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert [found.total for found in seen] == [8] * 8
    assert _rollup_writes(gateway) == 1  # one generation was stale: one write


def _stale_reader(url: str, env: dict[str, str], target_id: str, start: float, out) -> None:
    os.environ.update(env)
    gateway = open_gateway(url)
    counter = CounterShardDS("Rollup", target_id, gateway=gateway)
    gateway.stats.reset()
    time.sleep(max(0.0, start - time.time()))
    began = time.time()
    total = counter.get_count(max_age=1.0)
    out.put((total, gateway.stats.snapshot()["entity_writes"], began, time.time()))
    gateway.close()


def _in_processes(url: str, env: dict[str, str], reader) -> None:
    target_id = uuid.uuid4().hex[:8]
    counter = CounterShardDS("Rollup", target_id, gateway=reader)
    counter.add(5)
    counter.get_count(max_age=0)
    counter.add(2)
    time.sleep(1.1)  # the rollup is now stale for max_age=1
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start = time.time() + 3.0
    workers = [ctx.Process(target=_stale_reader, args=(url, env, target_id, start, out)) for _ in range(4)]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=120) for _ in workers]
    for worker in workers:
        worker.join(60)
    assert [worker.exitcode for worker in workers] == [0] * 4
    assert sorted(total for total, *_ in results) == [7] * 4
    # One rollup is written (2 entities) for readers that meet, not one per
    # reader. A rollup stays fresh for max_age (1 s), so readers spread over
    # ``span`` seconds (a loaded machine starts processes late) may write at
    # most one more generation per second of that span.
    span = max(ended for *_, ended in results) - min(began for *_, began, _ in results)
    writes = sum(written for _, written, _, _ in results)
    assert writes % 2 == 0 and 2 <= writes <= 2 * (1 + math.ceil(span)), (writes, span)
    if span < 1.0:
        assert writes == 2  # the readers met: they shared one rollup
    counter.add(1)  # another process's add shows within max_age
    time.sleep(1.05)
    assert counter.get_count(max_age=1.0) == 8


@pytest.mark.slow
def test_processes_share_the_rollup_on_a_sqlite_file(tmp_path):
    url = f"sqlite:///{tmp_path / 'rollup.sqlite3'}"
    reader = open_gateway(url)
    try:
        _in_processes(url, {}, reader)
    finally:
        reader.close()


@pytest.mark.slow
@pytest.mark.full  # the SQLite file's twin above runs in the quick run
def test_processes_share_the_rollup_on_the_firestore_emulator(firestore_emulator, firestore_gateway):
    url = f"datastore://{firestore_emulator.project}?namespace={firestore_gateway.namespace}"
    _in_processes(url, firestore_emulator.env, firestore_gateway)


def test_a_failed_rollup_write_never_fails_the_read(gateway, caplog):
    CounterShardDS("Counter Test", 1, gateway=gateway).add(9)
    failing = FaultyGateway(gateway, script={"commit": ["UNAVAILABLE"]})
    with caplog.at_level(logging.WARNING, logger="gds_counter.counter.rollup"):
        assert CounterShardDS("Counter Test", 1, gateway=failing).get_count(max_age=60) == 9
    assert "rollup of" in caplog.text and "not written" in caplog.text
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    assert counter.get_count_as_of(max_age=60).from_rollup is False  # nothing was written: read again
    assert counter.get_count_as_of(max_age=60).from_rollup is True


def test_a_malformed_rollup_is_written_again(gateway, caplog):
    counter = GeneralCounter("hits", gateway=gateway)
    counter.add(2)
    from gds_counter.gateway.values import RawEntity

    key = counter.layout.rollup_key(counter.name, counter.namespace)
    gateway.commit([Upsert(RawEntity(key, {"total": "two", "as_of": "yesterday"}))])
    with caplog.at_level(logging.WARNING, logger="gds_counter.counter.rollup"):
        assert counter.get_count_as_of(max_age=60).from_rollup is False
    assert "is not a rollup" in caplog.text
    assert counter.get_count_as_of(max_age=60) == TotalAsOf(2, counter.get_count_as_of(max_age=60).as_of, True)


def test_many_counters_read_their_rollups_in_one_lookup(any_gateway):
    counters = [CounterShardDS("Page", n, gateway=any_gateway) for n in range(1, ROLLUP_BATCH + 6)]
    for n, counter in enumerate(counters, start=1):
        counter.add(n)
    expected = list(range(1, len(counters) + 1))
    any_gateway.stats.reset()
    assert get_counts(counters, max_age=60) == expected  # none rolled up: read, then written in 2 batches
    assert _rollup_writes(any_gateway) == len(counters)
    any_gateway.stats.reset()
    assert get_counts(counters, max_age=60) == expected
    stats = any_gateway.stats.snapshot()
    assert stats["rpcs"] == stats["rpc.lookup"] == 1 and stats["entity_reads"] == len(counters)
    found, writes = plan.run(totals_as_of_plan(counters, 60.0), any_gateway)
    assert writes.written == writes.failed == 0 and all(f.from_rollup for f in found)


#: The shards of the next test: the most a counter may have in the full run;
#: in the quick run still several batches of lookups.
MANY_SHARDS = size(2_500, 10_000)


@pytest.mark.parametrize("layout", ["php", "ndb"])
def test_ten_thousand_shards_read_exactly_and_a_rollup_reads_one(layout, make_gateway, request):
    """Both layouts read 10,000 shards (``MANY_SHARDS``) exactly (the article's
    query, the batched lookup) on the embedded engine and the Firestore
    emulator; a fresh rollup then costs one RPC and one entity read."""
    for name in ("memory", "sqlite", "firestore"):
        gateway = make_gateway(name)
        counter = (CounterShardDS("Big", layout, gateway=gateway) if layout == "php"
                   else GeneralCounter("big-" + uuid.uuid4().hex[:6], gateway=gateway))
        counter.increase_shards(MANY_SHARDS)
        numbers = counter.layout.shard_numbers(MANY_SHARDS)
        shards = [counter.layout.shard_entity(counter.name, n, n % 7 + 1, counter.namespace) for n in numbers]
        for start in range(0, len(shards), 500):
            gateway.commit([Upsert(shard) for shard in shards[start : start + 500]])
        expected = sum(n % 7 + 1 for n in numbers)
        methods = ("query", "lookup") if layout == "php" else ("lookup",)
        for method in methods:
            gateway.stats.reset()
            assert counter.get_count(method=method) == expected, (name, method)
            stats = gateway.stats.snapshot()
            assert stats["entity_reads"] >= MANY_SHARDS, (name, method, stats)
        counter.get_count(max_age=60)
        gateway.stats.reset()
        assert counter.get_count(max_age=60) == expected
        stats = gateway.stats.snapshot()
        assert stats["rpcs"] == 1 and stats["entity_reads"] == 1, (name, stats)


@pytest.mark.parametrize("spoil", ["delete", "garbage"])
def test_a_rollup_deleted_or_spoiled_after_its_claim_is_written_again(gateway, spoil):
    """Its generation's claim is still there; with no usable rollup beside
    it, nobody alive holds it, so the next stale read writes over it."""
    from gds_counter.gateway.mutations import Delete
    from gds_counter.gateway.values import RawEntity

    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    counter.add(3)
    counter.get_count(max_age=0)
    key = counter.layout.rollup_key(counter.name, counter.namespace)
    gateway.commit([Delete(key)] if spoil == "delete" else [Upsert(RawEntity(key, {"total": "garbage"}))])
    assert counter.get_count_as_of(max_age=3600).from_rollup is False  # read, and written again
    assert counter.get_count_as_of(max_age=3600) == TotalAsOf(3, counter.get_count_as_of(max_age=3600).as_of, True)


def test_a_max_age_too_large_for_a_float_is_any_age(gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    counter.add(2)
    assert counter.get_count(max_age=10**400) == 2 and counter.get_count(max_age=float("inf")) == 2
