"""Every increment strategy under injected storage faults.

The rule under test (DESIGN.md, "No silent data loss"): an increment is
either counted once or raised as an error, and an error that says nothing
was applied means nothing was applied. So, after many seeded faults:

* safe-to-retry faults (ABORTED, UNAVAILABLE: nothing applied) are retried
  and every increment succeeds;
* an ambiguous commit (applied, then DEADLINE_EXCEEDED) surfaces as
  ``CommitUnknown`` and is never retried into a double count;
* the stored total equals exactly the increments reported successful plus
  the ones reported unknown that the fault log says were applied -- and in
  any case lies between "successful" and "successful + unknown".

Two levels of injection: ``FaultyGateway`` raises the gateway's errors
around a real gateway (embedded SQLite here), and ``inject_rpc_faults``
raises google.api_core errors under the Datastore gateway's own retry policy,
on the official emulators.

Each test runs on both faces (the ``face`` fixture): the blocking API, and
``gds_counter.aio`` on the async twin of the same storage
(``FaultyAsyncGateway``; the async Datastore gateway's ``AsyncRetry``), its
coroutines awaited one after the other on one event loop so the seeded
faults fall the same way on every run.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import uuid
import zlib
from collections import Counter
from typing import Any

import attrs
import pytest
from google.api_core.retry import AsyncRetry, Retry
from sizes import params

from gds_counter import aio
from gds_counter._load import run_load
from gds_counter.counter import AutoGrow, CounterShardDS
from gds_counter.errors import (
    BadValueError,
    CommitUnknown,
    Contention,
    GatewayError,
    TotalUnavailable,
    Unavailable,
)
from gds_counter.gateway import open_gateway
from gds_counter.gateway.base import Gateway
from gds_counter.gateway.datastore import DatastoreGateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Upsert
from gds_counter.gateway.values import RawEntity
from gds_counter.gds import RetryPolicy
from gds_counter.testing.async_faults import FaultyAsyncGateway
from gds_counter.testing.faults import (
    ABORTED,
    DEADLINE_EXCEEDED,
    RESOURCE_EXHAUSTED,
    UNAVAILABLE,
    UNAVAILABLE_AFTER,
    FaultInjector,
    FaultyGateway,
    inject_rpc_faults,
    remove_rpc_faults,
)

STRATEGIES = ["transactional", "increment", "auto", "auto-grow"]
#: Patient and fast: with up to ~30% of attempts failing, 12 attempts make
#: running out (a Contention) vanishingly rare; waits stay in milliseconds.
PATIENT = RetryPolicy(attempts=12, initial=0.001, maximum=0.01)
#: Grows after 4 conflicting attempts, at most to 40 shards.
GROW = AutoGrow(after_attempts=4, factor=2, max_shards=40)
#: The Datastore gateway's backoff, shortened for tests.
QUICK_RPC_RETRY = Retry(initial=0.01, maximum=0.05, multiplier=2.0, timeout=10.0)

ALL_CALLS = ("lookup", "begin_transaction", "commit", "run_query")


@attrs.define
class Outcome:
    ok: int = 0
    unknown: int = 0
    failed: Counter = attrs.field(factory=Counter)

    @property
    def tried(self) -> int:
        return self.ok + self.unknown + sum(self.failed.values())


class Awaited:
    """An ``aio`` object whose coroutine methods are run to completion on
    the face's event loop, one at a time: a test body reads the same on
    both faces (``counter.add(5)``), and an error is raised where it is."""

    def __init__(self, target: Any, runner: asyncio.Runner) -> None:
        self.target = target
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.target, name)
        if not inspect.iscoroutinefunction(attr):
            return attr
        return lambda *args, **kwargs: self._runner.run(attr(*args, **kwargs))


class Face:
    """The counters' face a test drives: "blocking" (``gds_counter``) or
    "aio" (``gds_counter.aio`` on the async twin of the same storage, on
    one event loop that lives as long as the test)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._runner = asyncio.Runner() if name == "aio" else None
        self._opened: list[Any] = []
        #: What the tally's area names add for this face.
        self.label = "" if name == "blocking" else f", {name}"

    def gateway(self, blocking: Any) -> Any:
        """The gateway this face's counters take on the storage ``blocking``
        reaches: itself, or its async twin (an ``AsyncDatastoreGateway``
        with the same settings and retry backoff, else a ``ThreadedGateway``),
        closed with the face."""
        if self._runner is None:
            return blocking
        if isinstance(blocking, DatastoreGateway):
            retry = blocking._retry  # the same backoff, as the product's DEFAULT_ASYNC_RETRY copies DEFAULT_RETRY's
            twin: Any = aio.AsyncDatastoreGateway(
                blocking.project, blocking.namespace, blocking.database, emulator_host=blocking.emulator_host or "",
                timeout=blocking.timeout,
                retry=None if retry is None else AsyncRetry(
                    initial=retry._initial, maximum=retry._maximum, multiplier=retry._multiplier,
                    timeout=retry._timeout,
                ),
            )
        else:
            twin = aio.async_twin(blocking)
        self._opened.append(twin)
        return twin

    def faulty(self, blocking: Gateway, rates: Any = None, **kwargs: Any) -> Any:
        """Gateway-level faults around ``blocking``, for this face."""
        if self._runner is None:
            return FaultyGateway(blocking, rates, **kwargs)
        return FaultyAsyncGateway(self.gateway(blocking), rates, **kwargs)

    def call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        """``method(*args, **kwargs)``, awaited on the aio face."""
        result = method(*args, **kwargs)
        return result if self._runner is None else self._runner.run(result)

    def learn_capabilities(self, gateway: Any) -> Any:
        """The gateway's one-off probe, made now."""
        return gateway.capabilities if self._runner is None else self.call(gateway.learn_capabilities)

    def counter_on(self, gateway: Any, strategy: str, name: str | None = None, **kwargs: Any) -> Any:
        """A ``CounterShardDS`` of this face on ``gateway`` (an aio one
        ``Awaited``), patient, growing under ``auto-grow``."""
        kwargs.setdefault("retry", PATIENT)
        if strategy == "auto-grow":
            kwargs.setdefault("auto_grow", GROW)
        face_class = CounterShardDS if self._runner is None else aio.CounterShardDS
        counter = face_class("faults", name or uuid.uuid4().hex[:12], gateway=gateway, strategy=strategy, **kwargs)
        return counter if self._runner is None else Awaited(counter, self._runner)

    def add_many(self, counter: Any, n: int, amount: int = 1) -> Outcome:
        """``n`` calls of ``add(amount)``, one after the other in this thread
        (so the seeded faults fall the same way every run), each classified
        by what it reported. Any error that is not a storage error propagates."""
        load = run_load(lambda: functools.partial(counter.add, amount), count=n, counted=(Contention, GatewayError))
        failed = Counter(load.errors)
        # CommitUnknown: it may have been applied. TransformsIgnored, Contention,
        # Unavailable and other GatewayErrors promise nothing was counted.
        unknown = failed.pop("CommitUnknown", 0)
        return Outcome(ok=load.ok, unknown=unknown, failed=failed)

    def close(self) -> None:
        if self._runner is None:
            return
        try:
            for gateway in self._opened:
                self._runner.run(gateway.close())
        finally:
            self._runner.close()


