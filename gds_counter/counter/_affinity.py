"""Which shard a writer takes: one that no other writer of this process
holds, and that other processes are not seen writing.

Random shards collide: 16 writers on 20 shards pick a shard someone else is
writing about half the time, and on a server with pessimistic locks
(Firestore in Datastore mode, and its emulator) a collision of two
transactions is expensive. Both read the shard (shared locks), both ask to
commit (exclusive locks), and neither can until one is aborted: production
aborts one at once (wound-wait), the Firestore emulator only after a lock
timeout of about 2 s, and every other transaction that read the shard
meanwhile waits and is aborted with them. Measured on the emulator with 4
processes x 4 threads on 20 shards, that cut the transactional counter to
a tenth of the PHP article's lossy algorithm.

So each process keeps out of the way of its own writers and learns to keep
out of the way of the others:

* **In-process exclusion.** A writer takes a shard no other writer of this
  process holds (the Firebase counter extension gives each client a shard
  of its own). Only when every shard is held do two writers share one.
* **A preference order per process, once others are about.** While this
  process sees no other writer, it spreads its writes over every free
  shard in turn, as the articles spread theirs at random (a single writer
  does not pile its writes onto one entity). Once it sees one (a busy
  shard, a foreign count, or ``Contention``, within ``BUSY_SECONDS``), it
  takes the first free shard in an order of its own, so its writers stay
  on a few shards (about as many as it has writers at once); two processes
  then share a shard only where their first choices overlap, not
  everywhere. The order is an arc: the
  shards from a start of this process's own on, wrapping around. Arcs
  overlap less than random orders do: two processes' first 4 of 20 shards
  meet for about 35% of pairs of random arcs (7 starting points of 20),
  against 62% for random orders (1 - C(16,4)/C(20,4)); and the starts are
  not random but spread by process id (``_arc_start``), so that processes
  started together begin apart. Alone, a process takes the shards of its
  arc in turn (round robin), which spreads its writes as evenly as
  possible and keeps processes that write at a similar rate apart.
* **Moving away from other processes.** A strategy reports what it found in
  the shard and what it wrote (``wrote``). When the count found is not the
  one this process last wrote there, another writer (another process, or a
  PHP app) is using that shard: this process avoids it for a while with
  probability ``YIELD_PROBABILITY`` (so of two processes meeting on a shard
  usually one leaves, not both). A shard where an attempt met
  ``Contention`` is always avoided. Avoided shards come back after
  ``AVOID_SECONDS`` (a process that left may have gone away). This costs no
  RPC: the signal is the value the transaction reads anyway, and it usually
  comes before the two writers ever overlap in a lock.
* **Looking before moving.** Every read of the total sees every shard, and
  the counter passes what it saw (``seen``, ``seen_shards``). A shard whose
  count changed between two reads while this process did not write it is
  busy: another process writes it. Writers skip busy shards for
  ``BUSY_SECONDS``, so that processes settle onto shards nobody else writes
  instead of trying them one by one, each try a possible lock collision.

None of this touches what is counted: every attempt still commits exactly
once or raises, and reads do not depend on which shards were written.

The state is kept per gateway (weakly: it goes with it) and per counter
(the most recently used ``MAX_COUNTERS`` of them), so that short-lived
counter objects (one per web request) share it. A forked child starts with
none: its parent's writers are not its own.

The arc's start and the dice belong to the process: every gateway of one
process starts its arcs at the same shard. A program that models several
app instances in one process (the workshop demo: one gateway per modelled
instance) says so with ``separate_instance``, which gives a gateway the
arc start and the dice a process of its own would have; without it the
modelled instances would all begin on one shard and meet there, as
separate processes do not.
"""

from __future__ import annotations

import collections
import contextvars
import logging
import math
import os
import random
import socket
import threading
import time
import weakref
import zlib
from types import TracebackType
from typing import Callable, Hashable, Iterable, Mapping

from gds_counter.errors import Contention
from gds_counter.gateway.base import Gateway
from gds_counter.gateway.keys import Key

__all__ = [
    "AVOID_SECONDS", "BUSY_SECONDS", "MAX_COUNTERS", "YIELD_PROBABILITY", "holding_shard", "seen", "seen_shards",
    "separate_instance", "wrote",
]

