"""The model of ``test_counter_model.py``: what each counter's total may be.

One integer per counter (``low``: the amounts acknowledged since the last
acknowledged reset) plus the amounts of the calls whose outcome is unknown
(``unknown``): the stored total lies in ``[low + negative unknowns, low +
positive unknowns]``. A history of those bounds, with when each state
began and ended, lets a check accept what the docs allow an older read to
show: a rollup read with ``max_age`` (true at some moment within it) and a
cached read (true at some moment within the cache's ``ttl``, plus every
write the cache sees since then).

Writers a cache sees are named per cache ("local": the gateway's shared
cache, which sees every counter write through that gateway object;
"redis": the writes of counters built with the same Redis URL). An unseen
writer (PHP's raw upserts, another process, another gateway object) may be
missing from a cached total for its ``ttl``.

PHP's writer at NUM_SHARDS=40 records its shard count nowhere, so a lookup
read (``method="lookup"``, ``get_counts``) does not see its shards beyond
the recorded count: ``hidden`` is the amount on them, which a lookup read
leaves out and a query read counts (docs/counter.md, "Reading").
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: Clock slack for "at some moment within max_age" (same host, same clock).
SLACK_S = 0.05
DEFAULT_SHARDS = 20
CACHES = ("local", "redis")


@dataclass(frozen=True)
class State:
    """Bounds of the stored total from ``start`` (when the call that made
    this state began) until the end of the next call. ``lo is None``: the
    total is not known at all (a reset that may have been partial)."""

    start: float
    end: float
    lo: int | None
    hi: int | None
    hidden: int
    seen: tuple[int, ...]  # per cache (CACHES): acknowledged amounts it saw, cumulated

    def holds(self, value: int, *, lookup_may_miss: bool, shift: int = 0) -> bool:
        if self.lo is None or self.hi is None:
            return True
        low = self.lo - (self.hidden if lookup_may_miss else 0)
        return low <= value - shift <= self.hi


@dataclass
class CounterModel:
    """One counter: see the module docstring."""

    name: str
    low: int = 0
    unknown: list[int] = field(default_factory=list)
    wild: bool = False  # after a reset that raised an error meaning "maybe partly applied"
    num_shards: int = DEFAULT_SHARDS
    php_high: dict[int, int] = field(default_factory=dict)  # PHP's amounts on shards above 20
    seen: list[int] = field(default_factory=lambda: [0] * len(CACHES))
    history: list[State] = field(default_factory=list)
    #: a shard of it is surely stored (what ``gds-counter rollup`` and
    #: ``list`` find a counter by)
    stored: bool = False
    #: per cache, the first state a cached total may come from (a reset, or
    #: an unknown write that cache saw, drops the total; a Redis restart
    #: loses it)
    cuts: list[int] = field(default_factory=lambda: [0] * len(CACHES))
    saved_cuts: list[int] = field(default_factory=lambda: [0] * len(CACHES))
    #: what happened to it, for the failure message
    events: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._push(0.0, 0.0)

    # --- the bounds -----------------------------------------------------------

    def hidden(self) -> int:
        return sum(amount for shard, amount in self.php_high.items() if shard > self.num_shards)

    def bounds(self) -> tuple[int | None, int | None]:
        if self.wild:
            return None, None
        return (self.low + sum(a for a in self.unknown if a < 0), self.low + sum(a for a in self.unknown if a > 0))

    def _push(self, start: float, end: float) -> None:
        lo, hi = self.bounds()
        self.history.append(State(start, end, lo, hi, self.hidden(), tuple(self.seen)))

    # --- what happened ----------------------------------------------------------

    def write(self, amount: int, outcome: str, start: float, end: float, seen_by: tuple[str, ...] = ()) -> None:
        """An add of ``amount``: outcome "stored", "not" or "unknown"."""
        self.events.append(f"add {amount} {outcome}")
        if outcome == "not":
            return
        if outcome == "stored":
            self.low += amount
            self.stored = True
            for cache in seen_by:
                self.seen[CACHES.index(cache)] += amount
        else:
            assert outcome == "unknown", outcome
            self.unknown.append(amount)
        self._push(start, end)
        if outcome == "unknown":
            for cache in seen_by:  # it drops that counter's cached total
                self.cuts[CACHES.index(cache)] = len(self.history) - 1

    def php_write(self, shard: int, start: float, end: float) -> None:
        """PHP's increment of one shard: +1, exact when it runs alone."""
        self.events.append(f"PHP +1 on shard {shard}")
        self.low += 1
        self.stored = True
        if shard > DEFAULT_SHARDS:
            self.php_high[shard] = self.php_high.get(shard, 0) + 1
        self._push(start, end)

    def reset(self, outcome: str, start: float, end: float, seen_by: tuple[str, ...] = ()) -> None:
        """A reset: "stored" (acknowledged: every shard is 0), "not"
        (documented as nothing applied) or "partial" (anything may be left).
        The caches that see it drop the counter's total; others may show an
        older one for their ttl."""
        self.events.append(f"reset {outcome}")
        if outcome == "not":
            return
        if outcome == "stored":
            self.low, self.unknown, self.wild, self.php_high = 0, [], False, {}
        else:
            self.wild = True
        self._push(start, end)
        for cache in seen_by:
            self.cuts[CACHES.index(cache)] = len(self.history) - 1

    def grown(self, num_shards: int) -> None:
        if num_shards > self.num_shards:
            self.events.append(f"grown to {num_shards} shards")
        self.num_shards = max(self.num_shards, num_shards)
        self._push(self.history[-1].start, self.history[-1].end)

    def cache_lost(self, cache: str) -> None:
        """The cache lost every total: what it shows next is read now."""
        self.cuts[CACHES.index(cache)] = len(self.history) - 1

    def cache_saved(self, cache: str) -> None:
        """A snapshot of the cache: a restore brings back what it held then."""
        self.saved_cuts[CACHES.index(cache)] = self.cuts[CACHES.index(cache)]

    def cache_restored(self, cache: str) -> None:
        """The cache is back as the last snapshot left it."""
        self.cuts[CACHES.index(cache)] = self.saved_cuts[CACHES.index(cache)]

    # --- the checks ---------------------------------------------------------------

    def _states_within(self, since: float, first: int = 0) -> list[State]:
        """The states that may have held at some moment from ``since`` on."""
        states = self.history
        return [
            state for i, state in enumerate(states)
            if i >= first and (i + 1 == len(states) or states[i + 1].end >= since)
        ]

    def exact(self, value: int, *, lookup: bool) -> str | None:
        """None if ``value`` is a total an exact read may return now, else why not."""
        if self.history[-1].holds(value, lookup_may_miss=lookup):
            return None
        return (f"{self.name}: read {value}, model bounds {self.bounds()} (hidden from lookups {self.hidden()}); "
                f"{self.story()}")

    def as_of(self, value: int, started: float, max_age: float) -> str | None:
        """A total true at some moment within ``max_age`` of the read's start."""
        states = self._states_within(started - max_age - SLACK_S)
        if any(state.holds(value, lookup_may_miss=True) for state in states):
            return None
        return (f"{self.name}: read {value} with max_age={max_age}, but the bounds within it were "
                f"{[(s.lo, s.hi) for s in states]}; {self.story()}")

    def cached(self, value: int, started: float, ttl: float, cache: str) -> str | None:
        """A cached total: true at some moment within ``ttl`` (after the
        cache's last cut), plus every acknowledged write that cache saw since."""
        index = CACHES.index(cache)
        now_seen = self.seen[index]
        states = self._states_within(started - ttl - SLACK_S, self.cuts[index])
        if any(state.holds(value, lookup_may_miss=True, shift=now_seen - state.seen[index]) for state in states):
            return None
        return (f"{self.name}: {cache} cache showed {value}; allowed: one of "
                f"{[(s.lo, s.hi, now_seen - s.seen[index]) for s in states]} (lo, hi, seen since); {self.story()}")

    def story(self, last: int = 40) -> str:
        """The counter's last events, oldest first."""
        return "its last events: " + ", ".join(self.events[-last:])
