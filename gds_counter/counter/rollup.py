"""Rollups: a counter's total as of a moment, kept in one entity, so that a
read allowed to be ``max_age`` seconds old costs one entity read, whatever
the shard count.

An exact read costs one entity read per shard (a lookup of every shard key,
or the article's query, which bills every shard it returns). Google's
sharding article keeps the total in memcache for 60 seconds; Firebase's
Distributed Counter folds the shards into the main document in the
background. A rollup does the first across processes, and says how old it
is: ``get_count(max_age=S)`` returns a total at most ``S`` seconds old,
and ``get_count_as_of`` returns it with the moment it was true.

The rollup entity (kind ``layout.rollup_kind``, key name = the counter's
name) holds ``total``, ``as_of`` (the wall-clock moment the exact read
began: every increment committed before it is in the total, and the total
was true at some moment at or after it) and ``claim`` (the generation that
wrote it, below). It never touches a shard, so PHP's target query and
ndb's key reads keep their exact totals; no writer updates it.

A read with ``max_age``: one lookup of the rollup key (1 RPC, 1 entity
read). When the rollup is at most ``max_age`` old (either way: a rollup
written by a clock far ahead is not trusted), that is the answer. Otherwise
the read is exact (as ``get_count()`` reads, strongly consistent) and the
rollup is written back.

**At most one rollup write per counter per generation**, without locks.
Readers that find the same stale rollup (generation ``g``: its ``as_of`` in
microseconds, or ``none``) all read the shards, and each then commits, in
one transaction that reads nothing (so nobody waits on a lock): an insert
of the claim entity ``g`` (a child of the rollup key) and the new rollup.
Only the first commit can insert claim ``g``; every other one fails with
``AlreadyExists`` and writes nothing. A reader that comes later finds the
new rollup, fresh, and does not write. So a counter read with ``max_age=S``
is rolled up at most once per ``S`` seconds, however many processes read
it. The claim is written in the same commit as the rollup, so a crash
between them cannot leave a generation claimed but unwritten.

**Claims live ``CLAIM_LIFETIME`` seconds, and the rollup lists them.** A
claim must outlive every reader that looked up its generation, or a slow
one would insert it again and write an older total over a newer one,
leaving the claims the newer rollup listed untracked. So a reader writes
only within ``WRITE_WITHIN`` seconds of its lookup, and a claim is deleted
only once it is ``CLAIM_LIFETIME`` old, by a later rollup write (at most
``SWEEP`` per write), which finds it in the rollup's ``claims`` list
(``"<generation>@<microseconds when made>"``).

**Readers' writes are paced, so a rollup never falls far behind.** A rollup
lists at most ``MAX_CLAIMS`` live claims. Half of them may be made at once;
past that, a stale reader writes only when the newest live claim is at
least ``pace()`` (``2 * CLAIM_LIFETIME / MAX_CLAIMS``, 1 s) old, and
otherwise returns its exact total without writing. So under constant
``max_age=0`` reads the rollup is rewritten about once a second and is
never more than about that behind the reads, instead of spending every
claim in a burst and then staying as it was for a whole lifetime.

**An explicit refresh** (``forced``: ``gds-counter rollup``) is not paced
and does not stop at ``MAX_CLAIMS``: it writes a current total, unless the
rollup already lists ``2 * MAX_CLAIMS`` live claims or its lookup is too
old; then it counts the counter as failed (``Writes.not_written``) rather
than skipping it quietly.

What a rollup promises: its total was true at some moment at or after its
``as_of``, and ``as_of`` is at most ``max_age`` before the reader's clock
(plus the skew between the writer's and the reader's clocks: wall clocks,
since processes on several hosts share it). A failed rollup write never
fails the read that made it: the exact total is returned and a warning is
logged.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from typing import Protocol, Sequence, TypeGuard

import attrs

from gds_counter._checks import is_int
from gds_counter.counter.layout import Layout
from gds_counter.errors import AlreadyExists, BadValueError, GDSError
from gds_counter.gateway import plan
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Insert, Mutation, Upsert
from gds_counter.gateway.values import RawEntity, epoch_micros

__all__ = [
    "ROLLUP_BATCH", "Rollable", "TotalAsOf", "Writes", "check_max_age", "exact_plan", "rewrite_plan", "total_as_of_plan",
    "totals_as_of_plan", "wall_clock",
]

log = logging.getLogger("gds_counter.counter.rollup")

#: Counters whose rollups one transaction writes (each counter's rollup and
#: claims are one entity group; Datastore's legacy limit is 25 groups).
ROLLUP_BATCH = 25

#: Seconds a claim is kept after it was made (module notes).
CLAIM_LIFETIME = 60.0
#: A reader writes its rollup only this many seconds after its lookup, at
#: most (a slower one looks it up again first): a commit that then takes up
#: to ``CLAIM_LIFETIME - WRITE_WITHIN`` still meets the claims it lists alive.
WRITE_WITHIN = 10.0
#: Live claims a rollup may list; a stale reader that finds this many
#: returns its exact total without writing (so does one that finds half as
#: many, the newest less than ``pace()`` old). An explicit refresh stops at
#: twice as many.
MAX_CLAIMS = 120
#: Expired claims one rollup write deletes at most (25 counters per commit,
#: each 2 + SWEEP mutations, stay within Datastore's 500).
SWEEP = 16

_TOTAL, _AS_OF, _CLAIM, _CLAIMS = "total", "as_of", "claim", "claims"


class Rollable(Protocol):
    """What a rollup needs of a counter (``_engine.Rollable`` is one; a
    protocol, so this module need not import the engine that uses it)."""

    layout: Layout
    name: str
    namespace: str

    def _total(self, method: str, *, use_cache: bool) -> plan.Plan[int]: ...

    def _read_method(self, method: str) -> str: ...


@attrs.frozen
class TotalAsOf:
    """A counter's total and the moment it was true: every increment
    committed before ``as_of`` (UTC) is in it. ``from_rollup``: read from the
    rollup rather than from the shards."""

    total: int
    as_of: dt.datetime
    from_rollup: bool


def wall_clock() -> dt.datetime:
    """Now, in UTC, looked up at each call (so freezegun can move it)."""
    return dt.datetime.now(dt.timezone.utc)


def check_max_age(max_age: object) -> float:
    """``max_age`` as seconds: a number from 0 up (``inf`` allowed: any
    rollup; an integer too large for a float counts as ``inf``)."""
    if isinstance(max_age, bool) or not isinstance(max_age, (int, float)):
        raise BadValueError(f"max_age must be a number of seconds from 0 up, got {max_age!r}")
    try:
        seconds = float(max_age)
    except OverflowError:
        seconds = math.inf if max_age > 0 else -math.inf
    if math.isnan(seconds) or seconds < 0:
        raise BadValueError(f"max_age must be a number of seconds from 0 up, got {max_age!r}")
    return seconds


def _generation(stored: TotalAsOf | None) -> str:
    return "none" if stored is None else str(epoch_micros(stored.as_of))


def _utc(moment: dt.datetime) -> dt.datetime:
    """A stored timestamp as UTC (one written without a zone is UTC)."""
    return moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)


def _stored(raw: RawEntity | None) -> TotalAsOf | None:
    """The rollup a stored entity holds; None when there is none, or when
    it is malformed (then it is written again)."""
    if raw is None:
        return None
    total, as_of = raw.properties.get(_TOTAL), raw.properties.get(_AS_OF)
    if not is_int(total) or not isinstance(as_of, dt.datetime):
        return None
    return TotalAsOf(total, _utc(as_of), True)


def _looked_up(raw: RawEntity | None) -> TotalAsOf | None:
    """``_stored``, saying once, where a reader first meets it, that a
    stored entity is no rollup."""
    found = _stored(raw)
    if raw is not None and found is None:
        log.warning("%s is not a rollup (total=%r, as_of=%r); it is written again",
                    raw.key, raw.properties.get(_TOTAL), raw.properties.get(_AS_OF))
    return found


def _fresh(stored: TotalAsOf, max_age: float) -> bool:
    return abs((wall_clock() - stored.as_of).total_seconds()) <= max_age


def exact_plan(counter: Rollable, method: str) -> plan.Plan[TotalAsOf]:
    """The exact total, read now (the cache is not asked), and when that was."""
    as_of = wall_clock()  # before the read: whatever was committed before it is in the total
    total: int = yield from counter._total(method, use_cache=False)
    return TotalAsOf(total, as_of, False)


@attrs.frozen
class _Stale:
    """A counter whose rollup its reader found stale: the exact total it
    read, the rollup entity it found, when it looked that up, and whether
    this is an explicit refresh (``forced``: not paced, and a rollup not
    written is a failure)."""

    counter: Rollable
    fresh: TotalAsOf
    raw: RawEntity | None
    looked: dt.datetime
    forced: bool = False


def _is_generation(name: object) -> TypeGuard[str]:
    """A generation this module names: ``none``, or microseconds."""
    return isinstance(name, str) and (name == "none" or (name.isascii() and name.isdigit() and len(name) <= 20))


def _claims(raw: RawEntity | None) -> list[tuple[str, int]]:
    """The claims a rollup entity lists, as (generation, microseconds when
    made); a rollup written before claims were listed names one, ``claim``,
    made when its total was read. Entries this module would not have
    written are skipped."""
    if raw is None:
        return []
    listed = raw.properties.get(_CLAIMS)
    if listed is None:
        before, as_of = raw.properties.get(_CLAIM), raw.properties.get(_AS_OF)
        if _is_generation(before) and isinstance(as_of, dt.datetime):
            return [(before, epoch_micros(_utc(as_of)))]
        return []
    out = []
    for entry in listed if isinstance(listed, list) else []:
        generation, _, made = entry.rpartition("@") if isinstance(entry, str) else ("", "", "")
        if _is_generation(generation) and made.isascii() and made.isdigit() and len(made) <= 20:
            out.append((generation, int(made)))
    return out


def _alive(made: int, now: dt.datetime) -> bool:
    """Whether a claim made at ``made`` (microseconds) is within its
    lifetime of ``now``, either way: a claim a clock far ahead made is not
    kept until that clock's future comes (it would hold ``MAX_CLAIMS`` up)."""
    return abs(epoch_micros(now) - made) <= CLAIM_LIFETIME * 1_000_000


