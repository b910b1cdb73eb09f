"""The Gateway contract, and the base every backend builds on.

Everything above the gateway layer (Store, counters, CLI) speaks only the
neutral types of ``keys``, ``values``, ``query`` and ``mutations``. That is
what lets one conformance suite run the same tests on every gateway.

``BaseGateway`` owns every rule the backends share, each written once:
checking keys and mutations before anything is sent, splitting lookups
(1,000 keys) and non-transactional commits (500 mutations) into legal
batches, transaction tokens (unknown or used-up ones are one error, read-only
ones cannot write), what a transform result means, and the gateway's
``Capabilities``. A backend then only moves bytes, through the ``_lookup``,
``_run_query``, ``_begin``, ``_commit``, ``_rollback`` and ``_allocate_ids``
hooks. Aggregation queries are checked once here too; their hook,
``_run_aggregation``, has a default that computes them through the
backend's own ``run_query`` (``gateway._aggregation``), which a server with
native aggregations (Cloud Datastore) overrides.
"""

from __future__ import annotations

import abc
import collections
import contextvars
import inspect
import logging
import threading
import uuid
from typing import Any, Callable, Generic, Iterator, Protocol, Sequence, TypeVar, runtime_checkable

import attrs
from typing_extensions import TypeIs

from gds_counter._checks import check_int, check_text
from gds_counter.errors import AlreadyExists, BadKeyError, BadValueError, GatewayError, NotFound, Unavailable
from gds_counter.gateway import plan
from gds_counter.gateway._aggregation import aggregate_rows, billed_reads, check_aggregation
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key, plain_key, require_complete
from gds_counter.gateway.mutations import (
    MAX_MUTATIONS_PER_COMMIT,
    CommitResult,
    Delete,
    Increment,
    Mutation,
    MutationResult,
    Upsert,
    check_commit,
    map_keys,
)
from gds_counter.gateway.query import (
    Aggregation,
    AggregationQuery,
    AggregationResult,
    PropertyFilter,
    Query,
    QueryResult,
    check_query,
)
from gds_counter.gateway.stats import Stats
from gds_counter.gateway.values import RawEntity

__all__ = ["MAX_KEYS_PER_LOOKUP", "BaseGateway", "Gateway", "is_gateway"]

log = logging.getLogger(__name__)

#: Datastore's limit on the keys of one lookup.
MAX_KEYS_PER_LOOKUP = 1000

#: Open transactions a gateway remembers; a caller that begins transactions
#: and never ends them must not grow memory without bound.
MAX_OPEN_TRANSACTIONS = 10_000

#: The kind of the throwaway entity a gateway writes (and deletes) once to
#: learn how its server treats increment transforms.
PROBE_KIND = "GdsCounterProbe"


@runtime_checkable
class Gateway(Protocol):
    """What every storage backend offers; ``BaseGateway`` implements it.

    * ``lookup`` returns one item per key, in input order, None for missing;
      any number of keys (split into legal batches).
    * ``commit`` applies the mutations of a transaction atomically (at most
      500). Without a transaction, one complete key named twice is refused
      with ``BadValueError`` before anything is written, as Datastore
      refuses it (a transaction applies such mutations in order). Without
      a transaction more than 500 mutations go in several commits of at
      most 500, each atomic on its own. With a transaction it
      raises ``Contention`` (and writes nothing) if another writer won; the
      transaction is used up either way. Incomplete keys get ids allocated
      and returned in the ``MutationResult``. A commit whose outcome is
      unknown raises ``CommitUnknown``: it must never be retried blindly.
    * ``begin_transaction`` returns an opaque token; passing it to lookup and
      run_query makes those reads part of the transaction. A token that is
      unknown, or already committed or rolled back, is a ``BadValueError``
      (``rollback`` of a finished transaction is a no-op: it is cleanup).
    * ``run_query`` applies ``offset`` fully before it returns a batch, so a
      continuation from ``end_cursor`` never needs the offset again.
    * ``run_aggregation`` runs an ``AggregationQuery`` (``COUNT``,
      ``COUNT_UP_TO``, ``SUM``, ``AVG``) and returns one value per alias,
      with Datastore's rules (``gateway._aggregation``); in a transaction
      when given its token. A server without aggregations raises
      ``GatewayError`` (and its ``capabilities.aggregation`` is False).
    * ``capabilities`` says what the server can do, learned once.
    * Every call counts itself in ``stats``.
    """

    stats: Stats

    #: The namespace the Store uses when the caller names none.
    namespace: str

    @property
    def capabilities(self) -> Capabilities: ...

    def lookup(self, keys: Sequence[Key], *, transaction: bytes | None = None) -> list[RawEntity | None]: ...

    def run_query(self, query: Query, *, transaction: bytes | None = None) -> QueryResult: ...

    def run_aggregation(
        self, aggregation: AggregationQuery, *, transaction: bytes | None = None
    ) -> AggregationResult: ...

    def begin_transaction(self, *, read_only: bool = False) -> bytes: ...

    def commit(self, mutations: Sequence[Mutation], *, transaction: bytes | None = None) -> CommitResult: ...

    def rollback(self, transaction: bytes) -> None: ...

    def allocate_ids(self, keys: Sequence[Key]) -> list[Key]: ...

    def reserve_ids(self, keys: Sequence[Key]) -> None: ...

    def close(self) -> None: ...


