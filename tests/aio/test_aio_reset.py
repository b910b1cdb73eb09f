"""``reset()`` through the asyncio face: the same plan as the blocking
face (``counter._reset``), awaited (issue 36, defect 1)."""

from __future__ import annotations

import asyncio

import pytest

from gds_counter import aio


@pytest.mark.parametrize("name", ["memory", "firestore"])
def test_the_asyncio_face_resets_every_shard_too(name, make_async_gateway):
    """``gds_counter.aio`` runs the same reset plan: a fresh object zeroes a
    counter another object grew to 40 shards."""
    gateway = make_async_gateway(name)

    async def main() -> None:
        writer = aio.CounterShardDS("Reset", 1, gateway=gateway)
        await writer.increase_shards(40)
        for _ in range(40):
            await writer.add(2)
        assert sum(count for n, count in await writer.shards() if n > 20) > 0
        await aio.CounterShardDS("Reset", 1, gateway=gateway).reset()
        assert await writer.get_count() == await writer.get_count(method="lookup") == 0

    asyncio.run(main())
