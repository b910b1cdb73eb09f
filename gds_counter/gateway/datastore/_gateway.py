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

import logging
import time
from typing import Any, Callable

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry

from gds_counter.gateway import plan
from gds_counter.gateway.base import BaseGateway, TransactionState
from gds_counter.gateway.datastore._requests import DatastoreRequests, Transport, final_error, retry_logger
from gds_counter.gateway.datastore._retry import DEFAULT_RETRY
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity

# Logged under the package's name, as before the package was split by idea,
# so logging configuration that names it keeps matching.
log = logging.getLogger("gds_counter.gateway.datastore")


class DatastoreGateway(DatastoreRequests, BaseGateway[TransactionState], Transport):
    """Gateway over Cloud Datastore / Firestore in Datastore mode.

    ``emulator_host`` (or ``DATASTORE_EMULATOR_HOST`` when it is None) points
    at an emulator over an insecure channel with no credentials; otherwise
    ``credentials`` or Application Default Credentials reach production.

    ``capabilities``: what the server can do, learned by one probe on first
    use (``BaseGateway.capabilities``), never assumed: the legacy Datastore
    emulator ignores transforms and masks, and a wrong guess would let a
    masked increment replace a shard.

    Thread-safe: one gateway may be shared by many threads (gRPC channels are).
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
        from google.cloud.datastore_v1.services.datastore import DatastoreClient
        from google.cloud.datastore_v1.services.datastore.transports import DatastoreGrpcTransport

        super().__init__(namespace)
        if self.emulator_host:
            import grpc

            # Emulators speak plaintext gRPC and need no credentials; a given
            # channel makes the transport skip the ADC lookup entirely.
            channel = grpc.insecure_channel(self.emulator_host)
            self._client = DatastoreClient(transport=DatastoreGrpcTransport(channel=channel))
        else:
            from google.auth.exceptions import DefaultCredentialsError

            try:
                self._client = DatastoreClient(credentials=credentials)
            except DefaultCredentialsError as exc:
                raise self._no_credentials(exc) from exc
        log.debug(
            "DatastoreGateway project=%s database=%r namespace=%r emulator=%s",
            project, self.database, self.namespace, self.emulator_host,
        )

    # --- plumbing ---------------------------------------------------------

    def _call(
        self, call: str, method: Callable[..., Any], request: Any, *, idempotent_commit: bool = False, policy: str = ""
    ) -> Any:
        """Send one logical request with the policy's retries and one overall
        deadline. ``policy`` names the call whose row of the policy table
        applies, when ``call`` has none of its own (an aggregation is a read
        like ``run_query``); errors still name ``call``."""
        rule = policy or call
        budget = self._budget(call)
        deadline = time.monotonic() + budget
        failures: list[BaseException] = []

        def attempt() -> Any:
            remaining = max(0.05, deadline - time.monotonic())
            try:
                return method(request=request, retry=None, timeout=remaining)
            except gexc.GoogleAPICallError as exc:
                failures.append(exc)
                raise

        on_error = retry_logger(self, call)

        try:
            retry = self._retry_for(rule, idempotent_commit, budget)
            if retry is None:
                return attempt()
            return retry(attempt, on_error=on_error)()
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            raise final_error(exc, failures, call=call, rule=rule, request=request) from exc

    # --- the hooks: the shared request plans, sent blocking -----------------------

    def _send(self, call: str, request: Any, *, idempotent_commit: bool = False, policy: str = "") -> Any:
        return self._call(call, getattr(self._client, call), request, idempotent_commit=idempotent_commit, policy=policy)

    def _lookup(self, keys: list[Key], txn: TransactionState | None) -> list[RawEntity | None]:
        return plan.run(self._lookup_plan(keys, txn), self)

    def _run_query(self, query: Query, txn: TransactionState | None) -> QueryResult:
        return plan.run(self._run_query_plan(query, txn), self)

    def _run_aggregation(self, aggregation: AggregationQuery, txn: TransactionState | None) -> AggregationResult:
        return plan.run(self._run_aggregation_plan(aggregation, txn), self)

    def _begin(self, read_only: bool) -> TransactionState:
        return plan.run(self._begin_plan(read_only), self)

    def _rollback(self, txn: TransactionState) -> None:
        plan.run(self._rollback_plan(txn), self)

    def _commit(self, chunk: list[Mutation], txn: TransactionState | None) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
        return plan.run(self._commit_plan(chunk, txn), self)

    def _allocate_ids(self, keys: list[Key]) -> list[Key]:
        return plan.run(self._allocate_ids_plan(keys), self)

    def _reserve_ids(self, keys: list[Key]) -> None:
        plan.run(self._reserve_ids_plan(keys), self)

    def close(self) -> None:
        try:
            self._client.transport.close()
        except Exception:  # closing twice or a dead channel is not worth failing over
            log.debug("closing the Datastore channel failed", exc_info=True)

