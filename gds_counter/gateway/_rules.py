"""The rules every backend shares, written once as plans (``GatewayRules``).

Checking keys and mutations before anything is sent, splitting lookups
(1,000 keys) and non-transactional commits (500 mutations) into legal
batches, transaction tokens (unknown or used-up ones are one error,
read-only ones cannot write), what a transform result means, and the
gateway's ``Capabilities``. Each public call of a gateway is a plan here
(``_plan_lookup``, ...) that asks the backend for the bytes through its
hooks (``gateway._hooks``); the drivers run such a plan inline when a plan
above calls the gateway (``rule_plan``). ``BaseGateway`` runs these rules on
blocking hooks, the asyncio face's Datastore gateway on async ones.
"""

from __future__ import annotations

import collections
import contextvars
import logging
import threading
from datetime import datetime
from typing import Any, ClassVar, Sequence, TypeVar

import attrs

from gds_counter._checks import check_int, check_text
from gds_counter._process import forks
from gds_counter.errors import AlreadyExists, BadKeyError, BadValueError, Contention, GDSError, NotFound
from gds_counter.gateway._aggregation import check_aggregation
from gds_counter.gateway._calls import CALLS, GatewayCall
from gds_counter.gateway._contract import MAX_KEYS_PER_LOOKUP, TransactionState
from gds_counter.gateway._effects import Plan, ask
from gds_counter.gateway._hooks import (
    AllocateIdsHook,
    BeginHook,
    CommitHook,
    LookupHook,
    ReserveIdsHook,
    RollbackHook,
    RunAggregationHook,
    RunQueryHook,
)
from gds_counter.gateway._probe import probe
from gds_counter.gateway._read_time import check_read_time
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key, plain_key, require_complete
from gds_counter.gateway.mutations import (
    MAX_MUTATIONS_PER_COMMIT,
    CommitResult,
    Delete,
    Mutation,
    MutationResult,
    check_commit,
    map_keys,
)
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult, check_query
from gds_counter.gateway.stats import Stats
from gds_counter.gateway.values import RawEntity

__all__ = ["MAX_OPEN_TRANSACTIONS", "GatewayRules"]

log = logging.getLogger("gds_counter.gateway.base")

T = TypeVar("T")

#: Open transactions a gateway remembers; a caller that begins transactions
#: and never ends them must not grow memory without bound.
MAX_OPEN_TRANSACTIONS = 10_000


