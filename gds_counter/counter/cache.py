"""An optional in-process TTL cache of counter totals.

The articles put totals in memcache for 60 seconds because an exact total
costs one read per shard. This cache plays the same part: a page that shows
a count a hundred times a second pays for one read a minute.

What it promises, within one process: a total it shows was true at some
moment in the last ``ttl`` seconds, every increment this process committed
since is in it, and none that failed is. Totals never go backwards because of
the cache. Two races make that hard, and both are closed here:

* A read that overlaps a write may or may not include it. Such a read is
  returned to its caller but never cached (``reading`` / ``store``).
* A write adjusts the cached total after its commit. The total it adjusts was
  therefore read before the write began (see above), so adding the amount is
  exact; a write whose outcome is unknown drops the entry instead. Between
  the commit and that adjustment the entry is behind storage, so while any
  write of a counter is in flight here, its reads go to storage.

Writes by other processes show after at most ``ttl`` seconds, as with the
articles' memcache.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from typing import Hashable, Iterator

import attrs

from gds_counter.errors import BadValueError, CommitUnknown
from gds_counter.gateway.base import Gateway

__all__ = ["DEFAULT_TTL", "CountCache", "shared_cache"]

DEFAULT_TTL = 60.0

#: Counters remembered before idle, expired ones are forgotten.
_PRUNE_ABOVE = 4096


@attrs.define
class _Key:
    """What the cache knows of one counter."""

    total: int | None = None
    expires: float = 0.0
    #: Writes of this counter in flight in this process.
    writing: int = 0
    #: Bumped when a write begins or ends: a read that saw it change overlapped one.
    generation: int = 0


class CountCache:
    """Totals keyed by counter, each kept for ``ttl`` seconds. Thread-safe.

    Uses ``time.monotonic`` (looked up at call time, so freezegun can move
    it). An entry whose expiry lies more than ``ttl`` ahead of the clock was
    made under another clock (a test's frozen time) and counts as expired.
    """

    def __init__(self, ttl: float = DEFAULT_TTL) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            raise BadValueError(f"cache ttl must be a positive number of seconds, got {ttl!r}")
        self.ttl = float(ttl)
        self._forget_all()
        _CACHES.add(self)

    def _forget_all(self) -> None:
        """Start empty, with a free lock: in a forked child, the parent's
        threads that held the lock or had writes in flight are not there to
        finish them, so nothing the parent knew is kept."""
        self._lock = threading.Lock()
        self._keys: dict[Hashable, _Key] = {}

    def _fresh(self, state: _Key, now: float) -> bool:
        return state.total is not None and now < state.expires <= now + self.ttl

    def get(self, key: Hashable) -> int | None:
        """The cached total, or None when there is no fresh one, or when a
        write of this counter is in flight here: it may have committed
        already, and a caller that saw its total must never be shown less."""
        now = time.monotonic()
        with self._lock:
            state = self._keys.get(key)
            if state is None or state.writing or not self._fresh(state, now):
                return None
            return state.total

    def reading(self, key: Hashable) -> int:
        """Call before reading a total from storage; pass the result to ``store``."""
        with self._lock:
            state = self._keys.setdefault(key, _Key())
            return -1 if state.writing else state.generation

    def store(self, key: Hashable, total: int, ticket: int) -> bool:
        """Cache ``total`` read after ``reading(key)`` returned ``ticket``,
        unless a write began or ended meanwhile. True if it was cached."""
        with self._lock:
            state = self._keys.setdefault(key, _Key())
            if ticket < 0 or state.writing or state.generation != ticket:
                return False
            now = time.monotonic()
            state.total, state.expires = total, now + self.ttl
            if len(self._keys) > _PRUNE_ABOVE:
                self._keys = {k: s for k, s in self._keys.items() if s.writing or self._fresh(s, now)}
            return True

    @contextlib.contextmanager
    def writing(self, key: Hashable, amount: int) -> Iterator[None]:
        """Around a commit of ``amount``: on success the cached total gains
        it; on ``CommitUnknown`` the entry is dropped; on any other error
        (nothing was committed) it is left as it was."""
        with self._lock:
            state = self._keys.setdefault(key, _Key())
            state.writing += 1
            state.generation += 1
        committed: bool | None = False
        try:
            yield
            committed = True
        except CommitUnknown:
            committed = None
            raise
        finally:
            with self._lock:
                state.writing -= 1
                state.generation += 1
                if committed is None:
                    state.total = None
                elif committed and state.total is not None:
                    state.total += amount  # the cached total was read before this write began

    def invalidate(self, key: Hashable) -> None:
        with self._lock:
            state = self._keys.get(key)
            if state is not None:
                state.total = None
                state.generation += 1

    def clear(self) -> None:
        with self._lock:
            for state in self._keys.values():
                state.total = None
                state.generation += 1


_shared: "weakref.WeakKeyDictionary[Gateway, CountCache]" = weakref.WeakKeyDictionary()
_shared_lock = threading.Lock()
#: Every cache, so that a forked child can empty them all.
_CACHES: "weakref.WeakSet[CountCache]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()
    for cache in list(_CACHES):
        cache._forget_all()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


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
