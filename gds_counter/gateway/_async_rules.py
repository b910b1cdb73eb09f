"""``AsyncRules``: the public calls of an async gateway on gRPC asyncio, as
``GatewayRules``' plans awaited on its ``AsyncHooks``.

The async Datastore and Firestore gateways differ only in their requests
and their client; this is what they share: each public call runs the rule
plan with the async driver (``plan.arun``), the capability probe runs once
per event loop however many tasks ask, and the client is made on first use
in each running loop. A gRPC asyncio channel belongs to the event loop it
was made in, so one client per loop (dropped with it): a gateway made at
import time, or shared by tests that each run their own loop, works in all
of them. Nor does a channel survive ``fork()``: a child that goes on running
its parent's loop makes its own client (``_grpc_clients``).
"""

from __future__ import annotations

import abc
import asyncio
import logging
import weakref
from datetime import datetime
from typing import Any, Sequence, TypeVar

from gds_counter._process import forks
from gds_counter.gateway import plan
from gds_counter.gateway._grpc_clients import Owned, current
from gds_counter.gateway._hooks import AsyncHooks
from gds_counter.gateway._rules import GatewayRules
from gds_counter.gateway.base import TransactionState
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import CommitResult, Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity

__all__ = ["AsyncRules"]

log = logging.getLogger("gds_counter.gateway")

Self = TypeVar("Self", bound="AsyncRules")


class AsyncRules(GatewayRules, AsyncHooks[TransactionState]):
    """The public calls as coroutines over the async hooks (module
    docstring). A subclass makes its client (``_new_client``) and fills in
    the hooks. ``await gateway.close()`` (or ``async with``) closes the
    channels."""

    def __init__(self, namespace: str = "", *, capabilities: Capabilities | None = None) -> None:
        super().__init__(namespace, capabilities=capabilities)
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Owned[Any]] = weakref.WeakKeyDictionary()
        self._probe_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    def _abandon_clients(self) -> None:
        """(``GatewayRules._after_fork_in_child``) Every loop's client the
        parent made, abandoned: dropped here (by ``close`` or with its loop)
        its channel would be finalized in the child, where gRPC asyncio
        hangs or crashes."""
        forks.abandon(*(held.client for held in self._clients.values()))
        self._clients = weakref.WeakKeyDictionary()

    @abc.abstractmethod
    def _new_client(self) -> Any:
        """A client for the running event loop."""

    def _client(self) -> Any:
        """This event loop's client (made on first use in it)."""
        loop = asyncio.get_running_loop()
        held = self._clients.get(loop)
        if held is None or not forks.owned_here(held.owner):  # a loop a forked child goes on running
            held = self._clients[loop] = current(held, self._new_client, self, asyncio=True)
        return held.client

    # --- the public calls: GatewayRules' plans, awaited ---------------------------------

    _runs_rules = True

    async def lookup(self, keys: Sequence[Key], *, transaction: bytes | None = None) -> list[RawEntity | None]:
        return await plan.arun(self._plan_lookup(keys, transaction), self)

    async def run_query(self, query: Query, *, transaction: bytes | None = None) -> QueryResult:
        return await plan.arun(self._plan_run_query(query, transaction), self)

    async def run_aggregation(
        self, aggregation: AggregationQuery, *, transaction: bytes | None = None
    ) -> AggregationResult:
        return await plan.arun(self._plan_run_aggregation(aggregation, transaction), self)

    async def begin_transaction(self, *, read_only: bool = False, read_time: datetime | None = None) -> bytes:
        return await plan.arun(self._plan_begin(read_only, read_time), self)

    async def commit(self, mutations: Sequence[Mutation], *, transaction: bytes | None = None) -> CommitResult:
        return await plan.arun(self._plan_commit(mutations, transaction), self)

    async def rollback(self, transaction: bytes) -> None:
        await plan.arun(self._plan_rollback(transaction), self)

    async def allocate_ids(self, keys: Sequence[Key]) -> list[Key]:
        return await plan.arun(self._plan_allocate_ids(keys), self)

    async def reserve_ids(self, keys: Sequence[Key]) -> None:
        await plan.arun(self._plan_reserve_ids(keys), self)

    @property
    def capabilities(self) -> Capabilities | None:
        """What the server can do, once ``learn_capabilities()`` has probed
        it (None before), or known from the start."""
        return self._capabilities

    async def learn_capabilities(self) -> Capabilities:
        """What this gateway's server can do, learned on first use by the
        blocking gateway's probe (``GatewayRules._plan_probe``), awaited;
        concurrent callers in one loop wait for the one probe."""
        known = self._capabilities
        if known is not None:
            return known
        loop = asyncio.get_running_loop()
        lock = self._probe_locks.setdefault(loop, asyncio.Lock())
        async with lock:
            if self._capabilities is not None:
                return self._capabilities
            probing = self._probing.set(True)
            try:
                found = await plan.arun(self._plan_probe(), self)
            finally:
                self._probing.reset(probing)
            return self._learned(found)

    async def close(self) -> None:
        """Close this loop's channel (others close with their loops)."""
        clients = list(self._clients.items())
        self._clients.clear()
        for loop, held in clients:
            if loop is asyncio.get_running_loop() and forks.owned_here(held.owner):
                try:
                    await held.client.transport.close()
                except Exception:  # closing twice or a dead channel is not worth failing over
                    log.debug("closing the channel of %r failed", self, exc_info=True)

    async def __aenter__(self: Self) -> Self:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
