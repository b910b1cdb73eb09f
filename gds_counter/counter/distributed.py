"""``DistributedCounter``: Firestore's "Distributed counters", kept as the
page keeps them.

The counter is a document (``"counters/likes"``); its shards are the
documents ``"0"`` .. ``"N-1"`` of that document's subcollection ``shards``,
each with an integer ``count``, and its total is the sum of ``count`` over
every document in ``shards``, whatever shard count their writer used. This
port records ``num_shards`` on the counter document (masked: the app's other
fields stay), creates every shard it records (the page's writers ``update``,
which fails on a missing document), and keeps a rollup, when asked for one,
in the counter document's own subcollection ``rollup``, which the page's
reader, listing ``shards`` alone, never sees.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import Unpack

from gds_counter.counter._arguments import check_num_shards
from gds_counter.counter.layout import FIRESTORE_PAGE
from gds_counter.counter.options import CounterChanges, CounterOptions
from gds_counter.counter.sharded import ShardedCounter
from gds_counter.errors import BadKeyError
from gds_counter.gateway.base import Gateway
from gds_counter.gateway.keys import MAX_DOCUMENT_NAME_BYTES, MAX_KEY_NAME_BYTES, document_key

__all__ = ["DistributedCounter", "check_counter_path"]


#: Room a counter path leaves for the documents below it (its shards, its
#: rollup and the rollup's claims) within Firestore's 6 KiB name limit.
_ROOM_BELOW = 96


def check_counter_path(path: Any, num_shards: Any) -> None:
    """What both faces check before anything else: the counter's document
    path (Firestore's rules: ``keys.document_key``) and its shard count,
    so that bad input is refused before a gateway is opened or written.
    Beyond Firestore's own rules, the path leaves room for the documents
    under it, and its last id is at most 1,499 bytes: reading the shards
    is a range of document names that ends just after that id's own (a
    1,500-byte id could be written but its counter never read)."""
    key = document_key(path, "counter path")
    last = key.name or ""
    if len(last.encode("utf-8")) > MAX_KEY_NAME_BYTES - 1:
        raise BadKeyError(
            f"counter path {path[:40]!r}...: its last id is {len(last.encode('utf-8')):,} bytes; a counter's "
            f"document id may have at most {MAX_KEY_NAME_BYTES - 1:,} (its shards are read as a range of names after it)"
        )
    if len(path.encode("utf-8")) > MAX_DOCUMENT_NAME_BYTES - _ROOM_BELOW:
        raise BadKeyError(
            f"counter path {path[:40]!r}... leaves no room under Firestore's {MAX_DOCUMENT_NAME_BYTES:,}-byte "
            f"limit for its shard documents (at most {MAX_DOCUMENT_NAME_BYTES - _ROOM_BELOW:,} bytes)"
        )
    check_num_shards(num_shards)


class DistributedCounter(ShardedCounter):
    """``DistributedCounter("counters/likes").increment()``: ``num_shards``
    (10) shard documents under the counter document ``path``. Runs on any
    gateway: Cloud Firestore (``firestore://PROJECT``), its emulator, or the
    embedded default (document paths as key paths), so a workshop needs no
    account."""

    def __init__(
        self,
        path: str,
        num_shards: int = 10,
        *,
        gateway: Gateway | str | None = None,
        options: CounterOptions | None = None,
        **changes: Unpack[CounterChanges],
    ) -> None:
        check_counter_path(path, num_shards)
        super().__init__(path, layout=FIRESTORE_PAGE, num_shards=num_shards, gateway=gateway, options=options, **changes)

    @property
    def path(self) -> str:
        """The counter document's path."""
        return self.name
