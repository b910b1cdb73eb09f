"""Fault injection for tests: make storage fail on purpose, reproducibly.

Test tooling, so it lives in ``gds_counter.testing`` and nothing in the
product imports it: a wrapper that fails on purpose must never be one
import away from production code.

Two wrappers, both driven by a seeded ``random.Random`` so a failing run can
be replayed exactly, and both recording every fault they injected so a test
can reconcile what it saw with what was stored:

``FaultyGateway(inner, rates, seed=...)``
    A Gateway that delegates every call to a real ``inner`` gateway (embedded
    SQLite or Datastore) and, on the calls and at the rates you choose,
    raises what the Datastore gateway raises once its own retries are done:

    =====================  ===========================================================
    fault                  what the wrapper does
    =====================  ===========================================================
    ``ABORTED``            raises ``Contention`` before the call; nothing applied
    ``UNAVAILABLE``        raises ``Unavailable`` before the call; nothing applied
    ``DEADLINE_EXCEEDED``  makes the call, drops its answer, then raises: for a
                           commit ``CommitUnknown`` (it WAS applied, the caller
                           cannot know), for other calls ``Unavailable`` (as
                           the Datastore gateway does: a read applies nothing)
    ``RESOURCE_EXHAUSTED`` raises ``GatewayError`` before the call (what the
                           Datastore gateway raises when quota retries run out);
                           nothing applied
    =====================  ===========================================================

    A transactional commit that fails before it is sent also ends the inner
    transaction, as a server does with an aborted one, so a pessimistic
    server's locks are not held until they time out. ``rollback`` never
    raises ``Contention`` (the Datastore gateway swallows it there).

    Each call's decision (what to raise, what was applied) is a plan
    (``FaultPlans``), so the asyncio face's ``async_faults.FaultyAsyncGateway``
    awaits the very same decisions around an async gateway.

``inject_rpc_faults(datastore_gateway, rates, seed=...)``
    Goes one level lower: it wraps the GAPIC client inside a
    ``DatastoreGateway`` (or the per-loop ``DatastoreAsyncClient`` inside an
    ``AsyncDatastoreGateway``, under its ``AsyncRetry``) so the faults are
    google.api_core exceptions (``Aborted``, ``ServiceUnavailable``,
    ``DeadlineExceeded``, ``ResourceExhausted``) raised by the RPC itself. The gateway's real retry
    policy (see the table in ``gds_counter.gateway.datastore``) then decides
    what is retried and what the caller sees, against a real server or
    emulator. Its faults are the four above plus ``UNAVAILABLE_AFTER`` (the
    request was applied, then the connection dropped: "Socket closed"), and
    ``UNAVAILABLE`` here is the "connection refused" kind that proves nothing
    was sent.

Rates are per call name (``lookup``, ``run_query``, ``begin_transaction``,
``commit``, ``rollback``, ``allocate_ids``) and per fault; one draw per call
picks at most one fault. ``injector.counts()`` gives the faults injected;
``with injector.paused():`` turns injection off, e.g. to read a total.

Example::

    gw = FaultyGateway(open_gateway("memory://"), {"commit": {ABORTED: 0.2, DEADLINE_EXCEEDED: 0.05}}, seed=7)
    counter = CounterShardDS("post", 1, gateway=gw)
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import random
import threading
from collections import Counter
from typing import Any, Iterator, Mapping, Sequence, TypeVar, cast

from gds_counter.errors import BadValueError, CommitUnknown, Contention, GatewayError, GDSError, Unavailable
from gds_counter.gateway import plan
from gds_counter.gateway.base import Gateway, is_gateway
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import CommitResult, Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.stats import Stats
from gds_counter.gateway.values import RawEntity

__all__ = [
    "ABORTED",
    "UNAVAILABLE",
    "UNAVAILABLE_AFTER",
    "DEADLINE_EXCEEDED",
    "RESOURCE_EXHAUSTED",
    "CALLS",
    "FaultInjector",
    "FaultPlans",
    "FaultyGateway",
    "FaultyRpcClient",
    "inject_rpc_faults",
    "remove_rpc_faults",
]

log = logging.getLogger(__name__)

R = TypeVar("R")

ABORTED = "ABORTED"
UNAVAILABLE = "UNAVAILABLE"
UNAVAILABLE_AFTER = "UNAVAILABLE_AFTER"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"

#: The calls of the Gateway protocol (and the GAPIC methods of the same names).
CALLS = ("lookup", "run_query", "begin_transaction", "commit", "rollback", "allocate_ids")

GATEWAY_FAULTS = (ABORTED, UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED)
RPC_FAULTS = (ABORTED, UNAVAILABLE, UNAVAILABLE_AFTER, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED)

class FaultInjector:
    """Seeded decisions and a record of what was injected. Thread-safe.

    ``rates`` maps a call name to ``{fault: probability}``; the
    probabilities of one call must add up to at most 1. ``script`` maps a
    call name to faults to inject on its next calls, in order, before the
    random draws (to force one sequence, such as an applied commit whose
    resend is then aborted).
    """

    def __init__(
        self,
        rates: Mapping[str, Mapping[str, float]] | None = None,
        *,
        seed: int | None = 0,
        allowed: Sequence[str] = GATEWAY_FAULTS,
        script: Mapping[str, Sequence[str | None]] | None = None,
    ) -> None:
        self.seed = seed
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._enabled = True
        self.rates: dict[str, dict[str, float]] = {}
        for call, faults in (rates or {}).items():
            if call not in CALLS:
                raise BadValueError(f"unknown call {call!r} in fault rates; expected one of {', '.join(CALLS)}")
            table: dict[str, float] = {}
            for fault, rate in faults.items():
                if fault not in allowed:
                    raise BadValueError(f"unknown fault {fault!r} for {call}; expected one of {', '.join(allowed)}")
                if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
                    raise BadValueError(f"rate of {fault} on {call} must be between 0 and 1, got {rate!r}")
                table[fault] = float(rate)
            if sum(table.values()) > 1.0 + 1e-9:
                raise BadValueError(f"fault rates on {call} add up to {sum(table.values())}, over 1")
            self.rates[call] = table
        #: Faults to inject first, in order, per call (None: no fault that
        #: time); random draws resume once a call's script is used up.
        self.script: dict[str, list[str | None]] = {}
        for call, sequence in (script or {}).items():
            if call not in CALLS:
                raise BadValueError(f"unknown call {call!r} in fault script; expected one of {', '.join(CALLS)}")
            for step in sequence:
                if step is not None and step not in allowed:
                    raise BadValueError(f"unknown fault {step!r} for {call}; expected one of {', '.join(allowed)}")
            self.script[call] = list(sequence)
        #: (call, fault) -> how many times it was injected.
        self.injected: Counter[tuple[str, str]] = Counter()
        #: calls seen per name, injected or not.
        self.calls: Counter[str] = Counter()

    def draw(self, call: str) -> str | None:
        """The fault to inject on this call, or None; records it."""
        with self._lock:
            self.calls[call] += 1
            if not self._enabled:
                return None
            scripted = self.script.get(call)
            if scripted:
                fault = scripted.pop(0)
                if fault is not None:
                    self.injected[(call, fault)] += 1
                return fault
            table = self.rates.get(call)
            if not table:
                return None
            roll = self._random.random()
            for fault, rate in table.items():
                if roll < rate:
                    self.injected[(call, fault)] += 1
                    return fault
                roll -= rate
            return None

    def forget(self, call: str, fault: str) -> None:
        """Un-record a fault that was drawn but could not be injected."""
        with self._lock:
            self.injected[(call, fault)] -= 1

    def counts(self) -> dict[str, int]:
        """Faults injected, per fault, over every call."""
        with self._lock:
            out: Counter[str] = Counter()
            for (_, fault), n in self.injected.items():
                out[fault] += n
            return {fault: n for fault, n in out.items() if n}

    @property
    def total(self) -> int:
        return sum(self.counts().values())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No faults inside the block (e.g. while a test reads the total)."""
        with self._lock:
            before, self._enabled = self._enabled, False
        try:
            yield
        finally:
            with self._lock:
                self._enabled = before

    def __repr__(self) -> str:
        return f"FaultInjector(seed={self.seed!r}, injected={self.counts()})"


