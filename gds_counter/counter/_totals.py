"""Exact totals of counters, read from their shards: many counters in one
batch lookup, one counter through its cache. The plans here serve
``Readable`` (``_engine``), ``get_counts`` in both faces, and rollups
(``rollup``)."""

from __future__ import annotations

from typing import Any, Callable, Hashable, Protocol, Sequence

from gds_counter.counter.cache import TotalCache
from gds_counter.counter.rollup import Rollable, totals_as_of_plan
from gds_counter.counter.shard_choice import ShardChooser, tell_seen
from gds_counter.gateway import plan
from gds_counter.gateway.keys import Key


class Readable(Rollable, Protocol):
    """What these plans read of a counter (``_engine.Readable`` is one;
    a protocol, so this module need not import the engine that uses it)."""

    _cache: TotalCache | None
    _config_key: Key
    _gateway: Any
    _chooser: ShardChooser

    def _identity(self) -> Hashable: ...

    def _read_shards(self) -> int: ...

    def _shard_keys(self, count: int) -> list[Key]: ...

    def _learn(self, recorded: int | None) -> None: ...

__all__ = ["Readable", "by_gateway", "counts_plan", "get_counts_plan", "read_shards_plan", "through_cache"]


def counts_plan(counters: Sequence[Readable], *, use_cache: bool = True) -> plan.Plan[list[int]]:
    """Totals of many counters in input order, with one batch lookup per
    gateway (for up to 1000 keys). Counters with a fresh cached total are
    not read. (All ``counters`` are on the gateway the plan runs against.)"""
    totals: list[int | None] = [None] * len(counters)
    tickets: list[Any] = [None] * len(counters)
    for i, counter in enumerate(counters):
        if counter._cache is not None:
            if use_cache:
                totals[i] = counter._cache.get(counter._identity())
            tickets[i] = counter._cache.reading(counter._identity())
    todo = [i for i, total in enumerate(totals) if total is None]
    read = yield from read_shards_plan([counters[i] for i in todo])
    for i, counts in zip(todo, read):
        total = totals[i] = sum(counts.values())
        cache = counters[i]._cache
        if cache is not None:
            cache.store(counters[i]._identity(), total, tickets[i])
    return [int(total or 0) for total in totals]


def get_counts_plan(counters: Sequence[Readable], *, use_cache: bool, max_age: float | None) -> plan.Plan[list[int]]:
    """What ``get_counts`` reads for the counters of one gateway: exact
    totals (``counts_plan``), or with ``max_age`` their rollups, each at most
    that old (``rollup.totals_as_of_plan``; stale ones are read exactly and
    rolled up). ``max_age`` was checked by the caller (``check_max_age``),
    before anything is read, even when no counter is listed."""
    if max_age is None:
        # A counter of documents is read as its get_count() reads it, by the
        # query of every document in its shards: the page's writers may use
        # more shards than it recorded, which a lookup of its keys misses.
        queried = [i for i, counter in enumerate(counters) if counter.layout.documents]
        looked_up = [i for i, counter in enumerate(counters) if not counter.layout.documents]
        totals: list[int] = [0] * len(counters)
        exact = yield from counts_plan([counters[i] for i in looked_up], use_cache=use_cache)
        for i, total in zip(looked_up, exact):
            totals[i] = total
        for i in queried:
            totals[i] = yield from counters[i]._total("query", use_cache=use_cache)
        return totals
    rolled, _ = yield from totals_as_of_plan(counters, max_age)
    return [f.total for f in rolled]


def by_gateway(counters: Sequence[Readable]) -> dict[Any, list[int]]:
    """Counter indexes grouped by the gateway each lives on."""
    groups: dict[Any, list[int]] = {}
    for i, counter in enumerate(counters):
        groups.setdefault(counter._gateway, []).append(i)
    return groups


def through_cache(counter: Readable, read: Callable[[], plan.Plan[int]], *, use_cache: bool) -> plan.Plan[int]:
    """``read()`` a counter's total, served from and kept in its cache (a
    total is kept only if no write of it overlapped the read)."""
    cache = counter._cache
    if cache is None:
        total: int = yield from read()
        return total
    key = counter._identity()
    if use_cache:
        cached = cache.get(key)
        if cached is not None:
            return cached
    ticket = cache.reading(key)
    total = yield from read()
    cache.store(key, total, ticket)
    return total


def read_shards_plan(counters: Sequence[Readable]) -> plan.Plan[list[dict[int, int]]]:
    """Every counter's shard counts: one lookup of all their shard and config
    keys, plus one more only for counters found to have grown beyond what
    this process knew. (All on the gateway the plan runs against.)"""
    results: list[dict[int, int]] = [{} for _ in counters]
    if not counters:
        return results
    spans: list[tuple[int, int]] = []  # (counter index, shards read)
    keys: list[Key] = []
    for i, counter in enumerate(counters):
        shard_keys = counter._shard_keys(counter._read_shards())
        spans.append((i, len(shard_keys)))
        keys += [counter._config_key, *shard_keys]
    found = iter((yield from plan.lookup(keys)))
    grown: list[tuple[int, int]] = []  # (counter index, shards read before)
    for i, width in spans:
        counter = counters[i]
        counter._learn(counter.layout.config_of(next(found)))
        numbers = counter.layout.shard_numbers(width)
        results[i] = {n: counter.layout.count_of(next(found)) for n in numbers}
        if counter._read_shards() > width:
            grown.append((i, width))
    if grown:
        extra: list[tuple[int, int, Key]] = []
        for i, width in grown:
            counter = counters[i]
            numbers = counter.layout.shard_numbers(counter._read_shards())[width:]
            extra += zip([i] * len(numbers), numbers, counter._shard_keys(counter._read_shards())[width:])
        more = yield from plan.lookup([key for _, _, key in extra])
        for (i, number, _), raw in zip(extra, more):
            results[i][number] = counters[i].layout.count_of(raw)
    for counter, counts in zip(counters, results):  # for this process's next shard choice
        tell_seen(counter._chooser, counter._identity(), counts, every=False)
    return results