def _mutations(stale: _Stale, now: dt.datetime) -> list[Mutation]:
    """Insert the claim of the generation ``stale.raw`` holds, write the
    rollup listing it, and delete up to ``SWEEP`` listed claims that are
    ``CLAIM_LIFETIME`` old."""
    layout, name, namespace = stale.counter.layout, stale.counter.name, stale.counter.namespace
    generation = _generation(_stored(stale.raw))
    listed = [(g, made) for g, made in _claims(stale.raw) if g != generation]
    expired = sorted((made, g) for g, made in listed if not _alive(made, now))[:SWEEP]
    gone = {g for _, g in expired}
    kept = [(g, made) for g, made in listed if g not in gone] + [(generation, epoch_micros(now))]
    rollup = RawEntity(
        layout.rollup_key(name, namespace),
        {
            _TOTAL: stale.fresh.total,
            _AS_OF: stale.fresh.as_of,
            _CLAIM: generation,
            _CLAIMS: [f"{g}@{made}" for g, made in kept],
        },
        frozenset({_TOTAL, _CLAIM, _CLAIMS}),
    )
    claim = RawEntity(layout.claim_key(name, generation, namespace), {_AS_OF: now}, frozenset({_AS_OF}))
    out: list[Mutation] = [Insert(claim), Upsert(rollup)]
    out += [Delete(layout.claim_key(name, g, namespace)) for _, g in expired]
    return out


