"""``FirestoreGateway``: the gateway hooks as blocking Firestore (native
mode) RPCs, through google-cloud-firestore's GAPIC client.

The transport is the Datastore gateway's in shape: an insecure channel with
no credentials for an emulator (``FIRESTORE_EMULATOR_HOST``, as
google-cloud-firestore honours it: that host, plaintext, the emulator's
``Bearer owner`` header), else ``credentials`` or Application Default
Credentials; one overall deadline per logical request with the policy's
retries inside it (``datastore._retry``, through ``_errors``). Streaming
RPCs (``BatchGetDocuments``, ``RunQuery``, ``RunAggregationQuery``) are
read to their end inside one attempt, so a failure midway is retried as a
whole read. Protobufs come from ``_codec`` and ``_query``.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time
from typing import Any, Callable

from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.cloud.firestore_v1.types import firestore as _fs
from google.cloud.firestore_v1.types import query as _q

from gds_counter.errors import BadKeyError, BadValueError, Contention, GatewayError, Unavailable
from gds_counter.gateway._aggregation import billed_reads
from gds_counter.gateway.base import BaseGateway, TransactionState
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.datastore._requests import strip_scheme
from gds_counter.gateway.datastore._retry import DEFAULT_RETRY, error_message, should_retry
from gds_counter.gateway.firestore._codec import DocumentCodec, document_of, field_path, random_id
from gds_counter.gateway.firestore._errors import final_error
from gds_counter.gateway.firestore._query import describe, shape_query
from gds_counter.gateway.keys import Key, project_name
from gds_counter.gateway.mutations import Delete, Mutation, Upsert
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity

__all__ = ["CAPABILITIES", "FirestoreGateway"]

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


class FirestoreGateway(BaseGateway[TransactionState]):
    """Gateway over Cloud Firestore in native mode (or its emulator).

    ``emulator_host`` (or ``FIRESTORE_EMULATOR_HOST`` when it is None)
    points at an emulator; otherwise ``credentials`` or Application
    Default Credentials reach production. Native mode has no namespaces,
    so this gateway's namespace is ``""`` and a key in another one is a
    ``BadKeyError`` before anything is sent.

    ``_allocate_ids`` asks the server for nothing: native mode allocates no
    ids, so an incomplete key gets a scattered random 63-bit id made here
    (``_codec.random_id``), written with the precondition exists=false when
    a commit numbers it, so two clashing ids are ``AlreadyExists``, never an
    overwrite. ``_reserve_ids`` has nothing to keep out of a sequence that
    does not exist: it checks the keys and sends nothing.

    Thread-safe: one gateway may be shared by many threads (gRPC channels are).
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
        super().__init__("", capabilities=CAPABILITIES)
        self.project, self.database, self.timeout = project, database, float(timeout)
        self.deadline: float | None = None
        self._retry = retry.with_timeout(self.timeout) if retry is not None else None
        self._retries: dict[tuple[str, bool], Any] = {}
        self._codec = DocumentCodec(project, database)
        host = emulator_host if emulator_host is not None else os.environ.get("FIRESTORE_EMULATOR_HOST")
        self.emulator_host = strip_scheme(host) if host else None
        self._metadata: list[tuple[str, str]] = [("google-cloud-resource-prefix", self._codec.database_name)]
        from google.cloud.firestore_v1.services.firestore import FirestoreClient
        from google.cloud.firestore_v1.services.firestore.transports import FirestoreGrpcTransport

        if self.emulator_host:
            import grpc

            if credentials is not None:
                log.warning("credentials are ignored: talking to the emulator at %s", self.emulator_host)
            # As google-cloud-firestore does: plaintext, and the emulator's owner token.
            self._metadata.append(("authorization", "Bearer owner"))
            channel = grpc.insecure_channel(self.emulator_host)
            self._client = FirestoreClient(transport=FirestoreGrpcTransport(channel=channel))
        else:
            from google.auth.exceptions import DefaultCredentialsError

            try:
                self._client = FirestoreClient(credentials=credentials)
            except DefaultCredentialsError as exc:
                raise GatewayError(
                    f"cannot reach Cloud Firestore project {project!r}: no credentials ({exc}). Pass credentials=, "
                    "set GOOGLE_APPLICATION_CREDENTIALS or run 'gcloud auth application-default login'; for an "
                    "emulator set FIRESTORE_EMULATOR_HOST. Nothing was sent"
                ) from exc
        log.debug("FirestoreGateway project=%s database=%r emulator=%s", project, database, self.emulator_host)

    def __repr__(self) -> str:
        where = f"emulator {self.emulator_host}" if self.emulator_host else "Cloud Firestore"
        return f"{type(self).__name__}({self.project!r}, database={self.database!r}, {where})"

    def _own_project(self) -> str:
        return self.project

    # --- plumbing: one deadline per request, the policy's retries inside it ----

    def set_deadline(self, at: float | None) -> None:
        """Bound every later call, its retries included, by the instant
        ``at`` (``time.monotonic()``) as well as by ``timeout``; as
        ``DatastoreGateway.set_deadline``. None lifts the bound."""
        self.deadline = at

    def _budget(self, call: str) -> float:
        if self.deadline is None:
            return self.timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Unavailable(
                f"{call}: not sent to {self!r}: the deadline set for its calls passed {-left:.1f} s ago, "
                "so nothing of it was written"
            )
        return min(self.timeout, left)

    def _retry_for(self, rule: str, idempotent_commit: bool, budget: float) -> Any:
        if self._retry is None:
            return None
        found = self._retries.get((rule, idempotent_commit))
        if found is None:
            found = self._retries[(rule, idempotent_commit)] = self._retry.with_predicate(
                functools.partial(should_retry, call=rule, idempotent_commit=idempotent_commit)
            )
        return found if budget == found.timeout else found.with_timeout(budget)

    def _send(
        self, call: str, method: str, request: Any, *, about: str, stream: bool = False,
        idempotent_commit: bool = False, policy: str = "",
    ) -> Any:
        """Send ``request`` with the client's ``method`` under the policy's
        row for ``policy or call``: the raw response (every one, in a list,
        for a streaming RPC). Errors name ``call`` and what it is ``about``."""
        rule = policy or call
        budget = self._budget(call)
        deadline = time.monotonic() + budget
        failures: list[BaseException] = []
        rpc: Callable[..., Any] = getattr(self._client, method)

        def attempt() -> Any:
            remaining = max(0.05, deadline - time.monotonic())
            try:
                answer = rpc(request=request, retry=None, timeout=remaining, metadata=self._metadata)
                return [item._pb for item in answer] if stream else getattr(answer, "_pb", None)
            except gexc.GoogleAPICallError as exc:
                failures.append(exc)
                raise

        def on_error(exc: BaseException) -> None:
            self.stats.bump(f"retry.{call}")
            log.info("retrying %s after %s: %s", call, type(exc).__name__, error_message(exc))

        try:
            retry = self._retry_for(rule, idempotent_commit, budget)
            return attempt() if retry is None else retry(attempt, on_error=on_error)()
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            raise final_error(exc, failures, call=call, rule=rule, about=about) from exc

    def _about(self, names: list[str]) -> str:
        shown = ", ".join(name.partition("/documents/")[2] for name in names[:_NAMED])
        more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
        return f"project {self.project!r}, database {self.database!r}" + (f", documents {shown}{more}" if names else "")

    # --- reads -----------------------------------------------------------------

    def _lookup(self, keys: list[Key], txn: TransactionState | None) -> list[RawEntity | None]:
        names = [self._codec.name_of(key) for key in keys]
        request = _fs.BatchGetDocumentsRequest.pb()(database=self._codec.database_name, documents=names)
        if txn is not None:
            request.transaction = txn.token
        answers = self._send(
            "lookup", "batch_get_documents", _fs.BatchGetDocumentsRequest(request), about=self._about(names), stream=True
        )
        self._record("lookup", reads=len(keys))
        found = {answer.found.name: answer.found for answer in answers if answer.HasField("found")}
        return [self._codec.entity_from_pb(found[name]) if name in found else None for name in names]

    def _run_query(self, query: Query, txn: TransactionState | None) -> QueryResult:
        shape = shape_query(self._codec, query)
        request = _fs.RunQueryRequest.pb()(parent=shape.parent)
        request.structured_query.CopyFrom(shape.structured)
        if txn is not None:
            request.transaction = txn.token
        answers = self._send(
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

    def _run_aggregation(self, aggregation: AggregationQuery, txn: TransactionState | None) -> AggregationResult:
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
        answers = self._send(
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

    def _begin(self, read_only: bool) -> TransactionState:
        request = _fs.BeginTransactionRequest.pb()(database=self._codec.database_name)
        if read_only:
            request.options.read_only.SetInParent()
        else:
            request.options.read_write.SetInParent()
        answer = self._send("begin_transaction", "begin_transaction", _fs.BeginTransactionRequest(request), about=self._about([]))
        self._record("begin_transaction")
        return TransactionState(bytes(answer.transaction), read_only)

    def _rollback(self, txn: TransactionState) -> None:
        request = _fs.RollbackRequest.pb()(database=self._codec.database_name, transaction=txn.token)
        try:
            self._send("rollback", "rollback", _fs.RollbackRequest(request), about=self._about([]))
        except (BadValueError, Contention) as exc:
            # Cleanup, often on an error path: a transaction the server already
            # ended must not hide the error being handled.
            log.debug("rollback of an already finished transaction ignored: %s", exc)
        finally:
            self._record("rollback")

    # --- writes -------------------------------------------------------------

    def _commit(self, chunk: list[Mutation], txn: TransactionState | None) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
        keys = [document_of(m) for m in chunk]
        keys = [key.completed(random_id()) if key.is_partial else key for key in keys]
        request = _fs.CommitRequest.pb()(database=self._codec.database_name)
        request.writes.extend(self._codec.write_to_pb(m, k) for m, k in zip(chunk, keys))
        if txn is not None:
            request.transaction = txn.token
        # Applying twice is harmless for a transaction (committed at most
        # once) and for whole upserts and deletes of named documents; not for
        # increments, preconditions or numbered documents.
        idempotent = txn is not None or all(
            isinstance(m, Delete) or (type(m) is Upsert and not m.transforms and not m.entity.key.is_partial)  # type: ignore[union-attr]
            for m in chunk
        )
        names = [write.delete or write.update.name for write in request.writes]
        answer = self._send(
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

    def _allocate_ids(self, keys: list[Key]) -> list[Key]:
        """Random ids made here (see the class): no RPC."""
        completed = [key.completed(random_id()) for key in keys]
        for key in completed:
            self._codec.name_of(key)  # a key in a namespace: BadKeyError
        return completed

    def _reserve_ids(self, keys: list[Key]) -> None:
        """Nothing to reserve (see the class): the keys are checked, nothing is sent."""
        for key in keys:
            self._codec.name_of(key)

    def close(self) -> None:
        try:
            self._client.transport.close()
        except Exception:  # closing twice or a dead channel is not worth failing over
            log.debug("closing the Firestore channel failed", exc_info=True)


def _field(name: str | None) -> str:
    return field_path(name or "")