@pytest.fixture(params=["blocking", "aio"])
def face(request):
    face = Face(request.param)
    yield face
    face.close()


@pytest.fixture
def memory():
    gateway = open_gateway("memory://")
    yield gateway
    gateway.close()


def open_transactions(gateway: Any) -> int:
    """Transactions the embedded gateway still holds open: a failure that
    left one open would hold its locks (on a server, until it timed out)."""
    return len(gateway._open_transactions)


def applied_unknowns(injector: FaultInjector) -> int:
    """Commits the fault log says were applied before the error."""
    return injector.injected[("commit", DEADLINE_EXCEEDED)] + injector.injected[("commit", UNAVAILABLE_AFTER)]


# --- the wrapper itself -----------------------------------------------------------


def test_same_seed_same_faults(memory):
    def run(seed: int) -> list[str | None]:
        injector = FaultInjector({"commit": {ABORTED: 0.3, UNAVAILABLE: 0.2}}, seed=seed)
        return [injector.draw("commit") for _ in range(200)]

    assert run(5) == run(5)
    assert run(5) != run(6)
    drawn = Counter(run(5))
    assert 40 < drawn[ABORTED] < 80 and 20 < drawn[UNAVAILABLE] < 60


def test_each_fault_does_what_it_says(memory, face):
    """ABORTED/UNAVAILABLE/RESOURCE_EXHAUSTED apply nothing; DEADLINE_EXCEEDED
    applies the commit and then reports it as unknown."""
    key = Key.of("K", "a")
    write = [Upsert(RawEntity(key, {"n": 0}), transforms=(Increment("n", 1),))]
    gw = face.faulty(memory, script={"commit": [ABORTED, UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, None]})
    for expected in (Contention, Unavailable, GatewayError):
        with pytest.raises(expected) as info:
            face.call(gw.commit, write)
        assert not isinstance(info.value, CommitUnknown)
        assert memory.lookup([key]) == [None]
    with pytest.raises(CommitUnknown):
        face.call(gw.commit, write)
    assert memory.lookup([key])[0].properties["n"] == 1  # it WAS applied
    face.call(gw.commit, write)
    assert memory.lookup([key])[0].properties["n"] == 1  # n=0 written, +1
    assert gw.injector.counts() == {ABORTED: 1, UNAVAILABLE: 1, RESOURCE_EXHAUSTED: 1, DEADLINE_EXCEEDED: 1}
    assert memory.stats["faults.ABORTED"] == 1


