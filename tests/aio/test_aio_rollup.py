"""Rollups through the asyncio face: the same plans as the blocking face
(``counter.rollup``), awaited; both faces share one rollup entity."""

from __future__ import annotations

import asyncio

import pytest

from gds_counter import aio
from gds_counter.counter import PHP_ARTICLE, CounterShardDS, TotalAsOf
from gds_counter.counter._inventory import rollup_all_plan
from gds_counter.counter.rollup import Writes
from gds_counter.gateway import plan


@pytest.mark.parametrize("name", ["memory", "sqlite", "firestore"])
def test_the_asyncio_face_reads_and_writes_the_rollup_the_blocking_face_does(name, make_async_gateway):
    gateway = make_async_gateway(name)

    async def main() -> None:
        counter = aio.CounterShardDS("Counter Test", 1, gateway=gateway)
        await counter.add(4)
        first = await counter.get_count_as_of(max_age=60)
        assert (first.total, first.from_rollup) == (4, False)
        await counter.add(1)
        assert await counter.get_count_as_of(max_age=60) == TotalAsOf(4, first.as_of, True)
        assert await counter.get_count(max_age=60) == 4
        assert await counter.get_count() == 5
        assert await aio.get_counts([counter], max_age=0) == [5]
        gateway.stats.reset()
        readers = [aio.CounterShardDS("Counter Test", 1, gateway=gateway) for _ in range(8)]
        totals = await asyncio.gather(*(r.get_count(max_age=60) for r in readers))
        assert totals == [5] * 8
        assert gateway.stats.snapshot()["entity_writes"] == 0  # all from the fresh rollup

    asyncio.run(main())


def test_both_faces_share_one_rollup(make_gateway):
    blocking = make_gateway("memory")
    counter = CounterShardDS("Counter Test", 1, gateway=blocking)
    counter.add(2)
    written = counter.get_count_as_of(max_age=60)

    async def main() -> TotalAsOf:
        async with aio.async_twin(blocking, owns=False) as gateway:
            return await aio.CounterShardDS("Counter Test", 1, gateway=gateway).get_count_as_of(max_age=60)

    assert asyncio.run(main()) == TotalAsOf(2, written.as_of, True)


@pytest.mark.parametrize("name", ["memory", "firestore"])
def test_the_asyncio_face_refreshes_a_rollup_after_a_burst_of_reads(name, make_async_gateway):
    """Issue 36, defect 6, awaited: 130 reads with ``max_age=0`` spend the
    rollup's claims; a forced refresh (the plan ``gds-counter rollup``
    runs, here awaited) still writes the total."""
    gateway = make_async_gateway(name)

    async def main() -> None:
        counter = aio.CounterShardDS("Counter Test", 1, gateway=gateway)
        for _ in range(130):
            await counter.add(1)
            await counter.get_count_as_of(max_age=0)
        make = lambda target: aio.ShardedCounter(target, layout=PHP_ARTICLE, gateway=gateway)  # noqa: E731
        rolled = await plan.arun(rollup_all_plan([counter.name], make, 0.0, forced=True), gateway)
        assert rolled.writes == Writes(written=1)
        found = await counter.get_count_as_of(max_age=3600)
        assert (found.total, found.from_rollup) == (130, True)

    asyncio.run(main())
