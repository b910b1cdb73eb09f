"""The Firestore gateway's requests, written once for the blocking and the
async transport, as the Datastore gateway's are (``datastore._requests``):
each hook is a plan (``gateway.plan``) that builds the ``google.firestore.v1``
request, asks for it to be sent (``Send``, an effect performed by the
gateway's transport: ``Transport`` blocking, ``AsyncTransport`` awaited)
and reads the answer. ``FirestoreGateway`` sends with the blocking GAPIC
client, ``AsyncFirestoreGateway`` with the generated
``FirestoreAsyncClient`` over gRPC asyncio; both under the Datastore
gateway's retry and error policy (``_errors``) and one deadline per call
(``datastore.CallBudget``), bounded too by the deadline of the counter's
call that is running (``_process.deadlines``). Protobufs come from
``_codec`` and ``_query``.

Settings both faces take the same way (``_configure``): the project, the
database, the timeout, and ``FIRESTORE_EMULATOR_HOST`` as
google-cloud-firestore honours it (that host, plaintext, no credentials
looked up, the emulator's ``Bearer owner`` header); else ``credentials`` or
Application Default Credentials (``_new_client``).
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import logging
import os
import re
from datetime import datetime
from typing import Any, Callable

from google.cloud.firestore_v1.types import firestore as _fs
from google.cloud.firestore_v1.types import query as _q

from gds_counter._process import deadlines
from gds_counter.errors import BadKeyError, BadValueError, GatewayError, Unavailable
from gds_counter.gateway import plan
from gds_counter.gateway._aggregation import billed_reads
from gds_counter.gateway._contract import TransactionState
from gds_counter.gateway._driven_hooks import HookPlans, rollback_plan
from gds_counter.gateway._effects import ask
from gds_counter.gateway._grpc_clients import gapic_client
from gds_counter.gateway._hooks import Hook
from gds_counter.gateway._rules import GatewayRules
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.datastore import CallBudget, strip_scheme
from gds_counter.gateway.firestore._codec import DocumentCodec, document_of, field_path, random_id
from gds_counter.gateway.firestore._errors import final_error
from gds_counter.gateway.firestore._query import describe, shape_query
from gds_counter.gateway.keys import Key, project_name
from gds_counter.gateway.mutations import Delete, Insert, Mutation, Upsert
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity

__all__ = ["CAPABILITIES", "AsyncTransport", "FirestoreRequests", "Send", "Transport"]

log = logging.getLogger("gds_counter.gateway.firestore")

#: What Firestore in native mode does, known without a probe: it applies
#: increments and masks, runs ``!=``, ``IN``, ``NOT IN`` and ``OR``, and
#: aggregations; it has no index flags to keep or lose.
CAPABILITIES = Capabilities(applies_transforms=True, indexes_transformed=False, not_equal_in_or=True, aggregation=True)

#: A Firestore database id, or ``(default)``.
_DATABASE = re.compile(r"\(default\)|[a-z][a-z0-9-]{2,62}")
#: How many document names an error lists before it says how many more.
_NAMED = 3

_StructuredAggregationPb = _q.StructuredAggregationQuery.pb()


class Transport(abc.ABC):
    """What sends a request, blocking (``FirestoreGateway``)."""

    @abc.abstractmethod
    def _send(self, call: str, method: str, request: Any, *, about: str, stream: bool = False,
              idempotent_commit: bool = False, policy: str = "") -> Any:
        """Send ``request`` with the client's ``method`` under the policy's
        row for ``policy or call``: the raw response (every one, in a list,
        for a streaming RPC, read to its end inside one attempt, so a
        failure midway is retried as a whole read). Errors name ``call``
        and what it is ``about``."""


class AsyncTransport(abc.ABC):
    """``Transport``, awaited (``AsyncFirestoreGateway``)."""

    @abc.abstractmethod
    async def _send(self, call: str, method: str, request: Any, *, about: str, stream: bool = False,
                    idempotent_commit: bool = False, policy: str = "") -> Any: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Send(Hook[Any]):
    """The effect of sending one request (``Transport._send``'s arguments;
    ``rpc`` is its ``call``)."""

    rpc: str
    method: str
    request: Any
    about: str
    stream: bool = False
    idempotent_commit: bool = False
    policy: str = ""

    def perform(self, backend: object) -> Any:
        if not isinstance(backend, Transport):
            raise TypeError(f"{self.rpc}: {backend!r} has no blocking Firestore transport")
        return backend._send(self.rpc, self.method, self.request, about=self.about, stream=self.stream,
                             idempotent_commit=self.idempotent_commit, policy=self.policy)

    async def aperform(self, backend: object) -> Any:
        if not isinstance(backend, AsyncTransport):
            raise TypeError(f"{self.rpc}: {backend!r} has no async Firestore transport")
        return await backend._send(self.rpc, self.method, self.request, about=self.about, stream=self.stream,
                                   idempotent_commit=self.idempotent_commit, policy=self.policy)


def _send(call: str, method: str, request: Any, *, about: str, stream: bool = False,
          idempotent_commit: bool = False, policy: str = "") -> plan.Plan[Any]:
    return ask(Send(call, method, request, about, stream, idempotent_commit, policy))


class FirestoreRequests(CallBudget, GatewayRules, HookPlans):
    """The hooks of both Firestore gateways, as plans over ``_send``.

    ``_allocate_ids`` asks the server for nothing: native mode allocates no
    ids, so an incomplete key gets a scattered random 63-bit id made here
    (``_codec.random_id``), written with the precondition exists=false when
    a commit numbers it, so two clashing ids are ``AlreadyExists``, never an
    overwrite. ``_reserve_ids`` has nothing to keep out of a sequence that
    does not exist: it checks the keys and sends nothing."""

    _log = log
    project: str
    database: str
    emulator_host: str | None
    _codec: DocumentCodec
    _metadata: list[tuple[str, str]]
    #: The credentials given (None: the emulator needs none, else Application Default Credentials).
    credentials: Any

    def _configure(self, project: str, database: str, emulator_host: str | None, credentials: Any,
                   timeout: float, retry: Any) -> None:
        """Check and keep the settings (module docstring), before anything
        is looked up or sent."""
        try:
            if not isinstance(project, str) or not project or project_name(project) is None:
                raise BadKeyError("it is empty")
        except BadKeyError as exc:
            raise BadValueError(f"{project!r} is not a Google Cloud project id: {exc}") from None
        database = database or "(default)"
        if not isinstance(database, str) or not _DATABASE.fullmatch(database):
            raise BadValueError(f"{database!r} is not a Firestore database id (or '(default)')")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise BadValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.project, self.database = project, database
        self._set_budget(timeout, retry)
        self._codec = DocumentCodec(project, database)
        host = emulator_host if emulator_host is not None else os.environ.get("FIRESTORE_EMULATOR_HOST")
        self.emulator_host = strip_scheme(host) if host else None
        self._metadata = [("google-cloud-resource-prefix", self._codec.database_name)]
        self.credentials = credentials
        if self.emulator_host:
            if credentials is not None:
                log.warning("credentials are ignored: talking to the emulator at %s", self.emulator_host)
            # As google-cloud-firestore does: plaintext, and the emulator's owner token.
            self._metadata.append(("authorization", "Bearer owner"))

    def _make_client(self, client: Callable[..., Any], transport: Callable[..., Any],
                     insecure_channel: Callable[[str], Any]) -> Any:
        return gapic_client(client, transport, insecure_channel, emulator_host=self.emulator_host,
                            credentials=self.credentials, service="Cloud Firestore", project=self.project,
                            emulator_env="FIRESTORE_EMULATOR_HOST")

    def __repr__(self) -> str:
        where = f"emulator {self.emulator_host}" if self.emulator_host else "Cloud Firestore"
        return f"{type(self).__name__}({self.project!r}, database={self.database!r}, {where})"

    def _own_project(self) -> str:
        return self.project

    def _budget(self, call: str) -> float:
        """``CallBudget._budget``, bounded too by the deadline of the
        counter's call that runs it (``deadlines.remaining``), so no RPC
        outlives its caller's deadline; once that has passed, the call is
        not sent (``Unavailable``: nothing written). A rollback is cleanup
        after that deadline too (it frees Firestore's locks): it keeps its
        own ``timeout``."""
        budget = super()._budget(call)
        if call == "rollback":
            return budget
        left = deadlines.remaining(budget)
        if left <= 0:
            raise Unavailable(f"{call}: not sent to {self!r}: its caller's deadline has passed, so nothing of it was written")
        return left

    def _final(self, call: str, about: str) -> Any:
        """How ``call``'s final error is worded (``_errors.final_error``)."""
        return functools.partial(final_error, call=call, about=about)

    def _about(self, names: list[str]) -> str:
        shown = ", ".join(name.partition("/documents/")[2] for name in names[:_NAMED])
        more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
        return f"project {self.project!r}, database {self.database!r}" + (f", documents {shown}{more}" if names else "")

    # --- reads -----------------------------------------------------------------

    def _lookup_plan(self, keys: list[Key], txn: TransactionState | None) -> plan.Plan[list[RawEntity | None]]:
        names = [self._codec.name_of(key) for key in keys]
        request = _fs.BatchGetDocumentsRequest.pb()(database=self._codec.database_name, documents=names)
        if txn is not None:
            request.transaction = txn.token
        answers = yield from _send(
            "lookup", "batch_get_documents", _fs.BatchGetDocumentsRequest(request), about=self._about(names), stream=True
        )
        self._record("lookup", reads=len(keys))
        found = {answer.found.name: answer.found for answer in answers if answer.HasField("found")}
        return [self._codec.entity_from_pb(found[name]) if name in found else None for name in names]

    def _run_query_plan(self, query: Query, txn: TransactionState | None) -> plan.Plan[QueryResult]:
        shape = shape_query(self._codec, query)
        request = _fs.RunQueryRequest.pb()(parent=shape.parent)
        request.structured_query.CopyFrom(shape.structured)
        if txn is not None:
            request.transaction = txn.token
        answers = yield from _send(
            "run_query", "run_query", _fs.RunQueryRequest(request), about=f"{self._about([])}, {describe(query)}",
            stream=True,
        )
        documents = [answer.document for answer in answers if answer.HasField("document")]
        self._record("run_query", reads=len(documents))
        return QueryResult(
            entities=tuple(shape.entity(self._codec, document) for document in documents),
            end_cursor=shape.cursor_after(documents[-1]) if documents else query.start_cursor,
            more_results=False,  # (RunQuery streams every result: there is no next batch)
        )

    def _run_aggregation_plan(
        self, aggregation: AggregationQuery, txn: TransactionState | None
    ) -> plan.Plan[AggregationResult]:
        """Firestore's own ``RunAggregationQuery`` (count, sum, avg), not the
        base's default (computing it from the query's rows): the default
        follows Datastore's index rows (one per list element; only indexed
        values), which are not Firestore's, and it reads every row, where
        Firestore bills one read per started 1,000 index entries. A
        ``COUNT(*)`` of its own rides along when there is room, so the reads
        can be recorded as Firestore bills them."""
        aliases = aggregation.aliases()
        kinds = [item.kind for item in aggregation.aggregations]
        extra = None
        if "COUNT" not in kinds and len(kinds) < 5:
            extra = "gds_counter_rows"
            while extra in aliases:
                extra += "_"
        summed = tuple(item.property or "" for item in aggregation.aggregations if item.kind in ("SUM", "AVG"))
        shape = shape_query(self._codec, aggregation.query, select=False, summed=summed)
        pb = _StructuredAggregationPb()
        pb.structured_query.CopyFrom(shape.structured)
        for item, alias in [*zip(aggregation.aggregations, aliases), *([(None, extra)] if extra else [])]:
            out = pb.aggregations.add()
            out.alias = alias
            if item is None or item.kind == "COUNT":
                out.count.SetInParent()
            elif item.kind == "COUNT_UP_TO":
                out.count.up_to.value = item.up_to or 0
                out.count.up_to.SetInParent()
            elif item.kind == "SUM":
                out.sum.field.field_path = _field(item.property)
            else:
                out.avg.field.field_path = _field(item.property)
        request = _fs.RunAggregationQueryRequest.pb()(parent=shape.parent)
        request.structured_aggregation_query.CopyFrom(pb)
        if txn is not None:
            request.transaction = txn.token
        answers = yield from _send(
            "run_aggregation_query", "run_aggregation_query", _fs.RunAggregationQueryRequest(request),
            about=f"{self._about([])}, {describe(aggregation.query)}", stream=True, policy="run_query",
        )
        found: dict[str, Any] = {}
        for answer in answers:
            if answer.HasField("result"):
                found.update((k, self._codec.value_from_pb(v)) for k, v in answer.result.aggregate_fields.items())
        missing = [alias for alias in aliases if alias not in found]
        if missing:
            raise GatewayError(f"run_aggregation_query: Firestore sent no value for {missing} (it sent {sorted(found)})")
        counted = [found[a] for a, k in zip(aliases, kinds) if k in ("COUNT", "COUNT_UP_TO")]
        rows = found[extra] if extra else max(counted) if counted else 0
        self._record("run_aggregation_query", reads=billed_reads(rows))
        return AggregationResult(tuple((alias, found[alias]) for alias in aliases))

    # --- transactions -------------------------------------------------------

    def _begin_plan(self, read_only: bool, read_time: datetime | None = None) -> plan.Plan[TransactionState]:
        request = _fs.BeginTransactionRequest.pb()(database=self._codec.database_name)
        if read_time is not None:
            request.options.read_only.read_time.FromDatetime(read_time)
        elif read_only:
            request.options.read_only.SetInParent()
        else:
            request.options.read_write.SetInParent()
        answer = yield from _send(
            "begin_transaction", "begin_transaction", _fs.BeginTransactionRequest(request), about=self._about([])
        )
        self._record("begin_transaction")
        return TransactionState(bytes(answer.transaction), read_only)

    def _rollback_plan(self, txn: TransactionState) -> plan.Plan[None]:
        request = _fs.RollbackRequest.pb()(database=self._codec.database_name, transaction=txn.token)
        return rollback_plan(
            _send("rollback", "rollback", _fs.RollbackRequest(request), about=self._about([])), self._record
        )

    # --- writes -------------------------------------------------------------

    def _commit_plan(
        self, chunk: list[Mutation], txn: TransactionState | None
    ) -> plan.Plan[list[tuple[Key | None, tuple[Any, ...] | None]]]:
        keys = [document_of(m) for m in chunk]
        keys = [key.completed(random_id()) if key.is_partial else key for key in keys]
        request = _fs.CommitRequest.pb()(database=self._codec.database_name)
        request.writes.extend(self._codec.write_to_pb(m, k) for m, k in zip(chunk, keys))
        if txn is not None:
            request.transaction = txn.token
        # Applying twice is harmless for a transaction (committed at most
        # once) and for upserts, updates and deletes of named documents
        # without transforms (the Datastore gateway's rule); not for
        # increments, inserts or numbered documents.
        idempotent = txn is not None or all(
            isinstance(m, Delete) or (not isinstance(m, Insert) and not m.transforms and m.entity.key is key)
            for m, key in zip(chunk, keys)
        )
        names = [write.delete or write.update.name for write in request.writes]
        answer = yield from _send(
            "commit", "commit", _fs.CommitRequest(request), about=self._about(names), idempotent_commit=idempotent
        )
        upserts = sum(isinstance(m, Upsert) for m in chunk)
        self._record("commit", writes=upserts, deletes=len(chunk) - upserts)
        out: list[tuple[Key | None, tuple[Any, ...] | None]] = []
        for mutation, key, result in zip(chunk, keys, answer.write_results):
            if isinstance(mutation, Delete):
                out.append((key, None))
                continue
            values = tuple(self._codec.value_from_pb(v) for v in result.transform_results)
            out.append((key, values or None))
        return out

    def _allocate_ids_plan(self, keys: list[Key]) -> plan.Plan[list[Key]]:
        """Random ids made here (see the class): no RPC."""
        completed = [key.completed(random_id()) for key in keys]
        for key in completed:
            self._codec.name_of(key)  # a key in a namespace: BadKeyError
        return plan.just(completed)

    def _reserve_ids_plan(self, keys: list[Key]) -> plan.Plan[None]:
        """Nothing to reserve (see the class): the keys are checked, nothing is sent."""
        for key in keys:
            self._codec.name_of(key)
        return plan.just(None)


def _field(name: str | None) -> str:
    return field_path(name or "")
