"""The gateway's calls as effects: one small typed class per call of the
``Gateway`` protocol, and the functions a plan calls them with.

``found = yield from lookup(keys, transaction=token)`` yields a ``Lookup``,
a ``GatewayCall[list[RawEntity | None]]``. Each call knows how to perform
itself on a blocking ``Gateway`` (``perform``) and on an ``AsyncGateway``
(``aperform``), typed methods that call the protocol's own methods, and
where a gateway's own rules for it are (``rules``: the ``GatewayRules``
plan, which the drivers run inline, in the same loop as the plan that
asked). So mypy follows a value from a plan's ``yield from commit(...)``
through the driver to the gateway's method and its rule plan, with no name
looked up at run time.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import ClassVar, Protocol, Sequence

from gds_counter.gateway._contract import AsyncGateway, Gateway
from gds_counter.gateway._effects import Ask, Plan, R, ask
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import CommitResult, Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity

__all__ = [
    "CALLS",
    "AllocateIds",
    "BeginTransaction",
    "Commit",
    "GatewayCall",
    "GetCapabilities",
    "Lookup",
    "ReserveIds",
    "Rollback",
    "RulePlans",
    "RunAggregation",
    "RunQuery",
    "allocate_ids",
    "begin_transaction",
    "capabilities",
    "commit",
    "lookup",
    "reserve_ids",
    "rollback",
    "run_aggregation",
    "run_query",
]


class RulePlans(Protocol):
    """A gateway's own rules for its calls, each a plan that yields the
    backend's hooks (``GatewayRules`` has them)."""

    def _plan_lookup(self, keys: Sequence[Key], transaction: bytes | None) -> Plan[list[RawEntity | None]]: ...

    def _plan_run_query(self, query: Query, transaction: bytes | None) -> Plan[QueryResult]: ...

    def _plan_run_aggregation(
        self, aggregation: AggregationQuery, transaction: bytes | None
    ) -> Plan[AggregationResult]: ...

    def _plan_begin(self, read_only: bool, read_time: datetime | None = None) -> Plan[bytes]: ...

    def _plan_commit(self, mutations: Sequence[Mutation], transaction: bytes | None) -> Plan[CommitResult]: ...

    def _plan_rollback(self, transaction: bytes) -> Plan[None]: ...

    def _plan_allocate_ids(self, keys: Sequence[Key]) -> Plan[list[Key]]: ...

    def _plan_reserve_ids(self, keys: Sequence[Key]) -> Plan[None]: ...


class GatewayCall(Ask[R]):
    """One call of the ``Gateway`` protocol, answered with an ``R``."""

    __slots__ = ()

    #: The ``Gateway`` member this call is. A gateway whose class or object
    #: has a method of its own under that name (a test's, a wrapper's) is
    #: called, not run inline (``GatewayRules.rule_plan``).
    method: ClassVar[str]

    def perform(self, gateway: Gateway) -> R:
        """Make the call on a blocking gateway."""
        raise NotImplementedError

    async def aperform(self, gateway: AsyncGateway) -> R:
        """Make the call on an async gateway."""
        raise NotImplementedError

    def rules(self, owner: RulePlans) -> Plan[R] | None:
        """``owner``'s rule plan for this call; None: it has none."""
        return None


@dataclasses.dataclass(frozen=True, slots=True)
class Lookup(GatewayCall[list[RawEntity | None]]):
    method: ClassVar[str] = "lookup"
    keys: list[Key]
    transaction: bytes | None = None

    def perform(self, gateway: Gateway) -> list[RawEntity | None]:
        return gateway.lookup(self.keys, transaction=self.transaction)

    async def aperform(self, gateway: AsyncGateway) -> list[RawEntity | None]:
        return await gateway.lookup(self.keys, transaction=self.transaction)

    def rules(self, owner: RulePlans) -> Plan[list[RawEntity | None]]:
        return owner._plan_lookup(self.keys, self.transaction)


@dataclasses.dataclass(frozen=True, slots=True)
class RunQuery(GatewayCall[QueryResult]):
    method: ClassVar[str] = "run_query"
    query: Query
    transaction: bytes | None = None

    def perform(self, gateway: Gateway) -> QueryResult:
        return gateway.run_query(self.query, transaction=self.transaction)

    async def aperform(self, gateway: AsyncGateway) -> QueryResult:
        return await gateway.run_query(self.query, transaction=self.transaction)

    def rules(self, owner: RulePlans) -> Plan[QueryResult]:
        return owner._plan_run_query(self.query, self.transaction)


@dataclasses.dataclass(frozen=True, slots=True)
class RunAggregation(GatewayCall[AggregationResult]):
    method: ClassVar[str] = "run_aggregation"
    aggregation: AggregationQuery
    transaction: bytes | None = None

    def perform(self, gateway: Gateway) -> AggregationResult:
        return gateway.run_aggregation(self.aggregation, transaction=self.transaction)

    async def aperform(self, gateway: AsyncGateway) -> AggregationResult:
        return await gateway.run_aggregation(self.aggregation, transaction=self.transaction)

    def rules(self, owner: RulePlans) -> Plan[AggregationResult]:
        return owner._plan_run_aggregation(self.aggregation, self.transaction)


