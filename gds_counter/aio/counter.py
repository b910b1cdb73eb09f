"""The asyncio face of the sharded counters: ``ShardedCounter``,
``CounterShardDS``, ``GeneralCounter`` and ``get_counts``, with the blocking
API's names, arguments and semantics, every call a coroutine.

They run the blocking counters' own plans (``counter._engine.CounterCore``)
with the async driver (``gateway.plan.arun``): same layouts, strategies,
shard affinity, cache, retries and errors; only the I/O differs. Safe to
share between tasks (and threads, each with its own event loop on a
gateway of its own).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterable, TypeVar

from typing_extensions import Unpack

from gds_counter._process import deadlines
from gds_counter.aio._gateway import AsyncGateway, resolve_gateway
from gds_counter.aio.store import Store
from gds_counter.counter import CounterCore, by_gateway, check_counter_path, check_counters, get_counts_plan, locate
from gds_counter.counter.article import article_counter_args
from gds_counter.counter.layout import FIRESTORE_PAGE, NDB_GENERAL, Layout
from gds_counter.counter.options import CounterChanges, CounterOptions, options_of
from gds_counter.counter.rollup import TotalAsOf, check_max_age
from gds_counter.counter.runtime import DEFAULT_IN_FLIGHT, Runtime
from gds_counter.counter.strategy import is_planned
from gds_counter.errors import BadValueError, Contention
from gds_counter.gateway import plan

__all__ = ["CounterShardDS", "DistributedCounter", "GeneralCounter", "ShardedCounter", "get_counts"]

T = TypeVar("T")


async def _run(planned: plan.Plan[T], gateway: Any, deadline: float | None) -> T:
    """Run one counter operation in one of the gateway's in-flight slots
    (``Runtime.in_flight_slot``: at most so many at once keep the loop
    responsive), within ``deadline`` seconds (the counter's retry policy's)
    counted from now: the wait for a slot counts too. (Counted from the
    plan's start, 100 tasks on a stalled file with a 0.5 s deadline took
    up to 2 s: four turns of 32 slots.) A call whose deadline passes before
    it gets a slot raises ``Contention``; nothing of it was sent."""
    bound = deadlines.limit(time.monotonic() + deadline) if deadline is not None else None
    try:
        slots = Runtime.of(gateway).in_flight_slot(gateway)
        # (No timeout, so no task made for the wait, when a slot is free: the usual case.)
        waited = None if deadline is None or not slots.locked() else deadlines.remaining(deadline)
        try:
            await asyncio.wait_for(slots.acquire(), waited)
        except asyncio.TimeoutError:
            raise Contention(
                f"the call's {deadline:g} s deadline passed while it waited for one of the "
                f"{getattr(gateway, 'max_in_flight', DEFAULT_IN_FLIGHT)} operations in flight on this "
                "event loop to end; nothing of it was sent", attempts=0,
            ) from None
        try:
            return await plan.arun(planned, gateway)
        finally:
            slots.release()
    finally:
        deadlines.restore(bound)


class ShardedCounter(CounterCore):
    """``gds_counter.ShardedCounter``, awaited. ``store`` (an
    ``aio.Store`` for the layout's shard kind) or ``gateway`` (an async
    gateway or a URL) says where it lives; neither: the shared default."""

    def __init__(
        self,
        name: str,
        *,
        layout: Layout,
        num_shards: int | None = None,
        store: Any = None,
        gateway: AsyncGateway | str | None = None,
        options: CounterOptions | None = None,
        **changes: Unpack[CounterChanges],
    ) -> None:
        chosen = options_of(options, changes)
        resolved, namespace = locate(
            name, layout, store, gateway, store_type=Store, store_label="gds_counter.aio Store",
            resolve=resolve_gateway,
        )
        super().__init__(
            name, layout=layout, gateway=resolved, namespace=namespace, num_shards=num_shards, options=chosen,
        )
        if not is_planned(self._strategy):
            # Its blocking add() would call the async gateway's coroutines
            # without awaiting them: refuse it before anything is written.
            raise BadValueError(
                f"strategy {self._strategy!r} has only a blocking add(); the asyncio face needs plan_add(shard, "
                "amount), the attempt as a plan (see gds_counter.counter.strategy)"
            )

    @property
    def gateway(self) -> AsyncGateway:
        gateway: AsyncGateway = self._gateway
        return gateway

    async def get_count(self, method: str = "auto", *, max_age: float | None = None) -> int:
        """The total (``gds_counter.ShardedCounter.get_count``; ``max_age``: from the rollup)."""
        return await _run(self._get_count(method, max_age), self._gateway, self._retry.deadline)

    async def get_count_as_of(self, method: str = "auto", *, max_age: float | None = None) -> TotalAsOf:
        """The total and when it was true (``gds_counter.ShardedCounter.get_count_as_of``)."""
        return await _run(self._get_count_as_of(method, max_age), self._gateway, self._retry.deadline)

    async def shards(self, method: str = "auto") -> list[tuple[int, int]]:
        """``(shard number, count)`` per shard (``ShardedCounter.shards``)."""
        return await _run(self._shards(method), self._gateway, self._retry.deadline)

    async def add(self, amount: int = 1) -> None:
        """Add ``amount``, counted exactly once or raised; no read back."""
        await _run(self._add(amount), self._gateway, self._retry.deadline)

    async def increment(self, amount: int = 1) -> int:
        """Add ``amount`` and return the total after it."""
        return await _run(self._increment(amount), self._gateway, self._retry.deadline)

    async def decrement(self, amount: int = 1) -> int:
        """Subtract ``amount`` and return the total after it."""
        return await _run(self._decrement(amount), self._gateway, self._retry.deadline)

    async def reset(self) -> None:
        """Set every shard ``get_count()`` counts to 0, at most 25 shards per
        transaction (``gds_counter.ShardedCounter.reset``: ``PartialReset``
        when only some were)."""
        await _run(self._reset(), self._gateway, self._retry.deadline)

    async def increase_shards(self, num_shards: int) -> int:
        """Spread future writes over ``num_shards`` shards (never fewer)."""
        return await _run(self._increase_shards(num_shards), self._gateway, self._retry.deadline)


class CounterShardDS(ShardedCounter):
    """``gds_counter.CounterShardDS`` (the PHP article's counter, its data
    kept), awaited: ``await CounterShardDS("Counter Test", 1).increment()``."""

    NUM_SHARDS = 20

    def __init__(
        self,
        target_type: str | int,
        target_id: str | int,
        num_shards: int = NUM_SHARDS,
        store: Any = None,
        *,
        gateway: AsyncGateway | str | None = None,
        options: CounterOptions | None = None,
        **changes: Unpack[CounterChanges],
    ) -> None:
        target, layout = article_counter_args(target_type, target_id, num_shards, store)
        self.target_type = target_type
        self.target_id = target_id
        super().__init__(
            target, layout=layout, num_shards=num_shards, store=store, gateway=gateway, options=options, **changes
        )

    @property
    def target(self) -> str:
        return self.name


class GeneralCounter(ShardedCounter):
    """``gds_counter.GeneralCounter`` (the Google article's ndb counter), awaited."""

    def __init__(
        self,
        name: str,
        num_shards: int | None = None,
        store: Any = None,
        *,
        gateway: AsyncGateway | str | None = None,
        layout: Layout = NDB_GENERAL,
        options: CounterOptions | None = None,
        **changes: Unpack[CounterChanges],
    ) -> None:
        super().__init__(
            name, layout=layout, num_shards=num_shards, store=store, gateway=gateway, options=options, **changes
        )


class DistributedCounter(ShardedCounter):
    """``gds_counter.DistributedCounter`` (Firestore's distributed counter), awaited."""

    def __init__(
        self,
        path: str,
        num_shards: int = 10,
        *,
        gateway: AsyncGateway | str | None = None,
        options: CounterOptions | None = None,
        **changes: Unpack[CounterChanges],
    ) -> None:
        check_counter_path(path, num_shards)
        super().__init__(path, layout=FIRESTORE_PAGE, num_shards=num_shards, gateway=gateway, options=options, **changes)

    @property
    def path(self) -> str:
        """The counter document's path."""
        return self.name


async def get_counts(
    counters: Iterable[ShardedCounter], *, use_cache: bool = True, max_age: float | None = None
) -> list[int]:
    """Totals of many counters in input order, one batch lookup per gateway
    (``gds_counter.get_counts``; ``max_age``: from their rollups)."""
    listed = check_counters(counters, ShardedCounter)
    max_age = None if max_age is None else check_max_age(max_age)  # also when no counter is listed
    totals = [0] * len(listed)
    for gateway, indexes in by_gateway(listed).items():
        bounds = [bound for i in indexes if (bound := listed[i]._retry.deadline) is not None]
        found = await _run(
            get_counts_plan([listed[i] for i in indexes], use_cache=use_cache, max_age=max_age), gateway,
            min(bounds) if bounds else None,  # (the soonest of their policies' deadlines)
        )
        for i, total in zip(indexes, found):
            totals[i] = total
    return totals
