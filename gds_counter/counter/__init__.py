"""Sharded counters: the PHP article's ``CounterShardDS`` and the Google
article's named ``GeneralCounter``, one engine with two data layouts."""

from gds_counter.counter._arguments import MAX_SHARDS
from gds_counter.counter.article import CounterShardDS, make_target
from gds_counter.counter.cache import CountCache
from gds_counter.counter.entity import CounterShardEntity
from gds_counter.counter.general import GeneralCounter
from gds_counter.counter.layout import NDB_GENERAL, PHP_ARTICLE, Layout
from gds_counter.counter.options import AutoGrow, CounterOptions
from gds_counter.counter.rollup import TotalAsOf
from gds_counter.counter.runtime import Runtime
from gds_counter.counter.shard_choice import AffinityShards, RandomShards, ShardChooser
from gds_counter.counter.sharded import ShardedCounter, get_counts
from gds_counter.counter.strategy import STRATEGIES, Shard, Strategy, Wrote

__all__ = [
    "AffinityShards",
    "AutoGrow",
    "CounterShardDS",
    "CounterShardEntity",
    "CountCache",
    "CounterOptions",
    "GeneralCounter",
    "Layout",
    "MAX_SHARDS",
    "NDB_GENERAL",
    "PHP_ARTICLE",
    "RandomShards",
    "Runtime",
    "STRATEGIES",
    "Shard",
    "ShardChooser",
    "ShardedCounter",
    "Strategy",
    "TotalAsOf",
    "Wrote",
    "get_counts",
    "make_target",
]
