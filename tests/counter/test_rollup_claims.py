"""The claims that make a rollup write once per generation
(``gds_counter.counter.rollup``): every claim entity is one its rollup
lists, none outlives ``CLAIM_LIFETIME`` by more than the next write, and a
reader slower than several generations writes nothing over a newer rollup.
"""

from __future__ import annotations

import datetime as dt
import threading
import time

from freezegun import freeze_time
from sizes import size

from gds_counter.counter import CounterShardDS, get_counts
from gds_counter.counter import rollup as rollup_module
from gds_counter.gateway import plan
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.query import PropertyFilter, Query
from gds_counter.gateway.values import RawEntity


def _claim_names(gateway, counter) -> set[str]:
    """The claim entities stored under the counter's rollup."""
    rollup_key = counter.layout.rollup_key(counter.name, counter.namespace)
    claims = PropertyFilter("__key__", "HAS_ANCESTOR", rollup_key)
    query = Query(counter.layout.rollup_kind + "Claim", filter=claims, keys_only=True, namespace=counter.namespace)
    return {found.key.name for found in plan.run(plan.query_all(query), gateway)}


def _rollup(gateway, counter) -> RawEntity:
    [raw] = gateway.lookup([counter.layout.rollup_key(counter.name, counter.namespace)])
    assert raw is not None
    return raw


def _listed(gateway, counter) -> set[str]:
    """The claims the rollup lists, by generation."""
    return {entry.rpartition("@")[0] for entry in _rollup(gateway, counter).properties.get("claims", [])}


def test_a_reader_slower_than_two_generations_writes_nothing_and_leaves_no_claim(any_gateway, monkeypatch):
    gateway = any_gateway
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    counter.add(1)
    counter.get_count(max_age=0)  # generation 0
    paused, resume = threading.Event(), threading.Event()
    original_exact = rollup_module.exact_plan

    def exact(reader, method):
        if threading.current_thread().name == "slow":
            paused.set()
            resume.wait(30)
        return (yield from original_exact(reader, method))

    monkeypatch.setattr(rollup_module, "exact_plan", exact)
    seen = []
    slow = threading.Thread(target=lambda: seen.append(counter.get_count_as_of(max_age=0)), name="slow")
    slow.start()
    assert paused.wait(30)  # it looked generation 0 up
    for amount in (2, 4):  # two more generations, written by others
        counter.add(amount)
        assert counter.get_count(max_age=0) == 1 + 2 + (4 if amount == 4 else 0)
    newest = _rollup(gateway, counter)
    resume.set()
    slow.join(30)
    assert seen[0].total == 7 and not seen[0].from_rollup  # its own read: exact
    assert _rollup(gateway, counter) == newest  # nothing written over the newer rollup
    assert _claim_names(gateway, counter) == _listed(gateway, counter)
    assert len(_listed(gateway, counter)) == 3


def test_concurrent_readers_leave_every_claim_listed(any_gateway):
    gateway = any_gateway
    """Readers with ``max_age=0`` rewrite the rollup as fast as they can,
    so some are slower than two generations; no claim is left untracked."""
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    counter.add(1)
    stop = time.monotonic() + size(0.5, 2.0)
    errors: list[BaseException] = []

    def read() -> None:
        reader = CounterShardDS("Counter Test", 1, gateway=gateway)
        try:
            while time.monotonic() < stop:
                reader.add(1)
                reader.get_count(max_age=0)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    claims = _claim_names(gateway, counter)
    assert claims and claims == _listed(gateway, counter)
    assert len(claims) <= rollup_module.MAX_CLAIMS + 1


