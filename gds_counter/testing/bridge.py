"""A blocking face over an async gateway, for running blocking test suites
against the asyncio code.

``BlockingBridge(async_gateway)`` is a ``Gateway`` whose every call runs the
async gateway's coroutine on an event loop of its own (one thread), and
waits. Every conformance and counter test written for blocking gateways
then exercises ``gds_counter.aio``'s gateways unchanged: the async
Datastore and Firestore transports (gRPC asyncio, ``AsyncRetry``) and the embedded
engine's thread pool, with ``GatewayRules``' plans run by the async driver.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import datetime
from typing import Any, Awaitable, Sequence, TypeVar

from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import CommitResult, Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.stats import Stats
from gds_counter.gateway.values import RawEntity

__all__ = ["BlockingBridge", "bridge_to_async"]

R = TypeVar("R")


class BlockingBridge:
    """A blocking ``Gateway`` over an async one (see the module docstring).
    ``close()`` closes the async gateway in its loop, then ends the loop."""

    def __init__(self, gateway: Any) -> None:
        self.async_gateway = gateway
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="gds-bridge", daemon=True)
        self._thread.start()

    def __repr__(self) -> str:
        return f"BlockingBridge({self.async_gateway!r})"

    def run(self, coroutine: Awaitable[R]) -> R:
        """Run a coroutine on the bridge's loop and wait for its result."""

        async def wrapped() -> R:
            return await coroutine

        return asyncio.run_coroutine_threadsafe(wrapped(), self._loop).result()

    @property
    def stats(self) -> Stats:
        stats: Stats = self.async_gateway.stats
        return stats

    @property
    def namespace(self) -> str:
        namespace: str = self.async_gateway.namespace
        return namespace

    @property
    def capabilities(self) -> Capabilities:
        return self.run(self.async_gateway.learn_capabilities())

    def lookup(self, keys: Sequence[Key], *, transaction: bytes | None = None) -> list[RawEntity | None]:
        return self.run(self.async_gateway.lookup(keys, transaction=transaction))

    def run_query(self, query: Query, *, transaction: bytes | None = None) -> QueryResult:
        return self.run(self.async_gateway.run_query(query, transaction=transaction))

    def run_aggregation(self, aggregation: AggregationQuery, *, transaction: bytes | None = None) -> AggregationResult:
        return self.run(self.async_gateway.run_aggregation(aggregation, transaction=transaction))

    def begin_transaction(self, *, read_only: bool = False, read_time: datetime | None = None) -> bytes:
        return self.run(self.async_gateway.begin_transaction(read_only=read_only, read_time=read_time))

    def commit(self, mutations: Sequence[Mutation], *, transaction: bytes | None = None) -> CommitResult:
        return self.run(self.async_gateway.commit(mutations, transaction=transaction))

    def rollback(self, transaction: bytes) -> None:
        self.run(self.async_gateway.rollback(transaction))

    def allocate_ids(self, keys: Sequence[Key]) -> list[Key]:
        return self.run(self.async_gateway.allocate_ids(keys))

    def reserve_ids(self, keys: Sequence[Key]) -> None:
        self.run(self.async_gateway.reserve_ids(keys))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self.run(self.async_gateway.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop.close()


def bridge_to_async(blocking: Any) -> BlockingBridge:
    """A ``BlockingBridge`` over the async twin of ``blocking`` (the same
    storage: the emulator, namespace and project, or the same embedded
    database); closing the bridge leaves ``blocking`` open."""
    from gds_counter.aio import async_twin

    return BlockingBridge(async_twin(blocking, owns=False))
