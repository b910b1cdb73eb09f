"""A backend's hooks, and the effects by which the shared rules call them.

The rules every backend shares (``GatewayRules``) are plans; where a rule
needs the backend to move bytes it asks for a hook, such as
``yield from ask(CommitHook(chunk, txn))``. A blocking backend implements
``BlockingHooks`` (``BaseGateway`` declares it, the embedded engine and the
Datastore gateway fill it in); the asyncio face's Datastore gateway
implements ``AsyncHooks``, the same hooks as coroutines. Each hook effect
performs itself on either (``perform``, ``aperform``): typed calls of the
hook methods, so mypy follows the rules down to the backend.

One thing is not checked statically: which ``TransactionState`` subclass a
backend keeps. The rules hand a hook back the state its own ``_begin``
made, so a backend sees only its own kind; the hooks are seen here as
taking any ``TransactionState`` (``_is_blocking``, ``_is_async``).
"""

from __future__ import annotations

import abc
import dataclasses
from datetime import datetime
from typing import Generic, TypeVar

from typing_extensions import TypeIs

from gds_counter.gateway._contract import TransactionState
from gds_counter.gateway._effects import Ask, R
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity

__all__ = [
    "AllocateIdsHook",
    "AsyncHooks",
    "BeginHook",
    "BlockingHooks",
    "CommitHook",
    "Hook",
    "LookupHook",
    "ReserveIdsHook",
    "RollbackHook",
    "RunAggregationHook",
    "RunQueryHook",
    "Written",
]

T = TypeVar("T", bound=TransactionState)

#: What a backend's commit hook answers for each mutation: the key (the
#: allocated one for an incomplete key) and the transform results as the
#: server sent them (None, or fewer than asked, when it sent none).
Written = list[tuple[Key | None, tuple[object, ...] | None]]


class BlockingHooks(abc.ABC, Generic[T]):
    """What a blocking backend implements: it only moves bytes."""

    @abc.abstractmethod
    def _lookup(self, keys: list[Key], txn: T | None) -> list[RawEntity | None]:
        """At most ``MAX_KEYS_PER_LOOKUP`` distinct complete keys, in order."""

    @abc.abstractmethod
    def _run_query(self, query: Query, txn: T | None) -> QueryResult:
        """One batch; limit and offset are already checked."""

    @abc.abstractmethod
    def _run_aggregation(self, aggregation: AggregationQuery, txn: T | None) -> AggregationResult:
        """A checked aggregation."""

    @abc.abstractmethod
    def _begin(self, read_only: bool, read_time: datetime | None = None) -> T:
        """Start a transaction on the server and describe it; ``read_time``
        (checked, read-only only): its reads see the data as it was then."""

    @abc.abstractmethod
    def _commit(self, mutations: list[Mutation], txn: T | None) -> Written:
        """At most 500 checked mutations, atomically (``Written``)."""

    @abc.abstractmethod
    def _rollback(self, txn: T) -> None:
        """End an open transaction on the server without writing."""

    @abc.abstractmethod
    def _allocate_ids(self, keys: list[Key]) -> list[Key]:
        """At most 500 incomplete keys, completed."""

    @abc.abstractmethod
    def _reserve_ids(self, keys: list[Key]) -> None:
        """At most 500 complete keys with ids: never allocate those ids."""


class AsyncHooks(abc.ABC, Generic[T]):
    """``BlockingHooks``, awaited: what an async backend implements."""

    @abc.abstractmethod
    async def _lookup(self, keys: list[Key], txn: T | None) -> list[RawEntity | None]: ...

    @abc.abstractmethod
    async def _run_query(self, query: Query, txn: T | None) -> QueryResult: ...

    @abc.abstractmethod
    async def _run_aggregation(self, aggregation: AggregationQuery, txn: T | None) -> AggregationResult: ...

    @abc.abstractmethod
    async def _begin(self, read_only: bool, read_time: datetime | None = None) -> T: ...

    @abc.abstractmethod
    async def _commit(self, mutations: list[Mutation], txn: T | None) -> Written: ...

    @abc.abstractmethod
    async def _rollback(self, txn: T) -> None: ...

    @abc.abstractmethod
    async def _allocate_ids(self, keys: list[Key]) -> list[Key]: ...

    @abc.abstractmethod
    async def _reserve_ids(self, keys: list[Key]) -> None: ...


def _is_blocking(backend: object) -> TypeIs[BlockingHooks[TransactionState]]:
    return isinstance(backend, BlockingHooks)


