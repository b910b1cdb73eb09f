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
from datetime import datetime
from typing import Any, Mapping, Sequence, TypeVar

from gds_counter.errors import BadValueError, CommitUnknown, Contention, GatewayError, GDSError, Unavailable
from gds_counter.gateway import plan
from gds_counter.gateway.base import Gateway, is_gateway
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import CommitResult, Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.stats import Stats
from gds_counter.gateway.values import RawEntity
from gds_counter.testing._fault_injector import (
    ABORTED,
    CALLS,
    DEADLINE_EXCEEDED,
    GATEWAY_FAULTS,
    RESOURCE_EXHAUSTED,
    UNAVAILABLE,
    UNAVAILABLE_AFTER,
    FaultInjector,
)
from gds_counter.testing._rpc_faults import FaultyRpcClient, inject_rpc_faults, remove_rpc_faults

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

R = TypeVar("R")


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

    def _begin_plan(self, read_only: bool, read_time: datetime | None = None) -> plan.Plan[bytes]:
        fault = self.injector.draw("begin_transaction")
        if fault is not None and fault != DEADLINE_EXCEEDED:
            self._fail_before("begin_transaction", fault)
        token = yield from plan.begin_transaction(read_only=read_only, read_time=read_time)
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

    def begin_transaction(self, *, read_only: bool = False, read_time: datetime | None = None) -> bytes:
        return plan.run(self._begin_plan(read_only, read_time), self.inner)

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
