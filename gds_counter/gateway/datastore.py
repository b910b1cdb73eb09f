"""The Cloud Datastore gateway: Cloud Datastore, Firestore in Datastore mode,
or either official emulator, through google-cloud-datastore's GAPIC layer.

Why the low-level GAPIC client and raw ``datastore_v1`` protos instead of
``google.cloud.datastore.Client``: the high-level client decides index flags
per entity (not per list element), has no property masks or property
transforms, and cannot send GQL. php-gds compatibility needs all of those, so
this module builds every request itself.

Retry and error policy (quoted by the README; ``should_retry`` and
``translate_error`` implement it and are unit-tested directly):

=====================  ==========================  ==================================  ===========================
gRPC status            lookup, run_query,          commit                              raised when not retried /
                       allocate_ids, begin_tx,                                         retries run out
                       rollback (idempotent)
=====================  ==========================  ==================================  ===========================
UNAVAILABLE            retried                     retried if the commit is            ``Unavailable`` (commit:
                                                   idempotent (transactional, or only  ``CommitUnknown`` if any
                                                   complete-key upserts/deletes        attempt may have arrived)
                                                   without transforms) or the error
                                                   shows the connection was never
                                                   made; else not retried
RESOURCE_EXHAUSTED     retried                     retried: a quota rejection is not   ``GatewayError``
                                                   applied, so it is safe
INTERNAL               retried                     NOT retried: may have been applied  ``CommitUnknown`` (commit)
DEADLINE_EXCEEDED      retried                     NOT retried: may have been applied  ``CommitUnknown`` (commit)
UNKNOWN, CANCELLED     not retried                 NOT retried: may have been applied  ``CommitUnknown`` (commit),
                                                                                       ``GatewayError`` (others)
ABORTED, or a message  not retried here: the       not retried here: the caller must   ``Contention(attempts=1)``
"too much contention"  caller redoes the whole     re-read and redo the transaction    (commit after an unknown
                       transaction                                                     attempt: ``CommitUnknown``)
INVALID_ARGUMENT       not retried                 not retried                         ``BadValueError`` (commit
                                                                                       after an unknown attempt:
                                                                                       ``CommitUnknown``)
anything else          not retried                 not retried                         ``GatewayError``
=====================  ==========================  ==================================  ===========================

Retries use ``google.api_core.retry.Retry`` (exponential backoff with
jitter); the whole call, retries included, is bounded by ``timeout`` seconds
so nothing hangs. A commit is never retried when its outcome is unknown,
because a blind retry of an increment could count it twice.
"""

from __future__ import annotations

import datetime as _dt
import logging
import os
import time
from typing import Any, Callable, Sequence

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.cloud.datastore_v1.types import datastore as _ds
from google.cloud.datastore_v1.types import entity as _ent
from google.cloud.datastore_v1.types import query as _qry

from gds_counter.errors import BadValueError, CommitUnknown, Contention, GatewayError, GDSError, Unavailable
from gds_counter.gateway.base import BaseGateway, TransactionState
from gds_counter.gateway.keys import Key, PathElement
from gds_counter.gateway.mutations import Delete, Mutation, Upsert
from gds_counter.gateway.query import CompositeFilter, Cursor, PropertyFilter, Query, QueryResult
from gds_counter.gateway.values import EPOCH, Geopoint, RawEntity

__all__ = ["DatastoreGateway", "should_retry", "translate_error", "DEFAULT_RETRY"]

log = logging.getLogger(__name__)

# Raw protobuf classes: faster than proto-plus wrappers and they expose
# HasField/WhichOneof, which the value mapping needs.
_ValuePb = _ent.Value.pb()
_EntityPb = _ent.Entity.pb()
_KeyPb = _ent.Key.pb()
_MutationPb = _ds.Mutation.pb()
_QueryPb = _qry.Query.pb()
_FilterPb = _qry.Filter.pb()
_GqlQueryPb = _qry.GqlQuery.pb()
_PropertyFilterPb = _qry.PropertyFilter.pb()
_CompositeFilterPb = _qry.CompositeFilter.pb()
_PropertyOrderPb = _qry.PropertyOrder.pb()
_BatchPb = _qry.QueryResultBatch.pb()

