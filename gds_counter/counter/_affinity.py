"""Which shard a writer takes: one that no other writer of this process holds.

Random shards collide: 16 writers on 20 shards pick a shard someone else is
writing about half the time, and on a server with locks (Firestore in
Datastore mode) every collision waits. Writers of one process can simply
stay out of each other's way, as the Firebase counter extension gives each
client a shard of its own. Collisions across processes remain, and fall as
shards are added.

The shards held are kept per gateway (weakly: they go with it) and per
counter, so that short-lived counter objects (one per web request) share
them. A forked child starts with none held: its parent's writers are not its
own.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import threading
import weakref
from typing import Hashable, Iterator

from gds_counter.gateway.base import Gateway

__all__ = ["holding_shard"]

_lock = threading.Lock()
#: gateway -> counter -> shard -> writers of this process holding it
_held: "weakref.WeakKeyDictionary[Gateway, dict[Hashable, collections.Counter[int]]]" = weakref.WeakKeyDictionary()


def _forget_all() -> None:
    global _lock
    _lock = threading.Lock()  # a thread of the parent may have held it at fork time
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all)


@contextlib.contextmanager
def holding_shard(gateway: Gateway, counter: Hashable, shards: range) -> Iterator[int]:
    """A shard of ``shards`` that no other writer of this process holds for
    ``counter`` (a random one among the free ones; any one when all are
    taken), held until the block ends."""
    with _lock:
        held = _held.setdefault(gateway, {}).setdefault(counter, collections.Counter())
        free = [n for n in shards if not held[n]]
        shard = random.choice(free or shards)
        held[shard] += 1
    try:
        yield shard
    finally:
        with _lock:
            held[shard] -= 1
            if not held[shard]:
                del held[shard]
