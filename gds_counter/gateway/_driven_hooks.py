"""A backend's hooks written once as plans, run by either driver.

A gateway whose requests are plans (``gateway.plan``: build the request,
ask for it to be sent, read the answer), as the Datastore and Firestore
gateways' are, gets its hooks here: ``BlockingPlannedHooks`` runs each plan
with the blocking driver, ``AsyncPlannedHooks`` awaits it with the async
one; the plans and the transport that performs their sends are the
gateway's own.
"""

from __future__ import annotations

import abc
import logging
from datetime import datetime
from typing import Any, Callable

from gds_counter.errors import BadValueError, Contention
from gds_counter.gateway import plan
from gds_counter.gateway._contract import TransactionState
from gds_counter.gateway._hooks import AsyncHooks, BlockingHooks, Written
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity

__all__ = ["AsyncPlannedHooks", "BlockingPlannedHooks", "HookPlans", "rollback_plan"]

log = logging.getLogger("gds_counter.gateway")


class HookPlans(abc.ABC):
    """The hooks' plans (``BlockingHooks``' contracts)."""

    @abc.abstractmethod
    def _lookup_plan(self, keys: list[Key], txn: TransactionState | None) -> plan.Plan[list[RawEntity | None]]: ...

    @abc.abstractmethod
    def _run_query_plan(self, query: Query, txn: TransactionState | None) -> plan.Plan[QueryResult]: ...

    @abc.abstractmethod
    def _run_aggregation_plan(
        self, aggregation: AggregationQuery, txn: TransactionState | None
    ) -> plan.Plan[AggregationResult]: ...

    @abc.abstractmethod
    def _begin_plan(self, read_only: bool, read_time: datetime | None = None) -> plan.Plan[TransactionState]: ...

    @abc.abstractmethod
    def _rollback_plan(self, txn: TransactionState) -> plan.Plan[None]: ...

    @abc.abstractmethod
    def _commit_plan(self, chunk: list[Mutation], txn: TransactionState | None) -> plan.Plan[Written]: ...

    @abc.abstractmethod
    def _allocate_ids_plan(self, keys: list[Key]) -> plan.Plan[list[Key]]: ...

    @abc.abstractmethod
    def _reserve_ids_plan(self, keys: list[Key]) -> plan.Plan[None]: ...

    def _driven(self) -> Any:
        """The gateway the drivers perform the plans' sends on: this one."""
        return self


class BlockingPlannedHooks(HookPlans, BlockingHooks[TransactionState]):
    """The hooks: the plans, run blocking."""

    def _lookup(self, keys: list[Key], txn: TransactionState | None) -> list[RawEntity | None]:
        return plan.run(self._lookup_plan(keys, txn), self._driven())

    def _run_query(self, query: Query, txn: TransactionState | None) -> QueryResult:
        return plan.run(self._run_query_plan(query, txn), self._driven())

    def _run_aggregation(self, aggregation: AggregationQuery, txn: TransactionState | None) -> AggregationResult:
        return plan.run(self._run_aggregation_plan(aggregation, txn), self._driven())

    def _begin(self, read_only: bool, read_time: datetime | None = None) -> TransactionState:
        return plan.run(self._begin_plan(read_only, read_time), self._driven())

    def _rollback(self, txn: TransactionState) -> None:
        plan.run(self._rollback_plan(txn), self._driven())

    def _commit(self, chunk: list[Mutation], txn: TransactionState | None) -> Written:
        return plan.run(self._commit_plan(chunk, txn), self._driven())

    def _allocate_ids(self, keys: list[Key]) -> list[Key]:
        return plan.run(self._allocate_ids_plan(keys), self._driven())

    def _reserve_ids(self, keys: list[Key]) -> None:
        plan.run(self._reserve_ids_plan(keys), self._driven())



class AsyncPlannedHooks(HookPlans, AsyncHooks[TransactionState]):
    """The hooks: the plans, awaited."""

    async def _lookup(self, keys: list[Key], txn: TransactionState | None) -> list[RawEntity | None]:
        return await plan.arun(self._lookup_plan(keys, txn), self._driven())

    async def _run_query(self, query: Query, txn: TransactionState | None) -> QueryResult:
        return await plan.arun(self._run_query_plan(query, txn), self._driven())

    async def _run_aggregation(self, aggregation: AggregationQuery, txn: TransactionState | None) -> AggregationResult:
        return await plan.arun(self._run_aggregation_plan(aggregation, txn), self._driven())

    async def _begin(self, read_only: bool, read_time: datetime | None = None) -> TransactionState:
        return await plan.arun(self._begin_plan(read_only, read_time), self._driven())

    async def _rollback(self, txn: TransactionState) -> None:
        await plan.arun(self._rollback_plan(txn), self._driven())

    async def _commit(self, chunk: list[Mutation], txn: TransactionState | None) -> Written:
        return await plan.arun(self._commit_plan(chunk, txn), self._driven())

    async def _allocate_ids(self, keys: list[Key]) -> list[Key]:
        return await plan.arun(self._allocate_ids_plan(keys), self._driven())

    async def _reserve_ids(self, keys: list[Key]) -> None:
        await plan.arun(self._reserve_ids_plan(keys), self._driven())


def rollback_plan(send: plan.Plan[Any], record: Callable[[str], None]) -> plan.Plan[None]:
    """A rollback hook's plan around its ``send``: a transaction the server
    already ended (refused as invalid, or aborted) is ignored, because a
    rollback is cleanup, often on an error path, and must not hide the
    error being handled; the RPC is ``record``ed either way."""
    try:
        yield from send
    except (BadValueError, Contention) as exc:
        log.debug("rollback of an already finished transaction ignored: %s", exc)
    finally:
        record("rollback")