def test_a_transaction_whose_commit_failed_is_ended(memory, face):
    gw = face.faulty(memory, script={"commit": [UNAVAILABLE]})
    token = face.call(gw.begin_transaction)
    with pytest.raises(Unavailable):
        face.call(gw.commit, [Upsert(RawEntity(Key.of("K", 1), {}))], transaction=token)
    with pytest.raises(BadValueError, match="is unknown, or was already committed or rolled back"):
        memory.commit([], transaction=token)


def test_bad_fault_configuration_is_refused(memory):
    with pytest.raises(BadValueError, match="unknown call 'comit'"):
        FaultyGateway(memory, {"comit": {ABORTED: 0.1}})
    with pytest.raises(BadValueError, match="unknown fault 'UNAVAILABLE_AFTER'"):
        FaultyGateway(memory, {"commit": {UNAVAILABLE_AFTER: 0.1}})  # only below the gateway's retries
    with pytest.raises(BadValueError, match="add up to"):
        FaultyGateway(memory, {"commit": {ABORTED: 0.7, UNAVAILABLE: 0.6}})
    with pytest.raises(BadValueError, match="inject_rpc_faults needs a DatastoreGateway"):
        inject_rpc_faults(memory)
    with pytest.raises(BadValueError, match="FaultyAsyncGateway wraps an async gateway"):
        FaultyAsyncGateway(memory)
    with pytest.raises(BadValueError, match="FaultyGateway wraps a Gateway"):
        FaultyGateway(aio.async_twin(memory))


# --- every strategy, on the embedded gateway -----------------------------------------