log = logging.getLogger(__name__)

#: How long a process keeps off a shard it saw another writer use.
AVOID_SECONDS = 30.0
#: The chance that a process leaves a shard on seeing another writer's
#: count there (after ``Contention`` it always leaves).
YIELD_PROBABILITY = 0.5
#: How long a shard seen changing under another writer counts as busy.
BUSY_SECONDS = 10.0
#: Counters whose shard knowledge a process keeps per gateway.
MAX_COUNTERS = 1024

#: Overridable in tests: the clock avoidance is measured on, and the dice.
_clock: Callable[[], float] = time.monotonic
_random = random.Random()

#: The golden ratio's fractional part: successive multiples of it, taken
#: modulo 1, stay as far apart as any sequence can (the three-gap theorem).
_GOLDEN = (math.sqrt(5) - 1) / 2
#: This process's id (tests stand in for other processes by replacing it).
_process_id = os.getpid


def _arc_start(size: int, counter: Hashable, instance: int | None = None) -> int:
    """Where this process's arc of ``size`` shards of ``counter`` starts.

    Processes started together (a server's workers, a pool) have nearby
    process ids, and ``pid * golden ratio`` modulo 1 spreads such ids
    evenly around the circle: the arcs of 4 consecutive ids on 20 shards
    start at least 2 shards apart, and at least 3 for 92% of ids, where 4
    random starts are all 3 or more apart 12% of the time. Their writers
    then begin on different shards, not only once they have met (on the
    Firestore emulator a first meeting costs both writers its 2 s lock
    timeout). The host name and the counter, hashed (the same in every
    process), turn the circle: each machine's processes may have the very
    same ids (containers), and a process's counters start apart from one
    another. ``instance`` stands in for the process id of an app instance
    modelled in this process (``separate_instance``)."""
    turn = zlib.crc32(f"{socket.gethostname()} {counter!r}".encode()) / 2**32
    number = _process_id() if instance is None else instance
    return int((turn + number * _GOLDEN) % 1.0 * size)


class _Instance:
    """The app instance a gateway's writers belong to, when it is not this
    process (``separate_instance``): its number, in place of the process id,
    and its own dice."""

    __slots__ = ("number", "dice")

    def __init__(self, number: int, dice: random.Random) -> None:
        self.number, self.dice = number, dice


