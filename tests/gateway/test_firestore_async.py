"""``AsyncFirestoreGateway`` on the official Firestore emulator in native
mode: google-cloud-firestore's async client (gRPC asyncio) behind the
blocking gateway's rules, requests, error policy, deadlines and stats.

Cancellation is the asyncio face's own risk: a task cancelled while its
commit RPC is in flight must end as the Datastore async gateway's does,
telling its caller the write may have been stored (``CancelledError``,
``CommitUnknown``), never that it was not, and never counting it twice.
The cancellation tests give every task a distinct power of two, so the
stored total says exactly which tasks' amounts were stored."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from gds_counter import DistributedCounter
from gds_counter._process import deadlines
from gds_counter.aio import DistributedCounter as AsyncDistributedCounter
from gds_counter.errors import AlreadyExists, CommitUnknown, Contention, GatewayError, NotFound, Unavailable
from gds_counter.gateway.firestore import AsyncFirestoreGateway, FirestoreGateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Insert, Update, Upsert
from gds_counter.gateway.query import Aggregation, AggregationQuery, Query
from gds_counter.gateway.values import RawEntity
from gds_counter.testing.bridge import BlockingBridge

pytestmark = pytest.mark.emulator


def twin(blocking: FirestoreGateway, **settings: Any) -> AsyncFirestoreGateway:
    """The async gateway on the blocking one's emulator."""
    return AsyncFirestoreGateway(blocking.project, blocking.database, emulator_host=blocking.emulator_host, **settings)


def shard_key(path: str, shard: int = 0) -> Key:
    collection, name = path.split("/")
    return Key.of(collection, name, "shards", str(shard))


def test_the_same_answers_and_stats_as_the_blocking_gateway(firestore_native_gateway):
    """One sequence of calls on both faces (the async one behind the test
    bridge): the same entities and transform results, and the same RPCs,
    reads and writes counted."""

    def calls_on(gateway: Any, kind: str) -> Any:
        key = Key.of(kind, "a")
        written = gateway.commit([Upsert(RawEntity(key, {"n": 1, "s": "x"}), transforms=[Increment("n", 4)])])
        token = gateway.begin_transaction()
        inside = gateway.lookup([key, Key.of(kind, "missing")], transaction=token)
        gateway.commit([Upsert(RawEntity(key, {"n": 9}))], transaction=token)
        found = gateway.lookup([key])
        counted = gateway.run_query(Query(kind=kind))
        summed = gateway.run_aggregation(AggregationQuery(Query(kind=kind), (Aggregation.sum("n"),)))
        return (
            [r.transform_results for r in written.mutation_results], [e.properties if e else None for e in inside],
            found[0].properties, len(counted.entities), dict(summed), gateway.stats.snapshot(),
        )

    bridge = BlockingBridge(twin(firestore_native_gateway))
    try:
        got = calls_on(bridge, "Async")
    finally:
        bridge.close()
    expected = calls_on(firestore_native_gateway, "Blocking")
    assert got == expected
    assert got[-1]["rpc.commit"] == 2 and got[-1]["rpc.run_aggregation_query"] == 1, got[-1]
    assert got[-1]["entity_reads"] == 5, got[-1]  # 3 looked up, 1 queried, 1 billed for the aggregation


def test_errors_follow_the_blocking_gateways_policy(firestore_native_gateway):
    """Refused inserts and updates, and a transaction that lost its lock,
    raise the classes of the errors table, naming the documents."""
    key = Key.of("Errors", "a")
    firestore_native_gateway.commit([Upsert(RawEntity(key, {"n": 1}))])

    async def main() -> list[BaseException]:
        seen: list[BaseException] = []
        async with twin(firestore_native_gateway, timeout=5) as gateway:
            for mutation in (Insert(RawEntity(key, {})), Update(RawEntity(Key.of("Errors", "gone"), {}))):
                try:
                    await gateway.commit([mutation])
                except (AlreadyExists, NotFound) as exc:
                    seen.append(exc)
        return seen

    inserted, updated = asyncio.run(main())
    assert isinstance(inserted, AlreadyExists) and "Errors/a" in str(inserted)
    assert isinstance(updated, NotFound) and "Errors/gone" in str(updated)


