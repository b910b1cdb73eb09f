"""The asyncio Store is the blocking Store awaited: the same calls on the
same storage give the same answers, transactions included. Each scenario
runs once through ``gds_counter.Store`` and once through ``aio.Store`` (in
namespaces of their own) and the transcripts are compared."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from gds_counter import Schema, Store, aio
from gds_counter.errors import BadValueError, Contention

SCHEMA = Schema("Book").add_string("title").add_integer("pages").add_string("isbn")


def _books(n: int) -> list[dict[str, Any]]:
    return [{"title": f"t{i:02d}", "pages": 10 * i, "isbn": f"i{i % 3}"} for i in range(n)]


def blocking_transcript(store: Store) -> list[Any]:
    out: list[Any] = []
    entities = [store.create_entity(data) for data in _books(12)]
    store.upsert(entities)
    ids = [e.get_key_id() for e in entities]
    out.append([b.title for b in store.fetch_by_ids(ids[:3])])
    out.append([b.title for b in store.fetch_all("SELECT * FROM Book WHERE isbn = @i ORDER BY pages DESC", {"i": "i1"})])
    store.query("SELECT * FROM Book ORDER BY title")
    pages = []
    while page := store.fetch_page(5):
        pages.append([b.title for b in page])
    out.append(pages)
    out.append((store.count(), store.count("SELECT * FROM Book WHERE pages > 50"), store.sum("pages"), store.avg("pages")))
    with store.transaction():
        [first] = store.fetch_by_ids(ids[:1])
        first.pages = 999
        store.upsert(first)
    try:
        with store.transaction():
            [second] = store.fetch_by_ids(ids[1:2])
            second.pages = -1
            store.upsert(second)
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    out.append([b.pages for b in store.fetch_by_ids(ids[:2])])
    store.begin_transaction()
    [third] = store.fetch_by_ids(ids[2:3])
    third.title = "php style"
    store.upsert(third)  # commits and uses up the transaction
    out.append(store.fetch_one("SELECT * FROM Book WHERE title = 'php style'").pages)

    def work(s: Store) -> int:
        [b] = s.fetch_by_ids(ids[3:4])
        b.pages += 1
        s.upsert(b)
        return int(b.pages)

    out.append(store.run_in_transaction(work))
    store.delete(store.fetch_by_ids(ids[4:6]))
    out.append([b is None for b in store.fetch_by_ids(ids[3:7])])
    try:
        store.upsert(store.create_entity({"title": "x" * 1501}))
    except BadValueError as exc:
        out.append(type(exc).__name__)
    return out


async def async_transcript(store: aio.Store) -> list[Any]:
    out: list[Any] = []
    entities = [store.create_entity(data) for data in _books(12)]
    await store.upsert(entities)
    ids = [e.get_key_id() for e in entities]
    out.append([b.title for b in await store.fetch_by_ids(ids[:3])])
    out.append([b.title for b in await store.fetch_all("SELECT * FROM Book WHERE isbn = @i ORDER BY pages DESC", {"i": "i1"})])
    store.query("SELECT * FROM Book ORDER BY title")
    pages = []
    while page := await store.fetch_page(5):
        pages.append([b.title for b in page])
    out.append(pages)
    out.append((await store.count(), await store.count("SELECT * FROM Book WHERE pages > 50"),
                await store.sum("pages"), await store.avg("pages")))
    async with store.transaction():
        [first] = await store.fetch_by_ids(ids[:1])
        first.pages = 999
        await store.upsert(first)
    try:
        async with store.transaction():
            [second] = await store.fetch_by_ids(ids[1:2])
            second.pages = -1
            await store.upsert(second)
            raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    out.append([b.pages for b in await store.fetch_by_ids(ids[:2])])
    await store.begin_transaction()
    [third] = await store.fetch_by_ids(ids[2:3])
    third.title = "php style"
    await store.upsert(third)
    out.append((await store.fetch_one("SELECT * FROM Book WHERE title = 'php style'")).pages)

    async def work(s: aio.Store) -> int:
        [b] = await s.fetch_by_ids(ids[3:4])
        b.pages += 1
        await s.upsert(b)
        return int(b.pages)

    out.append(await store.run_in_transaction(work))
    await store.delete(await store.fetch_by_ids(ids[4:6]))
    out.append([b is None for b in await store.fetch_by_ids(ids[3:7])])
    try:
        await store.upsert(store.create_entity({"title": "x" * 1501}))
    except BadValueError as exc:
        out.append(type(exc).__name__)
    return out


@pytest.mark.parametrize("name", ["memory", "firestore"])
def test_both_faces_give_the_same_transcript(make_gateway, make_async_gateway, name):
    expected = blocking_transcript(Store(SCHEMA, make_gateway(name)))
    gateway = make_async_gateway(name)

    async def scenario() -> list[Any]:
        async with gateway:
            return await async_transcript(aio.Store(SCHEMA, gateway))

    assert asyncio.run(scenario()) == expected
    assert expected[-1] == "BadValueError"  # the scenario really reached its end


def test_a_transaction_belongs_to_its_task(make_async_gateway):
    """Two tasks, two transactions on one Store: neither sees the other's
    buffered writes or token (the blocking Store keeps them per thread)."""
    gateway = make_async_gateway("memory")

    async def scenario() -> tuple[list[Any], int]:
        store = aio.Store(SCHEMA, gateway)
        book = store.create_entity({"title": "shared", "pages": 1})
        await store.upsert(book)
        entered = asyncio.Event()
        release = asyncio.Event()

        async def writer() -> None:
            async with store.transaction():
                [b] = await store.fetch_by_ids([book.get_key_id()])
                b.pages = 2
                await store.upsert(b)
                entered.set()
                await release.wait()

        async def reader() -> list[Any]:
            await entered.wait()
            seen = [(await store.fetch_by_ids([book.get_key_id()]))[0].pages, store._read_token()]
            release.set()
            return seen

        _, seen = await asyncio.gather(writer(), reader())
        return seen, (await store.fetch_by_ids([book.get_key_id()]))[0].pages

    seen, after = asyncio.run(scenario())
    assert seen == [1, None] and after == 2


def test_run_in_transaction_retries_contention_then_raises(make_async_gateway):
    gateway = make_async_gateway("memory")
    attempts = []

    async def work(store: aio.Store) -> None:
        attempts.append(1)
        raise Contention("always", attempts=1)

    async def scenario() -> None:
        store = aio.Store(SCHEMA, gateway)
        await store.run_in_transaction(work, retry=aio_retry())

    with pytest.raises(Contention, match="transaction on Book still conflicted after 3 attempts"):
        asyncio.run(scenario())
    assert len(attempts) == 3


def aio_retry() -> Any:
    from gds_counter import RetryPolicy

    return RetryPolicy(attempts=3, initial=0.001, maximum=0.002)


def test_iter_all_yields_every_batch_in_order(make_async_gateway):
    gateway = make_async_gateway("memory")

    async def scenario() -> list[str]:
        store = aio.Store(SCHEMA, gateway)
        await store.upsert([store.create_entity(data) for data in _books(30)])
        return [book.title async for book in store.iter_all("SELECT * FROM Book ORDER BY title DESC LIMIT 25")]

    assert asyncio.run(scenario()) == [f"t{i:02d}" for i in range(29, 4, -1)]


def test_a_strategy_with_only_a_blocking_add_is_refused(make_async_gateway):
    class Blocking:
        name = "mine"

        def add(self, shard: Any, amount: int) -> None:
            raise AssertionError("never called")

    with pytest.raises(BadValueError, match="plan_add"):
        aio.CounterShardDS("Counter Test", 1, gateway=make_async_gateway("memory"), strategy=Blocking())
