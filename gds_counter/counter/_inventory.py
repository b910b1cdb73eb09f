"""Which counters a storage holds, and rolling them all up: what
``gds-counter list --max-age`` and ``gds-counter rollup`` run.

Counters are found by key only: a keys-only query of the layout's shard
kind (each shard key names its counter, ``Layout.target_of``) and of its
config kind (a counter that grew has a config entity). Datastore bills a
keys-only query as one entity read per batch, not per key, so finding the
counters does not cost what reading their shards does.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import attrs

from gds_counter.counter.layout import Layout
from gds_counter.counter.rollup import ROLLUP_BATCH, TotalAsOf, Writes, check_max_age, totals_as_of_plan
from gds_counter.gateway import plan
from gds_counter.gateway.query import Query

__all__ = ["Rolled", "counter_names_plan", "rollup_all_plan"]


def counter_names_plan(layout: Layout, namespace: str) -> plan.Plan[list[str]]:
    """The name (target) of every counter with a shard or a config entity, sorted."""
    names: set[str] = set()
    for raw in (yield from plan.query_all(Query(layout.shard_kind, namespace=namespace, keys_only=True))):
        target = layout.target_of(raw.key) if raw.key is not None else None
        if target:
            names.add(target)
    if layout.documents:  # a counter document may be in any collection: its shards name it
        return sorted(names)
    for raw in (yield from plan.query_all(Query(layout.config_kind, namespace=namespace, keys_only=True))):
        if raw.key is not None and raw.key.name:
            names.add(raw.key.name)
    return sorted(names)


@attrs.frozen
class Rolled:
    """What ``rollup_all_plan`` did: each counter's total as of when, how
    many rollups it wrote (the others were fresh, or another reader wrote
    the same generation first), and how many it failed to write (logged)."""

    totals: list[tuple[str, TotalAsOf]]
    writes: Writes


def rollup_all_plan(
    names: Sequence[str], make: Callable[[str], Any], max_age: float, *, refresh: bool = True, forced: bool = False
) -> plan.Plan[Rolled]:
    """Every named counter (``make(name)`` builds it on the gateway the plan
    runs against) read with ``max_age`` (``rollup.totals_as_of_plan``),
    ``ROLLUP_BATCH`` counters at a time: one lookup of their rollups, an
    exact read of each stale one, their rollups written in one transaction.
    Safe to run from several places at once: a stale generation is written
    once (``counter.rollup``). ``forced`` (``gds-counter rollup``): every
    stale rollup is written, or counted as failed and named."""
    max_age = check_max_age(max_age)
    totals: list[tuple[str, TotalAsOf]] = []
    writes = Writes()
    for start in range(0, len(names), ROLLUP_BATCH):
        batch = list(names[start : start + ROLLUP_BATCH])
        found, wrote = yield from totals_as_of_plan([make(name) for name in batch], max_age, refresh=refresh, forced=forced)
        totals += zip(batch, found)
        writes += wrote
    return Rolled(totals, writes)
