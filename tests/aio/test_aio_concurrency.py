"""The asyncio face's promise: many increments from one event loop are each
counted exactly once, and the loop stays free while they run.

Acceptance (issue 15): 500 concurrent ``await counter.increment()`` give an
exact total on the embedded engine and on both emulators, and a 10 ms
ticker task beside them never waits more than 250 ms. The ticker's lag is a
correctness property of non-blocking I/O (a blocking call on the loop would
stall it for the whole call), not a speed figure. What the test run itself
brings is kept out of it: the heap of thousands of earlier tests, which a
full garbage collection walks while the loop waits (``quiet_heap``).
"""

from __future__ import annotations

import asyncio
import gc
import random
import time
import uuid

import pytest

from gds_counter import aio

INCREMENTS = 500
TICK = 0.010
MAX_LAG = 0.250


@pytest.fixture
def quiet_heap():
    """The test run's heap, collected and frozen (``gc.freeze``) for the
    test: a full collection of everything earlier tests left walks it all,
    on the loop's thread (the likeliest cause of the one stall past 250 ms
    seen in CI, whose cause was not recorded). What the increments
    themselves allocate is still collected as usual, and each collection's
    pause is recorded (seconds, the list yielded) for the failure message."""
    pauses: list[float] = []
    began: list[float] = []

    def timed(phase: str, info: dict) -> None:
        if phase == "start":
            began[:] = [time.monotonic()]
        elif began:
            pauses.append(time.monotonic() - began[0])

    gc.collect()
    gc.freeze()
    gc.callbacks.append(timed)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(timed)
        gc.unfreeze()


async def _ticker(stop: asyncio.Event, lags: list[float]) -> None:
    last = time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(TICK)
        now = time.monotonic()
        lags.append(now - last - TICK)
        last = now


async def _increments_beside_a_ticker(counter: aio.ShardedCounter) -> tuple[list[int], list[float]]:
    await counter.get_count()  # the gateway's first contact (a capability probe, a channel) is not the test
    stop, lags = asyncio.Event(), []
    ticker = asyncio.create_task(_ticker(stop, lags))
    try:
        totals = await asyncio.gather(*(counter.increment() for _ in range(INCREMENTS)))
    finally:
        stop.set()
        await ticker
    return list(totals), lags


@pytest.mark.parametrize("name", ["memory", "sqlite", "firestore", "datastore"])
def test_500_concurrent_increments_are_exact_and_the_loop_never_stalls(make_async_gateway, name, quiet_heap):
    gateway = make_async_gateway(name)

    async def scenario() -> tuple[list[int], list[float], int, list[int]]:
        async with gateway:
            counter = aio.CounterShardDS("Counter Test", 1, gateway=gateway)
            totals, lags = await _increments_beside_a_ticker(counter)
            return totals, lags, await counter.get_count(), await aio.get_counts([counter])

    totals, lags, total, batched = asyncio.run(scenario())
    assert total == INCREMENTS and batched == [INCREMENTS]
    # Each increment returns a total read after its own write: at least one,
    # at most all, and the last one read sees them all.
    assert all(1 <= t <= INCREMENTS for t in totals) and max(totals) == INCREMENTS
    assert lags, "the ticker never ran"
    assert max(lags) <= MAX_LAG, (f"the event loop stalled {max(lags) * 1000:.0f} ms (ticks: {len(lags)}; the longest "
                                  f"garbage collection meanwhile: {max(quiet_heap, default=0) * 1000:.0f} ms)")


def test_concurrent_counters_and_the_blocking_face_agree(make_async_gateway, make_gateway):
    """The same storage read by both faces: what the async face counted,
    the blocking face reads, and the other way round."""
    from gds_counter import CounterShardDS

    blocking = make_gateway("memory")
    gateway = aio.async_twin(blocking)

    async def scenario() -> list[int]:
        counters = [aio.CounterShardDS("Page", n, gateway=gateway) for n in range(5)]
        await asyncio.gather(*(c.add(n + 1) for n, c in enumerate(counters) for _ in range(10)))
        return await aio.get_counts(counters)

    assert asyncio.run(scenario()) == [10 * (n + 1) for n in range(5)]
    assert [CounterShardDS("Page", n, gateway=blocking).get_count() for n in range(5)] == [10 * (n + 1) for n in range(5)]
    CounterShardDS("Page", 0, gateway=blocking).add(5)

    async def read() -> int:
        return await aio.CounterShardDS("Page", 0, gateway=gateway).get_count()

    assert asyncio.run(read()) == 15
    asyncio.run(gateway.close())


TASKS, PER_TASK = 64, 6


@pytest.mark.parametrize("name", ["sqlite", "firestore"])
def test_every_total_from_tasks_includes_each_increment_acknowledged_before_the_call(make_async_gateway, name):
    """Tasks that finish together share one read of the total; none may be
    handed a read that began before it asked (tests/counter/
    test_total_consistency.py does the same from threads)."""
    gateway = make_async_gateway(name)
    target = uuid.uuid4().hex[:8]

    async def scenario() -> tuple[list[tuple[int, int]], list[list[int]], int]:
        async with gateway:
            counter = aio.CounterShardDS("Consistency", target, gateway=gateway)
            acknowledged = 0
            seen: list[tuple[int, int]] = []
            own: list[list[int]] = []  # each task's totals, in order

            async def writer() -> None:
                nonlocal acknowledged
                mine: list[int] = []
                own.append(mine)
                for _ in range(PER_TASK):
                    await asyncio.sleep(random.random() * 0.005)  # out of step: calls begin between others' reads
                    before = acknowledged  # one loop: no lock needed
                    total = await counter.increment()
                    acknowledged += 1
                    seen.append((before, total))
                    mine.append(total)

            await asyncio.gather(*(writer() for _ in range(TASKS)))
            return seen, own, await counter.get_count()

    seen, own, final = asyncio.run(scenario())
    expected = TASKS * PER_TASK
    assert len(seen) == expected
    assert [(before, total) for before, total in seen if total < before + 1] == []
    # A task's next total holds its previous increments and its new one.
    assert [totals for totals in own if any(b <= a for a, b in zip(totals, totals[1:]))] == []
    assert max(total for _, total in seen) == expected == final
