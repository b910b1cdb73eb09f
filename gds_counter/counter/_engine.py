"""The sharded counter engine, shared by every layout and by both faces.

``CounterCore`` holds a counter's state and every rule, as plans
(``gds_counter.gateway.plan``): generators that yield the gateway calls they
need. ``ShardedCounter`` (``sharded.py``) runs them on a blocking gateway,
``gds_counter.aio`` on an async one; neither holds a rule of its own.

What this engine adds to the articles it ports:

* **Counted once or raised.** Each attempt commits the amount to one shard
  (the chooser's: ``counter.shard_choice``) or raises. ``Contention`` and
  ``Unavailable`` (nothing applied) are retried with backoff on a fresh
  shard; when retries run out the last error is raised, ``Contention``
  naming the counter and the attempts. ``CommitUnknown`` is raised, never
  retried: a blind retry could count twice.
* **Overlapping writes are combined** (``counter._combined``), and so are
  the reads of the new total (``counter._shared_reads``): sixteen threads
  pay for a few commits and reads, and each still gets its own outcome. A
  call that overlaps nothing goes straight through (``counter._lone``).
* **Reads are one RPC per batch.** For a layout that stores its target (the
  PHP article's), ``get_count()`` is the article's query by ``target``, as
  PHP's ``getCount()`` is, so it sees every shard any writer wrote; for the
  ndb layout, one batch lookup of every shard key plus the config entity
  (1,000 keys per lookup). Both are strongly consistent, and take one
  integer per shard from the stored values, mapping no entity.
* **Shards only grow, and readers always see them.** How many shards a
  counter has is recorded in its config entity (kind ``layout.config_kind``,
  key name = counter name, ``num_shards``), which every read fetches in the
  same lookup. A reader learns a larger count there, reads the missing shards
  at once (a second lookup, once per process) and remembers it. A writer
  never writes a shard beyond ``layout.default_shards`` before the config
  records it, and a reader always reads at least ``default_shards`` shards,
  so nothing written is ever outside what readers look up. PHP's own reader
  queries by ``target`` and so sees grown shards anyway.
"""
from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, ContextManager, Hashable, Iterator

import attrs

from gds_counter._checks import check_amount
from gds_counter._process import deadlines
from gds_counter.counter._arguments import check_name, check_num_shards
from gds_counter.counter._lone import Combine, HashedKey, SharedRead
from gds_counter.counter._reset import reset_plan
from gds_counter.counter._shard_count import ShardCount
from gds_counter.counter._totals import counts_plan, read_shards_plan, through_cache
from gds_counter.counter.cache import TotalCache
from gds_counter.counter.layout import Layout
from gds_counter.counter.options import AutoGrow, CounterOptions
from gds_counter.counter.rollup import TotalAsOf, check_max_age, exact_plan, total_as_of_plan
from gds_counter.counter.runtime import Runtime
from gds_counter.counter.shard_choice import Holding, ShardChooser, tell_seen, tell_wrote
from gds_counter.counter.strategy import Shard, Wrote, get_strategy, planned
from gds_counter.errors import BadValueError, Contention, GDSError, TotalUnavailable, Unavailable
from gds_counter.gateway import plan
from gds_counter.gateway.keys import Key
from gds_counter.gateway.query import Query
from gds_counter.gds.transaction import retry_plan

__all__ = ["CounterCore"]

log = logging.getLogger("gds_counter.counter.sharded")  # the name logging configuration knows


@contextlib.contextmanager
def _both(outer: ContextManager[None], inner: ContextManager[None]) -> Iterator[None]:
    """``outer`` around ``inner``: both caches' brackets around one write."""
    with outer, inner:
        yield

