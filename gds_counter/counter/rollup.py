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
of the claim entity ``g`` (a child of the rollup key), the new rollup, and
the delete of the claim that wrote the old one. Only the first commit can
insert claim ``g``; every other one fails with ``AlreadyExists`` and writes
nothing. A reader that comes later finds the new rollup, fresh, and does
not write. So a counter read with ``max_age=S`` is rolled up at most once
per ``S`` seconds, however many processes read it. The claim is written in
the same commit as the rollup, so a crash between them cannot leave a
generation claimed but unwritten. A reader whose lookup is older than two
generations may insert an old claim again and write its own total: still
a true total with its own ``as_of``, only not the newest.

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
from typing import Protocol, Sequence

import attrs

from gds_counter._checks import is_int
from gds_counter.counter.layout import Layout
from gds_counter.errors import AlreadyExists, BadValueError, GDSError
from gds_counter.gateway import plan
from gds_counter.gateway.mutations import Delete, Insert, Mutation, Upsert
from gds_counter.gateway.values import EPOCH, RawEntity

__all__ = [
    "ROLLUP_BATCH", "Rollable", "TotalAsOf", "check_max_age", "exact_plan", "total_as_of_plan", "totals_as_of_plan", "wall_clock",
]

log = logging.getLogger("gds_counter.counter.rollup")

#: Counters whose rollups one transaction writes (each counter's rollup and
#: claims are one entity group; Datastore's legacy limit is 25 groups).
ROLLUP_BATCH = 25

_TOTAL, _AS_OF, _CLAIM = "total", "as_of", "claim"


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
    if stored is None:
        return "none"
    delta = stored.as_of - EPOCH
    return str((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)


def _stored(raw: RawEntity | None) -> TotalAsOf | None:
    """The rollup a stored entity holds; None when there is none, or when
    it is malformed (then it is written again)."""
    if raw is None:
        return None
    total, as_of = raw.properties.get(_TOTAL), raw.properties.get(_AS_OF)
    if not is_int(total) or not isinstance(as_of, dt.datetime):
        return None
    return TotalAsOf(total, as_of if as_of.tzinfo else as_of.replace(tzinfo=dt.timezone.utc), True)


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


def _mutations(counter: Rollable, fresh: TotalAsOf, raw: RawEntity | None) -> list[Mutation]:
    layout, name, namespace = counter.layout, counter.name, counter.namespace
    generation = _generation(_stored(raw))
    rollup = RawEntity(
        layout.rollup_key(name, namespace),
        {_TOTAL: fresh.total, _AS_OF: fresh.as_of, _CLAIM: generation},
        frozenset({_TOTAL, _CLAIM}),
    )
    claim = RawEntity(layout.claim_key(name, generation, namespace), {_AS_OF: fresh.as_of}, frozenset({_AS_OF}))
    out: list[Mutation] = [Insert(claim), Upsert(rollup)]
    before = raw.properties.get(_CLAIM) if raw is not None else None
    if isinstance(before, str) and before and before != generation:
        out.append(Delete(layout.claim_key(name, before, namespace)))
    return out


def _write(items: Sequence[tuple[Rollable, TotalAsOf, RawEntity | None]]) -> plan.Plan[int]:
    """Write the rollups of ``items`` (counter, exact total, the rollup
    entity its reader found), ``ROLLUP_BATCH`` counters per transaction;
    how many were written. A batch that meets another writer's claim is
    written again counter by counter, and that one is left to the other."""
    written = 0
    for start in range(0, len(items), ROLLUP_BATCH):
        chunk = list(items[start : start + ROLLUP_BATCH])
        mutations = [m for counter, fresh, raw in chunk for m in _mutations(counter, fresh, raw)]

        def blind(token: bytes, mutations: list[Mutation] = mutations) -> plan.Plan[Sequence[Mutation]]:
            return plan.just(mutations)  # reads nothing: no lock for another writer to wait on

        try:
            yield from plan.in_transaction(blind)
            written += len(chunk)
        except AlreadyExists:
            if len(chunk) > 1:
                for item in chunk:
                    written += yield from _write([item])
            else:
                written += yield from _taken(*chunk[0])
        except GDSError as exc:  # the totals are exact anyway: the next stale read writes again
            log.warning("rollup of %s not written: %s", ", ".join(str(c) for c, _, _ in chunk), exc)
    return written


def _taken(counter: Rollable, fresh: TotalAsOf, raw: RawEntity | None) -> plan.Plan[int]:
    """The claim of the generation ``raw`` shows was taken: by another
    reader, who wrote a rollup (nothing to do), or, when there is still no
    usable rollup (deleted or spoiled after its claim was made), by nobody
    alive: the rollup is written over that claim."""
    key = counter.layout.rollup_key(counter.name, counter.namespace)
    [now] = yield from plan.lookup([key])
    if _stored(now) is not None or _stored(raw) is not None:
        log.debug("rollup of %s: another reader wrote this generation", counter)
        return 0
    mutations = [Upsert(m.entity) if isinstance(m, Insert) else m for m in _mutations(counter, fresh, raw)]
    try:
        yield from plan.in_transaction(lambda token: plan.just(mutations))
    except GDSError as exc:
        log.warning("rollup of %s not written: %s", counter, exc)
        return 0
    return 1


def total_as_of_plan(counter: Rollable, method: str, max_age: float) -> plan.Plan[TotalAsOf]:
    """The counter's rollup if it is at most ``max_age`` old, else its exact
    total, rolled up (see the module's notes)."""
    [raw] = yield from plan.lookup([counter.layout.rollup_key(counter.name, counter.namespace)])
    stored = _looked_up(raw)
    if stored is not None and _fresh(stored, max_age):
        return stored
    fresh = yield from exact_plan(counter, method)
    yield from _write([(counter, fresh, raw)])
    return fresh


def totals_as_of_plan(
    counters: Sequence[Rollable], max_age: float, *, refresh: bool = True
) -> plan.Plan[tuple[list[TotalAsOf], int]]:
    """``total_as_of_plan`` for many counters (all on the gateway the plan
    runs against): one lookup of every rollup key, an exact read of each
    counter whose rollup is stale, and their rollups written in batches;
    also how many were written (``refresh=False``: none; the stale totals
    are still read exactly)."""
    raws = yield from plan.lookup([c.layout.rollup_key(c.name, c.namespace) for c in counters])
    out: list[TotalAsOf] = []
    stale: list[tuple[Rollable, TotalAsOf, RawEntity | None]] = []
    for counter, raw in zip(counters, raws):
        stored = _looked_up(raw)
        if stored is not None and _fresh(stored, max_age):
            out.append(stored)
            continue
        fresh = yield from exact_plan(counter, counter._read_method("auto"))
        out.append(fresh)
        stale.append((counter, fresh, raw))
    written = (yield from _write(stale)) if refresh else 0
    return out, written