def _recent(items: Sequence[_Stale]) -> plan.Plan[list[_Stale]]:
    """``items`` with every lookup older than ``WRITE_WITHIN`` made again
    (one lookup for them all); a counter whose rollup is by now at least as
    new as the total read is left out: another reader wrote it."""
    now = wall_clock()
    out = [item for item in items if (now - item.looked).total_seconds() <= WRITE_WITHIN]
    old = [item for item in items if (now - item.looked).total_seconds() > WRITE_WITHIN]
    if old:
        raws = yield from plan.lookup([i.counter.layout.rollup_key(i.counter.name, i.counter.namespace) for i in old])
        for item, raw in zip(old, raws):
            stored = _stored(raw)
            if stored is None or stored.as_of < item.fresh.as_of:
                out.append(attrs.evolve(item, raw=raw, looked=now))
    return out


def pace() -> float:
    """Seconds between a reader's rollup writes once half of ``MAX_CLAIMS``
    is listed alive: the other half then lasts a claim's lifetime."""
    return 2 * CLAIM_LIFETIME / MAX_CLAIMS


def _held_back(stale: _Stale, now: dt.datetime) -> str | None:
    """Why the rollup's claims hold ``stale``'s write back (see the
    module's notes), or None: a reader's, at ``MAX_CLAIMS`` live claims, or
    at half of that while the newest is less than ``pace()`` old; a forced
    refresh's, at twice ``MAX_CLAIMS``."""
    live = [made for _, made in _claims(stale.raw) if _alive(made, now)]
    if len(live) >= (2 * MAX_CLAIMS if stale.forced else MAX_CLAIMS):
        return f"its rollup lists {len(live)} claims made within {CLAIM_LIFETIME:g} s"
    if stale.forced or not live or len(live) < MAX_CLAIMS // 2:
        return None
    if epoch_micros(now) - max(live) < pace() * 1_000_000:
        return f"its rollup lists {len(live)} live claims, the newest less than {pace():g} s old"
    return None


