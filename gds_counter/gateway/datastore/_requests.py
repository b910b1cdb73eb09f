"""The Datastore gateway's requests, written once for the blocking and the
async transport: each hook is a plan (``gateway.plan``) that builds the
``datastore_v1`` request, asks for it to be sent (``Send``, an effect
performed by the gateway's transport: ``Transport`` blocking,
``AsyncTransport`` awaited), and reads the response, including the protocol's follow-ups a caller must never
see (deferred lookup keys asked for again; an offset the server skipped
only partly skipped to the end before a batch is returned).

``DatastoreGateway`` sends with the blocking GAPIC client, ``AsyncDatastoreGateway``
with the generated ``DatastoreAsyncClient`` over gRPC asyncio; both under the
same retry and error policy (``_retry``). Protobufs come from ``_codec``.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import os
from datetime import datetime
from typing import Any, Callable

from google.api_core import exceptions as gexc
from google.cloud.datastore_v1.types import datastore as _ds
from google.cloud.datastore_v1.types import query as _qry

from gds_counter.errors import BadValueError, GatewayError, GDSError
from gds_counter.gateway import plan
from gds_counter.gateway._aggregation import billed_reads
from gds_counter.gateway._driven_hooks import rollback_plan
from gds_counter.gateway._effects import ask
from gds_counter.gateway._grpc_clients import gapic_client
from gds_counter.gateway._hooks import Hook
from gds_counter.gateway.base import GatewayRules, TransactionState
from gds_counter.gateway.datastore._budget import CallBudget
from gds_counter.gateway.datastore._codec import Codec
from gds_counter.gateway.datastore._retry import translate_error
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Insert, Mutation, Upsert
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity

__all__ = ["AsyncTransport", "DatastoreRequests", "Send", "Transport", "final_error", "strip_scheme"]

log = logging.getLogger("gds_counter.gateway.datastore")

_QueryPb = _qry.Query.pb()
_BatchPb = _qry.QueryResultBatch.pb()


def strip_scheme(host: str) -> str:
    for prefix in ("http://", "https://"):
        if host.startswith(prefix):
            return host[len(prefix):].rstrip("/")
    return host.rstrip("/")


class Transport(abc.ABC):
    """What sends a request, blocking (``DatastoreGateway``)."""

    @abc.abstractmethod
    def _send(self, call: str, request: Any, *, idempotent_commit: bool = False, policy: str = "") -> Any:
        """Send ``request`` as the RPC ``call`` (the client method of that
        name) under the retry policy's row for ``policy or call``; the
        response."""


class AsyncTransport(abc.ABC):
    """``Transport``, awaited (``AsyncDatastoreGateway``)."""

    @abc.abstractmethod
    async def _send(self, call: str, request: Any, *, idempotent_commit: bool = False, policy: str = "") -> Any: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Send(Hook[Any]):
    """The effect of sending one request (the response is a protobuf
    message, which google-cloud-datastore does not type)."""

    rpc: str
    request: Any
    idempotent_commit: bool = False
    policy: str = ""

    def perform(self, backend: object) -> Any:
        if not isinstance(backend, Transport):
            raise TypeError(f"{self.rpc}: {backend!r} has no blocking Datastore transport")
        return backend._send(self.rpc, self.request, idempotent_commit=self.idempotent_commit, policy=self.policy)

    async def aperform(self, backend: object) -> Any:
        if not isinstance(backend, AsyncTransport):
            raise TypeError(f"{self.rpc}: {backend!r} has no async Datastore transport")
        return await backend._send(self.rpc, self.request, idempotent_commit=self.idempotent_commit, policy=self.policy)


def _send(call: str, request: Any, *, idempotent_commit: bool = False, policy: str = "") -> plan.Plan[Any]:
    """Send ``request`` as the RPC ``call`` under the retry policy's row
    for ``policy or call``."""
    return ask(Send(call, request, idempotent_commit, policy))


def final_error(
    exc: BaseException, failures: list[BaseException], *, call: str, rule: str, request: Any
) -> GDSError:
    """The gds_counter error for a call whose retries ended in ``exc``
    (``failures``: every attempt's error), by the policy table; errors name
    ``call`` even when another call's row (``rule``) applied, and, unless the
    server refused the request (``BadValueError``: its words name what it
    refused), what ``request`` was about (``named_in``)."""
    final = exc.cause if isinstance(exc, gexc.RetryError) and exc.cause is not None else exc
    earlier = [e for e in failures if e is not final]
    error = translate_error(final, call=rule, earlier_attempts=earlier)
    text = str(error).replace(rule, call, 1) if rule != call else str(error)
    named = "" if isinstance(error, BadValueError) else named_in(request)  # (a refusal's own text names what it refused)
    if named:
        text = f"{text} [{named}]"
    error.args = (text, *error.args[1:])
    return error


#: How many keys an error lists before it says how many more there were.
NAMED_KEYS = 3


def named_in(request: Any) -> str:
    """What a request is about, for its error: the project (and database),
    and the keys it writes or reads, or the kind it queries. (An error that
    said only "Deadline Exceeded" named nothing a user could look up.)"""
    pb = getattr(request, "_pb", None)
    if pb is None:
        return ""
    names = [f"project {pb.project_id!r}"] + ([f"database {pb.database_id!r}"] if pb.database_id else [])
    keys: list[Any] = []
    if hasattr(pb, "mutations"):
        for mutation in pb.mutations:
            operation = mutation.WhichOneof("operation")
            keys.append(mutation.delete if operation == "delete" else getattr(mutation, operation).key)
    elif hasattr(pb, "keys"):
        keys = list(pb.keys)
    if keys:
        shown = ", ".join(_path(key) for key in keys[:NAMED_KEYS])
        more = f" and {len(keys) - NAMED_KEYS} more" if len(keys) > NAMED_KEYS else ""
        names.append(f"keys {shown}{more}")
    query = getattr(pb, "aggregation_query", None)
    query = query.nested_query if query is not None and query.HasField("nested_query") else getattr(pb, "query", None)
    if query is not None and query.kind:
        names.append(f"kind {query.kind[0].name!r}")
    return ", ".join(names)


def _path(key: Any) -> str:
    namespace = f"{key.partition_id.namespace_id!r}:" if key.partition_id.namespace_id else ""
    return namespace + "/".join(
        f"{element.kind}:{element.name!r}" if element.name else f"{element.kind}:{element.id}" for element in key.path
    )


class DatastoreRequests(CallBudget, GatewayRules):
    """The hooks of both Datastore gateways, as plans over ``_send``."""

    _log = log
    project: str
    database: str
    emulator_host: str | None
    _codec: Codec
    _retry: Any
    #: The credentials given (None: the emulator needs none, else Application Default Credentials).
    _credentials: Any

    def _own_project(self) -> str:
        return self.project

    def _configure(
        self, project: str, database: str, emulator_host: str | None, credentials: Any, timeout: float, retry: Any
    ) -> None:
        """Check and keep the settings both Datastore gateways take, the same
        way: the project, the database, the deadline every call shares (the
        retry policy gets it too), and the emulator (from the argument, else
        ``DATASTORE_EMULATOR_HOST``; credentials are then ignored, said in a
        warning that does not quote them)."""
        if not project:
            raise BadValueError(f"{type(self).__name__} needs a project id")
        if timeout <= 0:
            raise BadValueError(f"timeout must be positive, got {timeout!r}")
        self.project = project
        # "(default)" is how Firestore names the default database; the API takes only "" for it.
        self.database = "" if database in (None, "", "(default)") else database
        self._set_budget(timeout, retry)
        self._codec = Codec(self.project, self.database)
        host = emulator_host if emulator_host is not None else os.environ.get("DATASTORE_EMULATOR_HOST")
        self.emulator_host = strip_scheme(host) if host else None
        if self.emulator_host and "@" in self.emulator_host:
            raise BadValueError(
                f"emulator host {'***@' + self.emulator_host.rpartition('@')[2]!r} (DATASTORE_EMULATOR_HOST or "
                "emulator_host) names a user or a password: an emulator takes none; give HOST:PORT"
            )
        if self.emulator_host and credentials is not None:
            log.warning("credentials are ignored: talking to the emulator at %s", self.emulator_host)
        self._credentials = credentials

    def _make_client(self, client: Callable[..., Any], transport: Callable[..., Any],
                     insecure_channel: Callable[[str], Any]) -> Any:
        return gapic_client(client, transport, insecure_channel, emulator_host=self.emulator_host,
                            credentials=self._credentials, service="Cloud Datastore", project=self.project,
                            emulator_env="DATASTORE_EMULATOR_HOST")

    def __repr__(self) -> str:
        where = f"emulator {self.emulator_host}" if self.emulator_host else "Cloud Datastore"
        return (
            f"{type(self).__name__}({self.project!r}, namespace={self.namespace!r}, "
            f"database={self.database!r}, {where})"
        )

    # --- reads --------------------------------------------------------------

    def _read_options(self, txn: TransactionState | None) -> Any:
        options = _ds.ReadOptions.pb()()
        if txn is not None:
            options.transaction = txn.token
        return options

    def _lookup_plan(self, keys: list[Key], txn: TransactionState | None) -> plan.Plan[list[RawEntity | None]]:
        found: dict[Key, RawEntity] = {}
        pending = keys
        while pending:
            request = _ds.LookupRequest.pb()(project_id=self.project, database_id=self.database)
            request.read_options.CopyFrom(self._read_options(txn))
            request.keys.extend(self._codec.key_to_pb(k) for k in pending)
            response = (yield from _send("lookup", _ds.LookupRequest(request)))._pb
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

    def _run_query_plan(self, query: Query, txn: TransactionState | None) -> plan.Plan[QueryResult]:
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
            response = (yield from _send("run_query", _ds.RunQueryRequest(request)))._pb
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

    def _run_aggregation_plan(
        self, aggregation: AggregationQuery, txn: TransactionState | None
    ) -> plan.Plan[AggregationResult]:
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
            response = (
                yield from _send("run_aggregation_query", _ds.RunAggregationQueryRequest(request), policy="run_query")
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

    def _begin_plan(self, read_only: bool, read_time: datetime | None = None) -> plan.Plan[TransactionState]:
        request = _ds.BeginTransactionRequest.pb()(project_id=self.project, database_id=self.database)
        if read_time is not None:
            request.transaction_options.read_only.read_time.FromDatetime(read_time)
        elif read_only:
            request.transaction_options.read_only.SetInParent()
        else:
            request.transaction_options.read_write.SetInParent()
        response = (yield from _send("begin_transaction", _ds.BeginTransactionRequest(request)))._pb
        self._record("begin_transaction")
        return TransactionState(bytes(response.transaction), read_only)

    def _rollback_plan(self, txn: TransactionState) -> plan.Plan[None]:
        request = _ds.RollbackRequest.pb()(
            project_id=self.project, database_id=self.database, transaction=txn.token
        )
        return rollback_plan(_send("rollback", _ds.RollbackRequest(request)), self._record)

    # --- writes ---------------------------------------------------------------

    def _commit_plan(
        self, chunk: list[Mutation], txn: TransactionState | None
    ) -> plan.Plan[list[tuple[Key | None, tuple[Any, ...] | None]]]:
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
            isinstance(m, Delete)
            or (not isinstance(m, Insert) and not m.transforms and m.entity.key is not None and not m.entity.key.is_partial)
            for m in chunk
        )
        response = (yield from _send("commit", _ds.CommitRequest(request), idempotent_commit=idempotent))._pb
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

    def _allocate_ids_plan(self, keys: list[Key]) -> plan.Plan[list[Key]]:
        request = _ds.AllocateIdsRequest.pb()(project_id=self.project, database_id=self.database)
        request.keys.extend(self._codec.key_to_pb(k) for k in keys)
        response = (yield from _send("allocate_ids", _ds.AllocateIdsRequest(request)))._pb
        self._record("allocate_ids")
        return [self._codec.key_from_pb(k) for k in response.keys]

    def _reserve_ids_plan(self, keys: list[Key]) -> plan.Plan[None]:
        request = _ds.ReserveIdsRequest.pb()(project_id=self.project, database_id=self.database)
        request.keys.extend(self._codec.key_to_pb(k) for k in keys)
        yield from _send("reserve_ids", _ds.ReserveIdsRequest(request))
        self._record("reserve_ids")