#: What makes a gateway (``reserve_ids`` is optional: gateways written before it still are ones).
_MEMBERS = tuple(name for name in dir(Gateway) if not name.startswith("_") and name != "reserve_ids") + ("stats", "namespace")


def is_gateway(candidate: object) -> TypeIs[Gateway]:
    """``isinstance(candidate, Gateway)`` without reading any member: before
    Python 3.12 the protocol check evaluates every property, and evaluating
    ``capabilities`` probes the server."""
    return all(inspect.getattr_static(candidate, name, None) is not None for name in _MEMBERS)


@attrs.define
class TransactionState:
    """One open transaction: its token, and whether it may write. Backends
    subclass it to keep what they need (the embedded engine, what was read)."""

    token: bytes
    read_only: bool


T = TypeVar("T", bound=TransactionState)


class GatewayRules(Generic[T]):
    """The shared rules of every gateway (see the module docstring), with the
    I/O left out: each public call is a plan (``gateway.plan``) that yields
    the backend hooks it needs (``Op("_lookup", ...)``). ``BaseGateway`` runs
    those plans on blocking hooks; the asyncio face's Datastore gateway runs
    the same plans on async ones."""

    def __init__(self, namespace: str = "", *, capabilities: Capabilities | None = None) -> None:
        """``capabilities``: for a backend that knows its own behaviour (the
        embedded engine); a server's are learned by probing it."""
        self.stats = Stats()
        self.namespace = namespace or ""
        self._open_transactions: collections.OrderedDict[bytes, T] = collections.OrderedDict()
        self._transactions_lock = threading.Lock()
        self._capabilities: Capabilities | None = capabilities
        # Per thread, and per asyncio task: a context variable is both.
        self._probing: contextvars.ContextVar[bool] = contextvars.ContextVar("gds_probing", default=False)
        self._aggregating: contextvars.ContextVar[int] = contextvars.ContextVar("gds_aggregating", default=0)

    #: What a backend says of aggregations before it is probed: only the
    #: probe (``_plan_probe``) finds out whether a server runs them.
    _aggregation = False

    # --- cost accounting -----------------------------------------------------

    def _record(self, rpc: str, *, reads: int = 0, writes: int = 0, deletes: int = 0) -> None:
        """Count one RPC, unless it is the gateway's own capability probe,
        which the caller did not ask for and which therefore goes to
        ``probe_rpcs`` instead of ``rpcs``."""
        if self._probing.get():
            self.stats.bump("probe_rpcs")
        elif self._aggregating.get():
            self.stats.bump("aggregation_batches")
        else:
            self.stats.record(rpc, reads=reads, writes=writes, deletes=deletes)

    # --- transactions -------------------------------------------------------

    def _transaction(self, token: bytes | None, *, use_up: bool = False) -> T | None:
        if token is None:
            return None
        if not isinstance(token, bytes):
            raise BadValueError(f"a transaction token is bytes from begin_transaction(), got {token!r}")
        with self._transactions_lock:
            txn = self._open_transactions.pop(token, None) if use_up else self._open_transactions.get(token)
        if txn is None:
            raise BadValueError(
                f"transaction {token!r} is unknown, or was already committed or rolled back; "
                "begin a new one"
            )
        return txn

    def plan_of(self, op: plan.Op) -> "plan.Plan[Any] | None":
        """The plan behind the public call ``op`` names (``lookup``,
        ``commit``, ...), for a driver to run it inline, in the same loop as
        the plan that asked (one ``run`` per call); None when this gateway
        answers that call some other way (a subclass's own method, or one
        set on the instance), which the driver then calls."""
        name, face = op.name, self._face()
        builder = _PLANS.get(name)
        if builder is None or face is None or name in vars(self) or getattr(type(self), name) is not getattr(face, name):
            return None
        return builder(self, *op.args, **dict(op.kwargs))

    @classmethod
    def _face(cls) -> type | None:
        """The class whose public methods just run the rule plans (a
        subclass that overrides one answers that call itself)."""
        return None

    def _plan_begin(self, read_only: bool) -> plan.Plan[bytes]:
        txn: T = yield from _hook("_begin", bool(read_only))
        with self._transactions_lock:
            self._open_transactions[txn.token] = txn
            while len(self._open_transactions) > MAX_OPEN_TRANSACTIONS:
                forgotten, _ = self._open_transactions.popitem(last=False)
                log.warning("forgot transaction %r: over %d open at once", forgotten, MAX_OPEN_TRANSACTIONS)
        return txn.token

    def _plan_rollback(self, transaction: bytes) -> plan.Plan[None]:
        with self._transactions_lock:
            txn = self._open_transactions.pop(transaction, None)
        if txn is None:
            # Rollback is cleanup, often on an error path after a commit used
            # the transaction up: it must not hide the error being handled.
            log.debug("rollback of a finished transaction %r ignored", transaction)
            return
        yield from _hook("_rollback", txn)

    # --- reads ---------------------------------------------------------------

    def _own_project(self) -> str | None:
        """The project a key may name and still be this gateway's own, an
        ordinary key (``keys.plain_key``); None: the gateway has none."""
        return None

    def _plain(self, keys: Sequence[Key]) -> list[Key]:
        own = self._own_project()
        return [plain_key(key, own) if isinstance(key, Key) else key for key in keys]

    def _plan_lookup(self, keys: Sequence[Key], transaction: bytes | None) -> plan.Plan[list[RawEntity | None]]:
        keys = self._plain(keys)
        for key in keys:
            require_complete(key, "lookup")
        txn = self._transaction(transaction)
        unique = list(dict.fromkeys(keys))
        found: dict[Key, RawEntity | None] = {}
        for start in range(0, len(unique), MAX_KEYS_PER_LOOKUP):
            batch = unique[start : start + MAX_KEYS_PER_LOOKUP]
            found.update(zip(batch, (yield from _hook("_lookup", batch, txn))))
        return [found[key] for key in keys]

    def _plan_run_query(self, query: Query, transaction: bytes | None) -> plan.Plan[QueryResult]:
        if query.limit is not None:
            check_int(query.limit, "query limit", low=0)
        check_int(query.offset, "query offset", low=0)
        check_query(query)
        result: QueryResult = yield from _hook("_run_query", query, self._transaction(transaction))
        return result

    def _plan_run_aggregation(
        self, aggregation: AggregationQuery, transaction: bytes | None
    ) -> plan.Plan[AggregationResult]:
        checked = check_aggregation(aggregation)
        check_query(checked.query)
        for item in checked.aggregations:
            if isinstance(item.alias, str):
                check_text(item.alias, "aggregation alias")
        result: AggregationResult = yield from _hook("_run_aggregation", checked, self._transaction(transaction))
        return result

    # --- writes --------------------------------------------------------------

    def _plan_allocate_ids(self, keys: Sequence[Key]) -> plan.Plan[list[Key]]:
        keys = self._plain(keys)
        for key in keys:
            if not isinstance(key, Key) or not key.is_partial:
                raise BadKeyError(f"allocate_ids needs incomplete keys, got {key}")
        out: list[Key] = []
        for start in range(0, len(keys), MAX_MUTATIONS_PER_COMMIT):
            out += yield from _hook("_allocate_ids", keys[start : start + MAX_MUTATIONS_PER_COMMIT])
        return out

    def _plan_reserve_ids(self, keys: Sequence[Key]) -> plan.Plan[None]:
        keys = self._plain(keys)
        for key in keys:
            if not isinstance(key, Key) or key.is_partial or key.id is None or key.id < 1:
                # (the Firestore emulator fails with UNKNOWN on a negative id: no allocator hands one out)
                raise BadKeyError(f"reserve_ids needs complete keys with positive numeric ids, got {key!r}")
        for start in range(0, len(keys), MAX_MUTATIONS_PER_COMMIT):
            yield from _hook("_reserve_ids", keys[start : start + MAX_MUTATIONS_PER_COMMIT])

    def _plan_commit(self, mutations: Sequence[Mutation], transaction: bytes | None) -> plan.Plan[CommitResult]:
        own = self._own_project()
        mutations = map_keys(mutations, lambda key, _holder, _name: plain_key(key, own))  # one key, named or not
        check_commit(mutations, transactional=transaction is not None)
        txn = self._transaction(transaction, use_up=True)
        if txn is not None:
            if txn.read_only and mutations:
                raise BadValueError("a read-only transaction cannot commit mutations; begin a read-write transaction")
            if len(mutations) > MAX_MUTATIONS_PER_COMMIT:
                raise BadValueError(
                    f"a transaction commits at most {MAX_MUTATIONS_PER_COMMIT} mutations atomically, "
                    f"got {len(mutations)}"
                )
            chunks = [mutations]
        else:
            # Nothing to write and no transaction to end: no RPC at all.
            chunks = [
                mutations[i : i + MAX_MUTATIONS_PER_COMMIT] for i in range(0, len(mutations), MAX_MUTATIONS_PER_COMMIT)
            ]
        results: list[MutationResult] = []
        for chunk in chunks:
            try:
                answers = yield from _hook("_commit", chunk, txn)
            except (AlreadyExists, NotFound) as exc:
                if not results:
                    raise
                raise type(exc)(
                    f"{exc}; before this commit, the {len(results)} mutation(s) of the call's earlier commits "
                    f"({MAX_MUTATIONS_PER_COMMIT} to a commit) were written"
                ) from exc
            for mutation, (key, values) in zip(chunk, answers):
                results.append(self._result(mutation, key, values))
        return CommitResult(tuple(results))

    def _result(self, mutation: Mutation, key: Key | None, values: tuple[Any, ...] | None) -> MutationResult:
        """One meaning for transform results on every gateway: ``()`` when the
        mutation asked for none, the values when the server applied them,
        None when it asked for some and the server ignored them (and then
        the gateway knows, from now on, that this server ignores them)."""
        if isinstance(mutation, Delete) or not mutation.transforms:
            return MutationResult(key, ())
        if values is not None and len(values) == len(mutation.transforms):
            return MutationResult(key, tuple(values))
        if self._probing.get():
            return MutationResult(key, None)  # the probe is asking exactly this
        self.stats.bump("transforms_ignored")
        with self._transactions_lock:  # a short lock of its own; the probe may be running
            known = self._capabilities
            if known is None or known.applies_transforms:
                log.warning("%r ignored property transforms (legacy Datastore emulator?); it will not be sent them again", self)
                self._capabilities = attrs.evolve(
                    known or Capabilities(applies_transforms=False, indexes_transformed=False, aggregation=self._aggregation),
                    applies_transforms=False,
                )
        return MutationResult(key, None)

    # --- capabilities -------------------------------------------------------

    def _plan_probe(self) -> plan.Plan[Capabilities]:
        """Ask the server, on a throwaway entity that is deleted after.

        A server-side increment with a property mask, then a read: does the
        server apply both, and does it index the result of a property sent
        unindexed? A server that ignores transforms also ignores the mask and
        replaces the entity, which is why this is never tried on real data.
        Then one ``!=`` query: the legacy Datastore emulator refuses it. Then
        one ``COUNT(*)``: the legacy emulator does not implement aggregations.
        These RPCs count as ``probe_rpcs``, not as the caller's ``rpcs``.
        """
        key = Key.of(PROBE_KIND, f"probe-{uuid.uuid4().hex}", namespace=self.namespace)
        yield from plan.commit([Upsert(RawEntity(key, {"keep": True, "n": 1}, frozenset({"n"})))])
        try:
            mask = Upsert(
                RawEntity(key, {"keep": True}, frozenset({"n"})), property_mask=("keep",), transforms=(Increment("n", 1),)
            )
            [sent] = (yield from plan.commit([mask])).mutation_results
            [after] = yield from plan.lookup([key])
            try:
                yield from plan.run_query(
                    Query(PROBE_KIND, namespace=self.namespace, filter=PropertyFilter("n", "!=", 0), keys_only=True, limit=1)
                )
                not_equal = True
            except Unavailable:
                raise  # says nothing about the server, only that it was not reached
            except (BadValueError, GatewayError):
                not_equal = False  # the legacy emulator answers UNKNOWN
            try:
                yield from plan.run_aggregation(
                    AggregationQuery(
                        Query(PROBE_KIND, namespace=self.namespace, filter=PropertyFilter("__key__", "=", key)),
                        (Aggregation.count(),),
                    )
                )
                aggregation = True
            except Unavailable:
                raise
            except (BadValueError, GatewayError):
                aggregation = False  # the legacy emulator answers UNIMPLEMENTED
        finally:
            yield from plan.commit([Delete(key)])
        applied = (
            sent.transform_results == (2,)
            and after is not None
            and after.properties.get("n") == 2
            and after.properties.get("keep") is True
        )
        return Capabilities(
            applies_transforms=applied,
            indexes_transformed=applied and after is not None and "n" not in after.unindexed,
            not_equal_in_or=not_equal,
            aggregation=aggregation,
        )

    def _learned(self, capabilities: Capabilities) -> Capabilities:
        """Keep what the probe found (unless the gateway learned meanwhile
        that its server ignores transforms), and say so."""
        with self._transactions_lock:
            known = self._capabilities
            if known is not None and not known.applies_transforms:
                capabilities = attrs.evolve(capabilities, applies_transforms=False)
            self._capabilities = capabilities
            log.info("%r: %s", self, self._capabilities)
            return self._capabilities


