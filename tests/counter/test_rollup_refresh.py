"""An explicit rollup refresh (``gds-counter rollup``, ``rollup_all_plan``
with ``forced=True``) writes every stale counter's current total, or
counts that counter as failed and names it: never neither (issue 36,
defect 6). Readers' own write-backs are paced, so a counter read with
``max_age=0`` under load keeps its rollup close behind, and the rollup a
large ``max_age`` then serves is the total as of its stated time."""

from __future__ import annotations

import datetime as dt
import math
import threading

import pytest
from freezegun import freeze_time

from gds_counter.counter import PHP_ARTICLE, CounterShardDS, ShardedCounter
from gds_counter.counter import rollup as rollup_module
from gds_counter.counter._inventory import rollup_all_plan
from gds_counter.counter.rollup import Writes
from gds_counter.gateway import plan


@pytest.fixture(params=["memory", "sqlite", "firestore", "memory+aio"])
def refresh_gateway(request, make_gateway):
    """The embedded gateway (memory, file), the Firestore emulator, and the
    asyncio face's gateway."""
    return make_gateway(request.param)


def _refresh(gateway, *names: str) -> Writes:
    """What ``gds-counter rollup`` runs: every named counter refreshed."""
    make = lambda name: ShardedCounter(name, layout=PHP_ARTICLE, gateway=gateway)  # noqa: E731
    return plan.run(rollup_all_plan(list(names), make, 0.0, forced=True), gateway).writes


def test_a_refresh_after_a_burst_of_max_age_zero_reads_writes_the_current_total(refresh_gateway):
    """The issue's repro: 130 ``add(1)`` each followed by
    ``get_count_as_of(max_age=0)`` leave more than ``MAX_CLAIMS`` (120)
    write-backs asked for within a claim's lifetime. The refresh that
    follows wrote nothing and reported no failure, and a read with
    ``max_age=3600`` showed 120 of 130; it must write 130."""
    counter = CounterShardDS("Counter Test", 1, gateway=refresh_gateway)
    for total in range(1, 131):
        counter.add(1)
        assert counter.get_count_as_of(max_age=0).total == total  # exact, written back or not
    before = rollup_module.wall_clock()
    assert _refresh(refresh_gateway, counter.name) == Writes(written=1)
    found = counter.get_count_as_of(max_age=3600)
    assert (found.total, found.from_rollup) == (130, True)
    assert found.as_of >= before  # the refresh's own read, not an older one


def test_a_refresh_after_concurrent_readers_matches_the_stored_total(refresh_gateway, monkeypatch):
    """Threads each add and read with ``max_age=0`` until well past the
    claim limit (made small here so every gateway reaches it); the refresh
    run after them leaves the rollup equal to the stored total. Meanwhile
    every rollup read with a large ``max_age`` keeps its promise: each
    increment that returned before its ``as_of`` is in its total."""
    monkeypatch.setattr(rollup_module, "MAX_CLAIMS", 6)
    counter = CounterShardDS("Counter Test", 1, gateway=refresh_gateway)
    errors: list[BaseException] = []
    returned: list[dt.datetime] = []  # when each add returned (after its commit)

    def read() -> None:
        reader = CounterShardDS("Counter Test", 1, gateway=refresh_gateway)
        try:
            for _ in range(10):
                reader.add(1)
                returned.append(rollup_module.wall_clock())
                reader.get_count(max_age=0)
                found = reader.get_count_as_of(max_age=3600)
                assert found.total >= sum(moment < found.as_of for moment in list(returned)), found
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    stored = counter.get_count()
    assert stored == 40
    writes = _refresh(refresh_gateway, counter.name)
    assert writes.written == 1 and writes.failed == 0
    found = counter.get_count_as_of(max_age=3600)
    assert (found.total, found.from_rollup) == (stored, True)


def test_a_refresh_the_claims_hold_back_fails_and_names_the_counter(gateway, monkeypatch):
    """A forced refresh is not held back by ``MAX_CLAIMS``, but the list
    stays bounded: at twice that many live claims it writes nothing and
    says so, as a failure naming the counter (``gds-counter rollup`` then
    exits 1)."""
    monkeypatch.setattr(rollup_module, "MAX_CLAIMS", 2)
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    with freeze_time("2026-01-01 12:00:00", tick=False) as clock:
        for _ in range(4):
            counter.add(1)
            clock.tick(1)
            assert _refresh(gateway, counter.name) == Writes(written=1)
        counter.add(1)
        clock.tick(1)
        writes = _refresh(gateway, counter.name)
        assert (writes.written, writes.failed) == (0, 1)
        [why] = writes.not_written
        assert "'Counter Test_1'" in why and "4 claims" in why
        clock.tick(rollup_module.CLAIM_LIFETIME)  # the claims expire: the next refresh writes
        assert _refresh(gateway, counter.name) == Writes(written=1)
        assert counter.get_count_as_of(max_age=3600).total == 5


def test_readers_at_max_age_zero_keep_the_rollup_within_a_pace_of_now(gateway, monkeypatch):
    """Readers spend half of ``MAX_CLAIMS`` at once, then write back once
    per ``pace()``: the rollup never falls more than a pace (plus the
    interval between reads) behind, never lists more than ``MAX_CLAIMS``
    live claims. Before, readers
    spent every claim in a burst and the rollup then stayed as it was for
    a whole ``CLAIM_LIFETIME``."""
    monkeypatch.setattr(rollup_module, "MAX_CLAIMS", 6)
    monkeypatch.setattr(rollup_module, "SWEEP", 3)
    pace, step = rollup_module.pace(), 2.0
    assert pace == 20.0
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    key = counter.layout.rollup_key(counter.name, counter.namespace)
    with freeze_time("2026-01-01 12:00:00", tick=False) as clock:
        for total in range(1, 91):  # three claim lifetimes
            counter.add(1)
            clock.tick(step)
            assert counter.get_count(max_age=0) == total
            now = dt.datetime.now(dt.timezone.utc)
            rolled = counter.get_count_as_of(max_age=math.inf)  # the rollup as it is, whatever its age
            assert rolled.from_rollup and (now - rolled.as_of).total_seconds() <= pace + step
            [raw] = gateway.lookup([key])
            made = [int(entry.rpartition("@")[2]) for entry in raw.properties["claims"]]
            live = [m for m in made if rollup_module._alive(m, now)]
            assert len(live) <= rollup_module.MAX_CLAIMS
