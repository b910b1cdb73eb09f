"""Shard sizing: how many shards a write rate needs, and what reading such
a counter costs; what ``gds-counter size --rate N`` prints.

One entity takes a handful of writes per second at most: Google's sharding
article expects "about five times a second" for any single entity or entity
group, and Firestore's "Distributed counters" sample sizes each shard for
being incremented "once per second". Sizing takes the cautious one
(``--per-shard`` changes it). A counter split into ``n`` shards takes about
``n`` times that. An exact read then
costs one entity read per shard (plus the config entity, for a lookup),
1,000 keys per lookup RPC; a fresh rollup costs one (``counter.rollup``).
"""

from __future__ import annotations

import math

import attrs

from gds_counter.counter._arguments import MAX_SHARDS
from gds_counter.errors import BadValueError
from gds_counter.gateway.base import MAX_KEYS_PER_LOOKUP

__all__ = ["DEFAULT_WRITES_PER_SHARD", "ShardSizing", "size_shards"]

#: Writes per second one shard entity is sized for (Datastore's guidance
#: for one entity, on the cautious side of the two articles).
DEFAULT_WRITES_PER_SHARD = 1.0


@attrs.frozen
class ShardSizing:
    """The shards ``rate`` increments per second need at ``per_shard`` writes
    per second each, and the entity reads and RPCs of one exact read (a
    batch lookup of every shard and the config entity; the article's query
    reads the shards alone) against one read of a fresh rollup."""

    rate: float
    per_shard: float
    shards: int
    exact_reads: int
    exact_rpcs: int
    rollup_reads: int = 1
    rollup_rpcs: int = 1


def _positive(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise BadValueError(f"{what} must be a positive number, got {value!r}")
    return float(value)


def size_shards(rate: float, per_shard: float = DEFAULT_WRITES_PER_SHARD) -> ShardSizing:
    """The sizing for ``rate`` increments per second; ``BadValueError`` when it
    needs more than ``MAX_SHARDS`` shards (then split the counter: one per
    region, say, and add their totals)."""
    rate, per_shard = _positive(rate, "rate"), _positive(per_shard, "writes per shard")
    shards = max(1, math.ceil(rate / per_shard - 1e-9))
    if shards > MAX_SHARDS:
        raise BadValueError(
            f"{rate:g} increments/s at {per_shard:g} writes/s per shard needs {shards:,} shards, over the "
            f"{MAX_SHARDS:,} a counter may have (at most {MAX_SHARDS * per_shard:,.0f}/s): split it into several counters"
        )
    reads = shards + 1
    return ShardSizing(rate, per_shard, shards, reads, math.ceil(reads / MAX_KEYS_PER_LOOKUP))
