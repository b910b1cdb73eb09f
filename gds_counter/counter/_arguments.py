"""What a counter's arguments must be, checked before anything is read or
written, the same way by both faces (blocking and ``gds_counter.aio``)."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol, TypeVar

from gds_counter._checks import check_int, check_text
from gds_counter.errors import BadValueError
from gds_counter.gateway.base import MAX_KEYS_PER_LOOKUP

__all__ = ["MAX_SHARDS", "check_counters", "check_name", "check_num_shards", "check_store_kind", "locate"]

C = TypeVar("C")

#: The most shards one counter may have. Every total reads every shard (and
#: the config entity) in one exact read; lookups go in batches of 1,000 keys
#: (``gateway.base.MAX_KEYS_PER_LOOKUP``), so 10,000 shards cost 10 lookup
#: RPCs per read, and a count recorded above this is refused rather than
#: read (``Layout.config_of``), because a billion keys would not fit in
#: memory at all.
MAX_SHARDS = 10_000


class ShardKinds(Protocol):
    """What a counter's arguments are checked against: its layout's name
    and shard kind (``counter.layout.Layout`` has both; naming the protocol
    here keeps this module below ``layout``, which reads ``MAX_SHARDS``)."""

    @property
    def name(self) -> str: ...

    @property
    def shard_kind(self) -> str: ...


def check_num_shards(num_shards: object, what: str = "num_shards") -> int:
    """A shard count a counter may be given: an int from 1 to ``MAX_SHARDS``,
    refused before anything is read or written."""
    count = check_int(num_shards, what, low=1, high=None)
    if count > MAX_SHARDS:
        raise BadValueError(
            f"{what} must be at most {MAX_SHARDS:,} (MAX_SHARDS), got {count:,}: every total reads every "
            f"shard, so {count:,} shards would take {-(-count // MAX_KEYS_PER_LOOKUP):,} lookups of "
            f"{MAX_KEYS_PER_LOOKUP:,} keys per read"
        )
    return count


def check_name(name: object) -> None:
    """A counter's name is a non-empty string (it is the shards' target)
    that can be stored: a lone surrogate (a command line's undecodable
    bytes become them) is named as the counter's, not as a shard key's."""
    if not isinstance(name, str) or not name:
        raise BadValueError(f"a counter needs a non-empty string name, got {name!r}")
    check_text(name, "counter name")


def locate(
    name: object,
    layout: ShardKinds,
    store: Any,
    gateway: Any,
    *,
    store_type: type[Any],
    store_label: str,
    resolve: Callable[[Any], Any],
) -> tuple[Any, str]:
    """The gateway and namespace a face's counter lives in: its ``store``'s
    (which must be a ``store_type`` for the layout's shard kind), else
    ``resolve(gateway)``'s. Both faces call this before anything is read, so
    a bad argument is refused the same way on each."""
    check_name(name)
    if store is not None:
        if not isinstance(store, store_type):
            raise BadValueError(f"store must be a {store_label}, got {type(store).__name__} {store!r}")
        check_store_kind(store.schema.kind, layout, str(name))
        return store.gateway, store.namespace
    resolved = resolve(gateway)
    return resolved, resolved.namespace


def check_store_kind(store_kind: str, layout: ShardKinds, name: str) -> None:
    """A counter given a Store keeps its shards in that Store's kind."""
    if store_kind != layout.shard_kind:
        raise BadValueError(
            f"store is for kind {store_kind!r} but counter {name!r} keeps its shards "
            f"in kind {layout.shard_kind!r} (layout {layout.name!r})"
        )


def check_counters(counters: Iterable[Any], kind: type[C]) -> list[C]:
    """``get_counts``'s argument: counters of the face that asks."""
    if isinstance(counters, (str, bytes)) or not hasattr(counters, "__iter__"):
        raise BadValueError(f"get_counts takes an iterable of counters, got {type(counters).__name__} {counters!r}")
    listed = list(counters)
    for counter in listed:
        if not isinstance(counter, kind):
            raise BadValueError(f"get_counts takes counters, got {type(counter).__name__} {counter!r}")
    return listed
