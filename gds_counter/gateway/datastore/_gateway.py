"""``DatastoreGateway``: the gateway hooks as ``datastore_v1`` RPCs.

This module owns the transport: the GAPIC client (an insecure channel with no
credentials for an emulator, so nothing looks up Application Default
Credentials), one overall deadline per logical request with the retries of
``_retry`` inside it, and the protocol's follow-ups that a caller must never
see: deferred lookup keys asked for again, and an offset the server skipped
only partly skipped to the end before a batch is returned. Aggregations go
out as ``RunAggregationQuery`` (the server's own, not the base's computation
from query rows). Protobufs come from ``_codec``.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.cloud.datastore_v1.types import datastore as _ds
from google.cloud.datastore_v1.types import query as _qry

from gds_counter.errors import BadValueError, Contention, GatewayError
from gds_counter.gateway.aggregation import billed_reads
from gds_counter.gateway.base import BaseGateway, TransactionState
from gds_counter.gateway.datastore._codec import Codec
from gds_counter.gateway.datastore._retry import DEFAULT_RETRY, error_message, should_retry, translate_error
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Mutation, Upsert
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity

# Logged under the package's name, as before the package was split by idea,
# so logging configuration that names it keeps matching.
log = logging.getLogger("gds_counter.gateway.datastore")

_QueryPb = _qry.Query.pb()
_BatchPb = _qry.QueryResultBatch.pb()


def _strip_scheme(host: str) -> str:
    for prefix in ("http://", "https://"):
        if host.startswith(prefix):
            return host[len(prefix):].rstrip("/")
    return host.rstrip("/")


class DatastoreGateway(BaseGateway[TransactionState]):
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
        if not project:
            raise BadValueError("DatastoreGateway needs a project id")
        if timeout <= 0:
            raise BadValueError(f"timeout must be positive, got {timeout!r}")
        from google.cloud.datastore_v1.services.datastore import DatastoreClient
        from google.cloud.datastore_v1.services.datastore.transports import DatastoreGrpcTransport

        super().__init__(namespace)
        self.project = project
        self.database = database or ""
        self.timeout = float(timeout)
        self._retry = retry.with_timeout(self.timeout) if retry is not None else None
        self._codec = Codec(self.project, self.database)

        host = emulator_host if emulator_host is not None else os.environ.get("DATASTORE_EMULATOR_HOST")
        self.emulator_host = _strip_scheme(host) if host else None
        if self.emulator_host:
            import grpc

            if credentials is not None:
                log.warning("credentials are ignored: talking to the emulator at %s", self.emulator_host)
            # Emulators speak plaintext gRPC and need no credentials; a given
            # channel makes the transport skip the ADC lookup entirely.
            channel = grpc.insecure_channel(self.emulator_host)
            self._client = DatastoreClient(transport=DatastoreGrpcTransport(channel=channel))
        else:
            self._client = DatastoreClient(credentials=credentials)
        log.debug(
            "DatastoreGateway project=%s database=%r namespace=%r emulator=%s",
            project, self.database, self.namespace, self.emulator_host,
        )

    def __repr__(self) -> str:
        where = f"emulator {self.emulator_host}" if self.emulator_host else "Cloud Datastore"
        return f"DatastoreGateway({self.project!r}, namespace={self.namespace!r}, database={self.database!r}, {where})"

    # --- plumbing ---------------------------------------------------------

    def _call(
        self, call: str, method: Callable[..., Any], request: Any, *, idempotent_commit: bool = False, policy: str = ""
    ) -> Any:
        """Send one logical request with the policy's retries and one overall
        deadline. ``policy`` names the call whose row of the policy table
        applies, when ``call`` has none of its own (an aggregation is a read
        like ``run_query``); errors still name ``call``."""
        rule = policy or call
        deadline = time.monotonic() + self.timeout
        failures: list[BaseException] = []

        def attempt() -> Any:
            remaining = max(0.05, deadline - time.monotonic())
            try:
                return method(request=request, retry=None, timeout=remaining)
            except gexc.GoogleAPICallError as exc:
                failures.append(exc)
                raise

        def on_error(exc: BaseException) -> None:
            self.stats.bump(f"retry.{call}")
            log.info("retrying %s after %s: %s", call, type(exc).__name__, error_message(exc))

        try:
            if self._retry is None:
                return attempt()
            retry = self._retry.with_predicate(
                lambda exc: should_retry(exc, call=rule, idempotent_commit=idempotent_commit)
            )
            return retry(attempt, on_error=on_error)()
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            final = exc.cause if isinstance(exc, gexc.RetryError) and exc.cause is not None else exc
            earlier = [e for e in failures if e is not final]
            error = translate_error(final, call=rule, earlier_attempts=earlier)
            if rule != call:
                error.args = (str(error).replace(rule, call, 1), *error.args[1:])
            raise error from exc

    # --- reads --------------------------------------------------------------

    def _read_options(self, txn: TransactionState | None) -> Any:
        options = _ds.ReadOptions.pb()()
        if txn is not None:
            options.transaction = txn.token
        return options

    def _lookup(self, keys: list[Key], txn: TransactionState | None) -> list[RawEntity | None]:
        found: dict[Key, RawEntity] = {}
        pending = keys
        while pending:
            request = _ds.LookupRequest.pb()(project_id=self.project, database_id=self.database)
            request.read_options.CopyFrom(self._read_options(txn))
            request.keys.extend(self._codec.key_to_pb(k) for k in pending)
            response = self._call("lookup", self._client.lookup, _ds.LookupRequest(request))._pb
            self._record("lookup", reads=len(pending))
            for result in response.found:
                entity = self._codec.entity_from_pb(result.entity)
                assert entity.key is not None
                found[entity.key] = entity
            # Datastore may answer only part of a big lookup; the rest
            # comes back as deferred keys to ask for again.
            pending = [self._codec.key_from_pb(k) for k in response.deferred]
            if pending:
                log.debug("lookup: following %d deferred keys", len(pending))
        return [found.get(key) for key in keys]

    def _run_query(self, query: Query, txn: TransactionState | None) -> QueryResult:
        """Run one batch of ``query``: natively as GQL when ``query.gql`` is set.

        Projection results are index values, as Datastore returns them (meaning
        18): a projected datetime comes back as integer microseconds since the
        epoch and a projected blob as a string. Only a schema can turn them
        back, so the Store does that, not this gateway.
        """
        request = _ds.RunQueryRequest.pb()(project_id=self.project, database_id=self.database)
        request.partition_id.CopyFrom(self._codec.partition(query.namespace))
        request.read_options.CopyFrom(self._read_options(txn))
        if query.gql is not None:
            request.gql_query.CopyFrom(self._codec.gql_to_pb(query))
        else:
            request.query.CopyFrom(self._codec.query_to_pb(query))
        while True:
            response = self._call("run_query", self._client.run_query, _ds.RunQueryRequest(request))._pb
            batch = response.batch
            self._record("run_query", reads=len(batch.entity_results))
            sent = request.query if request.HasField("query") else response.query
            left_to_skip = sent.offset - batch.skipped_results
            if (
                left_to_skip > 0
                and not batch.entity_results
                and batch.more_results == _BatchPb.NOT_FINISHED
            ):
                # The server skipped only part of the offset in this batch;
                # skip the rest before returning anything (protocol contract).
                resume = _QueryPb()
                resume.CopyFrom(sent)
                resume.offset = left_to_skip
                resume.start_cursor = batch.skipped_cursor or batch.end_cursor
                request.ClearField("gql_query")
                request.query.CopyFrom(resume)
                continue
            break
        entities = tuple(self._codec.entity_from_pb(r.entity) for r in batch.entity_results)
        return QueryResult(
            entities=entities,
            end_cursor=bytes(batch.end_cursor) or None,
            more_results=batch.more_results == _BatchPb.NOT_FINISHED,
        )

    def _run_aggregation(self, aggregation: AggregationQuery, txn: TransactionState | None) -> AggregationResult:
        """One ``RunAggregationQuery``, sent as a structured query (not the
        GQL text): that lets it carry a ``COUNT(*)`` of its own when the
        caller asked for none and there is room (five at most), because
        Datastore bills one entity read per started 1,000 index rows and
        only a count says how many rows there were. Without one (five
        aggregations, none a count) one read is recorded, the least.

        The legacy Datastore emulator does not implement the RPC: that is a
        ``GatewayError`` saying so (``capabilities.aggregation`` is False
        there, and nothing is sent once the probe has found it out).
        """
        known = self._capabilities
        if known is not None and not known.aggregation:
            raise GatewayError(f"{self!r} does not run aggregation queries (capabilities.aggregation is False); nothing was sent")
        aliases = aggregation.aliases()
        kinds = [a.kind for a in aggregation.aggregations]
        extra = None
        if "COUNT" not in kinds and ("SUM" in kinds or "AVG" in kinds) and len(kinds) < 5:
            extra = "gds_counter_rows"
            while extra in aliases:
                extra += "_"
        request = _ds.RunAggregationQueryRequest.pb()(project_id=self.project, database_id=self.database)
        request.partition_id.CopyFrom(self._codec.partition(aggregation.query.namespace))
        request.read_options.CopyFrom(self._read_options(txn))
        request.aggregation_query.CopyFrom(self._codec.aggregation_to_pb(aggregation, extra))
        try:
            response = self._call(
                "run_aggregation_query",
                self._client.run_aggregation_query,
                _ds.RunAggregationQueryRequest(request),
                policy="run_query",
            )._pb
        except GatewayError as exc:
            if isinstance(exc.__cause__, gexc.MethodNotImplemented):
                raise GatewayError(
                    f"{self!r} does not run aggregation queries: the server does not implement RunAggregationQuery "
                    "(the legacy Datastore emulator; the Firestore emulator in Datastore mode and Cloud Datastore do)"
                ) from exc
            raise
        results = response.batch.aggregation_results
        found = {name: self._codec.value_from_pb(pb)[0] for name, pb in results[0].aggregate_properties.items()} if results else {}
        missing = [alias for alias in aliases if alias not in found]
        if missing:
            raise GatewayError(f"run_aggregation_query: the server sent no value for {missing} (it sent {sorted(found)})")
        if "COUNT" in kinds:
            rows = found[aliases[kinds.index("COUNT")]]
        elif extra is not None:
            rows = found[extra]
        elif all(kind == "COUNT_UP_TO" for kind in kinds):
            rows = max(found[alias] for alias in aliases)
        else:
            rows = 0
        self._record("run_aggregation_query", reads=billed_reads(rows))
        return AggregationResult(tuple((alias, found[alias]) for alias in aliases))

    # --- transactions -------------------------------------------------------

    def _begin(self, read_only: bool) -> TransactionState:
        request = _ds.BeginTransactionRequest.pb()(project_id=self.project, database_id=self.database)
        if read_only:
            request.transaction_options.read_only.SetInParent()
        else:
            request.transaction_options.read_write.SetInParent()
        response = self._call(
            "begin_transaction", self._client.begin_transaction, _ds.BeginTransactionRequest(request)
        )._pb
        self._record("begin_transaction")
        return TransactionState(bytes(response.transaction), read_only)

    def _rollback(self, txn: TransactionState) -> None:
        request = _ds.RollbackRequest.pb()(
            project_id=self.project, database_id=self.database, transaction=txn.token
        )
        try:
            self._call("rollback", self._client.rollback, _ds.RollbackRequest(request))
        except (BadValueError, Contention) as exc:
            # Rollback is cleanup, often on an error path: a transaction the
            # server already ended must not hide the error being handled.
            log.debug("rollback of an already finished transaction ignored: %s", exc)
        finally:
            self._record("rollback")

    # --- writes ---------------------------------------------------------------

    def _commit(self, chunk: list[Mutation], txn: TransactionState | None) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
        request = _ds.CommitRequest.pb()(project_id=self.project, database_id=self.database)
        if txn is not None:
            request.mode = _ds.CommitRequest.pb().TRANSACTIONAL
            request.transaction = txn.token
        else:
            request.mode = _ds.CommitRequest.pb().NON_TRANSACTIONAL
        request.mutations.extend(self._codec.mutation_to_pb(m) for m in chunk)
        # Applying twice is harmless for a transaction (the server commits it
        # at most once) and for whole upserts/deletes of complete keys; not for
        # increments or key allocation.
        idempotent = txn is not None or all(
            isinstance(m, Delete) or (not m.transforms and m.entity.key is not None and not m.entity.key.is_partial)
            for m in chunk
        )
        response = self._call(
            "commit", self._client.commit, _ds.CommitRequest(request), idempotent_commit=idempotent
        )._pb
        upserts = sum(isinstance(m, Upsert) for m in chunk)
        self._record("commit", writes=upserts, deletes=len(chunk) - upserts)
        out: list[tuple[Key | None, tuple[Any, ...] | None]] = []
        for mutation, result in zip(chunk, response.mutation_results):
            if isinstance(mutation, Delete):
                out.append((mutation.key, None))
                continue
            key = self._codec.key_from_pb(result.key) if result.HasField("key") else mutation.entity.key
            values = tuple(self._codec.value_from_pb(v)[0] for v in result.transform_results)
            out.append((key, values or None))
        return out

    def _allocate_ids(self, keys: list[Key]) -> list[Key]:
        request = _ds.AllocateIdsRequest.pb()(project_id=self.project, database_id=self.database)
        request.keys.extend(self._codec.key_to_pb(k) for k in keys)
        response = self._call("allocate_ids", self._client.allocate_ids, _ds.AllocateIdsRequest(request))._pb
        self._record("allocate_ids")
        return [self._codec.key_from_pb(k) for k in response.keys]

    def close(self) -> None:
        try:
            self._client.transport.close()
        except Exception:  # closing twice or a dead channel is not worth failing over
            log.debug("closing the Datastore channel failed", exc_info=True)