@pytest.mark.parametrize("seed", params([1, 2], quick=[1]))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_safe_faults_are_retried_and_every_increment_counts(memory, face, strategy, seed, tally):
    """ABORTED and UNAVAILABLE both mean "nothing was applied": the counter
    retries them (with backoff, on a fresh shard) and every increment lands."""
    rates = {call: {ABORTED: 0.08, UNAVAILABLE: 0.08} for call in ALL_CALLS}
    gw = face.faulty(memory, rates, seed=seed)
    counter = face.counter_on(gw, strategy)
    outcome = face.add_many(counter, 150)
    with gw.injector.paused():
        total = counter.get_count()
    injected = gw.injector.counts()
    area = f"faults (gateway level, embedded{face.label}) {strategy}"
    tally.add_faults(area, injected)
    tally.add(area, operations=150, increments_lost=max(0, outcome.ok - total),
              double_counts=max(0, total - outcome.ok - outcome.unknown))
    assert injected[ABORTED] > 5 and injected[UNAVAILABLE] > 5, injected
    assert outcome == Outcome(ok=150), outcome
    assert total == 150
    assert memory.stats["counter.retries"] >= injected[ABORTED] // 3
    assert open_transactions(memory) == 0


@pytest.mark.parametrize("seed", params([11, 12, 13], quick=[11]))
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_ambiguous_commits_are_reported_never_double_counted(memory, face, strategy, seed, tally):
    """All four faults on every call. Each increment is reported as counted,
    unknown or failed; the stored total is exactly the counted ones plus the
    unknown ones whose commit the fault log says was applied."""
    rates = {
        "commit": {ABORTED: 0.1, UNAVAILABLE: 0.05, DEADLINE_EXCEEDED: 0.08, RESOURCE_EXHAUSTED: 0.03},
        "lookup": {ABORTED: 0.03, UNAVAILABLE: 0.03, DEADLINE_EXCEEDED: 0.02, RESOURCE_EXHAUSTED: 0.01},
        "begin_transaction": {ABORTED: 0.02, UNAVAILABLE: 0.03, RESOURCE_EXHAUSTED: 0.01},
        "rollback": {UNAVAILABLE: 0.1},
    }
    gw = face.faulty(memory, rates, seed=seed)
    counter = face.counter_on(gw, strategy)
    n = 200
    outcome = face.add_many(counter, n, amount=3)
    with gw.injector.paused():
        total = counter.get_count()
    applied = applied_unknowns(gw.injector)
    area = f"faults (gateway level, embedded{face.label}) {strategy}"
    tally.add_faults(area, gw.injector.counts())
    tally.add(area, operations=n, reported_unknown=outcome.unknown,
              increments_lost=max(0, outcome.ok * 3 - total) // 3,
              double_counts=max(0, total - 3 * (outcome.ok + outcome.unknown)) // 3)
    assert outcome.tried == n
    assert outcome.unknown > 0, "the seeds must produce ambiguous commits"
    # the bound every caller can rely on
    assert 3 * outcome.ok <= total <= 3 * (outcome.ok + outcome.unknown), outcome
    # and the exact reconciliation: every unknown here was in fact applied,
    # once; none was retried (a retry would count it twice)
    assert total == 3 * (outcome.ok + applied), (outcome, applied)
    if strategy != "auto-grow":  # growth commits config entities, which are not increments
        assert outcome.unknown == applied
    # what failed (not "unknown") failed for a reason that applies nothing
    assert set(outcome.failed) <= {"GatewayError", "Contention", "Unavailable"}, outcome.failed
    # and no failure left a transaction open
    assert open_transactions(memory) == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_concurrent_tasks_under_faults_count_each_increment_at_most_once(memory, strategy, tally):
    """The asyncio face's own risk: many tasks at once share writes
    (combined writes), the gateway's in-flight slots and the thread pool
    while faults interrupt them. Which call meets which fault then depends on the interleaving, so
    only what holds for every interleaving is asserted: nothing counted
    twice or lost, every unknown an applied commit, no transaction left
    open. (Threads on the blocking face: test_counter_races.py.)"""
    rates = {
        "commit": {ABORTED: 0.1, UNAVAILABLE: 0.05, DEADLINE_EXCEEDED: 0.08, RESOURCE_EXHAUSTED: 0.03},
        "lookup": {ABORTED: 0.03, UNAVAILABLE: 0.03, DEADLINE_EXCEEDED: 0.02, RESOURCE_EXHAUSTED: 0.01},
        "run_query": {ABORTED: 0.03, UNAVAILABLE: 0.03, DEADLINE_EXCEEDED: 0.02},
        "begin_transaction": {ABORTED: 0.02, UNAVAILABLE: 0.03, DEADLINE_EXCEEDED: 0.02, RESOURCE_EXHAUSTED: 0.01},
        "rollback": {UNAVAILABLE: 0.1, DEADLINE_EXCEEDED: 0.05},
    }
    gw = FaultyAsyncGateway(aio.async_twin(memory), rates, seed=21)
    kwargs: dict[str, Any] = {"auto_grow": GROW} if strategy == "auto-grow" else {}
    counter = aio.CounterShardDS("faults", uuid.uuid4().hex[:12], 5, gateway=gw, strategy=strategy, retry=PATIENT,
                                 **kwargs)
    # Waves of tasks at once: within a wave their writes combine (a few
    # commits carry the lot), so it takes many waves to meet 50 faults.
    waves, at_once = 200, 6
    n = waves * at_once

    async def one() -> str:
        try:
            await counter.add(2)
        except CommitUnknown:
            return "unknown"
        except (Contention, GatewayError) as error:  # anything else propagates and fails the test
            return type(error).__name__
        return "ok"

    async def scenario() -> tuple[Counter[str], int]:
        try:
            seen: Counter[str] = Counter()
            for _ in range(waves):
                seen.update(await asyncio.gather(*(one() for _ in range(at_once))))
            with gw.injector.paused():
                return seen, await counter.get_count()
        finally:
            await gw.close()

    seen, total = asyncio.run(scenario())
    applied = applied_unknowns(gw.injector)
    area = f"faults (gateway level, embedded, aio tasks) {strategy}"
    tally.add_faults(area, gw.injector.counts())
    tally.add(area, operations=n, reported_unknown=seen["unknown"],
              increments_lost=max(0, 2 * seen["ok"] - total) // 2,
              double_counts=max(0, total - 2 * (seen["ok"] + seen["unknown"])) // 2)
    assert sum(seen.values()) == n
    assert seen["unknown"] > 0 and gw.injector.total > 50, (seen, gw.injector)
    assert 2 * seen["ok"] <= total <= 2 * (seen["ok"] + seen["unknown"]), (seen, applied, total)
    if strategy != "auto-grow":  # growth commits config entities, which are not increments
        # Every unknown here was in fact applied, once: tasks whose amounts
        # one commit carried (combined writes) all get its outcome.
        assert total == 2 * (seen["ok"] + seen["unknown"]), (seen, applied, total)
        assert 0 < applied <= seen["unknown"]
    assert set(seen) - {"ok", "unknown"} <= {"GatewayError", "Contention", "Unavailable"}, seen
    assert open_transactions(memory) == 0


def test_an_increment_never_retries_an_unknown_commit(memory, face):
    """The first commit lands and times out: one unknown, one stored, and the
    counter did not try again."""
    gw = face.faulty(memory, script={"commit": [DEADLINE_EXCEEDED]})
    counter = face.counter_on(gw, "transactional")
    with pytest.raises(CommitUnknown, match="may or may not"):
        counter.add(5)
    assert counter.get_count() == 5
    assert gw.injector.calls["commit"] == 1
    assert memory.stats["counter.retries"] == 0


def test_increment_says_it_counted_when_only_reading_the_total_failed(memory, face):
    """increment() is add() then a read. If the read fails, the increment is
    already stored: the caller must learn that, not retry into a double count."""
    # the total is read by the article's target query (the PHP layout's read)
    gw = face.faulty(memory, script={"run_query": [RESOURCE_EXHAUSTED]})
    counter = face.counter_on(gw, "transactional")
    with pytest.raises(TotalUnavailable, match="WAS counted") as raised:
        counter.increment(3)
    assert isinstance(raised.value.__cause__, GatewayError)
    with gw.injector.paused():
        assert counter.get_count() == 3
    assert memory.stats["counter.retries"] == 0


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_storage_that_stays_unavailable_raises_unavailable_and_counts_nothing(memory, face, strategy):
    """Unavailable is retried within the counter's attempts, then raised as
    it is (not turned into Contention), with nothing counted."""
    gw = face.faulty(memory, {"commit": {UNAVAILABLE: 1.0}})
    counter = face.counter_on(gw, strategy, retry=RetryPolicy(attempts=4, initial=0.001, maximum=0.002))
    with pytest.raises(Unavailable, match="not sent"):
        counter.add(1)
    assert gw.injector.calls["commit"] == 4
    assert memory.stats["counter.retries"] == 3
    assert counter.get_count() == 0


#: How a capability probe's commit fails: which of its commits, and the error.
PROBE_FAILURES = {
    "its first write unreached": (lambda mutations: True, Unavailable("storage not reached (injected)")),
    "its increment unknown": (lambda mutations: any(getattr(m, "transforms", ()) for m in mutations),
                              CommitUnknown("commit outcome unknown (injected)")),
}


@pytest.mark.parametrize("failure", list(PROBE_FAILURES))
@pytest.mark.parametrize("strategy", ["increment", "auto"])
def test_a_capability_probe_that_fails_is_asked_again_and_the_amount_counted_once(firestore_gateway, face, strategy,
                                                                                    failure):
    """The gateway learns what its server does with one probe, on a throwaway
    entity, the first time a counter needs to know. If the storage is not
    reached then, nothing is known and nothing was counted: the counter
    retries the increment as for any Unavailable, the next attempt probes
    again, and the amount is counted exactly once. So too when the probe's
    own increment may or may not have been applied (``CommitUnknown``): that
    says nothing of the caller's amount, which was not sent, so the caller
    is not told "unknown" (it would not retry, and the amount would be lost)."""
    hits, error = PROBE_FAILURES[failure]
    gw = face.gateway(firestore_gateway)
    real_commit = gw._commit
    failed: list[Any] = []

    def probe_fails_once(mutations, txn):
        if not failed and hits(mutations):
            failed.append(mutations)
            raise error
        return real_commit(mutations, txn)  # on the aio face, the coroutine its driver awaits

    gw._commit = probe_fails_once  # type: ignore[method-assign]
    counter = face.counter_on(gw, strategy)
    counter.add(7)
    assert [m.entity.key.kind for m in failed[0]] == ["GdsCounterProbe"]  # it hit the probe, not a shard
    assert counter.get_count() == 7
    assert gw.stats["counter.retries"] == 1
    assert gw.capabilities.applies_transforms is True


# --- below the Datastore gateway's retries, on the emulators ----------------------------

RPC_RATES = {
    "commit": {ABORTED: 0.08, UNAVAILABLE: 0.08, UNAVAILABLE_AFTER: 0.05, DEADLINE_EXCEEDED: 0.05,
               RESOURCE_EXHAUSTED: 0.05},
    "lookup": {ABORTED: 0.03, UNAVAILABLE: 0.05, UNAVAILABLE_AFTER: 0.03, DEADLINE_EXCEEDED: 0.03,
               RESOURCE_EXHAUSTED: 0.03},
    "begin_transaction": {UNAVAILABLE: 0.05, DEADLINE_EXCEEDED: 0.03, RESOURCE_EXHAUSTED: 0.03},
    "rollback": {UNAVAILABLE: 0.1},
}


@pytest.mark.emulator
@pytest.mark.parametrize(
    "emulator_name,strategy",
    [
        ("datastore", "transactional"),
        ("datastore", "auto"),
        ("datastore", "auto-grow"),
        ("firestore", "transactional"),
        ("firestore", "increment"),
        ("firestore", "auto"),
        ("firestore", "auto-grow"),
    ],
)
def test_rpc_faults_under_the_real_retry_policy(request, face, emulator_name, strategy, tally):
    """google.api_core errors raised by the RPCs themselves, so the Datastore
    gateway's retry table decides: transient read errors and unsent commits
    are retried inside the gateway, ABORTED by the counter, and an applied
    commit that then failed comes back as CommitUnknown, never resent blindly."""
    emulator = request.getfixturevalue(f"{emulator_name}_emulator")
    blocking = emulator.gateway(namespace=f"rel-{uuid.uuid4().hex}", retry=QUICK_RPC_RETRY, timeout=10.0)
    gateway = face.gateway(blocking)
    try:
        face.learn_capabilities(gateway)  # the gateway's one-off probe: the faults are for the counter's calls
        injector = inject_rpc_faults(gateway, RPC_RATES, seed=zlib.crc32(f"{emulator_name}-{strategy}".encode()))
        counter = face.counter_on(gateway, strategy)
        n = 60
        outcome = face.add_many(counter, n, amount=2)
        with injector.paused():
            total = counter.get_count()
        applied = applied_unknowns(injector)
        area = f"faults (RPC level, {emulator_name} emulator{face.label}) {strategy}"
        tally.add_faults(area, injector.counts())
        tally.add(area, operations=n, reported_unknown=outcome.unknown,
                  increments_lost=max(0, 2 * outcome.ok - total) // 2,
                  double_counts=max(0, total - 2 * (outcome.ok + outcome.unknown)) // 2)
        assert outcome.tried == n
        assert injector.total > 10
        assert outcome.unknown > 0, "the seeds must produce applied commits whose answer was lost"
        assert 2 * outcome.ok <= total <= 2 * (outcome.ok + outcome.unknown), (outcome, injector)
        # every failure that is not "unknown" is one the gateway says applied nothing
        assert set(outcome.failed) <= {"Contention", "Unavailable", "GatewayError"}, outcome.failed
        # the gateway retried transient errors itself
        stats = gateway.stats.snapshot()
        assert sum(v for k, v in stats.items() if k.startswith("retry.")) > 0
        if strategy != "auto-grow":
            # each unknown was an applied commit, and nothing else was applied
            assert total == 2 * (outcome.ok + outcome.unknown), (outcome, applied)
    finally:
        remove_rpc_faults(gateway)
        blocking.close()


def test_a_resent_transaction_that_is_then_aborted_stays_unknown(firestore_emulator, face):
    """A transactional commit is resent after UNAVAILABLE ("Socket closed":
    it may have landed). If the resend is then ABORTED, the first attempt
    may still have been applied: that is CommitUnknown, not Contention -- a
    Contention would make the counter retry, counting it twice."""
    blocking = firestore_emulator.gateway(namespace=f"rel-{uuid.uuid4().hex}", retry=QUICK_RPC_RETRY, timeout=10.0)
    gateway = face.gateway(blocking)
    try:
        face.learn_capabilities(gateway)  # the gateway's one-off probe commits: done before the scripted faults
        injector = inject_rpc_faults(gateway, script={"commit": [UNAVAILABLE_AFTER, ABORTED]})
        counter = face.counter_on(gateway, "transactional")
        with pytest.raises(CommitUnknown):
            counter.add(4)
        with injector.paused():
            assert counter.get_count() == 4
        assert gateway.stats["counter.retries"] == 0
    finally:
        blocking.close()


def test_unsent_and_quota_rejected_commits_are_resent_by_the_gateway(firestore_emulator, face):
    """UNAVAILABLE with "connection refused" and RESOURCE_EXHAUSTED prove the
    commit was not applied: the gateway resends even a server-side increment."""
    blocking = firestore_emulator.gateway(namespace=f"rel-{uuid.uuid4().hex}", retry=QUICK_RPC_RETRY, timeout=10.0)
    gateway = face.gateway(blocking)
    try:
        counter = face.counter_on(gateway, "increment")
        counter.add(1)  # the one-off transform check, done before the faults
        injector = inject_rpc_faults(gateway, script={"commit": [UNAVAILABLE, RESOURCE_EXHAUSTED, UNAVAILABLE]})
        counter.add(1)
        assert injector.calls["commit"] == 4
        assert gateway.stats["retry.commit"] == 3
        assert counter.get_count() == 2
    finally:
        blocking.close()