_UTC = _dt.timezone.utc

_OPS = {
    "=": _PropertyFilterPb.EQUAL,
    "<": _PropertyFilterPb.LESS_THAN,
    "<=": _PropertyFilterPb.LESS_THAN_OR_EQUAL,
    ">": _PropertyFilterPb.GREATER_THAN,
    ">=": _PropertyFilterPb.GREATER_THAN_OR_EQUAL,
    "!=": _PropertyFilterPb.NOT_EQUAL,
    "IN": _PropertyFilterPb.IN,
    "NOT_IN": _PropertyFilterPb.NOT_IN,
    "HAS_ANCESTOR": _PropertyFilterPb.HAS_ANCESTOR,
}

#: Backoff shared by every call; per-call predicates are derived from it.
#: ``timeout`` here is replaced by the gateway's own timeout.
DEFAULT_RETRY = Retry(initial=0.1, maximum=4.0, multiplier=2.0, timeout=30.0)

_IDEMPOTENT_CALLS = frozenset({"lookup", "run_query", "allocate_ids", "begin_transaction", "rollback"})

#: Fragments of gRPC messages that prove the request never reached a server
#: (the connection was never made), so even a non-idempotent commit may be resent.
_NOT_SENT_MARKERS = (
    "failed to connect to all addresses",
    "connection refused",
    "dns resolution failed",
    "name resolution failure",
    "failed to connect to remote host",
)


def _message(exc: BaseException) -> str:
    return getattr(exc, "message", None) or str(exc)


def _is_contention(exc: BaseException) -> bool:
    return isinstance(exc, gexc.Aborted) or "too much contention" in _message(exc).lower()


def _never_sent(exc: BaseException) -> bool:
    text = _message(exc).lower()
    return isinstance(exc, gexc.ServiceUnavailable) and any(m in text for m in _NOT_SENT_MARKERS)


def should_retry(exc: BaseException, *, call: str, idempotent_commit: bool = False) -> bool:
    """The retry predicate of the policy table in the module docstring.

    ``call`` is the RPC name; ``idempotent_commit`` says a commit can be
    applied twice with the same result (transactional, or only complete-key
    upserts/deletes with no transforms).
    """
    if _is_contention(exc):
        return False
    if call in _IDEMPOTENT_CALLS:
        return isinstance(
            exc,
            (gexc.ServiceUnavailable, gexc.ResourceExhausted, gexc.InternalServerError, gexc.DeadlineExceeded),
        )
    if call == "commit":
        if isinstance(exc, gexc.ResourceExhausted):
            return True
        if isinstance(exc, gexc.ServiceUnavailable):
            return idempotent_commit or _never_sent(exc)
        return False
    return False


def _outcome_unknown(exc: BaseException) -> bool:
    """True when a failed commit attempt may nevertheless have been applied."""
    if isinstance(exc, gexc.ServiceUnavailable):
        return not _never_sent(exc)
    return isinstance(
        exc, (gexc.DeadlineExceeded, gexc.Unknown, gexc.InternalServerError, gexc.Cancelled)
    )