def _hook(name: str, *args: Any) -> plan.Plan[Any]:
    """Call the backend hook ``name`` of the gateway whose plan this is."""
    return (yield plan.Op(name, args))


class BaseGateway(GatewayRules[T], abc.ABC):
    """The shared rules (``GatewayRules``) run on blocking backend hooks."""

    @classmethod
    def _face(cls) -> type | None:
        return BaseGateway

    def __init__(self, namespace: str = "", *, capabilities: Capabilities | None = None) -> None:
        super().__init__(namespace, capabilities=capabilities)
        self._capabilities_lock = threading.RLock()  # the probe commits while holding it

    # --- hooks: what a backend implements ----------------------------------

    @abc.abstractmethod
    def _lookup(self, keys: list[Key], txn: T | None) -> list[RawEntity | None]:
        """At most ``MAX_KEYS_PER_LOOKUP`` distinct complete keys, in order."""

    @abc.abstractmethod
    def _run_query(self, query: Query, txn: T | None) -> QueryResult:
        """One batch; limit and offset are already checked."""

    @abc.abstractmethod
    def _begin(self, read_only: bool) -> T:
        """Start a transaction on the server and describe it."""

    @abc.abstractmethod
    def _commit(self, mutations: list[Mutation], txn: T | None) -> list[tuple[Key | None, tuple[Any, ...] | None]]:
        """At most 500 checked mutations, atomically. For each: the key (the
        allocated one for an incomplete key) and the transform results as the
        server sent them (None, or fewer than asked, when it sent none)."""

    @abc.abstractmethod
    def _rollback(self, txn: T) -> None:
        """End an open transaction on the server without writing."""

    @abc.abstractmethod
    def _allocate_ids(self, keys: list[Key]) -> list[Key]:
        """At most 500 incomplete keys, completed."""

    @abc.abstractmethod
    def _reserve_ids(self, keys: list[Key]) -> None:
        """At most 500 complete keys with ids: never allocate those ids."""

    def _run_aggregation(self, aggregation: AggregationQuery, txn: T | None) -> AggregationResult:
        """A checked aggregation. The default computes it from the rows of
        the query (``gateway._aggregation.aggregate_rows``), read through this
        gateway's own ``run_query`` (and ``lookup``) in ``txn``. Those reads
        are not what Datastore would bill: they count as
        ``aggregation_batches``, and the aggregation as one
        ``run_aggregation_query`` RPC reading one entity per started 1,000
        rows."""
        token = txn.token if txn is not None else None
        depth = self._aggregating.set(self._aggregating.get() + 1)
        try:
            values, rows = aggregate_rows(
                aggregation,
                lambda query: (batch.entities for batch in iterate_batches(self, query, transaction=token)),
                lambda keys: self.lookup(keys, transaction=token),
            )
        finally:
            self._aggregating.reset(depth)
        self._record("run_aggregation_query", reads=billed_reads(rows))
        return AggregationResult(values)

    def close(self) -> None:
        """Release connections; the default has none."""

    def __enter__(self: "BaseGateway[T]") -> "BaseGateway[T]":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def begin_transaction(self, *, read_only: bool = False) -> bytes:
        return plan.run(self._plan_begin(read_only), self)

    def rollback(self, transaction: bytes) -> None:
        plan.run(self._plan_rollback(transaction), self)

    def lookup(self, keys: Sequence[Key], *, transaction: bytes | None = None) -> list[RawEntity | None]:
        return plan.run(self._plan_lookup(keys, transaction), self)

    def run_query(self, query: Query, *, transaction: bytes | None = None) -> QueryResult:
        return plan.run(self._plan_run_query(query, transaction), self)

    def run_aggregation(self, aggregation: AggregationQuery, *, transaction: bytes | None = None) -> AggregationResult:
        return plan.run(self._plan_run_aggregation(aggregation, transaction), self)

    def allocate_ids(self, keys: Sequence[Key]) -> list[Key]:
        return plan.run(self._plan_allocate_ids(keys), self)

    def reserve_ids(self, keys: Sequence[Key]) -> None:
        """Keep ``keys``' ids out of what ``allocate_ids`` hands out (keys a
        caller numbered itself, or copied from elsewhere)."""
        return plan.run(self._plan_reserve_ids(keys), self)

    def commit(self, mutations: Sequence[Mutation], *, transaction: bytes | None = None) -> CommitResult:
        return plan.run(self._plan_commit(mutations, transaction), self)

    @property
    def capabilities(self) -> Capabilities:
        """What this gateway's server can do, learned on first use (one probe
        of increment transforms, on a throwaway entity: see ``_plan_probe``)
        and kept for the gateway's lifetime."""
        known = self._capabilities
        if known is not None:
            return known
        with self._capabilities_lock:
            if self._capabilities is not None:
                return self._capabilities
            probing = self._probing.set(True)
            try:
                found = plan.run(self._plan_probe(), self)
            finally:
                self._probing.reset(probing)
            return self._learned(found)


