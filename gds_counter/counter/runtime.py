"""``Runtime``: what the counters of one process keep for one gateway.

As google-cloud-ndb's ``Context`` holds one client's caches and batches,
a gateway's runtime holds what the counters that write through it share in
this process, whichever counter object each caller holds (a web app builds
one per request):

* ``cache``: the count cache that ``cache=True`` counters read, and that
  every write through the gateway passes (``counter.cache``);
* ``shards``: the shard chooser (``counter.shard_choice``);
* ``combined`` and ``async_combined``: the combined writes of threads and
  of the tasks of each event loop (``counter._combined``);
* ``shared`` and ``async_shared``: the shared reads of a counter's total,
  likewise (``counter._shared_reads``);
* the asyncio face's in-flight slots, per event loop (``in_flight_slot``);
* the clock and the dice they all use, so that a test gives them here
  instead of patching modules.

Nothing here is kept in module globals: the runtime hangs on its gateway
(``Runtime.of``) and goes with it. An async gateway over a blocking one
(``aio.ThreadedGateway``) uses the blocking one's, so both faces of one
process see each other's writes. After ``fork()`` each part starts afresh
in the child (``_process.forks``): the parent's threads, whose writes, locks
and rounds the parts tracked, are not there.
"""

from __future__ import annotations

import asyncio
import random
import threading
import weakref
from typing import Any, Callable

from gds_counter._checks import check_int
from gds_counter._process import forks
from gds_counter.counter._combined import AsyncCombinedWrites, CombinedWrites
from gds_counter.counter._shared_reads import AsyncSharedReads, SharedReads
from gds_counter.counter.cache import CountCache, monotonic
from gds_counter.counter.redis_cache import RedisCountCache
from gds_counter.counter.shard_choice import AffinityShards, ShardChooser
from gds_counter.errors import BadValueError

__all__ = ["DEFAULT_IN_FLIGHT", "Runtime"]

#: Counter operations one gateway runs at once in one event loop, unless the
#: gateway says otherwise (``max_in_flight``); see ``Runtime.in_flight_slot``.
DEFAULT_IN_FLIGHT = 64

#: The attribute of a gateway its runtime hangs on.
_ATTRIBUTE = "_gds_counter_runtime"


class Runtime:
    """See the module docstring. Build one to choose its parts, then
    ``install`` it on a gateway before building counters on it; otherwise
    ``of`` gives each gateway a default one on first use.

    ``clock`` (seconds, never going back) and ``dice`` are what the cache
    and the shard chooser use; ``instance`` numbers the app instance this
    gateway's writers stand for (None: this process; the workshop demo
    models several in one process); ``shards`` replaces the default
    ``AffinityShards``; ``combine_writes=False`` makes every caller commit
    its own amount, ``share_reads=False`` every caller read its own total
    (a benchmark's switches)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = monotonic,
        dice: random.Random | None = None,
        instance: int | None = None,
        shards: ShardChooser | None = None,
        combine_writes: bool = True,
        share_reads: bool = True,
    ) -> None:
        if shards is not None and (isinstance(shards, type) or not isinstance(shards, ShardChooser)):
            raise BadValueError(f"shards must be a ShardChooser instance, got {shards!r}")
        if not callable(clock):
            raise BadValueError(f"clock must be a function returning seconds, got {type(clock).__name__} {clock!r}")
        if dice is not None and not isinstance(dice, random.Random):
            raise BadValueError(f"dice must be a random.Random, got {type(dice).__name__} {dice!r}")
        if instance is not None:
            check_int(instance, "instance", low=None, high=None)
        self.clock = clock
        self.dice = dice if dice is not None else random.Random()
        self.instance = instance
        self.cache = CountCache(clock=clock)
        self.shards: ShardChooser = shards if shards is not None else AffinityShards(clock, self.dice, instance)
        self.combine_writes = combine_writes
        self.combined = CombinedWrites()
        self.async_combined = AsyncCombinedWrites()
        self.share_reads = share_reads
        self._redis_lock = threading.Lock()
        self._redis_caches: dict[str, RedisCountCache] = {}
        self.shared: SharedReads[int] = SharedReads()
        self.async_shared: AsyncSharedReads[int] = AsyncSharedReads()
        self._after_fork_in_child()
        forks.register(self)

    def _after_fork_in_child(self) -> None:
        """The parent's tasks are not here to give their slots back: none
        are kept. (The cache, the chooser and the combined writes see to
        their own fork: each is fork-safe on its own.)"""
        self._slots_lock = threading.Lock()
        self._slots: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = (
            weakref.WeakKeyDictionary()
        )

    @staticmethod
    def of(gateway: Any) -> "Runtime":
        """``gateway``'s runtime, made the first time it is asked for (an
        async gateway over a blocking one: the blocking one's)."""
        owner = getattr(gateway, "blocking", gateway)
        attributes = vars(owner)
        found: Runtime | None = attributes.get(_ATTRIBUTE)
        if found is None:
            # setdefault is atomic: threads racing here all get the one that won.
            found = attributes.setdefault(_ATTRIBUTE, Runtime())
        return found

    def install(self, gateway: Any) -> "Runtime":
        """Make this ``gateway``'s runtime (its blocking one's, for an async
        gateway over one). Counters built on the gateway before keep the
        runtime they were built with."""
        owner = getattr(gateway, "blocking", gateway)
        if isinstance(owner, (str, bytes, int, float, type(None))) or not hasattr(owner, "__dict__"):
            raise BadValueError(f"a runtime is installed on a gateway, got {type(gateway).__name__} {gateway!r}")
        vars(owner)[_ATTRIBUTE] = self
        return self

    def redis_cache(self, url: str, gateway: Any) -> RedisCountCache:
        """The cache every process shares for ``url`` (``cache="redis://..."``),
        one client per URL for the counters on ``gateway`` (whose storage
        names its keys); in a forked child it makes its own client
        (``RedisCountCache._after_fork_in_child``)."""
        with self._redis_lock:
            found = self._redis_caches.get(url)
            if found is None:
                found = self._redis_caches[url] = RedisCountCache(url, gateway)
            return found

    def in_flight_slot(self, gateway: Any) -> asyncio.Semaphore:
        """The slots for counter operations on ``gateway`` in the running
        loop (``gateway.max_in_flight`` of them, else ``DEFAULT_IN_FLIGHT``);
        the rest wait their turn, first come first served.

        Why: a thousand tasks that await a thousand increments would
        otherwise all become ready in the same few loop iterations, each
        running its share of the plan (mapping, checks, codec) before the
        loop can look at its timers again: measured with 500 concurrent
        increments, other tasks then waited up to 0.8 s; with at most 64 in
        flight they waited about 0.1 s, and the increments finished sooner.
        A counter operation holds its slot for its whole plan (its
        transactions included), so a slot is never waited for while holding
        a lock; Store calls, whose transactions span several calls, take
        none."""
        loop = asyncio.get_running_loop()
        with self._slots_lock:
            slot = self._slots.get(loop)
            if slot is None:
                slot = self._slots[loop] = asyncio.Semaphore(getattr(gateway, "max_in_flight", DEFAULT_IN_FLIGHT))
            return slot
