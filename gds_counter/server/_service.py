"""The Datastore v1 API's eight methods on a gateway, protobuf in, protobuf out.

Both protocols (gRPC in ``_grpc``, REST JSON in ``_rest``) hand their decoded
request here and send back what it returns, so each method's meaning is
written once. A request is read with the Datastore gateway's own codec
(``gateway.datastore._codec``, in the reverse direction) into the neutral
types, and run through the gateway's public calls: every rule (key and value
checks, batching, transaction tokens, the commit's ALREADY_EXISTS/NOT_FOUND
and contention) is the gateway's, so a client of the server gets what a
caller of the gateway gets, and a bad request is refused before anything
is written.

Projects: the embedded engine has no project, and every project is served
from the one store: a request's ``project_id`` and ``database_id`` are only
echoed in the keys of its answer, so that each client sees keys of its own
project. Two clients with different project ids therefore share data, as
php-gds and Python apps sharing one local store want. Namespaces are kept
as they are. A key naming another project than the request's (a GQL
``KEY(PROJECT('other'), ...)``, a key value of another project) is told
apart from the request's: the codec keeps its project, and the request's
project is the engine's own for the request (``_projects.Projects``).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import time
from typing import Any, Callable, Iterator, Sequence

from google.cloud.datastore_v1.types import datastore as _ds
from google.cloud.datastore_v1.types import query as _qry

from gds_counter._process import deadlines
from gds_counter.errors import BadKeyError, BadValueError, TransactionLost
from gds_counter.gateway.base import Gateway
from gds_counter.gateway.datastore import Codec
from gds_counter.gateway.keys import Key, project_name
from gds_counter.gateway.mutations import Delete, Mutation
from gds_counter.gateway.query import AggregationQuery, Query, QueryResult
from gds_counter.gateway.values import EPOCH, INDEX_VALUE
from gds_counter.gds import gql
from gds_counter.server._expiry import IDLE_S, OpenTransactions
from gds_counter.server._status import ServiceError, status_of

__all__ = ["METHODS", "DatastoreService"]

log = logging.getLogger("gds_counter.server")

_BatchPb = _qry.QueryResultBatch.pb()
_EntityResultPb = _qry.EntityResult.pb()
_CommitRequestPb = _ds.CommitRequest.pb()

#: Each method: its gRPC name, its REST verb, and its request and response classes (raw protobuf).
METHODS: tuple[tuple[str, str, Any, Any], ...] = (
    ("Lookup", "lookup", _ds.LookupRequest.pb(), _ds.LookupResponse.pb()),
    ("RunQuery", "runQuery", _ds.RunQueryRequest.pb(), _ds.RunQueryResponse.pb()),
    ("RunAggregationQuery", "runAggregationQuery", _ds.RunAggregationQueryRequest.pb(), _ds.RunAggregationQueryResponse.pb()),
    ("BeginTransaction", "beginTransaction", _ds.BeginTransactionRequest.pb(), _ds.BeginTransactionResponse.pb()),
    ("Commit", "commit", _ds.CommitRequest.pb(), _ds.CommitResponse.pb()),
    ("Rollback", "rollback", _ds.RollbackRequest.pb(), _ds.RollbackResponse.pb()),
    ("AllocateIds", "allocateIds", _ds.AllocateIdsRequest.pb(), _ds.AllocateIdsResponse.pb()),
    ("ReserveIds", "reserveIds", _ds.ReserveIdsRequest.pb(), _ds.ReserveIdsResponse.pb()),
)


def _transaction_of(request: Any) -> bytes | None:
    """The transaction an existing request runs in, if any (a read's
    ``read_options.transaction``, a commit's ``transaction``)."""
    options = getattr(request, "read_options", None)
    if options is not None and options.WhichOneof("consistency_type") == "transaction":
        return bytes(options.transaction)
    if isinstance(request, _CommitRequestPb) and request.WhichOneof("transaction_selector") == "transaction":
        return bytes(request.transaction)
    return None


#: How many open transactions at a ``read_time`` the server remembers the time of.
_PAST_KEPT = 10_000


def _now(out: Any) -> None:
    out.FromDatetime(_dt.datetime.now(_dt.timezone.utc).replace(tzinfo=None))


class DatastoreService:
    """The API's methods over ``gateway`` (not closed here: its opener
    closes it). Thread-safe as the gateway is: each request is one or a few
    gateway calls, and a transaction is the gateway's token."""

    def __init__(self, gateway: Gateway, *, transaction_idle: float = IDLE_S) -> None:
        self.gateway = gateway
        keep_history = getattr(gateway, "keep_history", None)
        if keep_history is not None:  # the embedded engine: reads at a past read_time need its history
            keep_history()
        #: Transactions clients began and have not ended (``_expiry``).
        self.transactions = OpenTransactions(gateway.rollback, transaction_idle)
        #: The past time each open transaction at a ``read_time`` reads at (its reads answer it).
        self._past: dict[bytes, _dt.datetime] = {}
        #: What a request in a transaction not open here is told: the
        #: Firestore emulator's words (the Datastore gateway knows them).
        self._lost = (
            "Transaction is invalid or closed: it is unknown to gds-counter serve (it was committed or rolled "
            f"back, ended after {transaction_idle:g} s idle, or began before the server restarted); this request "
            "applied nothing"
        )
        self._handlers: dict[str, Callable[[Any, Codec], Any]] = {
            "Lookup": self._lookup,
            "RunQuery": self._run_query,
            "RunAggregationQuery": self._run_aggregation_query,
            "BeginTransaction": self._begin_transaction,
            "Commit": self._commit,
            "Rollback": self._rollback,
            "AllocateIds": self._allocate_ids,
            "ReserveIds": self._reserve_ids,
        }

    def call(self, method: str, request: Any, *, deadline: float | None = None, via: str = "") -> Any:
        """Answer ``request`` (a raw protobuf of ``method``'s request class),
        within ``deadline`` (``time.monotonic()``; the gateway's storage
        waits end by then), or raise ``ServiceError`` with the status the
        emulator gives. Each request is logged at INFO (``-v``)."""
        started = time.monotonic()
        status = "OK"
        token = deadlines.limit(deadline) if deadline is not None else None
        try:
            if deadline is not None and started >= deadline:
                # Waited in the queue past the caller's deadline: the caller
                # has been told DEADLINE_EXCEEDED, so nothing may be applied.
                raise ServiceError("DEADLINE_EXCEEDED", "Deadline Exceeded (before the server took the request)")
            handler = self._handlers.get(method)
            if handler is None:
                raise ServiceError("UNIMPLEMENTED", f"unknown method {method!r}")
            self.transactions.expire()
            if not request.project_id:
                raise BadValueError("the request names no project_id (as Datastore refuses it)")
            _check_project(request.project_id)
            transaction = _transaction_of(request)
            if transaction is not None and not self.transactions.is_open(transaction):
                raise TransactionLost(self._lost)
            with _acting_for(self.gateway, request.project_id), self.transactions.in_use(transaction):
                return handler(request, Codec(request.project_id, request.database_id))
        except Exception as exc:
            error = status_of(exc)
            if deadline is not None and time.monotonic() >= deadline and error.status not in ("INVALID_ARGUMENT", "DEADLINE_EXCEEDED"):
                error = ServiceError("DEADLINE_EXCEEDED", f"the request's deadline passed: {error.message}")
            if error.status in ("INTERNAL", "UNKNOWN"):
                log.error("%s %s failed", via, method, exc_info=exc)
            status = error.status
            raise error from exc
        finally:
            if token is not None:
                deadlines.restore(token)
            log.info("%s %s project=%r %s %.1f ms", via, method, getattr(request, "project_id", "?"), status,
                     (time.monotonic() - started) * 1000)

    # --- reads ---------------------------------------------------------------

    @contextlib.contextmanager
    def _read_transaction(self, options: Any) -> Iterator[tuple[bytes | None, bytes | None]]:
        """The transaction a read runs in, and the token to send back when
        the read began it (``new_transaction``). A read at a ``read_time``
        runs in a read-only transaction at that time, begun and rolled back
        here."""
        which = options.WhichOneof("consistency_type")
        if which == "transaction":
            yield bytes(options.transaction), None
        elif which == "new_transaction":
            token = self._begin(options.new_transaction)
            yield token, token
        elif which == "read_time":
            read_time = _read_time(options.read_time)
            token = self.gateway.begin_transaction(read_only=True, read_time=read_time)
            self._past[token] = read_time
            try:
                yield token, None
            finally:
                self._past.pop(token, None)
                self.gateway.rollback(token)
        else:
            yield None, None  # strong or eventual: the embedded engine's reads are always strong

    def _read_time_of(self, token: bytes | None, out: Any) -> None:
        """A read's ``read_time``: the past time its transaction reads at, else now."""
        read_time = self._past.get(token) if token is not None else None
        if read_time is None:
            _now(out)
        else:
            out.FromDatetime(read_time)

    def _lookup(self, request: Any, codec: Codec) -> Any:
        keys = list(dict.fromkeys(codec.key_from_pb(pb) for pb in request.keys))
        response = _ds.LookupResponse.pb()()
        with self._read_transaction(request.read_options) as (token, began):
            found = self.gateway.lookup(keys, transaction=token)
            self._read_time_of(token, response.read_time)
        for key, entity in zip(keys, found):
            if entity is None:
                response.missing.add().entity.key.CopyFrom(codec.key_to_pb(key))
            else:
                codec.entity_to_pb(entity, response.found.add().entity)
        if began is not None:
            response.transaction = began
        return response

    def _query_of(self, request: Any, codec: Codec, *, aggregation: bool) -> Any:
        """The request's query as the neutral type, and the structured form
        to send back when it came as GQL (Datastore answers with both)."""
        namespace = request.partition_id.namespace_id
        asked = request.partition_id.project_id
        if asked and asked != request.project_id:
            raise BadValueError(
                f"the query's partition names project {asked!r}, but the request is for project {request.project_id!r}"
            )
        if request.partition_id.database_id not in ("", request.database_id):
            raise BadValueError(
                f"mismatched databases within request: the query's partition names database "
                f"{request.partition_id.database_id!r}, the request {request.database_id or 'the default database'!r}"
            )
        if request.HasField("gql_query"):
            text = request.gql_query.query_string
            bindings = codec.gql_bindings_from_pb(request.gql_query)
            literals = request.gql_query.allow_literals
            if aggregation:
                return gql.parse_aggregation(text, bindings, namespace=namespace, allow_literals=literals)
            return gql.parse(text, bindings, namespace=namespace, allow_literals=literals)
        if aggregation:
            if not request.HasField("aggregation_query"):
                raise BadValueError("runAggregationQuery needs an aggregation_query or a gql_query")
            return codec.aggregation_from_pb(request.aggregation_query, namespace)
        if not request.HasField("query"):
            raise BadValueError("runQuery needs a query or a gql_query")
        return codec.query_from_pb(request.query, namespace)

    def _run_query(self, request: Any, codec: Codec) -> Any:
        query: Query = self._query_of(request, codec, aggregation=False)
        response = _ds.RunQueryResponse.pb()()
        with self._read_transaction(request.read_options) as (token, began):
            result = self.gateway.run_query(query, transaction=token)
            self._batch(query, result, codec, response.batch, token)
        if request.HasField("gql_query"):
            response.query.CopyFrom(codec.query_to_pb(query))
        if began is not None:
            response.transaction = began
        return response

    def _batch(self, query: Query, result: QueryResult, codec: Codec, out: Any, token: bytes | None) -> None:
        out.entity_result_type = (
            _EntityResultPb.KEY_ONLY if query.keys_only
            else _EntityResultPb.PROJECTION if query.projection
            else _EntityResultPb.FULL
        )
        # Each result carries the cursor after it, as on Datastore and the
        # Firestore emulator: ndb pages a query it filters itself by them.
        cursors: Sequence[bytes | None] | None = result.cursors
        if cursors is None:  # a gateway that gives none: the last result's is the end cursor
            cursors = [None] * (len(result.entities) - 1) + [result.end_cursor]
        for entity, cursor in zip(result.entities, cursors):
            one = out.entity_results.add()
            codec.entity_to_pb(entity, one.entity)
            if query.projection:  # each projected value is marked, as the emulator marks it (gateway._meanings)
                for value in one.entity.properties.values():
                    value.meaning = INDEX_VALUE
            if cursor:
                one.cursor = cursor
        if result.end_cursor:
            out.end_cursor = result.end_cursor
        out.skipped_results = self._skipped(query, result, token)
        if result.more_results:
            out.more_results = _BatchPb.NOT_FINISHED
        elif query.limit is not None and len(result.entities) >= query.limit:
            out.more_results = _BatchPb.MORE_RESULTS_AFTER_LIMIT
        else:
            out.more_results = _BatchPb.NO_MORE_RESULTS
        self._read_time_of(token, out.read_time)

    def _skipped(self, query: Query, result: QueryResult, token: bytes | None) -> int:
        """How many results the offset skipped: all of it when a result
        follows it (the gateway skips the whole offset before it answers),
        else only the rows there were, counted. Clients read a smaller
        number with more results to come as "skip the rest", so it must be
        exact."""
        if not query.offset or result.entities or result.more_results:
            return query.offset
        counting = query.replace(offset=0, limit=query.offset)
        seen = 0
        while True:
            rows = self.gateway.run_query(counting, transaction=token)
            seen += len(rows.entities)
            if not rows.more_results or not rows.end_cursor or seen >= query.offset:
                return min(seen, query.offset)
            counting = counting.replace(start_cursor=rows.end_cursor, limit=query.offset - seen)

    def _run_aggregation_query(self, request: Any, codec: Codec) -> Any:
        aggregation: AggregationQuery = self._query_of(request, codec, aggregation=True)
        response = _ds.RunAggregationQueryResponse.pb()()
        batch = response.batch
        with self._read_transaction(request.read_options) as (token, began):
            values = self.gateway.run_aggregation(aggregation, transaction=token)
            self._read_time_of(token, batch.read_time)
        row = batch.aggregation_results.add()
        for alias, value in values.items():
            codec.value_to_pb(value, False, row.aggregate_properties[alias])
        batch.more_results = _BatchPb.NO_MORE_RESULTS
        if request.HasField("gql_query"):
            response.query.CopyFrom(codec.aggregation_to_pb(aggregation))
        if began is not None:
            response.transaction = began
        return response

    # --- transactions ----------------------------------------------------------

    def _begin_transaction(self, request: Any, codec: Codec) -> Any:
        return _ds.BeginTransactionResponse.pb()(transaction=self._begin(request.transaction_options))

    def _begin(self, options: Any) -> bytes:
        """Begin a transaction with these ``TransactionOptions``; a read-only
        one at a ``read_time`` reads the data as it was then."""
        read_only = options.HasField("read_only")
        past = read_only and options.read_only.HasField("read_time")
        read_time = _read_time(options.read_only.read_time) if past else None
        token = self.gateway.begin_transaction(read_only=read_only, read_time=read_time)
        self.transactions.began(token)
        if read_time is not None:
            self._past[token] = read_time
            while len(self._past) > _PAST_KEPT:  # (one a client never ended: forgotten, oldest first)
                del self._past[next(iter(self._past))]
        return token

    def _rollback(self, request: Any, codec: Codec) -> Any:
        if not request.transaction:
            raise BadValueError("rollback needs the transaction to roll back")
        if not self.transactions.known(bytes(request.transaction)):
            raise BadValueError("Invalid transaction: this server never began it")  # as the emulator answers
        self.transactions.ended(bytes(request.transaction))
        self._past.pop(bytes(request.transaction), None)
        self.gateway.rollback(bytes(request.transaction))
        return _ds.RollbackResponse.pb()()

    # --- writes ------------------------------------------------------------------

    def _commit(self, request: Any, codec: Codec) -> Any:
        which = request.WhichOneof("transaction_selector")
        mutations: list[Mutation] = [codec.mutation_from_pb(pb) for pb in request.mutations]
        if request.mode == _CommitRequestPb.NON_TRANSACTIONAL:
            if which is not None:
                raise BadValueError("a NON_TRANSACTIONAL commit names no transaction")
            token = None
        elif which == "transaction":
            token = bytes(request.transaction)
            self.transactions.ended(token)  # committed or not, it ends here
            self._past.pop(token, None)
        elif which == "single_use_transaction":
            token = self.gateway.begin_transaction(read_only=request.single_use_transaction.HasField("read_only"))
        elif request.mode == _CommitRequestPb.TRANSACTIONAL:
            raise BadValueError("a TRANSACTIONAL commit needs a transaction")
        else:
            raise BadValueError("a commit needs its mode: TRANSACTIONAL or NON_TRANSACTIONAL (as Datastore refuses one without)")
        result = self.gateway.commit(mutations, transaction=token)
        response = _ds.CommitResponse.pb()()
        for mutation, done in zip(mutations, result.mutation_results):
            out = response.mutation_results.add()
            key = mutation.key if isinstance(mutation, Delete) else mutation.entity.key
            if key is not None and key.is_partial and done.key is not None:
                # Only allocated keys are sent back: clients pair them with their incomplete keys in order.
                out.key.CopyFrom(codec.key_to_pb(done.key))
            for value in done.transform_results or ():
                codec.value_to_pb(value, False, out.transform_results.add())
        _now(response.commit_time)
        return response

    def _allocate_ids(self, request: Any, codec: Codec) -> Any:
        keys = [codec.key_from_pb(pb) for pb in request.keys]
        response = _ds.AllocateIdsResponse.pb()()
        for key in self.gateway.allocate_ids(keys):
            response.keys.add().CopyFrom(codec.key_to_pb(key))
        return response

    def _reserve_ids(self, request: Any, codec: Codec) -> Any:
        keys: list[Key] = [codec.key_from_pb(pb) for pb in request.keys]
        self.gateway.reserve_ids(keys)
        return _ds.ReserveIdsResponse.pb()()


def _read_time(stamp: Any) -> _dt.datetime:
    """A request's ``read_time`` (a protobuf ``Timestamp``) as an aware
    datetime; microseconds at most, as Datastore takes it."""
    if stamp.nanos % 1000:
        raise BadValueError(f"timestamp cannot have more than microseconds precision (read_time nanos={stamp.nanos})")
    return EPOCH + _dt.timedelta(seconds=stamp.seconds, microseconds=stamp.nanos // 1000)


def _check_project(project: str) -> None:
    """A request's project must be one Datastore takes: it is the project
    keys of other projects are told apart from (by name, so ``PROJ_A`` would
    order them otherwise than the ``proj-a`` a key literal must spell)."""
    try:
        project_name(project)
    except BadKeyError as exc:
        raise BadValueError(f"the request's project_id: {exc}") from None


def _acting_for(gateway: Gateway, project: str) -> contextlib.AbstractContextManager[None]:
    """The request's project as the gateway's own while it runs: the
    embedded engine's ``projects`` (a Datastore gateway has its project,
    and another gateway none to tell apart)."""
    projects = getattr(gateway, "projects", None)
    return projects.acting_for(project) if projects is not None else contextlib.nullcontext()
