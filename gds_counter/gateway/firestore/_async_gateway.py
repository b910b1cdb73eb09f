"""``AsyncFirestoreGateway``: the Firestore gateway on non-blocking I/O.

The same rules as ``FirestoreGateway``, none of them copied: the checks,
batching and transaction tokens are ``GatewayRules``' plans, awaited as
the async face of every gRPC asyncio gateway awaits them
(``gateway._async_rules``: one client per event loop); the requests and the
answers are ``FirestoreRequests``' plans; the retry predicate, the error
policy and the deadlines (``timeout``, ``set_deadline`` and the running
counter call's deadline) are the blocking gateway's. Only the transport
differs: google-cloud-firestore's generated ``FirestoreAsyncClient`` over
gRPC asyncio, retried by google-api-core's ``AsyncRetry``, so awaiting a
call never blocks the event loop.

Cancellation: a task cancelled while its RPC is in flight gets
``asyncio.CancelledError``; gRPC asyncio cancels the call on the client
(the server may already have applied a commit: nothing more is sent, and
the caller is never told that it was not stored). A cancelled transaction
is rolled back by the plan that began it, as the cancellation is thrown
into it (``plan.arun``), which frees Firestore's locks at once.
"""

from __future__ import annotations

import logging
from typing import Any

from google.api_core.retry import AsyncRetry

from gds_counter.gateway._async_rules import AsyncRules
from gds_counter.gateway._driven_hooks import AsyncPlannedHooks
from gds_counter.gateway.datastore import DEFAULT_ASYNC_RETRY
from gds_counter.gateway.firestore._requests import CAPABILITIES, AsyncTransport, FirestoreRequests

__all__ = ["AsyncFirestoreGateway"]

log = logging.getLogger("gds_counter.gateway.firestore")


class AsyncFirestoreGateway(FirestoreRequests, AsyncRules, AsyncPlannedHooks, AsyncTransport):
    """``FirestoreGateway``'s calls as coroutines, on gRPC asyncio.

    Arguments as for ``FirestoreGateway``; ``max_in_flight``: counter
    operations run at once per event loop (``gds_counter.aio``).
    ``await gateway.close()`` (or ``async with``) closes the channels. Its
    capabilities are Firestore's, known without a probe."""

    def __init__(
        self,
        project: str,
        database: str = "(default)",
        *,
        emulator_host: str | None = None,
        credentials: Any = None,
        timeout: float = 30.0,
        retry: AsyncRetry | None = DEFAULT_ASYNC_RETRY,
        max_in_flight: int = 64,
    ) -> None:
        self._configure(project, database, emulator_host, credentials, timeout, retry)
        super().__init__("", capabilities=CAPABILITIES)
        #: Counter operations at once per event loop (``counter.runtime.Runtime.in_flight_slot``).
        self.max_in_flight = max_in_flight

    def _new_client(self) -> Any:
        import grpc
        from google.cloud.firestore_v1.services.firestore import FirestoreAsyncClient
        from google.cloud.firestore_v1.services.firestore.transports import FirestoreGrpcAsyncIOTransport

        return self._make_client(FirestoreAsyncClient, FirestoreGrpcAsyncIOTransport, grpc.aio.insecure_channel)

    async def _send(self, call: str, method: str, request: Any, *, about: str, stream: bool = False,
                    idempotent_commit: bool = False, policy: str = "") -> Any:
        rpc = getattr(self._client(), method)

        async def attempt(seconds: float) -> Any:
            answer = await rpc(request=request, retry=None, timeout=seconds, metadata=self._metadata)
            return [item._pb async for item in answer] if stream else getattr(answer, "_pb", None)

        return await self._acall_rpc(
            call, attempt, self._final(call, about), idempotent_commit=idempotent_commit, policy=policy
        )