@dataclasses.dataclass(frozen=True, slots=True)
class BeginTransaction(GatewayCall[bytes]):
    method: ClassVar[str] = "begin_transaction"
    read_only: bool = False
    read_time: datetime | None = None

    def perform(self, gateway: Gateway) -> bytes:
        return gateway.begin_transaction(read_only=self.read_only, read_time=self.read_time)

    async def aperform(self, gateway: AsyncGateway) -> bytes:
        return await gateway.begin_transaction(read_only=self.read_only, read_time=self.read_time)

    def rules(self, owner: RulePlans) -> Plan[bytes]:
        return owner._plan_begin(self.read_only, self.read_time)


@dataclasses.dataclass(frozen=True, slots=True)
class Commit(GatewayCall[CommitResult]):
    method: ClassVar[str] = "commit"
    mutations: list[Mutation]
    transaction: bytes | None = None

    def perform(self, gateway: Gateway) -> CommitResult:
        return gateway.commit(self.mutations, transaction=self.transaction)

    async def aperform(self, gateway: AsyncGateway) -> CommitResult:
        return await gateway.commit(self.mutations, transaction=self.transaction)

    def rules(self, owner: RulePlans) -> Plan[CommitResult]:
        return owner._plan_commit(self.mutations, self.transaction)


@dataclasses.dataclass(frozen=True, slots=True)
class Rollback(GatewayCall[None]):
    method: ClassVar[str] = "rollback"
    transaction: bytes

    def perform(self, gateway: Gateway) -> None:
        gateway.rollback(self.transaction)

    async def aperform(self, gateway: AsyncGateway) -> None:
        await gateway.rollback(self.transaction)

    def rules(self, owner: RulePlans) -> Plan[None]:
        return owner._plan_rollback(self.transaction)


@dataclasses.dataclass(frozen=True, slots=True)
class AllocateIds(GatewayCall[list[Key]]):
    method: ClassVar[str] = "allocate_ids"
    keys: list[Key]

    def perform(self, gateway: Gateway) -> list[Key]:
        return gateway.allocate_ids(self.keys)

    async def aperform(self, gateway: AsyncGateway) -> list[Key]:
        return await gateway.allocate_ids(self.keys)

    def rules(self, owner: RulePlans) -> Plan[list[Key]]:
        return owner._plan_allocate_ids(self.keys)


@dataclasses.dataclass(frozen=True, slots=True)
class ReserveIds(GatewayCall[None]):
    method: ClassVar[str] = "reserve_ids"
    keys: list[Key]

    def perform(self, gateway: Gateway) -> None:
        gateway.reserve_ids(self.keys)

    async def aperform(self, gateway: AsyncGateway) -> None:
        await gateway.reserve_ids(self.keys)

    def rules(self, owner: RulePlans) -> Plan[None]:
        return owner._plan_reserve_ids(self.keys)


@dataclasses.dataclass(frozen=True, slots=True)
class GetCapabilities(GatewayCall[Capabilities]):
    """The ``capabilities`` property; an async gateway answers it with
    ``learn_capabilities()``. No rule plan: the gateway learns them once."""

    method: ClassVar[str] = "capabilities"

    def perform(self, gateway: Gateway) -> Capabilities:
        return gateway.capabilities

    async def aperform(self, gateway: AsyncGateway) -> Capabilities:
        return await gateway.learn_capabilities()


#: The calls that have a rule plan (``GatewayCall.rules``).
CALLS: tuple[type[GatewayCall[object]], ...] = (
    Lookup, RunQuery, RunAggregation, BeginTransaction, Commit, Rollback, AllocateIds, ReserveIds,
)

_GET_CAPABILITIES = GetCapabilities()


# --- the calls a plan may make -----------------------------------------------------


def lookup(keys: Sequence[Key], *, transaction: bytes | None = None) -> Plan[list[RawEntity | None]]:
    return ask(Lookup(list(keys), transaction))


def run_query(query: Query, *, transaction: bytes | None = None) -> Plan[QueryResult]:
    return ask(RunQuery(query, transaction))


def run_aggregation(aggregation: AggregationQuery, *, transaction: bytes | None = None) -> Plan[AggregationResult]:
    return ask(RunAggregation(aggregation, transaction))


def begin_transaction(*, read_only: bool = False, read_time: datetime | None = None) -> Plan[bytes]:
    return ask(BeginTransaction(read_only, read_time))


def commit(mutations: Sequence[Mutation], *, transaction: bytes | None = None) -> Plan[CommitResult]:
    return ask(Commit(list(mutations), transaction))


def rollback(transaction: bytes) -> Plan[None]:
    return ask(Rollback(transaction))


def allocate_ids(keys: Sequence[Key]) -> Plan[list[Key]]:
    return ask(AllocateIds(list(keys)))


def reserve_ids(keys: Sequence[Key]) -> Plan[None]:
    return ask(ReserveIds(list(keys)))


def capabilities() -> Plan[Capabilities]:
    """The gateway's capabilities (learned by a probe the first time)."""
    return ask(_GET_CAPABILITIES)
