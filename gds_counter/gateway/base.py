"""The Gateway contract, and the base every blocking backend builds on.

Everything above the gateway layer (Store, counters, CLI) speaks only the
neutral types of ``keys``, ``values``, ``query`` and ``mutations``, and the
``Gateway`` protocol (``gateway._contract``). That is what lets one
conformance suite run the same tests on every gateway.

``BaseGateway`` runs the rules every backend shares (``GatewayRules``,
``gateway._rules``: checks, batching, transaction tokens, what a transform
result means, the gateway's ``Capabilities``) on a blocking backend's hooks
(``BlockingHooks``, ``gateway._hooks``): ``_lookup``, ``_run_query``,
``_begin``, ``_commit``, ``_rollback``, ``_allocate_ids``, ``_reserve_ids``.
Aggregation queries are checked by the rules too; their hook,
``_run_aggregation``, has a default here that computes them through the
backend's own ``run_query`` (``gateway._aggregation``), which a server with
native aggregations (Cloud Datastore) overrides. Last, the blocking helpers
that follow a query's batches (``iterate_batches``, ``run_query_all``).

What other packages import from here stays importable from here: the
protocols, ``MAX_KEYS_PER_LOOKUP``, ``TransactionState``, ``GatewayRules``
and ``PROBE_KIND``.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Iterator, Sequence, TypeVar

from gds_counter.gateway import plan
from gds_counter.gateway._aggregation import aggregate_rows, billed_reads
from gds_counter.gateway._contract import MAX_KEYS_PER_LOOKUP, AsyncGateway, Gateway, TransactionState, is_gateway
from gds_counter.gateway._hooks import BlockingHooks
from gds_counter.gateway._probe import PROBE_KIND
from gds_counter.gateway._rules import GatewayRules
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import CommitResult, Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity

__all__ = [
    "MAX_KEYS_PER_LOOKUP",
    "PROBE_KIND",
    "AsyncGateway",
    "BaseGateway",
    "Gateway",
    "GatewayRules",
    "TransactionState",
    "is_gateway",
    "iterate_batches",
    "run_query_all",
]

T = TypeVar("T", bound=TransactionState)


class BaseGateway(GatewayRules, BlockingHooks[T]):
    """The shared rules (``GatewayRules``) run on blocking backend hooks."""

    _runs_rules = True

    def __init__(self, namespace: str = "", *, capabilities: Capabilities | None = None) -> None:
        super().__init__(namespace, capabilities=capabilities)
        self._capabilities_lock = threading.RLock()  # the probe commits while holding it

    def _after_fork_in_child(self) -> None:
        """A thread of the parent may have been probing at the fork: the
        child would wait for its lock for ever (it probes again itself)."""
        super()._after_fork_in_child()
        self._capabilities_lock = threading.RLock()

    # --- hooks: ``BlockingHooks``, which a backend implements; one default ---

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

    def begin_transaction(self, *, read_only: bool = False, read_time: datetime | None = None) -> bytes:
        return plan.run(self._plan_begin(read_only, read_time), self)

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
