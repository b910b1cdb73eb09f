"""``GeneralCounter``: the Google article's named ndb counter.

Counters are created on the fly by name; their shards are
``GeneralCounterShard`` entities named ``shard-{name}-{index}`` (0-based),
and ``GeneralCounterShardConfig`` (key name = counter name) records
``num_shards``, so data written by the Python 2 ndb sample is read and
written in place.
"""

from __future__ import annotations

from typing_extensions import Unpack

from gds_counter.counter.layout import NDB_GENERAL, Layout
from gds_counter.counter.options import CounterChanges, CounterOptions
from gds_counter.counter.sharded import ShardedCounter
from gds_counter.gateway.base import Gateway
from gds_counter.gds.store import Store


class GeneralCounter(ShardedCounter):
    """``GeneralCounter("hits").increment()``. ``num_shards`` None means
    whatever the config entity says (20 when there is none), as ndb did."""

    def __init__(
        self,
        name: str,
        num_shards: int | None = None,
        store: Store | None = None,
        *,
        gateway: Gateway | str | None = None,
        layout: Layout = NDB_GENERAL,
        options: CounterOptions | None = None,
        **changes: Unpack[CounterChanges],
    ) -> None:
        super().__init__(
            name, layout=layout, num_shards=num_shards, store=store, gateway=gateway, options=options, **changes
        )
