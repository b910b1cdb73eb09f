"""``FaultyAsyncGateway``: gateway-level fault injection for the asyncio face.

The async twin of ``faults.FaultyGateway``: the same ``FaultInjector`` (the
same seeded draws, script, counts and ``paused()``), the same faults and the
same semantics -- ABORTED, UNAVAILABLE and RESOURCE_EXHAUSTED fail before
the call, so nothing is applied; DEADLINE_EXCEEDED makes the call, then
fails (a commit as ``CommitUnknown``) -- around an async gateway
(``aio.ThreadedGateway`` over the embedded engine, ``AsyncDatastoreGateway``).
Nothing is decided here: each call awaits the plan ``faults.FaultPlans``
writes once for both faces, against the wrapped async gateway. So a seed
makes the same faults fall on the same calls whichever face runs them.

Example::

    gateway = FaultyAsyncGateway(aio.async_twin(open_gateway("memory://")), {"commit": {ABORTED: 0.2}}, seed=7)
    counter = aio.CounterShardDS("post", 1, gateway=gateway)
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Mapping, Sequence

from gds_counter.aio import is_async_gateway
from gds_counter.errors import BadValueError
from gds_counter.gateway import plan
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import CommitResult, Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity
from gds_counter.testing.faults import FaultInjector, FaultPlans

__all__ = ["FaultyAsyncGateway"]


class FaultyAsyncGateway(FaultPlans):
    """An async gateway that fails on purpose (see the module docstring);
    everything not a call (``stats``, ``namespace``, ``max_in_flight``, ...)
    is the inner gateway's. ``await close()`` closes the inner gateway."""

    def __init__(
        self,
        inner: Any,
        rates: Mapping[str, Mapping[str, float]] | None = None,
        *,
        seed: int | None = 0,
        injector: FaultInjector | None = None,
        script: Mapping[str, Sequence[str | None]] | None = None,
    ) -> None:
        if not is_async_gateway(inner):
            raise BadValueError(
                f"FaultyAsyncGateway wraps an async gateway (gds_counter.aio), got {type(inner).__name__} {inner!r}"
            )
        self._wrap_inner(inner, rates, seed, injector, script)

    async def learn_capabilities(self) -> Capabilities:
        # Not a fault point, as FaultyGateway.capabilities is not: the probe's
        # own calls go to the inner gateway.
        capabilities: Capabilities = await self.inner.learn_capabilities()
        return capabilities

    async def lookup(self, keys: Sequence[Key], *, transaction: bytes | None = None) -> list[RawEntity | None]:
        return await plan.arun(self._lookup_plan(keys, transaction), self.inner)

    async def run_query(self, query: Query, *, transaction: bytes | None = None) -> QueryResult:
        return await plan.arun(self._run_query_plan(query, transaction), self.inner)

    async def run_aggregation(
        self, aggregation: AggregationQuery, *, transaction: bytes | None = None
    ) -> AggregationResult:
        # Passed through without faults, as FaultyGateway does.
        result: AggregationResult = await self.inner.run_aggregation(aggregation, transaction=transaction)
        return result

    async def begin_transaction(self, *, read_only: bool = False, read_time: datetime | None = None) -> bytes:
        return await plan.arun(self._begin_plan(read_only, read_time), self.inner)

    async def commit(self, mutations: Sequence[Mutation], *, transaction: bytes | None = None) -> CommitResult:
        return await plan.arun(self._commit_plan(mutations, transaction), self.inner)

    async def rollback(self, transaction: bytes) -> None:
        await plan.arun(self._rollback_plan(transaction), self.inner)

    async def allocate_ids(self, keys: Sequence[Key]) -> list[Key]:
        return await plan.arun(self._allocate_ids_plan(keys), self.inner)

    async def reserve_ids(self, keys: Sequence[Key]) -> None:
        """Passed on without faults (not one of ``CALLS``)."""
        await self.inner.reserve_ids(keys)

    async def close(self) -> None:
        await self.inner.close()
