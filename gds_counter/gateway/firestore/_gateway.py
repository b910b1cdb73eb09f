"""``FirestoreGateway``: the gateway hooks as blocking Firestore (native
mode) RPCs, through google-cloud-firestore's GAPIC client.

The requests are ``_requests``' plans, shared with ``AsyncFirestoreGateway``;
here they are sent with the blocking ``FirestoreClient`` (an insecure
channel to an emulator, else credentials: ``FirestoreRequests._configure``),
one overall deadline per logical request with the policy's retries inside
it (``datastore.CallBudget``, through ``_errors``). Streaming RPCs
(``BatchGetDocuments``, ``RunQuery``, ``RunAggregationQuery``) are read to
their end inside one attempt, so a failure midway is retried as a whole read.
"""

from __future__ import annotations

import logging
from typing import Any

from google.api_core.retry import Retry

from gds_counter.gateway._driven_hooks import BlockingPlannedHooks
from gds_counter.gateway._grpc_clients import BlockingClient
from gds_counter.gateway.base import BaseGateway, TransactionState
from gds_counter.gateway.datastore import DEFAULT_RETRY
from gds_counter.gateway.firestore._requests import CAPABILITIES, FirestoreRequests, Transport

__all__ = ["CAPABILITIES", "FirestoreGateway"]

log = logging.getLogger("gds_counter.gateway.firestore")


class FirestoreGateway(FirestoreRequests, BlockingClient, BlockingPlannedHooks, BaseGateway[TransactionState], Transport):
    """Gateway over Cloud Firestore in native mode (or its emulator).

    ``emulator_host`` (or ``FIRESTORE_EMULATOR_HOST`` when it is None)
    points at an emulator; otherwise ``credentials`` or Application
    Default Credentials reach production. Native mode has no namespaces,
    so this gateway's namespace is ``""`` and a key in another one is a
    ``BadKeyError`` before anything is sent. Ids: ``FirestoreRequests``.

    Thread-safe: one gateway may be shared by many threads (gRPC channels
    are), and a forked child may go on using its parent's (it opens a
    channel of its own: ``gateway._grpc_clients``).
    """

    def __init__(
        self,
        project: str,
        database: str = "(default)",
        *,
        emulator_host: str | None = None,
        credentials: Any = None,
        timeout: float = 30.0,
        retry: Retry | None = DEFAULT_RETRY,
    ) -> None:
        self._configure(project, database, emulator_host, credentials, timeout, retry)
        super().__init__("", capabilities=CAPABILITIES)
        self._open_client()
        log.debug("FirestoreGateway project=%s database=%r emulator=%s", project, database, self.emulator_host)

    def _new_client(self) -> Any:
        import grpc
        from google.cloud.firestore_v1.services.firestore import FirestoreClient
        from google.cloud.firestore_v1.services.firestore.transports import FirestoreGrpcTransport

        return self._make_client(FirestoreClient, FirestoreGrpcTransport, grpc.insecure_channel)

    def _send(self, call: str, method: str, request: Any, *, about: str, stream: bool = False,
              idempotent_commit: bool = False, policy: str = "") -> Any:
        rpc = getattr(self._client(), method)

        def attempt(seconds: float) -> Any:  # a stream is read to its end inside the gate
            answer = rpc(request=request, retry=None, timeout=seconds, metadata=self._metadata)
            return [item._pb for item in answer] if stream else getattr(answer, "_pb", None)

        return self._call_rpc(call, lambda seconds: self._sent(attempt, seconds), self._final(call, about),
                              idempotent_commit=idempotent_commit, policy=policy)
