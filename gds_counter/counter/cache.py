"""An optional in-process TTL cache of counter totals.

The articles put totals in memcache for 60 seconds because an exact total
costs one read per shard. This cache plays the same part: a page that shows
a count a hundred times a second pays for one read a minute. Writers adjust
a cached total only after their commit succeeded, so a failed increment is
never visible, even briefly.
"""

from __future__ import annotations

import threading
import time
import weakref
from typing import Hashable

from gds_counter.errors import BadValueError
from gds_counter.gateway.base import Gateway

__all__ = ["DEFAULT_TTL", "CountCache", "shared_cache"]

DEFAULT_TTL = 60.0


class CountCache:
    """Totals keyed by counter, each kept for ``ttl`` seconds. Thread-safe.

    Uses ``time.monotonic`` (looked up at call time, so freezegun can move it).
    """

    def __init__(self, ttl: float = DEFAULT_TTL) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            raise BadValueError(f"cache ttl must be a positive number of seconds, got {ttl!r}")
        self.ttl = float(ttl)
        self._lock = threading.Lock()
        self._entries: dict[Hashable, tuple[int, float]] = {}

    def get(self, key: Hashable) -> int | None:
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if now >= entry[1]:
                del self._entries[key]
                return None
            return entry[0]

    def set(self, key: Hashable, total: int) -> None:
        with self._lock:
            self._entries[key] = (total, time.monotonic() + self.ttl)

    def add(self, key: Hashable, amount: int) -> None:
        """Apply a committed change to a cached total, keeping its expiry
        (the total is no fresher than the read it came from)."""
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and now < entry[1]:
                self._entries[key] = (entry[0] + amount, entry[1])

    def invalidate(self, key: Hashable) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


_shared: "weakref.WeakKeyDictionary[Gateway, CountCache]" = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()


def shared_cache(gateway: Gateway) -> CountCache:
    """The cache that counters built with ``cache=True`` share on ``gateway``,
    so that short-lived counter objects (one per web request) still share
    their cached totals. It lives exactly as long as the gateway: a new
    gateway, even one at the same address in memory, starts with none."""
    with _shared_lock:
        cache = _shared.get(gateway)
        if cache is None:
            cache = _shared[gateway] = CountCache()
        return cache
