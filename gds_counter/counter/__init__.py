"""Sharded counters: the PHP article's ``CounterShardDS``, the Google
article's named ``GeneralCounter`` and Firestore's ``DistributedCounter``,
one engine with three data layouts."""

from gds_counter.counter._arguments import MAX_SHARDS, check_counters, check_num_shards, locate
from gds_counter.counter._engine import CounterCore
from gds_counter.counter._inventory import counter_names_plan, rollup_all_plan
from gds_counter.counter._sizing import DEFAULT_WRITES_PER_SHARD, ShardSizing, size_shards
from gds_counter.counter._storage_scope import DATABASE_HEADER, STORAGE_HEADER, storage_scope
from gds_counter.counter._totals import by_gateway, get_counts_plan
from gds_counter.counter.article import CounterShardDS, make_target
from gds_counter.counter.cache import CountCache
from gds_counter.counter.distributed import DistributedCounter, check_counter_path
from gds_counter.counter.entity import CounterShardEntity
from gds_counter.counter.general import GeneralCounter
from gds_counter.counter.layout import FIRESTORE_PAGE, NDB_GENERAL, PHP_ARTICLE, Layout
from gds_counter.counter.options import AutoGrow, CounterOptions
from gds_counter.counter.rollup import TotalAsOf
from gds_counter.counter.runtime import Runtime
from gds_counter.counter.shard_choice import AffinityShards, RandomShards, ShardChooser
from gds_counter.counter.sharded import ShardedCounter, get_counts
from gds_counter.counter.strategy import STRATEGIES, PlannedStrategy, Shard, Strategy, Wrote

__all__ = [
    # the faces: classes and settings

    "AffinityShards",
    "AutoGrow",
    "CounterShardDS",
    "CounterShardEntity",
    "DistributedCounter",
    "FIRESTORE_PAGE",
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
    "PlannedStrategy",
    "Strategy",
    "TotalAsOf",
    "Wrote",
    "get_counts",
    "make_target",
    # the machinery the other faces run (gds_counter.aio, the command, serve):
    # one engine, so they hold no counter rules of their own
    "CounterCore",
    "DATABASE_HEADER",
    "DEFAULT_WRITES_PER_SHARD",
    "STORAGE_HEADER",
    "ShardSizing",
    "by_gateway",
    "check_counter_path",
    "check_counters",
    "check_num_shards",
    "counter_names_plan",
    "get_counts_plan",
    "locate",
    "rollup_all_plan",
    "size_shards",
    "storage_scope",
]