class FaultPlans:
    """What the faulty gateways of both faces share: the decision of each
    call (draw a fault; fail before the call, so nothing is applied; or make
    the call and fail after it) written once, as a plan (``gateway.plan``)
    over the inner gateway. ``FaultyGateway`` runs these plans blocking,
    ``async_faults.FaultyAsyncGateway`` awaits them: one place decides what
    is raised and what was applied, so the two faces meet the same faults.

    Everything else (``stats``, ``namespace`` and any attribute the inner
    gateway has) is the inner gateway's, so cost accounting and transform
    detection see the real storage.
    """

    inner: Any
    injector: FaultInjector

    def _wrap_inner(
        self,
        inner: Any,
        rates: Mapping[str, Mapping[str, float]] | None,
        seed: int | None,
        injector: FaultInjector | None,
        script: Mapping[str, Sequence[str | None]] | None,
    ) -> None:
        if injector is not None and (rates is not None or script is not None):
            raise BadValueError("give fault rates (and a script) or an injector, not both")
        self.inner = inner
        self.injector = injector or FaultInjector(rates, seed=seed, allowed=GATEWAY_FAULTS, script=script)

    # --- what the protocol reads as attributes ---------------------------------

    @property
    def stats(self) -> Stats:
        stats: Stats = self.inner.stats
        return stats

    @property
    def namespace(self) -> str:
        namespace: str = self.inner.namespace
        return namespace

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes not defined here (path, explain_query,
        # max_in_flight, ...); "inner" itself only before __init__ set it.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r}, {self.injector!r})"

    # --- injection ----------------------------------------------------------------

    def _fail_before(self, call: str, fault: str) -> None:
        self.inner.stats.bump(f"faults.{fault}")
        if fault == ABORTED:
            raise Contention(f"{call}: injected ABORTED (contention)", attempts=1)
        if fault == UNAVAILABLE:
            raise Unavailable(f"{call}: injected UNAVAILABLE; the request was not sent")
        if fault == RESOURCE_EXHAUSTED:
            raise GatewayError(f"{call} failed: ResourceExhausted: injected RESOURCE_EXHAUSTED (quota)")
        raise AssertionError(fault)  # pragma: no cover

    def _fail_after(self, call: str) -> None:
        self.inner.stats.bump(f"faults.{DEADLINE_EXCEEDED}")
        if call == "commit":
            raise CommitUnknown(
                "commit outcome unknown (it may or may not have been applied): injected DEADLINE_EXCEEDED "
                "after the commit was applied"
            )
        raise Unavailable(f"{call}: injected DEADLINE_EXCEEDED; a read applies nothing")

    def _faulty(self, call: str, request: plan.Plan[R]) -> plan.Plan[R]:
        """``request`` (one call of the inner gateway), failing before it
        or, for DEADLINE_EXCEEDED, after it, as the injector draws."""
        fault = self.injector.draw(call)
        if fault is not None and fault != DEADLINE_EXCEEDED:
            self._fail_before(call, fault)
        result = yield from request
        if fault == DEADLINE_EXCEEDED:
            self._fail_after(call)
        return result

    def _lookup_plan(self, keys: Sequence[Key], transaction: bytes | None) -> plan.Plan[list[RawEntity | None]]:
        return self._faulty("lookup", plan.lookup(keys, transaction=transaction))

    def _run_query_plan(self, query: Query, transaction: bytes | None) -> plan.Plan[QueryResult]:
        return self._faulty("run_query", plan.run_query(query, transaction=transaction))

    def _allocate_ids_plan(self, keys: Sequence[Key]) -> plan.Plan[list[Key]]:
        return self._faulty("allocate_ids", plan.allocate_ids(keys))

    def _begin_plan(self, read_only: bool) -> plan.Plan[bytes]:
        fault = self.injector.draw("begin_transaction")
        if fault is not None and fault != DEADLINE_EXCEEDED:
            self._fail_before("begin_transaction", fault)
        token = yield from plan.begin_transaction(read_only=read_only)
        if fault == DEADLINE_EXCEEDED:
            # The caller never learns the token: end the transaction, as it
            # would expire on a server.
            with contextlib.suppress(GDSError):
                yield from plan.rollback(token)
            self._fail_after("begin_transaction")
        return token

    def _commit_plan(self, mutations: Sequence[Mutation], transaction: bytes | None) -> plan.Plan[CommitResult]:
        fault = self.injector.draw("commit")
        if fault is not None and fault != DEADLINE_EXCEEDED:
            if transaction is not None:
                # A failed commit ends the transaction on the server.
                with contextlib.suppress(GDSError):
                    yield from plan.rollback(transaction)
            self._fail_before("commit", fault)
        result = yield from plan.commit(mutations, transaction=transaction)
        if fault == DEADLINE_EXCEEDED:
            self._fail_after("commit")
        return result

    def _rollback_plan(self, transaction: bytes) -> plan.Plan[None]:
        fault = self.injector.draw("rollback")
        if fault == ABORTED:
            self.injector.forget("rollback", fault)  # the Datastore gateway swallows it on rollback
            fault = None
        if fault is not None and fault != DEADLINE_EXCEEDED:
            with contextlib.suppress(GDSError):
                yield from plan.rollback(transaction)  # the server ends it anyway, in time
            self._fail_before("rollback", fault)
        yield from plan.rollback(transaction)
        if fault == DEADLINE_EXCEEDED:
            self._fail_after("rollback")


class FaultyGateway(FaultPlans):
    """A blocking Gateway that fails on purpose; see the module docstring
    (the asyncio face's twin is ``async_faults.FaultyAsyncGateway``)."""

    def __init__(
        self,
        inner: Gateway,
        rates: Mapping[str, Mapping[str, float]] | None = None,
        *,
        seed: int | None = 0,
        injector: FaultInjector | None = None,
        script: Mapping[str, Sequence[str | None]] | None = None,
    ) -> None:
        if not is_gateway(inner):
            raise BadValueError(f"FaultyGateway wraps a Gateway, got {type(inner).__name__} {inner!r}")
        self._wrap_inner(inner, rates, seed, injector, script)

    @property
    def capabilities(self) -> Capabilities:
        capabilities: Capabilities = self.inner.capabilities
        return capabilities

    def lookup(self, keys: Sequence[Key], *, transaction: bytes | None = None) -> list[RawEntity | None]:
        return plan.run(self._lookup_plan(keys, transaction), self.inner)

    def run_query(self, query: Query, *, transaction: bytes | None = None) -> QueryResult:
        return plan.run(self._run_query_plan(query, transaction), self.inner)

    def run_aggregation(self, aggregation: AggregationQuery, *, transaction: bytes | None = None) -> AggregationResult:
        # Passed through without faults: the injector's calls are the six RPCs above and below.
        result: AggregationResult = self.inner.run_aggregation(aggregation, transaction=transaction)
        return result

    def begin_transaction(self, *, read_only: bool = False) -> bytes:
        return plan.run(self._begin_plan(read_only), self.inner)

    def commit(self, mutations: Sequence[Mutation], *, transaction: bytes | None = None) -> CommitResult:
        return plan.run(self._commit_plan(mutations, transaction), self.inner)

    def rollback(self, transaction: bytes) -> None:
        plan.run(self._rollback_plan(transaction), self.inner)

    def allocate_ids(self, keys: Sequence[Key]) -> list[Key]:
        return plan.run(self._allocate_ids_plan(keys), self.inner)

    def reserve_ids(self, keys: Sequence[Key]) -> None:
        """Passed on without faults (not one of ``CALLS``)."""
        self.inner.reserve_ids(keys)

    def close(self) -> None:
        self.inner.close()


# --- below the Datastore gateway's retry layer -----------------------------------


class FaultyRpcClient:
    """Stands in for the GAPIC client inside a Datastore gateway: the
    blocking ``DatastoreClient`` of a ``DatastoreGateway`` or the
    ``DatastoreAsyncClient`` of an ``AsyncDatastoreGateway``. Each RPC
    method may raise a google.api_core exception instead of (or, for the
    applied faults, after) calling the real one; a coroutine method stays a
    coroutine, so the async gateway's ``AsyncRetry`` sees the same errors as
    the blocking gateway's ``Retry``. Anything else is the real client's."""

    def __init__(self, client: Any, injector: FaultInjector) -> None:
        self._real = client
        self.injector = injector

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name not in CALLS:
            return attr
        if inspect.iscoroutinefunction(attr):
            return self._wrap_async(name, attr)
        return self._wrap(name, attr)

    # One decision per fault, for both kinds of client.

    @staticmethod
    def _error_before(call: str, fault: str | None) -> Exception | None:
        """What the RPC raises instead of being sent (nothing applied)."""
        from google.api_core import exceptions as gexc

        if fault == ABORTED:
            return gexc.Aborted(f"injected ABORTED on {call}: too much contention on these datastore entities")
        if fault == UNAVAILABLE:
            return gexc.ServiceUnavailable(
                f"injected on {call}: failed to connect to all addresses; last error: "
                "UNAVAILABLE: Failed to connect to remote host: Connection refused"
            )
        if fault == RESOURCE_EXHAUSTED:
            return gexc.ResourceExhausted(f"injected RESOURCE_EXHAUSTED on {call}: quota exceeded")
        return None

    @staticmethod
    def _error_after(call: str, fault: str | None) -> Exception | None:
        """What the RPC raises after it was applied (its answer lost)."""
        from google.api_core import exceptions as gexc

        if fault == DEADLINE_EXCEEDED:
            return gexc.DeadlineExceeded(f"injected DEADLINE_EXCEEDED on {call} after it was applied")
        if fault == UNAVAILABLE_AFTER:
            return gexc.ServiceUnavailable(f"injected on {call} after it was applied: Socket closed")
        return None

    @staticmethod
    def _ending_rollback(call: str, fault: str | None, request: Any) -> Any:
        """The rollback a server does itself when it aborts a transactional
        commit (ending the transaction and, on Firestore, releasing its
        locks), as a request to send; None when there is none."""
        if call != "commit" or fault != ABORTED:
            return None
        transaction = getattr(request, "transaction", b"")
        if not transaction:
            return None
        from google.cloud.datastore_v1.types import datastore as _ds

        return _ds.RollbackRequest(
            project_id=request.project_id, database_id=request.database_id, transaction=transaction
        )

    def _wrap(self, call: str, method: Any) -> Any:
        from google.api_core import exceptions as gexc

        def rpc(*args: Any, **kwargs: Any) -> Any:
            fault = self.injector.draw(call)
            rollback = self._ending_rollback(call, fault, kwargs.get("request"))
            if rollback is not None:
                with contextlib.suppress(gexc.GoogleAPICallError):
                    self._real.rollback(request=rollback, timeout=5.0)
            before = self._error_before(call, fault)
            if before is not None:
                raise before
            answer = method(*args, **kwargs)
            after = self._error_after(call, fault)
            if after is not None:
                raise after
            return answer

        return rpc

    def _wrap_async(self, call: str, method: Any) -> Any:
        from google.api_core import exceptions as gexc

        async def rpc(*args: Any, **kwargs: Any) -> Any:
            fault = self.injector.draw(call)
            rollback = self._ending_rollback(call, fault, kwargs.get("request"))
            if rollback is not None:
                with contextlib.suppress(gexc.GoogleAPICallError):
                    await self._real.rollback(request=rollback, timeout=5.0)
            before = self._error_before(call, fault)
            if before is not None:
                raise before
            answer = await method(*args, **kwargs)
            after = self._error_after(call, fault)
            if after is not None:
                raise after
            return answer

        return rpc


class _FaultyClients:
    """Stands in for ``AsyncDatastoreGateway._client`` (which makes one
    client per event loop, on first use in it): the same clients, each
    behind a ``FaultyRpcClient`` sharing one injector, so the faults reach
    clients made in loops that start after the injection."""

    def __init__(self, clients: Any, injector: FaultInjector) -> None:
        self.real = clients
        self.injector = injector

    def __call__(self) -> FaultyRpcClient:
        return FaultyRpcClient(self.real(), self.injector)


def inject_rpc_faults(
    gateway: Any,
    rates: Mapping[str, Mapping[str, float]] | None = None,
    *,
    seed: int | None = 0,
    script: Mapping[str, Sequence[str | None]] | None = None,
) -> FaultInjector:
    """Make a ``DatastoreGateway``'s or ``AsyncDatastoreGateway``'s RPCs
    fail on purpose, below its retry policy; returns the injector (counts,
    ``paused()``). Call ``remove_rpc_faults(gateway)`` to undo."""
    from gds_counter.gateway.datastore import AsyncDatastoreGateway, DatastoreGateway

    if not isinstance(gateway, (DatastoreGateway, AsyncDatastoreGateway)):
        raise BadValueError(
            f"inject_rpc_faults needs a DatastoreGateway or an AsyncDatastoreGateway, got {type(gateway).__name__}"
        )
    if isinstance(vars(gateway).get("_client"), (FaultyRpcClient, _FaultyClients)):
        raise BadValueError(f"{gateway!r} already has RPC faults injected")
    injector = FaultInjector(rates, seed=seed, allowed=RPC_FAULTS, script=script)
    # Duck-typed: they stand in for the GAPIC client (the blocking gateway's
    # attribute) or for the async gateway's per-loop client method.
    if isinstance(gateway, AsyncDatastoreGateway):
        setattr(gateway, "_client", _FaultyClients(gateway._client, injector))  # shadows the method
    else:
        gateway._client = cast(Any, FaultyRpcClient(gateway._client, injector))
    return injector


def remove_rpc_faults(gateway: Any) -> None:
    """Undo ``inject_rpc_faults`` (nothing to undo: nothing done)."""
    client = vars(gateway).get("_client")
    if isinstance(client, FaultyRpcClient):
        gateway._client = client._real
    elif isinstance(client, _FaultyClients):
        del gateway._client  # the class's method again
