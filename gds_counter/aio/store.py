"""``gds_counter.aio.Store``: php-gds's Store, every call that touches
storage a coroutine.

Every rule (mapping, keys, php-gds's query and paging rules, transactions)
is ``StoreCore``'s, the very plans the blocking ``Store`` runs; here they are
awaited on an async gateway. The caller's transaction (a pending
``begin_transaction()`` token, or an ``async with store.transaction():``
block) is kept per asyncio task, as the blocking Store keeps it per thread.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, AsyncIterator, Awaitable, Callable, Iterable, Sequence, TypeVar

from gds_counter.aio._gateway import AsyncGateway, resolve_gateway
from gds_counter.gateway import plan
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Insert, Mutation, Update
from gds_counter.gateway.query import AggregationQuery, Query
from gds_counter.gds import StoreCore, from_raw
from gds_counter.gds.entity import Entity
from gds_counter.gds.schema import Schema
from gds_counter.gds.transaction import DEFAULT_RETRY, RetryPolicy, retry_plan

__all__ = ["Store"]

T = TypeVar("T")


class _TaskTransaction:
    """The current task's transaction, in a context variable of this Store
    (a task started inside a block sees it too: it copies the context)."""

    def __init__(self) -> None:
        self._var: contextvars.ContextVar[tuple[bytes | None, list[Mutation] | None]] = contextvars.ContextVar(
            "gds_store_transaction", default=(None, None)
        )

    @property
    def token(self) -> bytes | None:
        return self._var.get()[0]

    @token.setter
    def token(self, value: bytes | None) -> None:
        self._var.set((value, self._var.get()[1]))

    @property
    def block_mutations(self) -> list[Mutation] | None:
        return self._var.get()[1]

    @block_mutations.setter
    def block_mutations(self, value: list[Mutation] | None) -> None:
        self._var.set((self._var.get()[0], value))


class Store(StoreCore):
    """``gds_counter.Store``, awaited: ``await store.upsert(book)``,
    ``await store.fetch_all("SELECT * FROM Book")``, ``async with
    store.transaction():``. ``gateway``: an async gateway
    (``aio.open_gateway``) or a URL; None: the shared default."""

    def __init__(
        self,
        kind_or_schema: "str | Schema | type[Entity]",
        gateway: AsyncGateway | str | None = None,
        *,
        namespace: str | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        super().__init__(
            kind_or_schema, resolve_gateway(gateway), namespace=namespace, retry=retry, slot=_TaskTransaction()
        )

    @property
    def gateway(self) -> AsyncGateway:
        gateway: AsyncGateway = self._gateway
        return gateway

    async def _run(self, planned: plan.Plan[T]) -> T:
        return await plan.arun(planned, self._gateway)

    # --- writes -----------------------------------------------------------

    async def upsert(self, entities: Entity | Iterable[Entity]) -> None:
        """Write entities (checked before anything is sent); allocated ids
        are written back to them."""
        await self._run(self._upsert(entities))

    async def insert(self, entities: Entity | Iterable[Entity]) -> None:
        """``upsert`` of entities that must not exist (``gds_counter.Store.insert``)."""
        await self._run(self._upsert(entities, Insert))

    async def update(self, entities: Entity | Iterable[Entity]) -> None:
        """``upsert`` of entities that must exist (``gds_counter.Store.update``)."""
        await self._run(self._upsert(entities, Update))

    async def increment(self, entity: Entity, name: str, amount: int | float = 1) -> int | float:
        """Add ``amount`` to ``name`` on the server (a transform, no read)
        and return the new value (``gds_counter.Store.increment``)."""
        return await self._run(self._increment(entity, name, amount))

    async def delete(self, entities: Entity | Key | Iterable[Entity | Key]) -> None:
        await self._run(self._delete(entities))

    # --- lookups -----------------------------------------------------------

    async def fetch_by_id(self, key_id: int | str, parent: Entity | Key | None = None) -> Entity | None:
        return (await self.fetch_by_ids([key_id], parent))[0]

    async def fetch_by_ids(
        self, key_ids: Sequence[int | str], parent: Entity | Key | None = None
    ) -> list[Entity | None]:
        """One batch lookup; results in input order, None for missing."""
        return await self._run(self._fetch_keys(self._ids_keys(key_ids, parent)))

    async def fetch_by_name(self, key_name: str, parent: Entity | Key | None = None) -> Entity | None:
        return (await self.fetch_by_names([key_name], parent))[0]

    async def fetch_by_names(self, key_names: Sequence[str], parent: Entity | Key | None = None) -> list[Entity | None]:
        return await self._run(self._fetch_keys(self._names_keys(key_names, parent)))

    async def fetch_by_keys(self, keys: Sequence[Key]) -> list[Entity | None]:
        return await self._run(self._fetch_keys(list(keys)))

    # --- queries -----------------------------------------------------------

    async def fetch_one(self, query: str | Query | None = None, bindings: Any = None) -> Entity | None:
        return await self._run(self._fetch_one(query, bindings))

    async def fetch_all(self, query: str | Query | None = None, bindings: Any = None) -> list[Entity]:
        """Every result, following all batches."""
        return await self._run(self._fetch_all(query, bindings))

    async def iter_all(self, query: str | Query | None = None, bindings: Any = None) -> AsyncIterator[Entity]:
        """Like fetch_all, but yields as batches arrive: ``async for``."""
        self._use(query, bindings)
        remaining = self._query.limit
        current: Query | None = self._query
        while current is not None:
            batch = await self._run(plan.run_query(current, transaction=self._read_token()))
            for raw in batch.entities:
                yield from_raw(raw, self._schema)
            if remaining is not None:
                remaining -= len(batch.entities)
            current = plan.next_batch(current, batch, remaining)

    async def fetch_page(self, page_size: int, offset: int | str | None = None) -> list[Entity]:
        """The next ``page_size`` results after the store's cursor (an int
        ``offset`` skips, a cursor string starts there)."""
        return await self._run(self._fetch_page(page_size, offset))

    async def fetch_entity_group(self, entity: Entity | Key) -> list[Entity]:
        """The entity and its descendants of this store's kind."""
        return await self._run(self._fetch_entity_group(entity))

    # --- aggregations ---------------------------------------------------------

    async def count(self, query: str | Query | None = None, bindings: Any = None, *, up_to: int | None = None) -> int:
        """How many results ``query`` has, counted by the server."""
        return await self._run(self._count(query, bindings, up_to=up_to))

    async def sum(self, name: str, query: str | Query | None = None, bindings: Any = None) -> int | float:
        return await self._run(self._sum(name, query, bindings))

    async def avg(self, name: str, query: str | Query | None = None, bindings: Any = None) -> float | None:
        return await self._run(self._avg(name, query, bindings))

    async def aggregate(self, query: str | AggregationQuery, bindings: Any = None) -> dict[str, Any]:
        return await self._run(self._aggregate(query, bindings))

    # --- transactions --------------------------------------------------------

    async def begin_transaction(self, cross_group: bool = False, *, read_only: bool = False) -> "Store":
        """php-gds semantics: reads until the next write use this
        transaction, and the next upsert or delete commits it."""
        return await self._run(self._begin_transaction(cross_group, read_only=read_only))

    @contextlib.asynccontextmanager
    async def transaction(self, *, read_only: bool = False) -> AsyncIterator["Store"]:
        """``async with store.transaction():`` reads see one snapshot, writes
        are buffered and committed on exit (``Contention`` if another writer
        changed what was read); any exception rolls back and is re-raised."""
        token = await self._run(self._open_block(read_only))
        try:
            yield self
        except BaseException:
            await self._run(self._abort_block(token))
            raise
        await self._run(self._close_block(token, read_only))

    async def run_in_transaction(
        self, work: Callable[["Store"], Awaitable[T]], *, retry: RetryPolicy | None = None
    ) -> T:
        """Await ``work(store)`` in a transaction, retried with backoff on
        conflict (``Contention`` when retries run out); ``work`` must be
        safe to repeat."""

        def attempt() -> plan.Plan[T]:
            token = yield from self._open_block(False)
            try:
                result = yield from plan.awaiting(lambda: work(self))
            except GeneratorExit:
                raise  # closed, not driven: nothing can be sent (``plan.in_transaction``)
            except BaseException:
                yield from self._abort_block(token)
                raise
            yield from self._close_block(token, False)
            return result

        return await self._run(
            retry_plan(
                attempt,
                retry or self._retry,
                what=f"transaction on {self._schema.kind}",
                on_retry=lambda n: self._gateway.stats.bump("retries"),
            )
        )