def translate_error(
    exc: BaseException, *, call: str, earlier_attempts: Sequence[BaseException] = ()
) -> GDSError:
    """Map a google.api_core error to the gds_counter error of the policy table.

    ``earlier_attempts`` are the errors of attempts that were retried before
    ``exc``: for a commit, any of them with an unknown outcome makes the final
    result unknown too (the first attempt may have been applied).
    """
    if isinstance(exc, gexc.RetryError) and exc.cause is not None:
        exc = exc.cause
    text = _message(exc)
    if call == "commit" and any(_outcome_unknown(e) for e in earlier_attempts):
        # An earlier attempt may have been applied: whatever the resend says
        # (even ABORTED, which would invite a retry), the outcome is unknown.
        return CommitUnknown(f"commit outcome unknown (it may or may not have been applied): {text}")
    if _is_contention(exc):
        return Contention(f"{call}: contention: {text}", attempts=1)
    if call == "commit":
        if _outcome_unknown(exc):
            return CommitUnknown(f"commit outcome unknown (it may or may not have been applied): {text}")
    if isinstance(exc, gexc.ServiceUnavailable):
        return Unavailable(f"{call}: Datastore unavailable: {text}")
    if isinstance(exc, gexc.InvalidArgument):
        return BadValueError(f"{call}: rejected by Datastore: {text}")
    return GatewayError(f"{call} failed: {type(exc).__name__}: {text}")


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

    def _call(self, call: str, method: Callable[..., Any], request: Any, *, idempotent_commit: bool = False) -> Any:
        """Send one logical request with the policy's retries and one overall deadline."""
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
            log.info("retrying %s after %s: %s", call, type(exc).__name__, _message(exc))

        try:
            if self._retry is None:
                return attempt()
            retry = self._retry.with_predicate(
                lambda exc: should_retry(exc, call=call, idempotent_commit=idempotent_commit)
            )
            return retry(attempt, on_error=on_error)()
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            final = exc.cause if isinstance(exc, gexc.RetryError) and exc.cause is not None else exc
            earlier = [e for e in failures if e is not final]
            raise translate_error(final, call=call, earlier_attempts=earlier) from exc

    def _partition(self, namespace: str) -> Any:
        return _ent.PartitionId.pb()(project_id=self.project, database_id=self.database, namespace_id=namespace)

    # --- keys and values ----------------------------------------------------

    def _key_to_pb(self, key: Key) -> Any:
        pb = _KeyPb()
        pb.partition_id.project_id = self.project
        pb.partition_id.database_id = self.database
        pb.partition_id.namespace_id = key.namespace
        for element in key.path:
            path = pb.path.add()
            path.kind = element.kind
            if element.id is not None:
                path.id = element.id
            elif element.name is not None:
                path.name = element.name
        return pb

    @staticmethod
    def _key_from_pb(pb: Any) -> Key:
        elements = []
        for path in pb.path:
            which = path.WhichOneof("id_type")
            if which == "id":
                elements.append(PathElement(path.kind, id=path.id))
            elif which == "name":
                elements.append(PathElement(path.kind, name=path.name))
            else:
                elements.append(PathElement(path.kind))
        return Key(tuple(elements), pb.partition_id.namespace_id)

    def _value_to_pb(self, value: Any, excluded: bool, out: Any = None) -> Any:
        pb = _ValuePb() if out is None else out
        if isinstance(value, list):
            # Datastore rejects exclude_from_indexes on an array value: the
            # flag goes on each element, as php-gds writes it.
            pb.array_value.SetInParent()
            for item in value:
                self._value_to_pb(item, excluded, pb.array_value.values.add())
            return pb
        pb.exclude_from_indexes = excluded
        if value is None:
            pb.null_value = 0
        elif isinstance(value, bool):
            pb.boolean_value = value
        elif isinstance(value, int):
            pb.integer_value = value
        elif isinstance(value, float):
            pb.double_value = value
        elif isinstance(value, str):
            pb.string_value = value
        elif isinstance(value, bytes):
            pb.blob_value = value
        elif isinstance(value, _dt.datetime):
            delta = value.astimezone(_UTC) - EPOCH
            pb.timestamp_value.seconds = delta.days * 86400 + delta.seconds
            pb.timestamp_value.nanos = delta.microseconds * 1000
        elif isinstance(value, Key):
            pb.key_value.CopyFrom(self._key_to_pb(value))
        elif isinstance(value, Geopoint):
            pb.geo_point_value.latitude = value.latitude
            pb.geo_point_value.longitude = value.longitude
        elif isinstance(value, RawEntity):
            self._entity_to_pb(value, pb.entity_value)
        else:
            raise BadValueError(f"cannot store a {type(value).__name__} ({value!r})")
        return pb

    def _entity_to_pb(self, entity: RawEntity, out: Any = None) -> Any:
        pb = _EntityPb() if out is None else out
        # An empty embedded entity must still count as set, or the value goes
        # out with no value type and the server rejects it.
        pb.SetInParent()
        if entity.key is not None:
            pb.key.CopyFrom(self._key_to_pb(entity.key))
        for name, value in entity.properties.items():
            self._value_to_pb(value, name in entity.unindexed, pb.properties[name])
        return pb

    def _value_from_pb(self, pb: Any) -> tuple[Any, bool]:
        """The neutral value and whether it is excluded from indexes."""
        which = pb.WhichOneof("value_type")
        if which == "array_value":
            items = [self._value_from_pb(v) for v in pb.array_value.values]
            excluded = all(flag for _, flag in items) if items else pb.exclude_from_indexes
            return [v for v, _ in items], excluded
        excluded = pb.exclude_from_indexes
        if which is None or which == "null_value":
            return None, excluded
        if which == "boolean_value":
            return pb.boolean_value, excluded
        if which == "integer_value":
            return pb.integer_value, excluded
        if which == "double_value":
            return pb.double_value, excluded
        if which == "string_value":
            return pb.string_value, excluded
        if which == "blob_value":
            return bytes(pb.blob_value), excluded
        if which == "timestamp_value":
            ts = pb.timestamp_value
            return EPOCH + _dt.timedelta(seconds=ts.seconds, microseconds=ts.nanos // 1000), excluded
        if which == "key_value":
            return self._key_from_pb(pb.key_value), excluded
        if which == "geo_point_value":
            return Geopoint(pb.geo_point_value.latitude, pb.geo_point_value.longitude), excluded
        if which == "entity_value":
            return self._entity_from_pb(pb.entity_value), excluded
        raise GatewayError(f"unsupported Datastore value type {which!r}")

    def _entity_from_pb(self, pb: Any) -> RawEntity:
        key = self._key_from_pb(pb.key) if pb.HasField("key") else None
        properties: dict[str, Any] = {}
        unindexed = set()
        for name, value_pb in pb.properties.items():
            value, excluded = self._value_from_pb(value_pb)
            properties[name] = value
            if excluded:
                unindexed.add(name)
        return RawEntity(key, properties, frozenset(unindexed))

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
            request.keys.extend(self._key_to_pb(k) for k in pending)
            response = self._call("lookup", self._client.lookup, _ds.LookupRequest(request))._pb
            self._record("lookup", reads=len(pending))
            for result in response.found:
                entity = self._entity_from_pb(result.entity)
                assert entity.key is not None
                found[entity.key] = entity
            # Datastore may answer only part of a big lookup; the rest
            # comes back as deferred keys to ask for again.
            pending = [self._key_from_pb(k) for k in response.deferred]
            if pending:
                log.debug("lookup: following %d deferred keys", len(pending))
        return [found.get(key) for key in keys]

    def _filter_to_pb(self, flt: Any, out: Any) -> None:
        if isinstance(flt, CompositeFilter):
            parts = [f for f in flt.filters]
            if len(parts) == 1:
                self._filter_to_pb(parts[0], out)
                return
            composite = out.composite_filter
            composite.op = _CompositeFilterPb.AND if flt.op == "AND" else _CompositeFilterPb.OR
            for part in parts:
                self._filter_to_pb(part, composite.filters.add())
            return
        if isinstance(flt, PropertyFilter):
            prop = out.property_filter
            prop.property.name = flt.name
            prop.op = _OPS[flt.op]
            if flt.op in ("IN", "NOT_IN"):
                prop.value.array_value.SetInParent()
                for item in flt.value:
                    self._value_to_pb(item, False, prop.value.array_value.values.add())
            else:
                self._value_to_pb(flt.value, False, prop.value)
            return
        raise BadValueError(f"unknown filter {flt!r}")

    def _query_to_pb(self, query: Query) -> Any:
        pb = _QueryPb()
        if query.kind:
            pb.kind.add().name = query.kind
        if query.filter is not None:
            self._filter_to_pb(query.filter, pb.filter)
        for order in query.order:
            item = pb.order.add()
            item.property.name = order.name
            item.direction = _PropertyOrderPb.DESCENDING if order.descending else _PropertyOrderPb.ASCENDING
        if query.keys_only:
            pb.projection.add().property.name = "__key__"
        else:
            for name in query.projection:
                pb.projection.add().property.name = name
        for name in query.distinct_on:
            pb.distinct_on.add().name = name
        if query.limit is not None:
            pb.limit.value = query.limit
            pb.limit.SetInParent()
        if query.offset:
            pb.offset = query.offset
        if query.start_cursor:
            pb.start_cursor = query.start_cursor
        if query.end_cursor:
            pb.end_cursor = query.end_cursor
        return pb

    def _gql_to_pb(self, query: Query) -> Any:
        assert query.gql is not None
        pb = _GqlQueryPb(query_string=query.gql.text, allow_literals=True)
        for name, value in query.gql.named:
            self._binding_to_pb(value, pb.named_bindings[name])
        for value in query.gql.positional:
            self._binding_to_pb(value, pb.positional_bindings.add())
        return pb

    def _binding_to_pb(self, value: Any, out: Any) -> None:
        # A cursor (at LIMIT/OFFSET, "LIMIT @c" / "OFFSET @c") travels in its
        # own field; plain bytes are a blob value to compare with.
        if isinstance(value, Cursor):
            out.cursor = value.value
        else:
            self._value_to_pb(value, False, out.value)

    def _run_query(self, query: Query, txn: TransactionState | None) -> QueryResult:
        """Run one batch of ``query``: natively as GQL when ``query.gql`` is set.

        Projection results are index values, as Datastore returns them (meaning
        18): a projected datetime comes back as integer microseconds since the
        epoch and a projected blob as a string. Only a schema can turn them
        back, so the Store does that, not this gateway.
        """
        request = _ds.RunQueryRequest.pb()(project_id=self.project, database_id=self.database)
        request.partition_id.CopyFrom(self._partition(query.namespace))
        request.read_options.CopyFrom(self._read_options(txn))
        if query.gql is not None:
            request.gql_query.CopyFrom(self._gql_to_pb(query))
        else:
            request.query.CopyFrom(self._query_to_pb(query))
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
        entities = tuple(self._entity_from_pb(r.entity) for r in batch.entity_results)
        return QueryResult(
            entities=entities,
            end_cursor=bytes(batch.end_cursor) or None,
            more_results=batch.more_results == _BatchPb.NOT_FINISHED,
        )

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

    def _mutation_to_pb(self, mutation: Any) -> Any:
        pb = _MutationPb()
        if isinstance(mutation, Upsert):
            pb.upsert.CopyFrom(self._entity_to_pb(mutation.entity))
            if mutation.property_mask is not None:
                # An empty mask would mean "write everything" to Datastore;
                # naming only __key__ keeps every stored property instead.
                pb.property_mask.paths.extend(mutation.property_mask or ("__key__",))
            for transform in mutation.transforms:
                item = pb.property_transforms.add()
                item.property = transform.name
                item.increment.integer_value = transform.amount
        else:
            pb.delete.CopyFrom(self._key_to_pb(mutation.key))
        return pb

    def _commit(self, chunk: list[Mutation], txn: TransactionState | None) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
        request = _ds.CommitRequest.pb()(project_id=self.project, database_id=self.database)
        if txn is not None:
            request.mode = _ds.CommitRequest.pb().TRANSACTIONAL
            request.transaction = txn.token
        else:
            request.mode = _ds.CommitRequest.pb().NON_TRANSACTIONAL
        request.mutations.extend(self._mutation_to_pb(m) for m in chunk)
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
            key = self._key_from_pb(result.key) if result.HasField("key") else mutation.entity.key
            values = tuple(self._value_from_pb(v)[0] for v in result.transform_results)
            out.append((key, values or None))
        return out

    def _allocate_ids(self, keys: list[Key]) -> list[Key]:
        request = _ds.AllocateIdsRequest.pb()(project_id=self.project, database_id=self.database)
        request.keys.extend(self._key_to_pb(k) for k in keys)
        response = self._call("allocate_ids", self._client.allocate_ids, _ds.AllocateIdsRequest(request))._pb
        self._record("allocate_ids")
        return [self._key_from_pb(k) for k in response.keys]

    def close(self) -> None:
        try:
            self._client.transport.close()
        except Exception:  # closing twice or a dead channel is not worth failing over
            log.debug("closing the Datastore channel failed", exc_info=True)

