"""The count cache through the asyncio face (issue 23, items 6 and 7).

A task cancelled while its write waits in the thread pool leaves, but the
worker thread goes on and the commit lands: the cache must not keep a total
that misses it (a task whose ``increment()`` returned 3 then read 2). And a
counter with ``cache=True`` sees what every counter object of the process
writes through the same storage, from either face.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest

from gds_counter import aio
from gds_counter.counter import CounterShardDS
from gds_counter.gateway import open_gateway

#: How long the landing of a cancelled write may take on a loaded machine (a bound, not a speed).
LANDING_S = 60.0


def test_a_cancelled_write_that_lands_is_in_the_cached_total(tmp_path):
    path = tmp_path / "cancel.sqlite3"

    async def main() -> None:
        async with aio.open_gateway(f"sqlite:///{path}") as gateway:
            cached = aio.CounterShardDS("Counter Test", 1, gateway=gateway, cache=True)
            plain = aio.CounterShardDS("Counter Test", 1, gateway=gateway)
            assert await cached.get_count() == 0  # now cached
            blocker = sqlite3.connect(path, isolation_level=None)  # another process holds the write lock
            blocker.execute("BEGIN IMMEDIATE")
            try:
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(cached.add(1), 1.0)  # cancelled while its commit waits
            finally:
                blocker.execute("COMMIT")
                blocker.close()
            deadline = time.monotonic() + LANDING_S
            while await plain.get_count() != 1:  # the worker goes on: the commit lands
                assert time.monotonic() < deadline, "the cancelled write never landed"
                await asyncio.sleep(0.05)
            await cached.add(1)  # adjusts whatever total the cache still holds
            assert await cached.get_count() == 2
            assert await plain.increment() == 3
            assert await cached.get_count() == 3  # never less than a total a task was given
            assert await aio.get_counts([cached]) == [3]

    asyncio.run(main())


def test_a_cached_async_counter_sees_writes_of_counter_objects_without_a_cache():
    async def main() -> None:
        async with aio.open_gateway("memory://") as gateway:
            cached = aio.CounterShardDS("Counter Test", 1, gateway=gateway, cache=True)
            assert await cached.get_count() == 0
            assert await aio.CounterShardDS("Counter Test", 1, gateway=gateway).increment() == 1
            assert await cached.get_count() == 1
            await aio.CounterShardDS("Counter Test", 1, gateway=gateway).reset()
            assert await cached.get_count() == 0

    asyncio.run(main())


def test_both_faces_on_one_gateway_share_what_the_cache_sees():
    """An async gateway over a blocking one (``aio.ThreadedGateway``, as
    the shared default is on the embedded engine) is one storage: a write
    through either face is in the other face's cached total."""
    blocking = open_gateway("memory://")
    gateway = aio.ThreadedGateway(blocking)

    async def cached_total() -> int:
        return await aio.CounterShardDS("Counter Test", 1, gateway=gateway, cache=True).get_count()

    try:
        assert asyncio.run(cached_total()) == 0
        CounterShardDS("Counter Test", 1, gateway=blocking).add(2)
        assert asyncio.run(cached_total()) == 2
        cached_blocking = CounterShardDS("Counter Test", 1, gateway=blocking, cache=True)
        assert cached_blocking.get_count() == 2

        async def add() -> None:
            await aio.CounterShardDS("Counter Test", 1, gateway=gateway).add(3)

        asyncio.run(add())
        assert cached_blocking.get_count() == 5
    finally:
        asyncio.run(gateway.close())
        blocking.close()


def test_the_asyncio_face_shares_the_redis_cache_with_the_blocking_face(redis_server, tmp_path):
    """cache="redis://...": a task's read is served from the total the
    blocking face's writes keep, and its own writes keep it too."""
    url = f"sqlite:///{tmp_path / 'shared.sqlite3'}"
    blocking_gateway = open_gateway(url)
    try:
        blocking = CounterShardDS("Counter Test", 1, gateway=blocking_gateway, cache=redis_server.url)
        blocking.add(2)
        assert blocking.get_count() == 2  # cached in Redis

        async def main() -> None:
            async with aio.open_gateway(url) as gateway:
                counter = aio.CounterShardDS("Counter Test", 1, gateway=gateway, cache=redis_server.url)
                gateway.stats.reset()
                assert await counter.get_count() == 2 and gateway.stats.snapshot()["rpcs"] == 0
                await counter.add(3)
                assert await counter.get_count() == 5 and gateway.stats.snapshot()["rpc.commit"] == 1

        asyncio.run(main())
        blocking_gateway.stats.reset()
        assert blocking.get_count() == 5 and blocking_gateway.stats.snapshot()["rpcs"] == 0
    finally:
        blocking_gateway.close()
