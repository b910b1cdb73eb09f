"""``AsyncDatastoreGateway``: the Datastore gateway on non-blocking I/O.

The same rules as ``DatastoreGateway``, none of them copied: the checks,
batching, transaction tokens and capability probe are ``GatewayRules``'
plans, the requests and their follow-ups are ``DatastoreRequests``' plans,
the retry predicate and error translation are ``_retry``'s. Only the
transport differs: google-cloud-datastore's generated ``DatastoreAsyncClient``
over gRPC asyncio, retried by google-api-core's ``AsyncRetry`` (backoff
with jitter, the whole call bounded by ``timeout``), so awaiting a call
never blocks the event loop.

A gRPC asyncio channel belongs to the event loop it was made in, so the
client is made on first use in each running loop (one per loop, dropped
with it): a gateway made at import time, or shared by tests that each run
their own loop, works in all of them.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from typing import Any, Sequence

from google.api_core import exceptions as gexc
from google.api_core.retry import AsyncRetry

from gds_counter.gateway import plan
from gds_counter.gateway._hooks import AsyncHooks
from gds_counter.gateway.base import TransactionState
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.datastore._requests import AsyncTransport, DatastoreRequests, final_error, retry_logger
from gds_counter.gateway.datastore._retry import DEFAULT_ASYNC_RETRY
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import CommitResult, Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity

__all__ = ["AsyncDatastoreGateway"]

log = logging.getLogger("gds_counter.gateway.datastore")


class AsyncDatastoreGateway(DatastoreRequests, AsyncHooks[TransactionState], AsyncTransport):
    """``DatastoreGateway``'s calls as coroutines, on gRPC asyncio.

    Arguments as for ``DatastoreGateway``; ``max_in_flight``: counter
    operations run at once per event loop (``gds_counter.aio``). ``await gateway.close()`` (or
    ``async with``) closes the channels. ``learn_capabilities()`` probes the
    server once (the blocking gateway's ``capabilities`` property)."""

    def __init__(
        self,
        project: str,
        namespace: str = "",
        database: str = "",
        *,
        emulator_host: str | None = None,
        credentials: Any = None,
        timeout: float = 30.0,
        retry: AsyncRetry | None = DEFAULT_ASYNC_RETRY,
        max_in_flight: int = 64,
    ) -> None:
        self._configure(project, database, emulator_host, credentials, timeout, retry)
        super().__init__(namespace)
        self._credentials = credentials
        #: Counter operations at once per event loop (``counter.runtime.Runtime.in_flight_slot``).
        self.max_in_flight = max_in_flight
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()
        self._probe_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )

    # --- the transport ------------------------------------------------------------

    def _client(self) -> Any:
        """This event loop's client (made on first use in it)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            from google.cloud.datastore_v1.services.datastore.async_client import DatastoreAsyncClient
            from google.cloud.datastore_v1.services.datastore.transports import DatastoreGrpcAsyncIOTransport

            if self.emulator_host:
                import grpc

                # Plaintext and no credentials, as the blocking gateway: a
                # given channel makes the transport skip the ADC lookup.
                channel = grpc.aio.insecure_channel(self.emulator_host)
                client = DatastoreAsyncClient(transport=DatastoreGrpcAsyncIOTransport(channel=channel))
            else:
                from google.auth.exceptions import DefaultCredentialsError

                try:
                    client = DatastoreAsyncClient(credentials=self._credentials)
                except DefaultCredentialsError as exc:
                    raise self._no_credentials(exc) from exc
            self._clients[loop] = client
        return client

    async def _send(self, call: str, request: Any, *, idempotent_commit: bool = False, policy: str = "") -> Any:
        """Send one logical request with the policy's retries and one overall
        deadline (``DatastoreGateway._call``'s rules, awaited)."""
        rule = policy or call
        method = getattr(self._client(), call)
        budget = self._budget(call)
        deadline = time.monotonic() + budget
        failures: list[BaseException] = []

        async def attempt() -> Any:
            remaining = max(0.05, deadline - time.monotonic())
            try:
                return await method(request=request, retry=None, timeout=remaining)
            except gexc.GoogleAPICallError as exc:
                failures.append(exc)
                raise

        try:
            retry = self._retry_for(rule, idempotent_commit, budget)
            if retry is None:
                return await attempt()
            return await retry(attempt, on_error=retry_logger(self, call))()
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            raise final_error(exc, failures, call=call, rule=rule, request=request) from exc

    # --- the hooks: the shared request plans, awaited ------------------------------

    async def _lookup(self, keys: list[Key], txn: TransactionState | None) -> list[RawEntity | None]:
        return await plan.arun(self._lookup_plan(keys, txn), self)

    async def _run_query(self, query: Query, txn: TransactionState | None) -> QueryResult:
        return await plan.arun(self._run_query_plan(query, txn), self)

    async def _run_aggregation(self, aggregation: AggregationQuery, txn: TransactionState | None) -> AggregationResult:
        return await plan.arun(self._run_aggregation_plan(aggregation, txn), self)

    async def _begin(self, read_only: bool) -> TransactionState:
        return await plan.arun(self._begin_plan(read_only), self)

    async def _rollback(self, txn: TransactionState) -> None:
        await plan.arun(self._rollback_plan(txn), self)

    async def _commit(
        self, chunk: list[Mutation], txn: TransactionState | None
    ) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
        return await plan.arun(self._commit_plan(chunk, txn), self)

    async def _allocate_ids(self, keys: list[Key]) -> list[Key]:
        return await plan.arun(self._allocate_ids_plan(keys), self)

    async def _reserve_ids(self, keys: list[Key]) -> None:
        await plan.arun(self._reserve_ids_plan(keys), self)

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

    async def begin_transaction(self, *, read_only: bool = False) -> bytes:
        return await plan.arun(self._plan_begin(read_only), self)

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
        it (None before)."""
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
        for loop, client in clients:
            if loop is asyncio.get_running_loop():
                try:
                    await client.transport.close()
                except Exception:  # closing twice or a dead channel is not worth failing over
                    log.debug("closing the Datastore channel failed", exc_info=True)

    async def __aenter__(self) -> "AsyncDatastoreGateway":
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()
