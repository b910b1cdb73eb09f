"""``ThreadedGateway``: a blocking gateway behind a bounded thread pool, for
the asyncio face.

SQLite has no asynchronous I/O, so the embedded engine cannot be made
non-blocking; instead each of its calls runs in a worker thread of a pool
this gateway owns (at most ``max_workers`` calls at once; the rest wait
their turn without blocking anything), and the event loop only awaits the
result. The blocking gateway keeps every rule (checks, batching, tokens,
capabilities), so the answers are exactly the blocking API's.

The pool is a ``ForkSafePool``: a forked child gets threads of its own, and
never runs (nor waits for) the calls its parent had queued.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from datetime import datetime
from typing import Any, Callable, Sequence, TypeVar

from gds_counter.aio._pool import ForkSafePool
from gds_counter.errors import BadValueError
from gds_counter.gateway.base import Gateway, is_gateway
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import CommitResult, Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.stats import Stats
from gds_counter.gateway.values import RawEntity

__all__ = ["DEFAULT_WORKERS", "ThreadedGateway"]

R = TypeVar("R")

#: Worker threads per gateway: SQLite writes one at a time anyway, and a
#: few readers beside a writer keep the pool busy without a thread per task.
DEFAULT_WORKERS = 8


class ThreadedGateway:
    """The async gateway interface over a blocking ``Gateway`` (the
    embedded engine), each call in a worker of a bounded pool owned here
    (``max_workers`` threads; ``max_in_flight`` counter operations at once,
    default four per worker).
    ``close()`` (awaited) ends the pool and closes the blocking gateway
    when this gateway owns it (``owns=True``, as ``aio.open_gateway``
    makes it)."""

    def __init__(
        self, gateway: Gateway, *, max_workers: int = DEFAULT_WORKERS, owns: bool = False,
        max_in_flight: int | None = None,
    ) -> None:
        if not is_gateway(gateway):
            raise BadValueError(f"ThreadedGateway wraps a blocking gateway, got {type(gateway).__name__} {gateway!r}")
        if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
            raise BadValueError(f"max_workers must be a positive int, got {max_workers!r}")
        self.blocking = gateway
        #: Counter operations at once per event loop (``counter.runtime.Runtime.in_flight_slot``):
        #: enough to keep the pool busy, few enough to keep the loop free.
        self.max_in_flight = max_in_flight or 4 * max_workers
        self._owns = owns
        where = getattr(gateway, "path", None) or repr(gateway)
        self._pool = ForkSafePool(max_workers, name=f"the async gateway over {where}")
        self._probed = False

    def __repr__(self) -> str:
        return f"ThreadedGateway({self.blocking!r})"

    @property
    def stats(self) -> Stats:
        return self.blocking.stats

    @property
    def namespace(self) -> str:
        return self.blocking.namespace

    async def _in_pool(self, function: Callable[..., R], *args: Any, **kwargs: Any) -> R:
        # The caller's context goes along, as asyncio.to_thread does it.
        context = contextvars.copy_context()
        call = functools.partial(context.run, function, *args, **kwargs)
        return await self._pool.run(call)

    async def learn_capabilities(self) -> Capabilities:
        """The blocking gateway's capabilities: probed in the pool the first
        time; once known, its property answers without I/O (and with what
        it learned since), so asking costs the loop no thread hop."""
        if self._probed:
            return self.blocking.capabilities
        capabilities = await self._in_pool(lambda: self.blocking.capabilities)
        self._probed = True
        return capabilities

    async def lookup(self, keys: Sequence[Key], *, transaction: bytes | None = None) -> list[RawEntity | None]:
        return await self._in_pool(self.blocking.lookup, keys, transaction=transaction)

    async def run_query(self, query: Query, *, transaction: bytes | None = None) -> QueryResult:
        return await self._in_pool(self.blocking.run_query, query, transaction=transaction)

    async def run_aggregation(
        self, aggregation: AggregationQuery, *, transaction: bytes | None = None
    ) -> AggregationResult:
        return await self._in_pool(self.blocking.run_aggregation, aggregation, transaction=transaction)

    async def begin_transaction(self, *, read_only: bool = False, read_time: datetime | None = None) -> bytes:
        return await self._in_pool(self.blocking.begin_transaction, read_only=read_only, read_time=read_time)

    async def commit(self, mutations: Sequence[Mutation], *, transaction: bytes | None = None) -> CommitResult:
        return await self._in_pool(self.blocking.commit, mutations, transaction=transaction)

    async def rollback(self, transaction: bytes) -> None:
        await self._in_pool(self.blocking.rollback, transaction)

    async def allocate_ids(self, keys: Sequence[Key]) -> list[Key]:
        return await self._in_pool(self.blocking.allocate_ids, keys)

    async def reserve_ids(self, keys: Sequence[Key]) -> None:
        await self._in_pool(self.blocking.reserve_ids, keys)

    async def close(self) -> None:
        """End the pool (after the calls in it) and, if owned, the gateway."""
        await asyncio.get_running_loop().run_in_executor(None, self._close_now)

    def _close_now(self) -> None:
        self._pool.shutdown(wait=True)
        if self._owns:
            self.blocking.close()

    async def __aenter__(self) -> "ThreadedGateway":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