@attrs.frozen
class Writes:
    """What writing rollups did: how many were ``written``, and how many
    ``failed`` (logged), each named with why in ``not_written``: an error, a
    lookup too old to write, or, for a forced refresh, claims that hold it
    back. Those left to another reader (who wrote the same generation or a
    newer rollup), and a reader's write its claims hold back, are neither."""

    written: int = 0
    failed: int = 0
    not_written: tuple[str, ...] = ()

    def __add__(self, other: Writes) -> Writes:
        return Writes(self.written + other.written, self.failed + other.failed, self.not_written + other.not_written)


def _failed(items: Sequence[_Stale], why: object) -> Writes:
    """``items`` not written, logged and named with ``why``."""
    names = ", ".join(str(item.counter) for item in items)
    log.warning("rollup of %s not written: %s", names, why)
    return Writes(failed=len(items), not_written=tuple(f"{item.counter}: {why}" for item in items))


def _once(items: Sequence[_Stale]) -> list[_Stale]:
    """``items`` with each counter once (the first): two of one counter
    would insert one claim twice in one commit, and fail with the rest."""
    seen: set[Key] = set()
    out = []
    for item in items:
        key = item.counter.layout.rollup_key(item.counter.name, item.counter.namespace)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def _write(items: Sequence[_Stale]) -> plan.Plan[Writes]:
    """Write the rollups of ``items`` that may be written, ``ROLLUP_BATCH``
    counters per transaction. A batch that meets another writer's claim is
    written again counter by counter, and that one is left to the other."""
    done = Writes()
    items = _once(items)
    for start in range(0, len(items), ROLLUP_BATCH):
        recent = yield from _recent(items[start : start + ROLLUP_BATCH])
        now = wall_clock()
        chunk = []
        for item in recent:
            took = (now - item.looked).total_seconds()
            why = f"its lookup is {took:.1f} s old" if took > WRITE_WITHIN else _held_back(item, now)
            if why is None:
                chunk.append(item)
            elif item.forced or took > WRITE_WITHIN:
                done += _failed([item], why)
            else:
                log.debug("rollup of %s not written: %s", item.counter, why)  # its read is exact anyway
        if not chunk:
            continue
        mutations = [m for item in chunk for m in _mutations(item, now)]

        def blind(token: bytes, mutations: list[Mutation] = mutations) -> plan.Plan[Sequence[Mutation]]:
            return plan.just(mutations)  # reads nothing: no lock for another writer to wait on

        try:
            yield from plan.in_transaction(blind)
            done += Writes(written=len(chunk))
        except AlreadyExists:
            if len(chunk) > 1:
                for item in chunk:
                    done += yield from _write([item])
            else:
                done += yield from _taken(chunk[0])
        except GDSError as exc:  # the totals are exact anyway: the next stale read writes again
            done += _failed(chunk, exc)
    return done


