"""``DatastoreGateway``: the gateway hooks as blocking ``datastore_v1`` RPCs.

This module owns the transport: the GAPIC client (an insecure channel with no
credentials for an emulator, so nothing looks up Application Default
Credentials), one overall deadline per logical request with the retries of
``_retry`` inside it, and the protocol's follow-ups that a caller must never
see. The requests themselves (and those follow-ups: deferred lookup keys,
a partly skipped offset; aggregations as ``RunAggregationQuery``) are plans
in ``_requests``, shared with ``AsyncDatastoreGateway``; here they are sent
with the blocking GAPIC client.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from google.api_core.retry import Retry

from gds_counter.gateway._driven_hooks import BlockingPlannedHooks
from gds_counter.gateway._grpc_clients import BlockingClient
from gds_counter.gateway.base import BaseGateway, TransactionState
from gds_counter.gateway.datastore._requests import DatastoreRequests, Transport, final_error
from gds_counter.gateway.datastore._retry import DEFAULT_RETRY

# Logged under the package's name, as before the package was split by idea,
# so logging configuration that names it keeps matching.
log = logging.getLogger("gds_counter.gateway.datastore")


class DatastoreGateway(DatastoreRequests, BlockingClient, BlockingPlannedHooks, BaseGateway[TransactionState], Transport):
    """Gateway over Cloud Datastore / Firestore in Datastore mode.

    ``emulator_host`` (or ``DATASTORE_EMULATOR_HOST`` when it is None) points
    at an emulator over an insecure channel with no credentials; otherwise
    ``credentials`` or Application Default Credentials reach production.

    ``capabilities``: what the server can do, learned by one probe on first
    use (``BaseGateway.capabilities``), never assumed: the legacy Datastore
    emulator ignores transforms and masks, and a wrong guess would let a
    masked increment replace a shard.

    Thread-safe: one gateway may be shared by many threads (gRPC channels
    are), and a forked child may go on using its parent's (it opens a
    channel of its own: ``gateway._grpc_clients``).
    """

    def __init__(
        self,
        project: str,
        namespace: str = "",
        database: str = "",
        *,
        emulator_host: str | None = None,
        credentials: Any = None,
        timeout: float = 30.0,
        retry: Retry | None = DEFAULT_RETRY,
    ) -> None:
        self._configure(project, database, emulator_host, credentials, timeout, retry)
        super().__init__(namespace)
        self._open_client()
        log.debug(
            "DatastoreGateway project=%s database=%r namespace=%r emulator=%s",
            project, self.database, self.namespace, self.emulator_host,
        )

    def _new_client(self) -> Any:
        import grpc
        from google.cloud.datastore_v1.services.datastore import DatastoreClient
        from google.cloud.datastore_v1.services.datastore.transports import DatastoreGrpcTransport

        return self._make_client(DatastoreClient, DatastoreGrpcTransport, grpc.insecure_channel)

    # --- the hooks: the shared request plans, sent blocking -----------------------

    def _call(
        self, call: str, method: Callable[..., Any], request: Any, *, idempotent_commit: bool = False, policy: str = ""
    ) -> Any:
        """Send one logical request with the client's ``method``, the
        policy's retries and one overall deadline (``CallBudget._call_rpc``).
        ``policy`` names the call whose row of the policy table applies,
        when ``call`` has none of its own (an aggregation is a read like
        ``run_query``); errors still name ``call``."""
        return self._call_rpc(
            call,
            lambda seconds: self._sent(lambda left: method(request=request, retry=None, timeout=left), seconds),
            functools.partial(final_error, call=call, request=request), idempotent_commit=idempotent_commit,
            policy=policy,
        )

    def _send(self, call: str, request: Any, *, idempotent_commit: bool = False, policy: str = "") -> Any:
        return self._call(call, getattr(self._client(), call), request, idempotent_commit=idempotent_commit, policy=policy)