def test_no_call_runs_past_its_callers_deadline(firestore_native_gateway):
    """A commit that waits behind another transaction's lock ends when the
    running call's deadline (``_process.deadlines``, which a counter's call
    states) passes, not when the gateway's 30 s timeout or the emulator's
    lock timeout (2 s: then ABORTED) does: as ``CommitUnknown``, because
    the request was sent. Once the deadline has passed, nothing is sent
    (``Unavailable``). On both faces."""
    holder = firestore_native_gateway
    key = Key.of("Locked", "a")
    holder.commit([Upsert(RawEntity(key, {"n": 0}))])
    token = holder.begin_transaction()
    holder.lookup([key], transaction=token)  # the emulator locks what a transaction read
    increment = [Upsert(RawEntity(key, {}), property_mask=(), transforms=[Increment("n", 1)])]

    async def on_async() -> tuple[BaseException, float, BaseException]:
        async with twin(holder, timeout=30) as gateway:
            bound = deadlines.limit(time.monotonic() + 0.3)
            try:
                started = time.monotonic()
                with pytest.raises(GatewayError) as first:
                    await gateway.commit(increment)
                waited = time.monotonic() - started
                with pytest.raises(GatewayError) as late:
                    await gateway.commit(increment)
            finally:
                deadlines.restore(bound)
            return first.value, waited, late.value

    blocking = FirestoreGateway(holder.project, emulator_host=holder.emulator_host, timeout=30)
    try:
        error, waited, late = asyncio.run(on_async())
        assert isinstance(error, CommitUnknown) and waited < 1.5, (error, waited)
        assert isinstance(late, Unavailable) and "nothing of it was written" in str(late)
        bound = deadlines.limit(time.monotonic() + 0.3)
        try:
            started = time.monotonic()
            with pytest.raises(CommitUnknown):
                blocking.commit(increment)
            assert time.monotonic() - started < 1.5
        finally:
            deadlines.restore(bound)
    finally:
        blocking.close()
        holder.rollback(token)


async def _settle(tasks: list[asyncio.Task[Any]]) -> list[BaseException | None]:
    """What each task was told: None (done), or its error."""
    outcomes: list[BaseException | None] = []
    for task in tasks:
        try:
            await task
            outcomes.append(None)
        except (asyncio.CancelledError, Exception) as exc:
            outcomes.append(exc)
    return outcomes


async def _cancel_behind_a_lock(
    holder: FirestoreGateway, locked: list[Key], counter: Any, amounts: list[int], *, every: int
) -> list[BaseException | None]:
    """One task per amount adds it to ``counter`` while a transaction of
    ``holder`` holds the documents ``locked`` (the emulator locks what a
    transaction read), so every task waits inside its write; after a
    second every ``every``-th task is cancelled there, then the lock is
    released. What each task was told (``_settle``)."""
    token = holder.begin_transaction()
    holder.lookup(locked, transaction=token)
    tasks = [asyncio.create_task(counter.add(amount)) for amount in amounts]
    await asyncio.sleep(1.0)
    assert not any(task.done() for task in tasks)
    for task in tasks[::every]:
        task.cancel()
    await asyncio.sleep(0.2)
    holder.rollback(token)
    return await _settle(tasks)