class GatewayRules:
    """The shared rules of every gateway (see the module docstring), with the
    I/O left out: each public call is a plan (``gateway.plan``) that yields
    the backend hooks it needs (``LookupHook``, ...). ``BaseGateway`` runs
    those plans on blocking hooks; the asyncio face's Datastore gateway runs
    the same plans on async ones.

    A class whose public calls just run these plans says so
    (``_runs_rules = True``): the drivers then run the plan inline for a
    call a plan yields (``rule_plan``), unless a subclass, or the object
    itself, answers that call with a method of its own."""

    #: Set by a class whose public methods run the rule plans (the face).
    _runs_rules: ClassVar[bool] = False
    #: The calls this class answers with its rule plans (``__init_subclass__``).
    _ruled_calls: ClassVar[frozenset[type[GatewayCall[object]]]] = frozenset()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        face = next((k for k in cls.__mro__ if vars(k).get("_runs_rules")), None)
        cls._ruled_calls = frozenset(
            call for call in CALLS if face is not None and getattr(cls, call.method) is getattr(face, call.method)
        )

    def __init__(self, namespace: str = "", *, capabilities: Capabilities | None = None) -> None:
        """``capabilities``: for a backend that knows its own behaviour (the
        embedded engine); a server's are learned by probing it."""
        self.stats = Stats()
        self.namespace = namespace or ""
        self._open_transactions: collections.OrderedDict[bytes, TransactionState] = collections.OrderedDict()
        self._transactions_lock = threading.Lock()
        #: The transactions open when this process forked (or was forked):
        #: refused, on both sides of the fork (``_before_fork``).
        self._forked: set[bytes] = set()
        self._capabilities: Capabilities | None = capabilities
        # Per thread, and per asyncio task: a context variable is both.
        self._probing: contextvars.ContextVar[bool] = contextvars.ContextVar("gds_probing", default=False)
        self._aggregating: contextvars.ContextVar[int] = contextvars.ContextVar("gds_aggregating", default=0)
        forks.register(self)

    def _before_fork(self) -> None:
        """A transaction open now would be held by both processes after the
        fork, and each would commit the same mutations (seen: both applied,
        the one told "nothing applied" redid it): both refuse it
        (``Contention``). Read without the lock, which the forking thread
        may hold (a signal's handler): the copy is one step under the GIL."""
        self._forked.update(self._open_transactions)

    def _after_fork_in_child(self) -> None:
        """A thread of the parent may have held a lock at the fork; the
        child, which has none of its threads, would wait for it for ever.
        The parent's gRPC clients are abandoned (``_abandon_clients``)."""
        self._transactions_lock = threading.Lock()
        self.stats._after_fork_in_child()
        self._abandon_clients()

    def _abandon_clients(self) -> None:
        """In a forked child: keep every client the parent made, unused and
        never collected (``gateway._grpc_clients``); none here."""

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

    def _transaction(self, token: bytes | None, *, use_up: bool = False) -> TransactionState | None:
        if token is None:
            return None
        if not isinstance(token, bytes):
            raise BadValueError(f"a transaction token is bytes from begin_transaction(), got {token!r}")
        if token in self._forked:
            raise Contention(
                f"transaction {token!r} was open when the process forked: this process and the other both hold it, "
                "and each would apply it, so neither may use it; nothing of it was applied: roll it back and retry it"
            )
        with self._transactions_lock:
            txn = self._open_transactions.pop(token, None) if use_up else self._open_transactions.get(token)
        if txn is None:
            raise BadValueError(
                f"transaction {token!r} is unknown, or was already committed or rolled back; "
                "begin a new one"
            )
        return txn

    def rule_plan(self, call: GatewayCall[T]) -> Plan[T] | None:
        """The plan behind the public call ``call`` (``Lookup``, ``Commit``,
        ...), for a driver to run it inline, in the same loop as the plan
        that asked (one ``run`` per call); None when this gateway answers
        that call some other way (a subclass's own method, or one set on
        the object), which the driver then calls."""
        if type(call) not in self._ruled_calls or call.method in self.__dict__:
            return None
        return call.rules(self)

    def _plan_begin(self, read_only: bool, read_time: datetime | None = None) -> Plan[bytes]:
        if read_time is not None:
            read_time = check_read_time(read_time, read_only=bool(read_only))
        txn = yield from ask(BeginHook(bool(read_only), read_time))
        with self._transactions_lock:
            self._open_transactions[txn.token] = txn
            while len(self._open_transactions) > MAX_OPEN_TRANSACTIONS:
                forgotten, _ = self._open_transactions.popitem(last=False)
                log.warning("forgot transaction %r: over %d open at once", forgotten, MAX_OPEN_TRANSACTIONS)
        return txn.token

    def _plan_rollback(self, transaction: bytes) -> Plan[None]:
        with self._transactions_lock:
            txn = self._open_transactions.pop(transaction, None)
        self._forked.discard(transaction)
        if txn is None:
            # Rollback is cleanup, often on an error path after a commit used
            # the transaction up: it must not hide the error being handled.
            log.debug("rollback of a finished transaction %r ignored", transaction)
            return
        yield from ask(RollbackHook(txn))

    # --- reads ---------------------------------------------------------------

    def _own_project(self) -> str | None:
        """The project a key may name and still be this gateway's own, an
        ordinary key (``keys.plain_key``); None: the gateway has none."""
        return None

    def _plain(self, keys: Sequence[Key]) -> list[Key]:
        own = self._own_project()
        return [plain_key(key, own) if isinstance(key, Key) else key for key in keys]

    def _plan_lookup(self, keys: Sequence[Key], transaction: bytes | None) -> Plan[list[RawEntity | None]]:
        keys = self._plain(keys)
        for key in keys:
            require_complete(key, "lookup")
        txn = self._transaction(transaction)
        unique = list(dict.fromkeys(keys, True))
        found: dict[Key, RawEntity | None] = {}
        for start in range(0, len(unique), MAX_KEYS_PER_LOOKUP):
            batch = unique[start : start + MAX_KEYS_PER_LOOKUP]
            found.update(zip(batch, (yield from ask(LookupHook(batch, txn)))))
        return [found[key] for key in keys]

    def _plan_run_query(self, query: Query, transaction: bytes | None) -> Plan[QueryResult]:
        if query.limit is not None:
            check_int(query.limit, "query limit", low=0)
        check_int(query.offset, "query offset", low=0)
        check_query(query)
        return (yield from ask(RunQueryHook(query, self._transaction(transaction))))

    def _plan_run_aggregation(
        self, aggregation: AggregationQuery, transaction: bytes | None
    ) -> Plan[AggregationResult]:
        checked = check_aggregation(aggregation)
        check_query(checked.query)
        for item in checked.aggregations:
            if isinstance(item.alias, str):
                check_text(item.alias, "aggregation alias")
        return (yield from ask(RunAggregationHook(checked, self._transaction(transaction))))

    # --- writes --------------------------------------------------------------

    def _plan_allocate_ids(self, keys: Sequence[Key]) -> Plan[list[Key]]:
        keys = self._plain(keys)
        for key in keys:
            if not isinstance(key, Key) or not key.is_partial:
                raise BadKeyError(f"allocate_ids needs incomplete keys, got {key}")
        out: list[Key] = []
        for start in range(0, len(keys), MAX_MUTATIONS_PER_COMMIT):
            out += yield from ask(AllocateIdsHook(keys[start : start + MAX_MUTATIONS_PER_COMMIT]))
        return out

    def _plan_reserve_ids(self, keys: Sequence[Key]) -> Plan[None]:
        keys = self._plain(keys)
        for key in keys:
            if not isinstance(key, Key) or key.is_partial or key.id is None or key.id < 1:
                # (the Firestore emulator fails with UNKNOWN on a negative id: no allocator hands one out)
                raise BadKeyError(f"reserve_ids needs complete keys with positive numeric ids, got {key!r}")
        for start in range(0, len(keys), MAX_MUTATIONS_PER_COMMIT):
            yield from ask(ReserveIdsHook(keys[start : start + MAX_MUTATIONS_PER_COMMIT]))

    def _plan_commit(self, mutations: Sequence[Mutation], transaction: bytes | None) -> Plan[CommitResult]:
        own = self._own_project()
        mutations = map_keys(mutations, lambda key, _holder, _name: plain_key(key, own))  # one key, named or not
        check_commit(mutations, transactional=transaction is not None)
        txn = None if transaction is None else self._transaction(transaction, use_up=True)
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
            chunks = [mutations] if 0 < len(mutations) <= MAX_MUTATIONS_PER_COMMIT else [
                mutations[i : i + MAX_MUTATIONS_PER_COMMIT] for i in range(0, len(mutations), MAX_MUTATIONS_PER_COMMIT)
            ]
        results: list[MutationResult] = []
        for chunk in chunks:
            try:
                answers = yield from ask(CommitHook(chunk, txn))
            except (AlreadyExists, NotFound) as exc:
                if not results:
                    raise
                raise type(exc)(
                    f"{exc}; before this commit, the {len(results)} mutation(s) of the call's earlier commits "
                    f"({MAX_MUTATIONS_PER_COMMIT} to a commit) were written"
                ) from exc
            except BaseException as exc:
                if txn is not None and not isinstance(exc, (GDSError, GeneratorExit)):
                    # Interrupted or cancelled, maybe before it was sent: no answer ended the
                    # transaction, so the caller's rollback must (a locking server, Firestore in
                    # native mode, kept its locks on what it read until it expired).
                    with self._transactions_lock:
                        self._open_transactions[txn.token] = txn
                raise
            for mutation, (key, values) in zip(chunk, answers):
                results.append(self._result(mutation, key, values))
        return CommitResult(tuple(results))

    def _result(self, mutation: Mutation, key: Key | None, values: tuple[object, ...] | None) -> MutationResult:
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

    def _plan_probe(self) -> Plan[Capabilities]:
        """What the server can do, asked on a throwaway entity (``gateway._probe``)."""
        return probe(self.namespace)

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
