"""Which shard a writer takes (``ShardChooser``): uniformly at random, as
the articles do (``RandomShards``), or one that no other writer of this
process holds and that other processes are not seen writing
(``AffinityShards``, the default; ``docs/architecture.md`` gives the
measurement that chose it).

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
  the shard and what it wrote (the engine passes it to ``wrote``). When the count found is not the
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

An ``AffinityShards`` keeps its state per counter (the most recently used
``MAX_COUNTERS`` of them); a gateway's runtime (``counter.runtime``) holds
one, so that short-lived counter objects (one per web request) share it. A
forked child starts with none: its parent's writers are not its own.

The clock, the dice and the process's number (where its arcs start) come
from the runtime, so tests give them there. A program that models several
app instances in one process (the workshop demo: one gateway per modelled
instance) gives each gateway a runtime with an ``instance`` number of its
own and dice of its own; without that the modelled instances would all
begin on one shard and meet there, as separate processes do not.
"""

from __future__ import annotations

import collections
import logging
import math
import random
import socket
import threading
import zlib
from types import TracebackType
from typing import Callable, Hashable, Mapping, Protocol, runtime_checkable

from gds_counter._process import forks
from gds_counter.errors import BadValueError, Contention

__all__ = ["AVOID_SECONDS", "BUSY_SECONDS", "MAX_COUNTERS", "YIELD_PROBABILITY", "AffinityShards", "RandomShards", "ShardChooser"]

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

#: The golden ratio's fractional part: successive multiples of it, taken
#: modulo 1, stay as far apart as any sequence can (the three-gap theorem).
_GOLDEN = (math.sqrt(5) - 1) / 2


@runtime_checkable
class ShardChooser(Protocol):
    """Which shard of a counter each attempt writes, and what it learns.

    The engine calls ``take`` before an attempt and ``give_back`` after it,
    whatever it ended in (``error`` None: committed); ``wrote`` when a
    strategy reported what the shard held before and after its commit, and
    ``seen`` with what a read found (shard number -> count; ``every``: the
    read saw every stored shard, so a shard missing holds 0). ``give_back``
    and ``wrote`` return True when the chooser decided to move off that
    shard (counted as ``counter.shard_moves``). ``counter`` is a hashable
    name of the counter, the same for every object of one counter.

    A choice never changes what is counted, only where: every attempt
    commits exactly once or raises wherever it lands."""

    def take(self, counter: Hashable, shards: range) -> int: ...

    def give_back(self, counter: Hashable, shard: int, error: BaseException | None) -> bool: ...

    def wrote(self, counter: Hashable, shard: int, found: int, stored: int) -> bool: ...

    def seen(self, counter: Hashable, counts: Mapping[int, int], *, every: bool) -> None: ...


class Holding:
    """A shard of ``shards`` for one attempt on ``counter``, taken from
    ``chooser`` and given back however the attempt ends (``with
    Holding(...) as number``); ``moved()`` is called when the chooser moves
    off the shard. A class, not a generator: every attempt enters one.

    A chooser may be the user's own, so what it does is checked here: a
    shard outside ``shards``, or an error of the chooser's, is refused
    before anything is sent (``BadValueError``: a shard outside the
    counter's range would be missed by the readers that look shards up); an
    error of the chooser's once the attempt ended is logged, never raised,
    since the attempt's outcome is already decided."""

    __slots__ = ("_chooser", "_counter", "_shards", "_moved", "_number")

    def __init__(self, chooser: ShardChooser, counter: Hashable, shards: range, moved: Callable[[], None]) -> None:
        self._chooser, self._counter, self._shards, self._moved = chooser, counter, shards, moved

    def __enter__(self) -> int:
        try:
            number = self._chooser.take(self._counter, self._shards)
        except Exception as exc:
            raise BadValueError(
                f"shard chooser {self._chooser!r} failed to choose a shard of {self._shards} for {self._counter!r}: "
                f"{type(exc).__name__}: {exc}; nothing was written"
            ) from exc
        if isinstance(number, bool) or not isinstance(number, int) or number not in self._shards:
            self._release(number)
            raise BadValueError(
                f"shard chooser {self._chooser!r} chose shard {number!r} for {self._counter!r}, which is not one "
                f"of its shards {self._shards}; nothing was written"
            )
        self._number = number
        return number

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            moved = self._chooser.give_back(self._counter, self._number, exc)
        except Exception:
            log.warning("shard chooser %r failed to take back shard %d", self._chooser, self._number, exc_info=True)
            return
        if moved:
            self._moved()

    def _release(self, number: object) -> None:
        """Give a refused choice back (a chooser may count what it handed out)."""
        try:
            self._chooser.give_back(self._counter, number, None)  # type: ignore[arg-type]
        except Exception:
            log.warning("shard chooser %r failed to take back %r", self._chooser, number, exc_info=True)


def tell_wrote(chooser: ShardChooser, counter: Hashable, shard: int, found: int, stored: int) -> bool:
    """``chooser.wrote(...)``, where an error of the chooser's is logged,
    not raised: what it is told about has happened already (a commit), and
    its outcome stands."""
    try:
        return bool(chooser.wrote(counter, shard, found, stored))
    except Exception:
        log.warning("shard chooser %r failed in wrote()", chooser, exc_info=True)
        return False


def tell_seen(chooser: ShardChooser, counter: Hashable, counts: Mapping[int, int], *, every: bool) -> None:
    """``chooser.seen(...)``, where an error of the chooser's is logged, not
    raised: what it is told about has happened already (a read)."""
    try:
        chooser.seen(counter, counts, every=every)
    except Exception:
        log.warning("shard chooser %r failed in seen()", chooser, exc_info=True)