def _is_async(backend: object) -> TypeIs[AsyncHooks[TransactionState]]:
    return isinstance(backend, AsyncHooks)


class Hook(Ask[R]):
    """One backend hook, answered with an ``R``: performed on the gateway
    whose rule plan asked for it (the driver's)."""

    __slots__ = ()

    def perform(self, backend: object) -> R:
        if not _is_blocking(backend):
            raise TypeError(f"{self!r} is a backend hook; {backend!r} has no blocking hooks")
        return self.call(backend)

    async def aperform(self, backend: object) -> R:
        if not _is_async(backend):
            raise TypeError(f"{self!r} is a backend hook; {backend!r} has no async hooks")
        return await self.acall(backend)

    def call(self, hooks: BlockingHooks[TransactionState]) -> R:
        raise NotImplementedError

    async def acall(self, hooks: AsyncHooks[TransactionState]) -> R:
        raise NotImplementedError


@dataclasses.dataclass(frozen=True, slots=True)
class LookupHook(Hook[list[RawEntity | None]]):
    keys: list[Key]
    txn: TransactionState | None

    def call(self, hooks: BlockingHooks[TransactionState]) -> list[RawEntity | None]:
        return hooks._lookup(self.keys, self.txn)

    async def acall(self, hooks: AsyncHooks[TransactionState]) -> list[RawEntity | None]:
        return await hooks._lookup(self.keys, self.txn)


@dataclasses.dataclass(frozen=True, slots=True)
class RunQueryHook(Hook[QueryResult]):
    query: Query
    txn: TransactionState | None

    def call(self, hooks: BlockingHooks[TransactionState]) -> QueryResult:
        return hooks._run_query(self.query, self.txn)

    async def acall(self, hooks: AsyncHooks[TransactionState]) -> QueryResult:
        return await hooks._run_query(self.query, self.txn)


@dataclasses.dataclass(frozen=True, slots=True)
class RunAggregationHook(Hook[AggregationResult]):
    aggregation: AggregationQuery
    txn: TransactionState | None

    def call(self, hooks: BlockingHooks[TransactionState]) -> AggregationResult:
        return hooks._run_aggregation(self.aggregation, self.txn)

    async def acall(self, hooks: AsyncHooks[TransactionState]) -> AggregationResult:
        return await hooks._run_aggregation(self.aggregation, self.txn)


@dataclasses.dataclass(frozen=True, slots=True)
class BeginHook(Hook[TransactionState]):
    read_only: bool
    read_time: datetime | None = None

    def call(self, hooks: BlockingHooks[TransactionState]) -> TransactionState:
        return hooks._begin(self.read_only, self.read_time)

    async def acall(self, hooks: AsyncHooks[TransactionState]) -> TransactionState:
        return await hooks._begin(self.read_only, self.read_time)


@dataclasses.dataclass(frozen=True, slots=True)
class CommitHook(Hook[Written]):
    mutations: list[Mutation]
    txn: TransactionState | None

    def call(self, hooks: BlockingHooks[TransactionState]) -> Written:
        return hooks._commit(self.mutations, self.txn)

    async def acall(self, hooks: AsyncHooks[TransactionState]) -> Written:
        return await hooks._commit(self.mutations, self.txn)


@dataclasses.dataclass(frozen=True, slots=True)
class RollbackHook(Hook[None]):
    txn: TransactionState

    def call(self, hooks: BlockingHooks[TransactionState]) -> None:
        hooks._rollback(self.txn)

    async def acall(self, hooks: AsyncHooks[TransactionState]) -> None:
        await hooks._rollback(self.txn)


@dataclasses.dataclass(frozen=True, slots=True)
class AllocateIdsHook(Hook[list[Key]]):
    keys: list[Key]

    def call(self, hooks: BlockingHooks[TransactionState]) -> list[Key]:
        return hooks._allocate_ids(self.keys)

    async def acall(self, hooks: AsyncHooks[TransactionState]) -> list[Key]:
        return await hooks._allocate_ids(self.keys)


@dataclasses.dataclass(frozen=True, slots=True)
class ReserveIdsHook(Hook[None]):
    keys: list[Key]

    def call(self, hooks: BlockingHooks[TransactionState]) -> None:
        hooks._reserve_ids(self.keys)

    async def acall(self, hooks: AsyncHooks[TransactionState]) -> None:
        await hooks._reserve_ids(self.keys)
