"""An optional in-process TTL cache of counter totals.

The articles put totals in memcache for 60 seconds because an exact total
costs one read per shard. This cache plays the same part: a page that shows
a count a hundred times a second pays for one read a minute.

What it promises, within one process: a total it shows was true at some
moment in the last ``ttl`` seconds, and every increment committed since
through the gateway it caches for is in it, and none that failed is; totals
never go backwards because of the cache. Which writes it sees: the shared
cache of a gateway (``cache=True``) sees every write of this process through
that gateway, by any counter object, with or without a cache of its own
(the engine passes every write through it); a ``CountCache`` passed
explicitly sees the writes of the counters built with it, and shows other
writes, like those of other processes, after at most ``ttl`` seconds. The
races, and how each is closed:

* A read that overlaps a write may or may not include it. Such a read is
  returned to its caller but never cached (``reading`` / ``store``).
* A write adjusts the cached total after its commit. The total it adjusts was
  therefore read before the write began (see above), so adding the amount is
  exact. Between the commit and that adjustment the entry is behind storage,
  so while any write of a counter is in flight here, its reads go to storage.
* A write whose outcome this process did not learn (cancelled, interrupted,
  ``CommitUnknown``, any error but ``Contention`` and ``Unavailable``, which
  mean nothing was written) may still land later: a thread cannot be stopped
  and a server may apply a request whose caller left. Its counter's total is
  dropped, and for ``ttl`` seconds none is kept, so reads go to storage.
* ``reset()`` changes the total by an amount it does not know: the total is
  dropped when it ends, however it ends.

Writes by other processes show after at most ``ttl`` seconds, as with the
articles' memcache.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any, Callable, ContextManager, Hashable, Optional, Protocol, Tuple

import attrs

from gds_counter._process import forks
from gds_counter.errors import BadValueError, Contention, TransformsIgnored, Unavailable

__all__ = ["DEFAULT_TTL", "CountCache", "TotalCache", "monotonic"]

DEFAULT_TTL = 60.0

#: Counters remembered before idle, expired ones are forgotten.
_PRUNE_ABOVE = 4096


#: Errors that mean a write stored nothing: the cached total stays true.
_NOT_STORED = (Contention, Unavailable, TransformsIgnored)


@attrs.define(eq=False)
class _Key:
    """What the cache knows of one counter."""

    total: int | None = None
    expires: float = 0.0
    #: Writes of this counter in flight in this process.
    writing: int = 0
    #: Bumped when a write begins or ends: a read that saw it change overlapped one.
    generation: int = 0
    #: Until then (the cache's clock) no total is kept: a write whose
    #: outcome is unknown may still land.
    doubtful_until: float = 0.0


#: What ``reading`` gives and ``store`` takes: the entry and its generation
#: when the read began (None: a write was in flight, the read is not kept).
Ticket = Optional[Tuple[_Key, int]]

class TotalCache(Protocol):
    """What the counter asks of a cache of totals: this module's
    ``CountCache`` (one process) or ``redis_cache.RedisCountCache`` (every
    process). ``reading`` gives a ticket that ``store`` takes back."""

    def get(self, key: Hashable) -> int | None: ...

    def reading(self, key: Hashable) -> Any: ...

    def store(self, key: Hashable, total: int, ticket: Any) -> bool: ...

    def writing(self, key: Hashable, amount: int | None) -> ContextManager[None]: ...


def monotonic() -> float:
    """``time.monotonic()``, looked up at each call so that freezegun can
    move it: the default clock of caches and runtimes."""
    return time.monotonic()


class CountCache:
    """Totals keyed by counter, each kept for ``ttl`` seconds. Thread-safe;
    a forked child starts with it empty.

    ``clock`` (seconds, never going back) defaults to ``time.monotonic``,
    looked up at each call so that freezegun can move it. An entry whose
    expiry lies more than ``ttl`` ahead of the clock was made under another
    clock (a test's frozen time) and counts as expired.
    """

    def __init__(self, ttl: float = DEFAULT_TTL, *, clock: Callable[[], float] = monotonic) -> None:
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            raise BadValueError(f"cache ttl must be a positive number of seconds, got {ttl!r}")
        self.ttl = float(ttl)
        self._clock = clock
        self._after_fork_in_child()
        forks.register(self)

    def _after_fork_in_child(self) -> None:
        """Start empty, with a free lock: in a forked child, the parent's
        threads that held the lock or had writes in flight are not there to
        finish them, so nothing the parent knew is kept."""
        self._lock = threading.Lock()
        self._keys: dict[Hashable, _Key] = {}

    def _fresh(self, state: _Key, now: float) -> bool:
        return state.total is not None and now < state.expires <= now + self.ttl

    def _doubtful(self, state: _Key, now: float) -> bool:
        # (An end more than ttl ahead was set under another clock: over.)
        return now < state.doubtful_until <= now + self.ttl

    def get(self, key: Hashable) -> int | None:
        """The cached total, or None when there is no fresh one, or when a
        write of this counter is in flight here: it may have committed
        already, and a caller that saw its total must never be shown less."""
        now = self._clock()
        with self._lock:
            state = self._keys.get(key)
            if state is None or state.writing or not self._fresh(state, now) or self._doubtful(state, now):
                return None
            return state.total

    def reading(self, key: Hashable) -> Ticket:
        """Call before reading a total from storage; pass the result to ``store``."""
        with self._lock:
            state = self._keys.setdefault(key, _Key())
            return None if state.writing else (state, state.generation)

    def store(self, key: Hashable, total: int, ticket: Ticket) -> bool:
        """Cache ``total`` read after ``reading(key)`` returned ``ticket``,
        unless a write began or ended meanwhile (or the entry was forgotten
        and made anew), or a write's outcome is in doubt. True if cached."""
        with self._lock:
            state = self._keys.get(key)
            now = self._clock()
            if ticket is None or state is not ticket[0] or state.writing or state.generation != ticket[1]:
                return False
            if self._doubtful(state, now):
                return False
            state.total, state.expires = total, now + self.ttl
            if len(self._keys) > _PRUNE_ABOVE:
                self._keys = {k: s for k, s in self._keys.items()
                              if s.writing or self._fresh(s, now) or self._doubtful(s, now)}
            return True

    def writing(self, key: Hashable, amount: int | None) -> "_Writing":
        """Around a write that adds ``amount`` (None: changes the total by
        an amount not known here, as a reset does). Stored: the cached total
        gains ``amount`` (or is dropped). ``Contention`` or ``Unavailable``
        (nothing stored): it is left as it was (or dropped, for an unknown
        amount: a reset may have zeroed some shards). Anything else, even
        ``CancelledError``, ``KeyboardInterrupt`` or ``GeneratorExit``: the
        write may still land, so the total is dropped and none is kept for
        ``ttl`` seconds."""
        return _Writing(self, key, amount)

    def _begin(self, key: Hashable) -> _Key:
        """A write of ``key`` begins (``_Writing``): reads go to storage."""
        with self._lock:
            state = self._keys.get(key)
            if state is None:
                state = self._keys[key] = _Key()
            state.writing += 1
            state.generation += 1
        return state

    def _end(self, key: Hashable, state: _Key, amount: int | None, outcome: str) -> None:
        """The write of ``key`` that ``_begin`` gave ``state`` ended with
        ``outcome`` ("stored", "not stored" or "unknown")."""
        with self._lock:
            state.writing -= 1
            state.generation += 1
            now = self._clock()
            if outcome == "unknown":
                state.total = None
                state.doubtful_until = now + self.ttl
            elif amount is None:
                state.total = None
            elif outcome == "stored" and state.total is not None:
                state.total += amount  # the cached total was read before this write began
            if not state.writing and state.total is None and not self._doubtful(state, now) \
                    and self._keys.get(key) is state:
                del self._keys[key]  # nothing to remember: counters only written take no room

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


class _Writing:
    """``CountCache.writing``'s bracket: a class, not a ``contextlib``
    generator, which cost a lone ``add()`` four calls more (the write runs
    inside ``with``, so its outcome is what ``__exit__`` is given)."""

    __slots__ = ("cache", "key", "amount", "state")

    def __init__(self, cache: CountCache, key: Hashable, amount: int | None) -> None:
        self.cache, self.key, self.amount = cache, key, amount

    def __enter__(self) -> None:
        self.state = self.cache._begin(self.key)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        outcome = "stored" if exc is None else "not stored" if isinstance(exc, _NOT_STORED) else "unknown"
        self.cache._end(self.key, self.state, self.amount, outcome)
