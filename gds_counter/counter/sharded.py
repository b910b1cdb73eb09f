"""The sharded counter engine, shared by every layout.

Why shards: Datastore and Firestore sustain only a few writes per second on
one entity. A counter spread over N shard entities takes about N times the
write rate; its total is the sum of the shards.

What this engine adds to the articles it ports:

* **Counted once or raised.** Each attempt commits the amount to one random
  shard or raises. ``Contention`` is retried with backoff on a *fresh*
  random shard; when retries run out, ``Contention`` names the counter and
  the attempts. ``Unavailable`` (storage not reached, nothing applied) is
  retried the same way, within the same attempts; when they run out the last
  ``Unavailable`` is raised. (On the Datastore gateway each attempt has
  already retried for up to the gateway's ``timeout``, so a server that stays
  down makes an increment raise after at most ``attempts`` x ``timeout``.)
  Outcomes that cannot be known (``CommitUnknown``) are raised,
  never retried, because a blind retry could count twice.
* **Reads are one RPC.** ``get_count()`` is one batch lookup of every shard
  key plus the counter's config entity: strongly consistent, and no query.
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

import logging
import random
import threading
from typing import Any, Hashable, Iterable, Sequence

import attrs

from gds_counter.counter.cache import DEFAULT_CACHE, CountCache
from gds_counter.counter.layout import Layout
from gds_counter.counter.strategy import Strategy, get_strategy
from gds_counter.errors import BadValueError, Contention, CorruptDataError, GDSError, TotalUnavailable, Unavailable
from gds_counter.gateway.base import MAX_ID, MAX_KEYS_PER_LOOKUP, Gateway, Key, RawEntity
from gds_counter.gds.entity import Entity
from gds_counter.gds.mapper import from_raw
from gds_counter.gds.store import Store
from gds_counter.gds.transaction import DEFAULT_RETRY, RetryPolicy, retry_contention

log = logging.getLogger(__name__)

#: Datastore (legacy, and its emulator) limits a transaction to 25 entity
#: groups; reset() zeroes shards in transactions of at most this many.
_MAX_GROUPS_PER_TRANSACTION = 25


@attrs.frozen
class AutoGrow:
    """Grow a counter's shards when writers keep colliding.

    After ``after_attempts`` conflicting attempts in a row, the shard count
    is multiplied by ``factor`` (up to ``max_shards``), recorded in the
    config entity so every process spreads its writes wider, and the
    increment is tried again on the larger set. Growth is never undone.
    """

    after_attempts: int = attrs.field(default=3, validator=attrs.validators.ge(1))
    factor: int = attrs.field(default=2, validator=attrs.validators.ge(2))
    max_shards: int = attrs.field(default=320, validator=attrs.validators.ge(1))


def check_count_amount(amount: Any) -> int:
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise BadValueError(f"amount must be an int, got {type(amount).__name__} {amount!r}")
    if not -MAX_ID <= amount <= MAX_ID:
        raise BadValueError(f"amount {amount} does not fit in a 64-bit integer")
    return amount


def check_num_shards(num_shards: Any, what: str = "num_shards") -> int:
    if isinstance(num_shards, bool) or not isinstance(num_shards, int):
        raise BadValueError(f"{what} must be an int, got {type(num_shards).__name__} {num_shards!r}")
    if num_shards < 1:
        raise BadValueError(f"{what} must be at least 1, got {num_shards}")
    return num_shards


class ShardedCounter:
    """One counter, stored as shards in the given ``layout``.

    ``CounterShardDS`` (PHP layout) and ``GeneralCounter`` (ndb layout) are
    this class with their articles' constructors. Safe to share between
    threads.
    """

    def __init__(
        self,
        name: str,
        *,
        layout: Layout,
        num_shards: int | None = None,
        store: Store | None = None,
        gateway: Gateway | str | None = None,
        entity_class: type[Entity] | None = None,
        strategy: str | Strategy = "auto",
        retry: RetryPolicy = DEFAULT_RETRY,
        cache: CountCache | bool | None = None,
        auto_grow: AutoGrow | bool | None = None,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise BadValueError(f"a counter needs a non-empty string name, got {name!r}")
        if not isinstance(retry, RetryPolicy):
            raise BadValueError(f"retry must be a RetryPolicy, got {type(retry).__name__} {retry!r}")
        self.layout = layout
        self.name = name
        #: num_shards None: write into as many shards as the config entity
        #: says (the default when there is none), as ndb did, so that readers
        #: that trust the config (ndb's get_count) see every write.
        self._follow_config = num_shards is None
        self._min_shards = 1 if num_shards is None else check_num_shards(num_shards)
        self._strategy = get_strategy(strategy)
        self.strategy_name = strategy if isinstance(strategy, str) else self._strategy.name
        if auto_grow is None:
            auto_grow = strategy == "auto-grow"
        self._auto_grow: AutoGrow | None = (AutoGrow() if auto_grow is True else auto_grow) or None
        self._retry = retry
        self._cache: CountCache | None = DEFAULT_CACHE if cache is True else (cache or None)

        self._shard_schema = layout.shard_schema()
        if entity_class is not None:
            self._shard_schema.set_entity_class(entity_class)
        if store is None:
            store = Store(self._shard_schema, gateway)
        elif not isinstance(store, Store):
            raise BadValueError(f"store must be a gds Store, got {type(store).__name__} {store!r}")
        elif store.schema.kind != layout.shard_kind:
            raise BadValueError(
                f"store is for kind {store.schema.kind!r} but counter {name!r} keeps its shards "
                f"in kind {layout.shard_kind!r} (layout {layout.name!r})"
            )
        self.store = store
        # Check the key names now, so a bad name fails before any write: up
        # to the last shard this counter may write (growth included), or an
        # increment on a low shard could land where no read can reach it.
        grow_cap = self._auto_grow.max_shards if self._auto_grow is not None else 0
        layout.shard_key(name, layout.shard_numbers(max(self._min_shards, layout.default_shards, grow_cap))[-1])
        self._config_store = Store(layout.config_schema(), store.gateway, namespace=store.namespace)
        self._config_schema = self._config_store.schema

        self._lock = threading.Lock()
        #: Shards this process writes into: the constructor's number, raised
        #: to whatever the config entity was seen to hold.
        self._num_shards = 0 if self._follow_config else self._min_shards
        self._config_seen = not self._follow_config
        #: The largest shard count known to be recorded in the config entity.
        self._recorded = 0

    # --- naming -------------------------------------------------------------

    @property
    def gateway(self) -> Gateway:
        return self.store.gateway

    @property
    def num_shards(self) -> int:
        """Shards this counter writes into (grows, never shrinks)."""
        return self._num_shards or self.layout.default_shards

    @property
    def read_shards(self) -> int:
        """Shards a read looks up: never fewer than the layout's default,
        because a writer built with the default (or PHP's NUM_SHARDS) may
        have written them without recording anything."""
        return max(self._num_shards, self.layout.default_shards)

    def _writable(self) -> None:
        """Know how many shards to write into before the first write."""
        if not self._config_seen:
            self._learn(self._decode_config(self.gateway.lookup([self.config_key()])[0]))

    def shard_name(self, shard: int) -> str:
        return self.layout.shard_name(self.name, shard)

    def shard_key(self, shard: int) -> Key:
        return self.layout.shard_key(self.name, shard, self.store.namespace)

    def config_key(self) -> Key:
        return self.layout.config_key(self.name, self.store.namespace)

    def shard_entity(self, shard: int, count: int | None) -> Entity:
        """A shard as the layout stores it (``count`` None: without count)."""
        entity = self.store.create_entity(self.layout.shard_fields(self.name, count))
        entity.set_key_name(self.shard_name(shard))
        return entity

    def _cache_key(self) -> Hashable:
        return (id(self.gateway), self.store.namespace, self.layout.shard_kind, self.name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.describe()} shards={self._num_shards}>"

    def describe(self) -> str:
        return f"{self.layout.shard_kind} {self.name!r}"

    # --- decoding -------------------------------------------------------------

    def count_of(self, shard: Entity) -> int:
        """A shard's count; a missing count is 0 (a shard written with the
        count left to a transform the server ignored)."""
        value = shard[self.layout.count_property]
        if value is None:
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            raise CorruptDataError(
                f"shard {shard.get_key()} holds {self.layout.count_property}={value!r} "
                f"({type(value).__name__}); a shard count must be an integer"
            )
        return value

    def _decode_shard(self, raw: RawEntity) -> int:
        return self.count_of(from_raw(raw, self._shard_schema))

    def _decode_config(self, raw: RawEntity | None) -> int | None:
        return None if raw is None else self._config_value(from_raw(raw, self._config_schema))

    def _config_value(self, config: Entity) -> int | None:
        value = config[self.layout.config_property]
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CorruptDataError(
                f"counter config {config.get_key()} holds {self.layout.config_property}={value!r}; "
                "it must be a positive integer"
            )
        return value

    def _learn(self, recorded: int | None) -> None:
        with self._lock:
            self._config_seen = True
            if recorded is None:
                self._num_shards = self._num_shards or self.layout.default_shards
                return
            self._recorded = max(self._recorded, recorded)
            if recorded > self._num_shards:
                if self._num_shards:
                    log.info("%s has grown to %d shards", self.describe(), recorded)
                self._num_shards = recorded

    # --- reads ------------------------------------------------------------------

    def get_count(self, method: str = "lookup") -> int:
        """The total. ``"lookup"`` (default): one batch lookup, strongly
        consistent, served from the cache when one is set. ``"query"``: the
        PHP article's ``SELECT * FROM ... WHERE target = @target``, summing
        whatever shards exist (eventually consistent on legacy Datastore)."""
        if method == "lookup":
            return get_counts([self])[0]
        if method == "query":
            return self._count_by_query()
        raise BadValueError(f"get_count method must be 'lookup' or 'query', got {method!r}")

    def _count_by_query(self) -> int:
        target = self.layout.target_property
        if target is None:
            raise BadValueError(
                f"layout {self.layout.name!r} stores no target property, so its shards cannot be "
                "queried; use get_count() (a key lookup)"
            )
        # A fresh Store: a Store remembers its query, so sharing one between
        # threads that query would mix them up.
        store = Store(self._shard_schema, self.gateway, namespace=self.store.namespace)
        shards = store.fetch_all(f"SELECT * FROM {self.layout.shard_kind} WHERE {target} = @target", {"target": self.name})
        return sum(self.count_of(shard) for shard in shards)

    def shards(self) -> list[tuple[int, int]]:
        """``(shard number, count)`` for every shard a read covers, missing
        shards as 0, in shard order: where the writes went."""
        counts = _read_shards([self])[0]
        return sorted(counts.items())

    # --- writes -------------------------------------------------------------------

    def add(self, amount: int = 1) -> None:
        """Add ``amount`` without reading anything back: the hot path.

        Returns once the amount is committed exactly once; raises otherwise
        (``Contention`` after retries, with the attempts in its message).
        """
        amount = check_count_amount(amount)
        if amount == 0:
            return
        self._writable()
        self._ensure_recorded()
        self._commit(amount)
        if self._cache is not None:
            self._cache.add(self._cache_key(), amount)

    def increment(self, amount: int = 1) -> int:
        """Add ``amount`` and return the total after it (one batch lookup
        after the write, instead of the article's query)."""
        self.add(amount)
        try:
            return get_counts([self], use_cache=False)[0]
        except GDSError as exc:
            raise TotalUnavailable(
                f"{self.describe()}: the increment by {amount} WAS counted, but reading the new total "
                f"failed ({exc}); do not retry the increment"
            ) from exc

    def decrement(self, amount: int = 1) -> int:
        """Subtract ``amount``; one shard may go below zero, the total is exact."""
        amount = check_count_amount(amount)
        return self.increment(-amount)

    def reset(self) -> None:
        """Set every shard to 0, in transactions of at most 25 shards (so an
        increment racing with it is either wiped or kept whole, never half)."""
        numbers = list(self.layout.shard_numbers(self.read_shards))
        store = self.store
        for start in range(0, len(numbers), _MAX_GROUPS_PER_TRANSACTION):
            chunk = numbers[start : start + _MAX_GROUPS_PER_TRANSACTION]

            def zero(tx: Store, chunk: list[int] = chunk) -> None:
                found = tx.fetch_by_names([self.shard_name(n) for n in chunk])
                stale = [n for n, shard in zip(chunk, found) if shard is not None and shard[self.layout.count_property] != 0]
                if stale:
                    tx.upsert([self.shard_entity(n, 0) for n in stale])

            store.run_in_transaction(zero, retry=self._retry)
        if self._cache is not None:
            self._cache.invalidate(self._cache_key())
        log.info("reset %s (%d shards)", self.describe(), len(numbers))

    def increase_shards(self, num_shards: int) -> int:
        """Spread future writes over ``num_shards`` shards, recorded for every
        process. Fewer than now is refused: a shard dropped from the count
        would vanish from reads. Returns the shard count."""
        num_shards = check_num_shards(num_shards)
        self.layout.shard_key(self.name, self.layout.shard_numbers(num_shards)[-1])  # every new key fits

        def record(tx: Store) -> int:
            stored = self._load_config(tx)
            # No config means the default, for a counter that follows it (ndb's reading).
            current = max(stored or (self.layout.default_shards if self._follow_config else 0), self._num_shards)
            if num_shards < current:
                raise BadValueError(
                    f"counter {self.name!r} has {current} shards; increase_shards({num_shards}) would "
                    f"decrease it from {current} to {num_shards} (shards only grow)"
                )
            if (stored or 0) < num_shards:
                self._save_config(tx, num_shards)
            return num_shards

        self._learn(self._config_store.run_in_transaction(record, retry=self._retry))
        return self._num_shards

    # --- the config entity ------------------------------------------------------------

    def _load_config(self, tx: Store) -> int | None:
        config = tx.fetch_by_name(self.name)
        return None if config is None else self._config_value(config)

    def _save_config(self, tx: Store, num_shards: int) -> None:
        entity = tx.create_entity({self.layout.config_property: num_shards})
        entity.set_key_name(self.name)
        tx.upsert(entity)

    def _ensure_recorded(self) -> None:
        """Before writing beyond the default shards, make sure the config
        says so, or a reader built with the default would miss those shards."""
        wanted = self._num_shards
        if wanted <= self.layout.default_shards or wanted <= self._recorded:
            return

        def record(tx: Store) -> int:
            stored = self._load_config(tx) or 0
            if stored < wanted:
                self._save_config(tx, wanted)
                return wanted
            return stored

        self._learn(self._config_store.run_in_transaction(record, retry=self._retry))

    def _grow(self, seen: int) -> bool:
        """Multiply the shard count after sustained contention. True if this
        counter now has more shards than ``seen`` (grown by us or by another
        process meanwhile)."""
        grow = self._auto_grow
        assert grow is not None

        def record(tx: Store) -> int:
            stored = self._load_config(tx) or 0
            current = max(stored, seen, self._min_shards)
            if stored > seen:
                return stored  # another process grew it already
            target = min(current * grow.factor, grow.max_shards)
            if target <= current:
                return current
            self._save_config(tx, target)
            return target

        try:
            self._learn(self._config_store.run_in_transaction(record, retry=self._retry))
        except Contention as exc:
            # The config is itself contended: not growing now is safe (the
            # increment is then raised, not dropped).
            log.warning("%s could not record more shards: %s", self.describe(), exc)
        if self._num_shards > seen:
            self.gateway.stats.bump("counter.grown")
            log.warning("%s kept conflicting on %d shards; now %d", self.describe(), seen, self._num_shards)
            return True
        return False

    # --- committing one amount ---------------------------------------------------------

    def _commit(self, amount: int) -> None:
        stats = self.gateway.stats
        attempts = 0
        what = f"increment of counter {self.describe()} by {amount}"

        def attempt() -> None:
            shard = random.choice(self.layout.shard_numbers(self._num_shards))
            self._strategy.add(self, shard, amount)

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
                retry_contention(
                    attempt, policy, what=what, on_retry=lambda _: stats.bump("counter.retries"),
                    also_retry=(Unavailable,),
                )
                return
            except Contention as exc:
                attempts += exc.attempts
                if may_grow:
                    # Grown: retry on more shards. Not grown (capped, or the
                    # config is contended): one last full round, then raise.
                    growing = self._grow(seen)
                    continue
                raise Contention(
                    f"counter {self.describe()}: the increment by {amount} was NOT counted; "
                    f"it conflicted on all {attempts} attempts (over {self._num_shards} shards). "
                    "Retry later, add shards (increase_shards) or use auto_grow.",
                    attempts=attempts,
                ) from exc


def get_counts(counters: Iterable[ShardedCounter], *, use_cache: bool = True) -> list[int]:
    """Totals of many counters in input order, with one batch lookup per
    gateway (for up to 1000 keys): a page listing 30 counters costs one RPC,
    not 30. Counters with a fresh cached total are not read."""
    counters = list(counters)
    for counter in counters:
        if not isinstance(counter, ShardedCounter):
            raise BadValueError(f"get_counts takes counters, got {type(counter).__name__} {counter!r}")
    totals: list[int | None] = [None] * len(counters)
    if use_cache:
        for i, counter in enumerate(counters):
            if counter._cache is not None:
                totals[i] = counter._cache.get(counter._cache_key())
    todo = [i for i, total in enumerate(totals) if total is None]
    shard_counts = _read_shards([counters[i] for i in todo])
    for i, counts in zip(todo, shard_counts):
        total = sum(counts.values())
        totals[i] = total
        if counters[i]._cache is not None:
            counters[i]._cache.set(counters[i]._cache_key(), total)
    return [int(total) for total in totals]  # type: ignore[arg-type]


def _read_shards(counters: Sequence[ShardedCounter]) -> list[dict[int, int]]:
    """Every counter's shard counts: one lookup of all their shard and config
    keys per gateway, plus one more only for counters found to have grown
    beyond what this process knew."""
    results: list[dict[int, int]] = [{} for _ in counters]
    by_gateway: dict[int, list[int]] = {}
    for i, counter in enumerate(counters):
        by_gateway.setdefault(id(counter.gateway), []).append(i)
    for indexes in by_gateway.values():
        gateway = counters[indexes[0]].gateway
        wanted: list[tuple[int, int | None, Key]] = []  # (counter index, shard or None for config, key)
        for i in indexes:
            counter = counters[i]
            wanted.append((i, None, counter.config_key()))
            wanted += [(i, n, counter.shard_key(n)) for n in counter.layout.shard_numbers(counter.read_shards)]
        grown: list[tuple[int, int | None, Key]] = []
        for (i, shard, _), raw in zip(wanted, _lookup(gateway, [key for _, _, key in wanted])):
            counter = counters[i]
            if shard is not None:
                results[i][shard] = 0 if raw is None else counter._decode_shard(raw)
                continue
            before = counter.read_shards
            counter._learn(counter._decode_config(raw))
            extra = counter.layout.shard_numbers(counter.read_shards)[before:]
            grown += [(i, n, counter.shard_key(n)) for n in extra]
        if grown:
            for (i, shard, _), raw in zip(grown, _lookup(gateway, [key for _, _, key in grown])):
                assert shard is not None
                results[i][shard] = 0 if raw is None else counters[i]._decode_shard(raw)
    return results


def _lookup(gateway: Gateway, keys: list[Key]) -> list[RawEntity | None]:
    found: list[RawEntity | None] = []
    for start in range(0, len(keys), MAX_KEYS_PER_LOOKUP):
        found += gateway.lookup(keys[start : start + MAX_KEYS_PER_LOOKUP])
    return found