class RandomShards:
    """A uniformly random shard per attempt, as both articles choose. It
    keeps nothing; its dice are reseeded in a forked child (children of one
    parent would otherwise throw the same numbers)."""

    def __init__(self, dice: random.Random | None = None) -> None:
        self.dice = dice if dice is not None else random.Random()
        forks.register(self)

    def take(self, counter: Hashable, shards: range) -> int:
        return self.dice.choice(shards)

    def give_back(self, counter: Hashable, shard: int, error: BaseException | None) -> bool:
        return False

    def wrote(self, counter: Hashable, shard: int, found: int, stored: int) -> bool:
        return False

    def seen(self, counter: Hashable, counts: Mapping[int, int], *, every: bool) -> None:
        return None

    def _after_fork_in_child(self) -> None:
        self.dice.seed()


def _arc_start(size: int, counter: Hashable, number: int) -> int:
    """Where the arc of ``size`` shards of ``counter`` starts for process
    (or modelled app instance) ``number``.

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
    another."""
    turn = zlib.crc32(f"{socket.gethostname()} {counter!r}".encode()) / 2**32
    return int((turn + number * _GOLDEN) % 1.0 * size)


class _CounterShards:
    """What this process knows about one counter's shards."""

    __slots__ = (
        "counter", "number", "dice", "held", "order", "ranked", "cursor", "last", "wrote_since",
        "avoid_until", "values", "busy_until", "contended_until",
    )

    def __init__(self, counter: Hashable, number: int, dice: random.Random) -> None:
        #: which counter (``_arc_start``)
        self.counter = counter
        #: the process (or modelled app instance) whose writers these are
        self.number = number
        #: the dice it leaves a shard by
        self.dice = dice
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

    def choose(self, shards: range, now: float) -> int:
        if self.ranked != shards:
            # New (or grown): a fresh arc, from this process's own start.
            start = _arc_start(len(shards), self.counter, self.number)
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


class AffinityShards:
    """See the module docstring: a shard no other writer of this process
    holds, an arc of this process's own once others are about, moving away
    from shards another writer uses. Thread-safe; safe across ``fork()``.

    ``clock`` is what avoidance is measured on, ``dice`` decides who leaves
    a shared shard, and ``instance`` stands for the process id where arcs
    start (None: this process's id, read when a counter is first seen)."""

    def __init__(
        self, clock: Callable[[], float], dice: random.Random | None = None, instance: int | None = None,
    ) -> None:
        self.clock = clock
        self.dice = dice if dice is not None else random.Random()
        self.instance = instance
        self._reset()
        forks.register(self)

    def _reset(self) -> None:
        # Re-entrant: a plan the garbage collector finalizes in this thread
        # (one an interrupt dropped) gives its shard back from inside a take.
        self._lock = threading.RLock()
        #: counter -> what this process knows of its shards (most recent last)
        self._known: collections.OrderedDict[Hashable, _CounterShards] = collections.OrderedDict()

    def _after_fork_in_child(self) -> None:
        """The parent's writers are not this process's: forget them, with a
        free lock, and throw dice of its own (children forked from one
        parent, gunicorn ``--preload`` workers, would otherwise draw the
        same shards to leave). Its arcs start from its own process id."""
        self._reset()
        self.dice.seed()

    def _state(self, counter: Hashable) -> _CounterShards:
        """The counter's state, made the most recent; called under the lock."""
        counters = self._known
        state = counters.get(counter)
        if state is None:
            number = self.instance if self.instance is not None else forks.here()
            state = counters[counter] = _CounterShards(counter, number, self.dice)
            if len(counters) > MAX_COUNTERS:
                # Forget the least recently used counters nobody is writing.
                for name in [name for name, old in counters.items() if not old.held][: len(counters) - MAX_COUNTERS]:
                    del counters[name]
        else:
            counters.move_to_end(counter)
        return state

    def take(self, counter: Hashable, shards: range) -> int:
        """The first shard in this process's order that no other writer of
        this process holds and that is not avoided, held until ``give_back``."""
        with self._lock:
            state = self._state(counter)
            shard = state.choose(shards, self.clock())
            state.held[shard] = state.held.get(shard, 0) + 1
            return shard

    def give_back(self, counter: Hashable, shard: int, error: BaseException | None) -> bool:
        """The attempt on ``shard`` ended; ``Contention`` makes this process
        avoid the shard (True: it moves away)."""
        moved = isinstance(error, Contention)
        with self._lock:
            state = self._state(counter)
            if moved:
                state.avoid(shard, self.clock(), "contention")
            left = state.held.get(shard, 0) - 1
            if left > 0:
                state.held[shard] = left
            else:
                state.held.pop(shard, None)
        return moved

    def wrote(self, counter: Hashable, shard: int, found: int, stored: int) -> bool:
        """The attempt found the count ``found`` in its shard and committed
        ``stored`` there: a count this process did not leave means another
        writer uses the shard (True: this process leaves it)."""
        moved = False
        with self._lock:
            state = self._state(counter)
            last = state.last.get(shard)
            if last is not None and last != found:
                now = self.clock()
                state.contended(now)
                if state.dice.random() < YIELD_PROBABILITY:
                    state.avoid(shard, now, f"found {found}, this process left {last}: another writer uses it")
                    moved = True
            state.wrote_since.add(shard)
            state.last[shard] = stored
        return moved

    def seen(self, counter: Hashable, counts: Mapping[int, int], *, every: bool) -> None:
        """What a read of ``counter``'s shards found."""
        with self._lock:
            self._state(counter).observe(counts, self.clock(), every=every)
