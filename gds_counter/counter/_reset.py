"""``reset()``: every shard ``get_count()`` counts set to 0, and an error
that says how far it got when it could not finish.

**Which shards.** Whatever a read of the counter would count, found the way
that read finds it, never from what this process happened to learn: the
config entity is looked up first (a counter another process grew to 40
shards has 40), and every shard up to ``max(recorded, default_shards,
known)`` is zeroed; for a layout that stores its target (the PHP article's)
the article's query by ``target`` is run too, and every entity it finds is
zeroed as well (a PHP writer at ``NUM_SHARDS`` 40 records nothing, and
PHP's ``getCount()`` sums whatever that query finds).

**Why not all or nothing.** One transaction over every shard would make a
reset atomic, but a Datastore transaction is bounded (25 entity groups on
legacy Datastore and its emulator, where each shard is its own group; 500
entities per commit anywhere) while a counter may have ``MAX_SHARDS``
(10,000). Nor can a reset be a marker that readers subtract: PHP and ndb
readers sum the shard entities themselves, so those must hold 0. So shards
are zeroed ``MAX_GROUPS_PER_TRANSACTION`` at a time, each chunk in its own
transaction (an increment racing with it is wiped or kept whole, never
half), and each chunk retried as the counter's ``RetryPolicy`` says.

**What a failure means.** When the first chunk fails, nothing was applied
(``Contention``, ``Unavailable``) or its one commit's outcome is unknown
(``CommitUnknown``): that error is raised as it is. When a later chunk
fails, earlier chunks were committed: ``PartialReset`` is raised, naming the
counter and which shards were set to 0, which were not, and which were in
the commit whose outcome is unknown. A reset is idempotent (it writes 0, not
a difference), so calling ``reset()`` again finishes it.

**Totals kept elsewhere.** The process's caches drop the counter's total
(``CountCache.writing`` with an unknown amount), and a rollup, if the
counter has one, is written again from an exact read once every shard is 0,
so ``get_count(max_age=...)`` does not answer with the total from before.
"""

from __future__ import annotations

import logging
from typing import Protocol, Sequence

from gds_counter.counter.layout import Layout
from gds_counter.counter.rollup import Rollable, rewrite_plan
from gds_counter.errors import Contention, GDSError, PartialReset, Unavailable
from gds_counter.gateway import plan
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Mutation, Upsert
from gds_counter.gds.transaction import RetryPolicy, retry_plan

__all__ = ["MAX_GROUPS_PER_TRANSACTION", "Resettable", "reset_plan"]

log = logging.getLogger("gds_counter.counter.sharded")  # the engine's logger: a reset is one of its calls

#: Datastore (legacy, and its emulator) limits a transaction to 25 entity
#: groups, and each shard is a group of its own: reset() zeroes shards in
#: transactions of at most this many.
MAX_GROUPS_PER_TRANSACTION = 25


class Resettable(Rollable, Protocol):
    """What a reset needs of a counter (``_engine.CounterCore`` is one; a
    protocol, so this module need not import the engine that uses it)."""

    _config_key: Key
    _retry: RetryPolicy

    def _learn(self, recorded: int | None) -> None: ...

    def _read_shards(self) -> int: ...

    def _shard_keys(self, count: int) -> list[Key]: ...

    def _query_shards(self) -> plan.Plan[list[tuple[Key, int]]]: ...


def counted_keys_plan(counter: Resettable) -> plan.Plan[list[Key]]:
    """Every key ``get_count()`` counts, by either method: the shards up to
    the count the config entity records (looked up now), and for a layout
    with a target, whatever the target query finds beyond them."""
    [config] = yield from plan.lookup([counter._config_key])
    counter._learn(counter.layout.config_of(config))
    keys = list(counter._shard_keys(counter._read_shards()))
    if counter.layout.can_query:
        known = set(keys)
        for key, _ in (yield from counter._query_shards()):
            if key not in known:
                known.add(key)
                keys.append(key)
    return keys