def test_claims_are_deleted_once_they_are_a_lifetime_old(gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    lifetime = dt.timedelta(seconds=rollup_module.CLAIM_LIFETIME)
    with freeze_time("2026-01-01 12:00:00", tick=False) as clock:
        for _ in range(5):
            counter.add(1)
            counter.get_count(max_age=0)
            clock.tick(1)
        assert len(_claim_names(gateway, counter)) == 5
        clock.tick(lifetime - dt.timedelta(seconds=2))  # the first three are more than a lifetime old
        counter.add(1)
        assert counter.get_count(max_age=0) == 6
        claims = _claim_names(gateway, counter)
        assert len(claims) == 3 and claims == _listed(gateway, counter)


def test_a_rollup_hammered_at_max_age_zero_spends_half_its_claims_at_once_then_one_per_pace(gateway, monkeypatch):
    """Readers write back while fewer than half of ``MAX_CLAIMS`` claims are
    alive, then only once the newest is ``pace()`` old: the rest of the
    claims last a lifetime, so the rollup never stops for one (it used to
    spend them all in a burst, then stay as it was until they expired)."""
    monkeypatch.setattr(rollup_module, "MAX_CLAIMS", 6)
    monkeypatch.setattr(rollup_module, "SWEEP", 3)
    assert rollup_module.pace() == 20.0
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    with freeze_time("2026-01-01 12:00:00", tick=False) as clock:
        for total in range(1, 9):
            counter.add(1)
            clock.tick(0.5)
            assert counter.get_count(max_age=0) == total  # exact, written or not
        assert len(_claim_names(gateway, counter)) == 3
        assert _rollup(gateway, counter).properties["total"] == 3  # the fourth read on found 3 live claims
        clock.tick(rollup_module.pace())
        counter.add(1)
        assert counter.get_count(max_age=0) == 9
        assert _rollup(gateway, counter).properties["total"] == 9  # the newest claim is a pace old
        assert len(_claim_names(gateway, counter)) == 4
        clock.tick(rollup_module.CLAIM_LIFETIME + 1)
        counter.add(1)
        assert counter.get_count(max_age=0) == 10
        assert _rollup(gateway, counter).properties["total"] == 10
        claims = _claim_names(gateway, counter)
        assert len(claims) == 4 - 3 + 1 and claims == _listed(gateway, counter)


def test_a_rollup_written_before_claims_were_listed_has_its_claim_deleted_in_time(gateway):
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    key = counter.layout.rollup_key(counter.name, counter.namespace)
    with freeze_time("2026-01-01 12:00:00", tick=False) as clock:
        as_of = dt.datetime.now(dt.timezone.utc)
        gateway.commit([
            Upsert(RawEntity(counter.layout.claim_key(counter.name, "none", counter.namespace), {"as_of": as_of})),
            Upsert(RawEntity(key, {"total": 0, "as_of": as_of, "claim": "none"})),
        ])
        clock.tick(rollup_module.CLAIM_LIFETIME + 1)
        counter.add(2)
        assert counter.get_count(max_age=0) == 2
        assert _claim_names(gateway, counter) == _listed(gateway, counter) and "none" not in _listed(gateway, counter)


def test_a_reader_whose_lookup_is_old_looks_again_before_it_writes(gateway, monkeypatch):
    """A lookup older than ``WRITE_WITHIN`` when the write begins is made
    again (one lookup more), and the write claims what it finds then."""
    original_exact = rollup_module.exact_plan

    def lookups_of_a_stale_read(name: str, lag: float) -> int:
        counter = CounterShardDS("Counter Test", name, gateway=gateway)
        counter.add(1)
        with freeze_time("2026-01-01 12:00:00", tick=False) as clock:

            def slow_exact(reader, method):
                found = yield from original_exact(reader, method)
                clock.tick(lag)
                return found

            monkeypatch.setattr(rollup_module, "exact_plan", slow_exact)
            gateway.stats.reset()
            assert counter.get_count(max_age=0) == 1
            lookups = gateway.stats.snapshot()["rpc.lookup"]
            assert _rollup(gateway, counter).properties["total"] == 1
            assert _claim_names(gateway, counter) == _listed(gateway, counter) == {"none"}
        return lookups

    assert lookups_of_a_stale_read("a", rollup_module.WRITE_WITHIN + 1) == lookups_of_a_stale_read("b", 0.0) + 1


def test_a_rollup_listing_claims_this_library_never_writes_is_read_and_written_again(gateway):
    """Entries that name no generation (another writer's, or spoiled) are
    not this library's claims: they are dropped from the list, and no key
    is built from them."""
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    counter.add(4)
    key = counter.layout.rollup_key(counter.name, counter.namespace)
    hostile = [7, None, "x@1", "none@\u00b2", "__key__@5", "1@", "@1", "12@3@4", "9" * 21 + "@1", "none@" + "9" * 5000,
               "none@1"]
    gateway.commit([Upsert(RawEntity(key, {"total": 1, "as_of": dt.datetime(2000, 1, 1, tzinfo=dt.timezone.utc),
                                           "claims": hostile}, frozenset({"claims"})))])
    assert counter.get_count(max_age=0) == 4
    listed = _rollup(gateway, counter).properties["claims"]
    assert [entry.rpartition("@")[0] for entry in listed] == ["946684800000000"]  # "none@1": expired, swept
    assert _claim_names(gateway, counter) == {"946684800000000"}


def test_a_counter_listed_twice_is_rolled_up_once_with_the_others(any_gateway, caplog):
    a = CounterShardDS("A", 1, gateway=any_gateway)
    b = CounterShardDS("B", 1, gateway=any_gateway)
    a.add(1)
    b.add(2)
    with caplog.at_level("WARNING", logger="gds_counter.counter.rollup"):
        assert get_counts([a, b, CounterShardDS("A", 1, gateway=any_gateway), a], max_age=60) == [1, 2, 1, 1]
    assert "not written" not in caplog.text
    assert [found.from_rollup for found in (a.get_count_as_of(max_age=60), b.get_count_as_of(max_age=60))] == [True, True]


def test_claims_a_clock_far_ahead_made_do_not_hold_the_rollup_up(gateway):
    """Readers on a host a day ahead fill the claim list; readers with the
    right time still find the claims outside their lifetime, and write."""
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    ahead = dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)
    with freeze_time(ahead, tick=True):
        for _ in range(rollup_module.MAX_CLAIMS + 5):
            counter.get_count(max_age=0)
    counter.add(3)
    assert counter.get_count_as_of(max_age=60).from_rollup is False  # a rollup from the future is not trusted
    found = counter.get_count_as_of(max_age=60)
    assert (found.total, found.from_rollup) == (3, True)  # ... and it was written over