class _CounterShards:
    """What this process knows about one counter's shards."""

    __slots__ = (
        "counter", "instance", "held", "order", "ranked", "cursor", "last", "wrote_since",
        "avoid_until", "values", "busy_until", "contended_until", "numbers",
    )

    def __init__(self, counter: Hashable, instance: _Instance | None = None) -> None:
        #: which counter (``_arc_start``)
        self.counter = counter
        #: the modelled app instance whose writers these are; None: this process
        self.instance = instance
        #: shard -> writers of this process holding it now (a shard nobody holds is absent)
        self.held: dict[int, int] = {}
        #: this process's preference: the counter's shards from its own start on, wrapping around
        self.order: list[int] = []
        #: the shards ``order`` ranks (a range compares in O(1), on every attempt)
        self.ranked = range(0)
        #: where in ``order`` a writer of this process, alone, looks first
        self.cursor = 0
        #: shard -> the count this process last committed there
        self.last: dict[int, int] = {}
        #: shards this process wrote since the last read of them
        self.wrote_since: set[int] = set()
        #: shard -> when this process may take it again
        self.avoid_until: dict[int, float] = {}
        #: shard -> its count at the last read
        self.values: dict[int, int] = {}
        #: shard -> until when another writer is taken to be using it
        self.busy_until: dict[int, float] = {}
        #: until when other writers are known to be about (then: keep to few shards)
        self.contended_until = 0.0
        #: shard key name -> shard number (None: not a shard), learned from reads
        self.numbers: dict[str, int | None] = {}

    def choose(self, shards: range, now: float) -> int:
        if self.ranked != shards:
            # New (or grown): a fresh arc, from this process's own start.
            start = _arc_start(len(shards), self.counter, None if self.instance is None else self.instance.number)
            self.order = [*shards[start:], *shards[:start]]
            self.ranked = shards
            self.cursor = 0
        # Others about: keep to this process's first choices, so that
        # processes meet on few shards. Alone: spread over every shard, the
        # next quiet one along the arc (round robin: every shard in turn).
        if now < self.contended_until:
            for n in self.order:
                if self._quiet(n, now):
                    return n
        else:
            size = len(self.order)
            for step in range(size):
                at = (self.cursor + step) % size
                if self._quiet(self.order[at], now):
                    self.cursor = at + 1
                    return self.order[at]
        held = self.held
        for n in self.order:  # every quiet shard is taken: a busy one
            if n not in held and self.avoid_until.get(n, 0.0) <= now:
                return n
        free = [n for n in self.order if n not in held]
        if free:  # every free shard is avoided: the one avoided longest ago
            return min(free, key=lambda n: self.avoid_until.get(n, 0.0))
        fewest = min(held[n] for n in self.order)
        return self.dice.choice([n for n in self.order if held[n] == fewest])

    @property
    def dice(self) -> random.Random:
        """This process's dice, or the modelled instance's own."""
        return _random if self.instance is None else self.instance.dice

    def _quiet(self, n: int, now: float) -> bool:
        """Held by no writer of this process, neither avoided nor busy."""
        return n not in self.held and self.avoid_until.get(n, 0.0) <= now and self.busy_until.get(n, 0.0) <= now

    def contended(self, now: float) -> None:
        self.contended_until = now + BUSY_SECONDS

    def avoid(self, shard: int, now: float, why: str) -> None:
        self.avoid_until[shard] = now + AVOID_SECONDS
        self.contended(now)
        log.debug("avoiding shard %d for %.0f s: %s", shard, AVOID_SECONDS, why)

    def observe(self, counts: Mapping[int, int], now: float, *, every: bool) -> None:
        """A read found ``counts``; ``every``: it read every stored shard,
        so a shard missing from it holds 0. A shard that changed between two
        reads while this process did not write it is busy."""
        for n in set(self.order).union(counts) if every else counts:
            if n in self.held or n in self.wrote_since:
                # This process's own writes change it: judge from the next read on.
                self.wrote_since.discard(n)
                self.values.pop(n, None)
                continue
            value = counts.get(n, 0)
            before = self.values.get(n)
            if before is not None and before != value:
                self.busy_until[n] = now + BUSY_SECONDS
                self.contended(now)
            self.values[n] = value


class _Hold:
    __slots__ = ("state", "shard", "gateway")

    def __init__(self, state: _CounterShards, shard: int, gateway: Gateway) -> None:
        self.state, self.shard, self.gateway = state, shard, gateway


_lock = threading.Lock()
#: gateway -> counter -> what this process knows of its shards (most recent last)
_known: "weakref.WeakKeyDictionary[Gateway, collections.OrderedDict[Hashable, _CounterShards]]" = (
    weakref.WeakKeyDictionary()
)
#: gateway -> the app instance it stands for, when not this process (``separate_instance``)
_instances: "weakref.WeakKeyDictionary[Gateway, _Instance]" = weakref.WeakKeyDictionary()
#: The shard the running attempt holds: how a strategy's ``wrote`` finds it.
#: A context variable, not a thread-local, so that plans driven by asyncio
#: tasks each see their own.
_current: "contextvars.ContextVar[_Hold | None]" = contextvars.ContextVar("gds_counter_shard_hold", default=None)


def _forget_all() -> None:
    global _lock
    _lock = threading.Lock()  # a thread of the parent may have held it at fork time
    _known.clear()
    _instances.clear()  # the child is one process: its own
    # Its own dice: children forked from one parent (gunicorn --preload
    # workers) would otherwise draw the same shards to leave. (``random``'s
    # module functions are reseeded at a fork; an instance of
    # ``random.Random`` is not.) Its arcs start from its own process id.
    _random.seed()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all)


def _state(gateway: Gateway, counter: Hashable) -> _CounterShards:
    """The counter's state, made the most recent; called under ``_lock``."""
    counters = _known.setdefault(gateway, collections.OrderedDict())
    state = counters.get(counter)
    if state is None:
        state = counters[counter] = _CounterShards(counter, _instances.get(gateway))
        if len(counters) > MAX_COUNTERS:
            # Forget the least recently used counters nobody is writing.
            for name in [name for name, old in counters.items() if not old.held][: len(counters) - MAX_COUNTERS]:
                del counters[name]
    else:
        counters.move_to_end(counter)
    return state