def reset_plan(counter: Resettable) -> plan.Plan[int]:
    """Set every shard ``get_count()`` counts to 0 (see the module's notes);
    returns how many shard keys were covered."""
    keys = yield from counted_keys_plan(counter)
    done = 0
    for start in range(0, len(keys), MAX_GROUPS_PER_TRANSACTION):
        chunk = keys[start : start + MAX_GROUPS_PER_TRANSACTION]

        def attempt(chunk: list[Key] = chunk) -> plan.Plan[None]:
            return _zero_chunk(counter, chunk)

        try:
            yield from retry_plan(attempt, counter._retry, what=f"resetting {counter}")
        except GDSError as exc:
            if done == 0:
                raise  # nothing of this reset was committed: the error tells the truth as it is
            raise _partial(counter, keys, done, chunk, exc) from exc
        done += len(chunk)
    yield from _refresh_rollup(counter)
    return len(keys)


def _refresh_rollup(counter: Resettable) -> plan.Plan[None]:
    """A counter read with ``max_age`` has a rollup, which still holds the
    total from before the reset: write it again from an exact read, so that
    ``get_count(max_age=...)`` does not answer with the old total after
    ``reset()`` returned. A failure here does not undo the reset: it is
    logged, and the old rollup then serves until it is ``max_age`` old."""
    try:  # an error here must not say the reset failed: every shard is 0 already
        # forced: readers' pacing must not leave the pre-reset total in place
        writes = yield from rewrite_plan(counter)
        if writes.not_written:
            log.warning("%s was reset, but its rollup was not written again: %s", counter, writes.not_written[0])
    except GDSError as exc:
        log.warning("%s was reset, but its rollup was not written again: %s", counter, exc)


def _zero_chunk(counter: Resettable, chunk: list[Key]) -> plan.Plan[None]:
    """One transaction: read the shards of ``chunk``, write 0 to those that
    exist and hold anything else."""
    layout = counter.layout

    def zero(token: bytes) -> plan.Plan[Sequence[Mutation]]:
        found = yield from plan.lookup(chunk, transaction=token)
        return [
            Upsert(layout.shard_entity_at(key, counter.name, 0))
            for key, raw in zip(chunk, found)
            if raw is not None and raw.properties.get(layout.count_property) != 0
        ]

    return plan.in_transaction(zero)


def _partial(counter: Resettable, keys: list[Key], done: int, chunk: list[Key], exc: GDSError) -> PartialReset:
    """The error of a reset whose chunk ``chunk`` failed with ``exc`` after
    the first ``done`` keys were committed as 0."""
    applied_nothing = isinstance(exc, (Contention, Unavailable))
    zeroed = keys[:done]
    unknown = [] if applied_nothing else chunk
    not_zeroed = keys[done + len(unknown):]
    names = counter.layout, counter.name
    doubt = (f"; whether {_describe(*names, unknown)} were set to 0 is unknown (that commit's outcome was not "
             "learned)") if unknown else ""
    message = (
        f"{counter} was only PARTLY reset, its total is neither what it was nor 0: {len(zeroed)} of {len(keys)} "
        f"shards were set to 0 ({_describe(*names, zeroed)}), {len(not_zeroed)} were not "
        f"({_describe(*names, not_zeroed)}){doubt}. Call reset() again to finish (it is idempotent). "
        f"It failed on: {type(exc).__name__}: {exc}"
    )
    return PartialReset(
        message,
        zeroed=tuple(_name(k) for k in zeroed),
        not_zeroed=tuple(_name(k) for k in not_zeroed),
        unknown=tuple(_name(k) for k in unknown),
    )


def _name(key: Key) -> str:
    return key.name or str(key)


def _describe(layout: Layout, target: str, keys: Sequence[Key]) -> str:
    """Shard keys for a message: numbers as runs (``shards 1-25, 31``),
    keys that are not numbered shards by name."""
    if not keys:
        return "none"
    numbers: list[int] = []
    others: list[str] = []
    for key in keys:
        number = layout.shard_number(target, key)
        if number is None:
            others.append(repr(_name(key)))
        else:
            numbers.append(number)
    runs: list[tuple[int, int]] = []
    for number in sorted(numbers):
        if runs and runs[-1][1] == number - 1:
            runs[-1] = (runs[-1][0], number)
        else:
            runs.append((number, number))
    parts = [f"{a}" if a == b else f"{a}-{b}" for a, b in runs] + others
    return ("shards " if numbers else "") + ", ".join(parts)
