"""``CounterShardDS``: the PHP article's counter, API and data kept.

Target strings are ``f"{target_type}_{target_id}"``, exactly as PHP built
them, so ``("a_b", 1)`` and ``("a", "b_1")`` are ONE counter: both are target
``"a_b_1"``. That ambiguity is the PHP layout's; it is kept so PHP and
Python apps share counters. Pick target types without ``_`` to avoid it.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import Unpack

from gds_counter._checks import is_int
from gds_counter.counter._arguments import check_num_shards
from gds_counter.counter.entity import CounterShardEntity
from gds_counter.counter.layout import Layout
from gds_counter.counter.options import CounterChanges, CounterOptions
from gds_counter.counter.sharded import ShardedCounter
from gds_counter.errors import BadValueError
from gds_counter.gateway.base import Gateway
from gds_counter.gds.store import Store


def _target_part(what: str, value: Any) -> str:
    if not (isinstance(value, str) or is_int(value)):
        raise BadValueError(f"{what} must be a non-empty string or an int, got {type(value).__name__} {value!r}")
    text = str(value)
    if text == "":
        raise BadValueError(f"{what} must not be empty (got {value!r})")
    return text


def article_entity_class(store: Any) -> type[CounterShardEntity]:
    """The shard class a counter given ``store`` writes: a Store (of either
    face) of a ``CounterShardEntity`` subclass brings that subclass's
    ``KIND_PFX``; anything else, the article's own class (a wrong store is
    refused later, by ``locate``)."""
    schema = getattr(store, "schema", None)
    declared = schema.get_entity_class() if schema is not None else None
    if isinstance(declared, type) and issubclass(declared, CounterShardEntity):
        return declared
    return CounterShardEntity


def make_target(target_type: Any, target_id: Any) -> str:
    """PHP's ``$target_type . "_" . $target_id``, refusing empty parts."""
    return f"{_target_part('target_type', target_type)}_{_target_part('target_id', target_id)}"


def article_counter_args(target_type: Any, target_id: Any, num_shards: int, store: Any) -> tuple[str, Layout]:
    """What both faces' ``CounterShardDS`` check before anything else, in
    this order: the target's parts, the shard count, the store's shard
    class; the target (PHP's ``type_id``) and the layout of that class."""
    target = make_target(target_type, target_id)
    check_num_shards(num_shards)
    return target, article_entity_class(store).layout()


class CounterShardDS(ShardedCounter):
    """``CounterShardDS("Counter Test", 1).increment()``: a counter for one
    object (type, id), sharded over ``num_shards`` ``IK_CounterShardEntity``
    entities as the PHP article stored them.

    ``store`` defaults to a Store on the shared default gateway (``GDS_URL``,
    the emulator, or the embedded SQLite file); ``gateway`` picks another
    gateway (or URL) without building a Store. A Store of a
    ``CounterShardEntity`` subclass uses that subclass's ``KIND_PFX``.
    ``options`` (``CounterOptions``: strategy, retry, cache, auto_grow,
    shards), or any of its fields as keywords, say how it writes and reads.
    """

    NUM_SHARDS = 20

    def __init__(
        self,
        target_type: str | int,
        target_id: str | int,
        num_shards: int = NUM_SHARDS,
        store: Store | None = None,
        *,
        gateway: Gateway | str | None = None,
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