class holding_shard:
    """A shard of ``shards`` for one attempt on ``counter``: the first in
    this process's order that no other writer of this process holds and that
    is not avoided, held until the block ends (``with holding_shard(...) as
    shard``). ``Contention`` raised in the block makes this process avoid
    the shard. A class, not a generator: every attempt of every increment
    enters one."""

    __slots__ = ("_gateway", "_counter", "_shards", "_state", "_shard", "_outer")

    def __init__(self, gateway: Gateway, counter: Hashable, shards: range) -> None:
        self._gateway, self._counter, self._shards = gateway, counter, shards

    def __enter__(self) -> int:
        with _lock:
            state = self._state = _state(self._gateway, self._counter)
            shard = self._shard = state.choose(self._shards, _clock())
            state.held[shard] = state.held.get(shard, 0) + 1
        self._outer = _current.get()
        _current.set(_Hold(state, shard, self._gateway))
        return shard

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        state, shard = self._state, self._shard
        # set, not reset(token): a plan closed by the garbage collector ends
        # in whatever context that runs, where the token is not valid.
        _current.set(self._outer)
        with _lock:
            if isinstance(exc, Contention):
                state.avoid(shard, _clock(), "contention")
            left = state.held[shard] - 1
            if left:
                state.held[shard] = left
            else:
                del state.held[shard]
        if isinstance(exc, Contention):
            self._gateway.stats.bump("counter.shard_moves")


def wrote(found: int, stored: int) -> None:
    """Tell the affinity that the running attempt found the count ``found``
    in its shard and committed ``stored`` there. Called by strategies after
    a successful commit; outside ``holding_shard`` it does nothing."""
    hold = _current.get()
    if hold is None:
        return
    moved = False
    with _lock:
        state, shard = hold.state, hold.shard
        last = state.last.get(shard)
        if last is not None and last != found:
            now = _clock()
            state.contended(now)
            if state.dice.random() < YIELD_PROBABILITY:
                state.avoid(shard, now, f"found {found}, this process left {last}: another writer uses it")
                moved = True
        state.wrote_since.add(shard)
        state.last[shard] = stored
    if moved:
        hold.gateway.stats.bump("counter.shard_moves")


def seen(gateway: Gateway, counter: Hashable, counts: Mapping[int, int]) -> None:
    """Tell the affinity what a read of some shards of ``counter`` found
    (shard number -> count, 0 for a shard not stored)."""
    with _lock:
        _state(gateway, counter).observe(counts, _clock(), every=False)


def seen_shards(
    gateway: Gateway, counter: Hashable, shards: Iterable[tuple[Key, int]], number_of: Callable[[Key], int | None]
) -> None:
    """``seen`` for a query's ``(key, count)`` pairs: every stored shard,
    ``number_of`` telling a key's shard number (worked out once per name)."""
    with _lock:
        state = _state(gateway, counter)
        counts: dict[int, int] = {}
        for key, count in shards:
            name = key.name or ""
            number = state.numbers.get(name, -1)
            if number == -1:
                number = state.numbers[name] = number_of(key)
            if number is not None:
                counts[number] = count
        state.observe(counts, _clock(), every=True)


def separate_instance(gateway: Gateway, number: int, dice: random.Random | None = None) -> None:
    """Let ``gateway``'s writers choose shards as the writers of a separate
    app instance would: arcs started as for a process with id ``number``
    (instances started together: consecutive numbers), and dice of their
    own (``dice``, else freshly seeded). What the gateway knew of its
    counters' shards is forgotten: it was learned as another instance.

    For a program that models several app instances in one process, one
    gateway each (the workshop demo). Nothing else changes: the in-process
    exclusion, avoidance and busy shards were per gateway already, and what
    is counted never depends on the shard chosen."""
    with _lock:
        _instances[gateway] = _Instance(number, dice if dice is not None else random.Random())
        _known.pop(gateway, None)
