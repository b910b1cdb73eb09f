"""``AsyncDatastoreGateway``: the Datastore gateway on non-blocking I/O.

The same rules as ``DatastoreGateway``, none of them copied: the checks,
batching, transaction tokens and capability probe are ``GatewayRules``'
plans, awaited as the async face of every gRPC asyncio gateway awaits them
(``gateway._async_rules``: one client per event loop), the requests and
their follow-ups are ``DatastoreRequests``' plans, the retry predicate and
error translation are ``_retry``'s. Only the transport differs:
google-cloud-datastore's generated ``DatastoreAsyncClient`` over gRPC
asyncio, retried by google-api-core's ``AsyncRetry`` (backoff with jitter,
the whole call bounded by ``timeout``: ``_budget``), so awaiting a call
never blocks the event loop.
"""

from __future__ import annotations

import functools
from typing import Any

from google.api_core.retry import AsyncRetry

from gds_counter.gateway._async_rules import AsyncRules
from gds_counter.gateway._driven_hooks import AsyncPlannedHooks
from gds_counter.gateway.datastore._requests import AsyncTransport, DatastoreRequests, final_error
from gds_counter.gateway.datastore._retry import DEFAULT_ASYNC_RETRY

__all__ = ["AsyncDatastoreGateway"]


class AsyncDatastoreGateway(DatastoreRequests, AsyncRules, AsyncPlannedHooks, AsyncTransport):
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
        #: Counter operations at once per event loop (``counter.runtime.Runtime.in_flight_slot``).
        self.max_in_flight = max_in_flight

    # --- the transport ------------------------------------------------------------

    def _new_client(self) -> Any:
        import grpc
        from google.cloud.datastore_v1.services.datastore.async_client import DatastoreAsyncClient
        from google.cloud.datastore_v1.services.datastore.transports import DatastoreGrpcAsyncIOTransport

        return self._make_client(DatastoreAsyncClient, DatastoreGrpcAsyncIOTransport, grpc.aio.insecure_channel)

    async def _send(self, call: str, request: Any, *, idempotent_commit: bool = False, policy: str = "") -> Any:
        """Send one logical request with the policy's retries and one overall
        deadline (``CallBudget._acall_rpc``)."""
        method = getattr(self._client(), call)
        return await self._acall_rpc(
            call, lambda seconds: method(request=request, retry=None, timeout=seconds),
            functools.partial(final_error, call=call, request=request), idempotent_commit=idempotent_commit,
            policy=policy,
        )