class CounterCore(ShardCount):
    """One counter's state and rules, stored as shards in ``layout``, on
    ``gateway`` (already resolved by the face: blocking or async) in
    ``namespace``. The public methods are the faces'; here every operation
    is a plan. Safe to share between threads (and tasks)."""

    def __init__(
        self,
        name: str,
        *,
        layout: Layout,
        gateway: Any,
        namespace: str,
        num_shards: int | None = None,
        options: CounterOptions = CounterOptions(),
    ) -> None:
        check_name(name)
        strategy, retry, cache, auto_grow = options.strategy, options.retry, options.cache, options.auto_grow
        self.layout = layout
        self.name = name
        #: num_shards None: write into as many shards as the config entity
        #: says (the default when there is none), as ndb did, so that readers
        #: that trust the config (ndb's get_count) see every write.
        self._follow_config = num_shards is None
        self._min_shards = 1 if num_shards is None else check_num_shards(num_shards)
        self._strategy = get_strategy(strategy)
        self._planned = planned(self._strategy)
        if auto_grow is None:
            auto_grow = strategy == "auto-grow"
        self._auto_grow: AutoGrow | None = (AutoGrow() if auto_grow is True else auto_grow) or None
        self._retry = retry
        self._gateway = gateway
        self.namespace = namespace
        #: Which counter this is, for caches and shard choosers (made once).
        self._ident: Hashable = (namespace, layout.shard_kind, name)
        #: What the counters of this process share on this gateway.
        self._runtime = runtime = Runtime.of(gateway)
        #: Every write of this process through the gateway passes through its
        #: shared cache, whether or not this counter reads from it, so that a
        #: counter with ``cache=True`` sees the writes of every counter object.
        self._shared_cache = runtime.cache
        #: Where each attempt writes: this counter's own chooser, else the runtime's.
        self._chooser: ShardChooser = options.shards if options.shards is not None else runtime.shards
        self.options = options
        self._cache: TotalCache | None = (
            runtime.redis_cache(cache, gateway) if isinstance(cache, str)
            else self._shared_cache if cache is True else (cache or None)
        )
        # Check the key names now, so a bad name fails before any write: up
        # to the last shard this counter may write (growth included), or an
        # increment on a low shard could land where no read can reach it.
        grow_cap = self._auto_grow.max_shards if self._auto_grow is not None else 0
        self._shard_key(layout.shard_numbers(max(self._min_shards, layout.default_shards, grow_cap))[-1])
        self._config_key = layout.config_key(name, self.namespace)

        self._lock = threading.Lock()
        #: Shards this process writes into: the constructor's number, raised
        #: to whatever the config entity was seen to hold.
        self._num_shards = 0 if self._follow_config else self._min_shards
        self._config_seen = not self._follow_config
        #: The largest shard count known to be recorded in the config entity.
        self._recorded = 0
        #: Shards known to exist as documents (a ``documents`` layout creates
        #: every shard it records, for the page's writers, which ``update``).
        self._created = 0
        #: Shard keys built so far, in shard order: a read reuses them.
        self._keys: list[Key] = []
        #: What a strategy is given for each shard written so far.
        self._shard_objects: dict[int, Shard] = {}
        #: The article's query for this counter's shards (``_query_shards``).
        self._target_query: Query | None = None
        #: Shard key name -> shard number (None: not a shard), as queries find them.
        self._numbers: dict[str, int | None] = {}
        #: Callers of one process whose writes go by this key are combined
        #: into one write (``_commit``): the same counter written the same
        #: way, whichever counter object each holds. None: a strategy that
        #: cannot be a key (unhashable) writes each amount alone.
        #: (A ``HashedKey``: its hash, which walks the layout and the
        #: policy, is worked out once, not at each of a call's lookups.)
        self._combining: Hashable | None = HashedKey.of(
            ("commit", layout, self._identity(), self._strategy, retry, self._auto_grow,
             self._follow_config, self._min_shards, self._chooser)
        ) if runtime.combine_writes else None
        #: The key of this counter's shared reads of its total.
        self._total_key = HashedKey(("total", layout, self._ident))

    # --- where it lives -------------------------------------------------------

    @property
    def num_shards(self) -> int:
        """Shards this counter writes into (grows, never shrinks)."""
        return self._num_shards or self.layout.default_shards

    def _read_shards(self) -> int:
        """Shards a read looks up: never fewer than the layout's default,
        because a writer built with the default (or PHP's NUM_SHARDS) may
        have written them without recording anything. A counter of
        documents has every shard it records (and its reads query them all)."""
        if self.layout.documents:
            return self._num_shards or self.layout.default_shards
        return max(self._num_shards, self.layout.default_shards)

    def _shard_key(self, number: int) -> Key:
        return self.layout.shard_key(self.name, number, self.namespace)

    def _shard_keys(self, count: int) -> list[Key]:
        """The first ``count`` shard keys, built once per counter."""
        keys = self._keys
        if len(keys) < count:
            with self._lock:
                keys = self._keys
                if len(keys) < count:
                    numbers = self.layout.shard_numbers(count)[len(keys):]
                    keys = self._keys = keys + [self._shard_key(n) for n in numbers]
        return keys[:count]

    def _shard(self, number: int) -> Shard:
        shard = self._shard_objects.get(number)
        if shard is None:
            shard = self._shard_objects[number] = Shard(self._gateway, self.layout, self.name, number, self.namespace)
        return shard

    def _identity(self) -> Hashable:
        return self._ident

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self} shards={self._num_shards}>"

    def __str__(self) -> str:
        return f"{self.layout.shard_kind} {self.name!r}"

    # --- reads ------------------------------------------------------------------

    def _read_method(self, method: str) -> str:
        if method not in ("auto", "query", "lookup"):
            raise BadValueError(f"get_count method must be 'auto', 'query' or 'lookup', got {method!r}")
        if method == "auto":
            return "query" if self.layout.can_query else "lookup"
        if method == "query" and not self.layout.can_query:
            raise BadValueError(
                f"layout {self.layout.name!r} stores no target property, so its shards cannot be "
                "queried; use get_count() (a key lookup)"
            )
        return method

    def _get_count(self, method: str = "auto", max_age: float | None = None) -> plan.Plan[int]:
        """The total, served from the cache when one is set and fresh (see
        ``ShardedCounter.get_count`` for the methods), or with ``max_age``
        from the rollup (``counter.rollup``), within the policy's deadline."""
        if max_age is not None:
            found: TotalAsOf = yield from self._get_count_as_of(method, max_age)
            return found.total
        total: int = yield from deadlines.bounded(self._total(self._read_method(method), use_cache=True), self._retry.deadline)
        return total

    def _get_count_as_of(self, method: str = "auto", max_age: float | None = None) -> plan.Plan[TotalAsOf]:
        """The total and when it was true: exact now (``max_age`` None), else
        the rollup if it is at most ``max_age`` seconds old (``counter.rollup``)."""
        read = self._read_method(method)
        work = exact_plan(self, read) if max_age is None else total_as_of_plan(self, read, check_max_age(max_age))
        found: TotalAsOf = yield from deadlines.bounded(work, self._retry.deadline)
        return found

    def _total(self, method: str, *, use_cache: bool) -> plan.Plan[int]:
        if method == "lookup":
            [total] = yield from counts_plan([self], use_cache=use_cache)
            return total

        def read() -> plan.Plan[int]:
            shards = yield from self._query_shards()
            return sum([count for _, count in shards])

        def shared_read() -> plan.Plan[int]:  # begun after each sharer asked: strongly consistent
            runtime = self._runtime
            if not runtime.share_reads:
                return (yield from read())
            total: int = yield from plan.ask(
                SharedRead(runtime.shared, runtime.async_shared, self._total_key, read, lambda: self._gateway.stats.bump("shared_reads"))
            )
            return total

        result: int = yield from through_cache(self, shared_read, use_cache=use_cache)
        return result

    def _query_shards(self) -> plan.Plan[list[tuple[Key, int]]]:
        """Every stored shard of this counter, by the article's target query.
        The total is their sum, as PHP's ``getCount()`` sums whatever its
        query finds."""
        query = self._target_query
        if query is None:  # immutable: built once per counter
            query = self._target_query = self.layout.shards_query(self.name, self.namespace)
        found = yield from plan.query_all(query)
        if self.layout.documents:  # the ancestor query also finds deeper documents named "shards"
            under, home = self.layout.under, self._config_key
            found = [shard for shard in found if shard.key is not None and under(home, shard.key)]
        # One pass over the rows: each shard's count, and by shard number,
        # which shards other processes write, for this process's next choice.
        # A count stored as an int (every writer's but an odd PHP one's) is
        # taken as it is; any other value is ``count_of``'s to read or refuse.
        count_of, numbers, count_property = self.layout.count_of, self._numbers, self.layout.count_property
        shards: list[tuple[Key, int]] = []
        counts: dict[int, int] = {}
        for shard in found:
            key = shard.key
            if not key:
                continue
            count = shard.properties.get(count_property)
            if type(count) is not int:
                count = count_of(shard)
            shards.append((key, count))
            number = numbers.get(key.path[-1].name or "", -1)
            if number == -1:
                number = self._number_of(key)
            if number is not None:
                counts[number] = count
        tell_seen(self._chooser, self._ident, counts, every=True)
        return shards

    def _number_of(self, key: Key) -> int | None:
        """The shard number of a key a query found (None: not one of this
        counter's shards), worked out once per key name."""
        name = key.name or ""
        number = self._numbers.get(name, -1)
        if number == -1:
            number = self._numbers[name] = self.layout.shard_number(self.name, key)
        return number

    def _shards(self, method: str = "auto") -> plan.Plan[list[tuple[int, int]]]:
        """``(shard number, count)`` for every shard a read covers (see
        ``ShardedCounter.shards``)."""
        if self._read_method(method) == "lookup":
            [counts] = yield from read_shards_plan([self])
            return sorted(counts.items())
        # A breakdown also lists recorded shards nobody has written yet.
        [config] = yield from plan.lookup([self._config_key])
        self._learn(self.layout.config_of(config))
        every = dict.fromkeys(self.layout.shard_numbers(self._read_shards()), 0)
        for key, count in (yield from self._query_shards()):
            number = self._number_of(key)
            if number is not None:  # an entity with this target but another key name is in no shard
                every[number] = count
        return sorted(every.items())

    # --- writes -------------------------------------------------------------------

    def _must_record(self) -> bool:
        """Whether this process writes beyond the default shards more than
        the config is known to record (``_ensure_recorded``): on every
        write's path, so here, not in ``_shard_count``."""
        wanted = self._num_shards
        if self.layout.documents:  # the page's writers need every shard document: record (and create) them all
            return wanted > self._recorded or wanted > self._created
        return wanted > self.layout.default_shards and wanted > self._recorded

    def _add(self, amount: int = 1) -> plan.Plan[None]:
        """Add ``amount`` without reading anything back: the hot path. Returns
        once it is committed exactly once; raises otherwise. The policy's
        deadline bounds the whole call (``_process.deadlines.bounded``)."""
        amount = check_amount(amount)
        if amount == 0:
            return
        yield from deadlines.bounded(self._adding(amount), self._retry.deadline)

    def _adding(self, amount: int) -> plan.Plan[None]:
        if not self._config_seen:
            yield from self._writable()
        if self._must_record():
            yield from self._ensure_recorded()
        with self._seen_by_caches(amount):
            yield from self._commit(amount)

    def _seen_by_caches(self, amount: int | None) -> ContextManager[None]:
        """Around a write that adds ``amount`` (None: by an amount not known,
        as a reset does): the gateway's shared cache and this counter's own
        cache, if it has another, learn how it ended (``CountCache.writing``).
        Without another cache, the shared cache's bracket itself."""
        shared = self._shared_cache.writing(self._ident, amount)
        if self._cache is None or self._cache is self._shared_cache:
            return shared
        return _both(shared, self._cache.writing(self._ident, amount))

    def _increment(self, amount: int = 1) -> plan.Plan[int]:
        """Add ``amount`` and return the total after it: one read after the
        write (``get_count``'s), where the article read before it and
        returned that plus one. The policy's deadline bounds both."""
        return deadlines.bounded(self._incrementing(amount), self._retry.deadline)

    def _incrementing(self, amount: int) -> plan.Plan[int]:
        yield from self._add(amount)
        try:
            total: int = yield from self._total(self._read_method("auto"), use_cache=False)
            return total
        except GDSError as exc:
            raise TotalUnavailable(
                f"{self}: the increment by {amount} WAS counted, but reading the new total "
                f"failed ({exc}); do not retry the increment"
            ) from exc

    def _decrement(self, amount: int = 1) -> plan.Plan[int]:
        """Subtract ``amount``; one shard may go below zero, the total is exact."""
        return self._increment(-check_amount(amount))

    def _reset(self) -> plan.Plan[None]:
        """Set every shard ``get_count()`` counts to 0 (the config entity's
        count, and for the PHP layout whatever its target query finds), in
        transactions of at most 25 shards, within the policy's deadline.
        A failure after some were committed is ``PartialReset``; see
        ``counter._reset`` for why a reset cannot be all or nothing."""
        with self._seen_by_caches(None):
            covered = yield from deadlines.bounded(reset_plan(self), self._retry.deadline)
        log.info("reset %s (%d shards)", self, covered)

    def _increase_shards(self, num_shards: int) -> plan.Plan[int]:
        """Spread future writes over ``num_shards`` shards, recorded for every
        process. Fewer than now is refused: a shard dropped from the count
        would vanish from reads. Returns the shard count."""
        num_shards = check_num_shards(num_shards)
        self.layout.shard_key(self.name, self.layout.shard_numbers(num_shards)[-1])  # every new key fits

        def decide(stored: int | None) -> int:
            # No config means the default, for a counter that follows it (ndb's reading).
            current = max(stored or (self.layout.default_shards if self._follow_config else 0), self._num_shards)
            if num_shards < current:
                raise BadValueError(
                    f"counter {self.name!r} has {current} shards; increase_shards({num_shards}) would "
                    f"decrease it from {current} to {num_shards} (shards only grow)"
                )
            return num_shards

        yield from deadlines.bounded(self._record(decide), self._retry.deadline)
        return self._num_shards

    def _grow(self, seen: int) -> plan.Plan[bool]:
        """Multiply the shard count after sustained contention. True if this
        counter now has more shards than ``seen`` (grown by us or by another
        process meanwhile)."""
        grow = self._auto_grow
        assert grow is not None

        def decide(stored: int | None) -> int:
            stored = stored or 0
            if stored > seen:
                return stored  # another process grew it already
            current = max(stored, seen, self._min_shards)
            target = min(current * grow.factor, grow.max_shards)
            return target if target > current else stored  # at the cap: record nothing

        try:
            yield from self._record(decide)
        except Contention as exc:
            # The config is itself contended: not growing now is safe (the
            # increment is then raised, not dropped).
            log.warning("%s could not record more shards: %s", self, exc)
        if self._num_shards > seen:
            self._gateway.stats.bump("counter.grown")
            log.warning("%s kept conflicting on %d shards; now %d", self, seen, self._num_shards)
            return True
        return False

    # --- committing one amount ---------------------------------------------------------

    def _commit(self, amount: int) -> plan.Plan[None]:
        """Commit ``amount`` exactly once or raise: in one write with what
        the other callers of this process add to this counter meanwhile
        (``counter._combined``). Sixteen threads on one counter so pay
        for a few attempts, not sixteen, and meet each other on no lock."""
        if self._combining is None:
            yield from self._commit_sum(amount, 1)
        else:
            runtime = self._runtime
            yield Combine(runtime.combined, runtime.async_combined, self._combining, amount, self._commit_sum)

    def _commit_sum(self, amount: int, callers: int) -> plan.Plan[None]:
        """Commit ``amount``, the sum of ``callers``' amounts, in one
        attempt at a time, retried on a fresh shard as the policy says."""
        stats = self._gateway.stats
        if callers > 1:
            stats.bump("counter.combined", callers - 1)  # amounts that rode in another caller's write
        attempts = 0
        together = f" (the amounts of {callers} callers, combined)" if callers > 1 else ""

        def moved() -> None:
            stats.bump("counter.shard_moves")

        what = f"increment of counter {self} by {amount}{together}"

        def attempt() -> plan.Plan[None]:
            with Holding(self._chooser, self._ident, self.layout.shard_numbers(self._num_shards), moved) as number:
                wrote = yield from self._planned.plan_add(self._shard(number), amount)
                # What the shard held tells the chooser whether another
                # process writes it too (then this process moves elsewhere).
                if isinstance(wrote, Wrote) and tell_wrote(self._chooser, self._ident, number, wrote.found, wrote.stored):
                    moved()

        grow = self._auto_grow
        growing = grow is not None
        while True:
            may_grow = growing and grow is not None and self._num_shards < grow.max_shards
            policy = self._retry
            if may_grow:
                assert grow is not None
                policy = attrs.evolve(policy, attempts=min(policy.attempts, grow.after_attempts))
            seen = self._num_shards
            try:
                # Unavailable means nothing was applied (the Datastore gateway
                # raises it only then, after its own retries), so it is as
                # safe to retry as Contention; CommitUnknown never is.
                yield from retry_plan(
                    attempt, policy, what=what, on_retry=lambda _: stats.bump("counter.retries"),
                    also_retry=(Unavailable,),
                )
                return
            except Contention as exc:
                attempts += exc.attempts
                if may_grow:
                    # Grown: retry on more shards. Not grown (capped, or the
                    # config is contended): one last full round, then raise.
                    growing = yield from self._grow(seen)
                    continue
                why = (f"its deadline ({self._retry.deadline:g} s) ran out after {attempts} attempt(s). Retry later"
                       if deadlines.remaining(1.0) == 0 else f"it conflicted on all {attempts} attempts (over "
                       f"{self._num_shards} shards). Retry later, add shards (increase_shards) or use auto_grow")
                raise type(exc)(  # a TransactionLost stays one: the class says why, as the message does
                    f"counter {self}: the increment by {amount}{together} was NOT counted; {why}. Last: {exc}",
                    attempts=attempts,
                ) from exc