def _taken(stale: _Stale) -> plan.Plan[Writes]:
    """The claim of the generation ``stale.raw`` shows was taken: by another
    reader, who wrote a rollup (nothing to do), or, when there is still no
    usable rollup (deleted or spoiled after its claim was made), by nobody
    alive: the rollup is written over that claim."""
    counter = stale.counter
    [now] = yield from plan.lookup([counter.layout.rollup_key(counter.name, counter.namespace)])
    if _stored(now) is not None or _stored(stale.raw) is not None:
        log.debug("rollup of %s: another reader wrote this generation", counter)
        return Writes()
    mutations = [Upsert(m.entity) if isinstance(m, Insert) else m for m in _mutations(stale, wall_clock())]
    try:
        yield from plan.in_transaction(lambda token: plan.just(mutations))
    except GDSError as exc:
        return _failed([stale], exc)
    return Writes(written=1)


def total_as_of_plan(counter: Rollable, method: str, max_age: float) -> plan.Plan[TotalAsOf]:
    """The counter's rollup if it is at most ``max_age`` old, else its exact
    total, rolled up (see the module's notes)."""
    looked = wall_clock()
    [raw] = yield from plan.lookup([counter.layout.rollup_key(counter.name, counter.namespace)])
    stored = _looked_up(raw)
    if stored is not None and _fresh(stored, max_age):
        return stored
    fresh = yield from exact_plan(counter, method)
    yield from _write([_Stale(counter, fresh, raw, looked)])
    return fresh


def rewrite_plan(counter: Rollable) -> plan.Plan[Writes]:
    """Write ``counter``'s rollup again from an exact read, as an explicit
    refresh (``forced``), if it has one (a counter without a rollup gets
    none): what ``reset()`` does once every shard is 0, so that a read with
    ``max_age`` does not answer the total from before it. One lookup."""
    looked = wall_clock()
    [raw] = yield from plan.lookup([counter.layout.rollup_key(counter.name, counter.namespace)])
    if raw is None:
        return Writes()
    fresh = yield from exact_plan(counter, counter._read_method("auto"))
    return (yield from _write([_Stale(counter, fresh, raw, looked, forced=True)]))


def totals_as_of_plan(
    counters: Sequence[Rollable], max_age: float, *, refresh: bool = True, forced: bool = False
) -> plan.Plan[tuple[list[TotalAsOf], Writes]]:
    """``total_as_of_plan`` for many counters (all on the gateway the plan
    runs against): one lookup of every rollup key, an exact read of each
    counter whose rollup is stale, and their rollups written in batches;
    also what the writes did (``refresh=False``: none; the stale totals
    are still read exactly). ``forced``: an explicit refresh, whose every
    stale rollup is written or counted as failed (the module's notes)."""
    looked = wall_clock()
    raws = yield from plan.lookup([c.layout.rollup_key(c.name, c.namespace) for c in counters])
    out: list[TotalAsOf] = []
    stale: list[_Stale] = []
    for counter, raw in zip(counters, raws):
        stored = _looked_up(raw)
        if stored is not None and _fresh(stored, max_age):
            out.append(stored)
            continue
        fresh = yield from exact_plan(counter, counter._read_method("auto"))
        out.append(fresh)
        stale.append(_Stale(counter, fresh, raw, looked, forced))
    writes = (yield from _write(stale)) if refresh else Writes()
    return out, writes