#: Each public call's rule plan, built from the call's own arguments (``plan_of``).
_PLANS: dict[str, Callable[..., plan.Plan[Any]]] = {
    "lookup": lambda gateway, keys, transaction=None: gateway._plan_lookup(keys, transaction),
    "run_query": lambda gateway, query, transaction=None: gateway._plan_run_query(query, transaction),
    "run_aggregation": lambda gw, aggregation, transaction=None: gw._plan_run_aggregation(aggregation, transaction),
    "begin_transaction": lambda gateway, read_only=False: gateway._plan_begin(read_only),
    "commit": lambda gateway, mutations, transaction=None: gateway._plan_commit(mutations, transaction),
    "rollback": lambda gateway, transaction: gateway._plan_rollback(transaction),
    "allocate_ids": lambda gateway, keys: gateway._plan_allocate_ids(keys),
    "reserve_ids": lambda gateway, keys: gateway._plan_reserve_ids(keys),
}


# --- the checks every backend shares ----------------------------------------


# --- following a query ---------------------------------------------------------


def iterate_batches(gateway: Gateway, query: Query, *, transaction: bytes | None = None) -> Iterator[QueryResult]:
    """Follow a query's batches to the end or to its limit, yielding each
    batch as it arrives (``plan.next_batch`` says how to go on)."""
    remaining = query.limit
    current: Query | None = query
    while current is not None:
        result = gateway.run_query(current, transaction=transaction)
        yield result
        if remaining is not None:
            remaining -= len(result.entities)
        current = plan.next_batch(current, result, remaining)


def run_query_all(gateway: Gateway, query: Query, *, transaction: bytes | None = None) -> Iterator[RawEntity]:
    """Every result of a query, across all batches."""
    for batch in iterate_batches(gateway, query, transaction=transaction):
        yield from batch.entities
