"""``ShardedCounter``: the blocking face of the sharded counter engine.

Every rule (shards, growth, reads, retries, the cache) lives in
``engine.CounterCore`` as plans; this class runs them on a blocking gateway
(``gds_counter.gateway.plan.run``), as ``gds_counter.aio`` runs the same
plans on an async one. See ``engine`` for what the engine does and why.
"""

from __future__ import annotations

from typing import Iterable

from typing_extensions import Unpack

from gds_counter.counter._arguments import check_counters, locate
from gds_counter.counter._engine import CounterCore
from gds_counter.counter._totals import by_gateway, get_counts_plan
from gds_counter.counter.layout import Layout
from gds_counter.counter.options import CounterChanges, CounterOptions, options_of
from gds_counter.counter.rollup import TotalAsOf, check_max_age
from gds_counter.gateway import plan, resolve_gateway
from gds_counter.gateway.base import Gateway
from gds_counter.gds.store import Store

__all__ = ["ShardedCounter", "get_counts"]


class ShardedCounter(CounterCore):
    """One counter, stored as shards in the given ``layout``.

    ``CounterShardDS`` (PHP layout) and ``GeneralCounter`` (ndb layout) are
    this class with their articles' constructors. Safe to share between
    threads.

    ``store`` (a Store for the layout's shard kind) or ``gateway`` (a
    gateway or URL) says where the counter lives; neither means the shared
    default gateway. ``options`` (``CounterOptions``), and any of its fields
    given as keywords, say how it writes and reads.
    """

    def __init__(
        self,
        name: str,
        *,
        layout: Layout,
        num_shards: int | None = None,
        store: Store | None = None,
        gateway: Gateway | str | None = None,
        options: CounterOptions | None = None,
        **changes: Unpack[CounterChanges],
    ) -> None:
        chosen = options_of(options, changes)
        resolved, namespace = locate(
            name, layout, store, gateway, store_type=Store, store_label="gds Store", resolve=resolve_gateway
        )
        super().__init__(
            name, layout=layout, gateway=resolved, namespace=namespace, num_shards=num_shards, options=chosen,
        )

    @property
    def gateway(self) -> Gateway:
        gateway: Gateway = self._gateway
        return gateway

    # --- reads ------------------------------------------------------------------

    def get_count(self, method: str = "auto", *, max_age: float | None = None) -> int:
        """The total, served from the cache when one is set and fresh.

        ``"query"``: the PHP article's ``SELECT * FROM <kind> WHERE target =
        @target``. It sees every shard any writer wrote, PHP writers with any
        ``NUM_SHARDS`` included, in one RPC per result batch; strongly
        consistent on Firestore in Datastore mode (every Cloud Datastore
        database today). ``"lookup"``: one batch lookup of the shard keys this
        process knows of (at least the layout's default 20) and the config
        entity; right when every writer records its shard count (this
        library's writers do; the article's PHP writers do not).
        ``"auto"`` (default): ``"query"`` for layouts that store a target
        (the PHP article's), ``"lookup"`` for the others (ndb's, whose
        writers all follow the config entity).

        ``max_age`` (seconds): a total at most that old, from the counter's
        rollup when it is fresh enough (1 RPC, 1 entity read, whatever the
        shard count), else read as above and rolled up for the next reader
        (``gds_counter.counter.rollup``). Without it the total is exact."""
        return plan.run(self._get_count(method, max_age), self._gateway)

    def get_count_as_of(self, method: str = "auto", *, max_age: float | None = None) -> TotalAsOf:
        """The total and the moment it was true (``TotalAsOf``): exact now
        without ``max_age`` (the cache is not asked), else as ``get_count``
        with ``max_age`` reads it, with the age that read allowed."""
        return plan.run(self._get_count_as_of(method, max_age), self._gateway)

    def shards(self, method: str = "auto") -> list[tuple[int, int]]:
        """``(shard number, count)`` for every shard a read covers, missing
        shards as 0, in shard order: where the writes went. ``method`` as
        for ``get_count``; a query also lists shards beyond the recorded
        shard count (a PHP writer with a larger ``NUM_SHARDS``), and reads
        the config entity too (two RPCs)."""
        return plan.run(self._shards(method), self._gateway)

    # --- writes -------------------------------------------------------------------

    def add(self, amount: int = 1) -> None:
        """Add ``amount`` without reading anything back: the hot path.

        Returns once the amount is committed exactly once; raises otherwise
        (``Contention`` after retries, with the attempts in its message).
        """
        plan.run(self._add(amount), self._gateway)

    def increment(self, amount: int = 1) -> int:
        """Add ``amount`` and return the total after it: one read after the
        write (``get_count``'s), where the article read before it and
        returned that plus one."""
        return plan.run(self._increment(amount), self._gateway)

    def decrement(self, amount: int = 1) -> int:
        """Subtract ``amount``; one shard may go below zero, the total is exact."""
        return plan.run(self._decrement(amount), self._gateway)

    def reset(self) -> None:
        """Set every shard ``get_count()`` counts to 0 (the config entity's
        shard count, and for the PHP layout whatever its target query finds),
        in transactions of at most 25 shards (so an increment racing with it
        is either wiped or kept whole, never half).

        Not all or nothing (``counter._reset`` says why): an error from the
        first transaction means nothing was reset; ``PartialReset`` means
        some shards were, and names them. Calling it again finishes it."""
        plan.run(self._reset(), self._gateway)

    def increase_shards(self, num_shards: int) -> int:
        """Spread future writes over ``num_shards`` shards, recorded for every
        process. Fewer than now is refused: a shard dropped from the count
        would vanish from reads. Returns the shard count."""
        return plan.run(self._increase_shards(num_shards), self._gateway)


def get_counts(
    counters: Iterable[ShardedCounter], *, use_cache: bool = True, max_age: float | None = None
) -> list[int]:
    """Totals of many counters in input order, with one batch lookup per
    gateway (for up to 1000 keys): a page listing 30 counters costs one RPC,
    not 30. Counters with a fresh cached total are not read. With
    ``max_age``: one lookup of their rollups, each total at most that old
    (stale ones read exactly and rolled up)."""
    listed = check_counters(counters, ShardedCounter)
    max_age = None if max_age is None else check_max_age(max_age)  # also when no counter is listed
    totals = [0] * len(listed)
    for gateway, indexes in by_gateway(listed).items():
        found = plan.run(get_counts_plan([listed[i] for i in indexes], use_cache=use_cache, max_age=max_age), gateway)
        for i, total in zip(indexes, found):
            totals[i] = total
    return totals
