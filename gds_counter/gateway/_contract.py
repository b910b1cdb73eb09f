"""What a gateway is, to the code above it: the ``Gateway`` protocol (and
its asyncio twin, ``AsyncGateway``), Datastore's limit on one lookup, and
the state a gateway keeps of one open transaction.

Types only, no rules: the rules every backend shares are
``gateway._rules.GatewayRules``; ``gateway.base.BaseGateway`` runs them on
a blocking backend's hooks.
"""

from __future__ import annotations

import inspect
from datetime import datetime
from typing import Protocol, Sequence, runtime_checkable

import attrs
from typing_extensions import TypeIs

from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import CommitResult, Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.stats import Stats
from gds_counter.gateway.values import RawEntity

__all__ = ["MAX_KEYS_PER_LOOKUP", "AsyncGateway", "Gateway", "TransactionState", "is_gateway"]

#: Datastore's limit on the keys of one lookup.
MAX_KEYS_PER_LOOKUP = 1000

@runtime_checkable
class Gateway(Protocol):
    """What every storage backend offers; ``BaseGateway`` implements it.

    * ``lookup`` returns one item per key, in input order, None for missing;
      any number of keys (split into legal batches).
    * ``commit`` applies the mutations of a transaction atomically (at most
      500). Without a transaction, one complete key named twice is refused
      with ``BadValueError`` before anything is written, as Datastore
      refuses it (a transaction applies such mutations in order). Without
      a transaction more than 500 mutations go in several commits of at
      most 500, each atomic on its own. With a transaction it
      raises ``Contention`` (and writes nothing) if another writer won; the
      transaction is used up either way (but for a commit interrupted or
      cancelled with no answer: its rollback still ends it). Incomplete
      keys get ids allocated and returned in the ``MutationResult``. A commit whose outcome is
      unknown raises ``CommitUnknown``: it must never be retried blindly.
    * ``begin_transaction`` returns an opaque token; passing it to lookup and
      run_query makes those reads part of the transaction. A token that is
      unknown, or already committed or rolled back, is a ``BadValueError``
      (``rollback`` of a finished transaction is a no-op: it is cleanup).
      ``read_time`` (an aware ``datetime``, read-only only): its reads see
      the database as it was then (``gateway._read_time``); a time older
      than the storage keeps is ``ReadTimeTooOld``.
    * ``run_query`` applies ``offset`` fully before it returns a batch, so a
      continuation from ``end_cursor`` never needs the offset again.
    * ``run_aggregation`` runs an ``AggregationQuery`` (``COUNT``,
      ``COUNT_UP_TO``, ``SUM``, ``AVG``) and returns one value per alias,
      with Datastore's rules (``gateway._aggregation``); in a transaction
      when given its token. A server without aggregations raises
      ``GatewayError`` (and its ``capabilities.aggregation`` is False).
    * ``capabilities`` says what the server can do, learned once.
    * Every call counts itself in ``stats``.
    """

    stats: Stats

    #: The namespace the Store uses when the caller names none.
    namespace: str

    @property
    def capabilities(self) -> Capabilities: ...

    def lookup(self, keys: Sequence[Key], *, transaction: bytes | None = None) -> list[RawEntity | None]: ...

    def run_query(self, query: Query, *, transaction: bytes | None = None) -> QueryResult: ...

    def run_aggregation(
        self, aggregation: AggregationQuery, *, transaction: bytes | None = None
    ) -> AggregationResult: ...

    def begin_transaction(self, *, read_only: bool = False, read_time: datetime | None = None) -> bytes: ...

    def commit(self, mutations: Sequence[Mutation], *, transaction: bytes | None = None) -> CommitResult: ...

    def rollback(self, transaction: bytes) -> None: ...

    def allocate_ids(self, keys: Sequence[Key]) -> list[Key]: ...

    def reserve_ids(self, keys: Sequence[Key]) -> None: ...

    def close(self) -> None: ...


#: What makes a gateway (``reserve_ids`` is optional: gateways written before it still are ones).
_MEMBERS = tuple(name for name in dir(Gateway) if not name.startswith("_") and name != "reserve_ids") + ("stats", "namespace")


def is_gateway(candidate: object) -> TypeIs[Gateway]:
    """``isinstance(candidate, Gateway)`` without reading any member: before
    Python 3.12 the protocol check evaluates every property, and evaluating
    ``capabilities`` probes the server."""
    return all(inspect.getattr_static(candidate, name, None) is not None for name in _MEMBERS)


@attrs.define
class TransactionState:
    """One open transaction: its token, and whether it may write. Backends
    subclass it to keep what they need (the embedded engine, what was read)."""

    token: bytes
    read_only: bool



@runtime_checkable
class AsyncGateway(Protocol):
    """What an async gateway offers: ``Gateway``'s calls, awaited
    (``learn_capabilities()`` for the ``capabilities`` property, which may
    need a probe)."""

    stats: Stats
    namespace: str

    async def learn_capabilities(self) -> Capabilities: ...

    async def lookup(self, keys: Sequence[Key], *, transaction: bytes | None = None) -> list[RawEntity | None]: ...

    async def run_query(self, query: Query, *, transaction: bytes | None = None) -> QueryResult: ...

    async def run_aggregation(
        self, aggregation: AggregationQuery, *, transaction: bytes | None = None
    ) -> AggregationResult: ...

    async def begin_transaction(self, *, read_only: bool = False, read_time: datetime | None = None) -> bytes: ...

    async def commit(self, mutations: Sequence[Mutation], *, transaction: bytes | None = None) -> CommitResult: ...

    async def rollback(self, transaction: bytes) -> None: ...

    async def allocate_ids(self, keys: Sequence[Key]) -> list[Key]: ...

    async def reserve_ids(self, keys: Sequence[Key]) -> None: ...

    async def close(self) -> None: ...