def _check_exactly_once(total: int, amounts: list[int], outcomes: list[BaseException | None], every: int) -> None:
    """The stored ``total`` holds every acknowledged amount once, no amount
    whose caller was told it was not stored, and each other one (the caller
    was told it may have been: cancelled, ``CommitUnknown``) at most once.
    Amounts are distinct powers of two, so the total's bits name them.
    Every ``every``-th task was cancelled, and was told so."""
    assert all(isinstance(o, asyncio.CancelledError) for o in outcomes[::every])
    must = sum(a for a, o in zip(amounts, outcomes) if o is None)
    may = sum(a for a, o in zip(amounts, outcomes) if isinstance(o, (asyncio.CancelledError, CommitUnknown)))
    told_not = [o for o in outcomes if o is not None and not isinstance(o, (asyncio.CancelledError, CommitUnknown))]
    assert all(isinstance(o, (Contention, Unavailable)) for o in told_not), told_not  # the not-stored classes
    assert total & must == must, f"an acknowledged amount was lost: total {total:b}, acknowledged {must:b}"
    assert total & ~(must | may) == 0 and total <= must + may, (
        f"counted twice, or counted though its caller was told it was not: total {total:b}, "
        f"acknowledged {must:b}, maybe {may:b}"
    )
    assert any(o is None for o in outcomes)


def test_tasks_cancelled_while_their_commit_is_in_flight(firestore_native_gateway):
    """Every task's increment commit waits behind a lock another
    transaction holds; half of the tasks are cancelled while they wait,
    then the lock is released. gRPC asyncio cancels each cancelled call on
    the client; the emulator may still apply it. The cancelled tasks'
    callers are told ``CancelledError`` (may have been stored), the others
    their amounts, and the stored total holds every acknowledged amount
    once and each cancelled one at most once."""
    holder = firestore_native_gateway
    path = "counters/cancel-commit"
    DistributedCounter(path, 1, gateway=holder).add(0)  # the shard exists
    amounts = [1 << i for i in range(24)]

    async def main() -> list[BaseException | None]:
        async with twin(holder) as gateway:
            counter = AsyncDistributedCounter(path, 1, gateway=gateway, strategy="increment")
            return await _cancel_behind_a_lock(holder, [shard_key(path)], counter, amounts, every=2)

    outcomes = asyncio.run(main())
    _check_exactly_once(DistributedCounter(path, 1, gateway=holder).get_count(), amounts, outcomes, 2)


def test_tasks_cancelled_mid_transaction_roll_back_and_count_at_most_once(firestore_native_gateway):
    """Transactional increments on a two-shard counter whose shards another
    transaction holds locked, so each task's transaction waits inside
    (behind the lock, at its read or its commit); a third of them are
    cancelled there, then the lock is released. The plan that began a
    transaction rolls it back when cancelled, so its locks go at once and a
    writer after them does not wait for them to expire; the total holds every acknowledged amount once and each
    cancelled one at most once."""
    holder = firestore_native_gateway
    path = "counters/cancel-transaction"
    DistributedCounter(path, 2, gateway=holder).add(0)
    amounts = [1 << i for i in range(40)]

    async def main() -> list[BaseException | None]:
        async with twin(holder) as gateway:
            counter = AsyncDistributedCounter(path, 2, gateway=gateway, strategy="transactional")
            locked = [shard_key(path, 0), shard_key(path, 1)]
            outcomes = await _cancel_behind_a_lock(holder, locked, counter, amounts, every=3)
            started = time.monotonic()
            await counter.add(0)  # no lock of a cancelled transaction is left behind
            assert time.monotonic() - started < 10
            return outcomes

    outcomes = asyncio.run(main())
    _check_exactly_once(DistributedCounter(path, 2, gateway=holder).get_count(), amounts, outcomes, 3)


def test_the_asyncio_distributed_counter_under_200_tasks(firestore_native_gateway):
    """200 tasks increment one asyncio ``DistributedCounter`` at once on the
    async gateway: the total is exact, and every ``increment()`` returned a
    total that includes its own amount."""
    path = "counters/many-tasks"

    async def main() -> tuple[list[int], int]:
        async with twin(firestore_native_gateway) as gateway:
            counter = AsyncDistributedCounter(path, 10, gateway=gateway)
            results = await asyncio.gather(*(counter.increment() for _ in range(200)))
            return list(results), await counter.get_count()

    results, total = asyncio.run(main())
    assert total == 200 == DistributedCounter(path, 10, gateway=firestore_native_gateway).get_count()
    assert max(results) == 200 and min(results) >= 1
