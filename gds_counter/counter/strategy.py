"""How one attempt adds an amount to one shard.

A strategy makes exactly one attempt on the shard it is given and either
commits the amount or raises; retrying (on a fresh random shard) is the
engine's job. That split keeps "counted exactly once or raised" in one place.

* ``transactional``: read the shard and write it back in a transaction.
  Works on every gateway; costs a begin, a lookup and a commit.
* ``increment``: a server-side increment transform, one commit, no read.
  Raises ``TransformsIgnored`` where the server drops transforms (the legacy
  Datastore emulator), so nothing is ever reported that was not stored. The
  first one per gateway and process is checked in a way that cannot lose
  data (see ``_checked_increment``), because such a server also ignores the
  property mask and would otherwise overwrite the shard.
* ``auto``: ``increment`` where the gateway applies transforms AND stores
  the result as the layout says (Cloud Datastore and Firestore index a
  transformed value, but the PHP layout's ``count`` is unindexed, so there
  the PHP layout is written with transactions and the ndb layout, whose
  count is indexed, with transforms), else ``transactional``. The first ``TransformsIgnored`` from a gateway makes it
  fall back for that attempt and for every later one on that gateway
  (logged once).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

from gds_counter.errors import BadValueError, GDSError, TransformsIgnored
from gds_counter.gateway.base import Gateway, Increment, Upsert
from gds_counter.gds.mapper import from_raw, to_raw

if TYPE_CHECKING:
    from gds_counter.counter.sharded import ShardedCounter

log = logging.getLogger(__name__)


@runtime_checkable
class Strategy(Protocol):
    name: str

    def add(self, counter: "ShardedCounter", shard: int, amount: int) -> None:
        """Commit ``amount`` to ``shard`` once, or raise (``Contention`` when
        another writer won; it is then safe to retry)."""


class Transactional:
    name = "transactional"

    def add(self, counter: "ShardedCounter", shard: int, amount: int) -> None:
        store = counter.store
        with store.transaction():
            [current] = store.fetch_by_names([counter.shard_name(shard)])
            value = 0 if current is None else counter.count_of(current)
            store.upsert(counter.shard_entity(shard, value + amount))


@attrs.frozen
class TransformSupport:
    """What one gateway was seen to do with an increment transform."""

    applies: bool
    #: Whether an unindexed property stays unindexed after a transform.
    #: Cloud Datastore / Firestore index the result, which the PHP layout's
    #: ``count`` must not be; None until seen.
    keeps_unindexed: bool | None = None


class _TransformRegistry:
    """Per-process memory of each gateway's transform behaviour.

    A server that ignores transforms (the legacy Datastore emulator) also
    ignores property masks and REPLACES the entity with what was sent, so a
    masked "target only" write would wipe a shard's count. A gateway's claim
    (``supports_transforms``) is therefore checked once, with an increment
    that cannot lose data, before the no-read path is trusted.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: "weakref.WeakKeyDictionary[Gateway, TransformSupport]" = weakref.WeakKeyDictionary()
        self._seen_ids: dict[int, TransformSupport] = {}  # gateways that cannot be weakly referenced

    def get(self, gateway: Gateway) -> TransformSupport | None:
        if not getattr(gateway, "supports_transforms", False):
            return TransformSupport(applies=False)
        with self._lock:
            try:
                return self._seen.get(gateway)
            except TypeError:
                return self._seen_ids.get(id(gateway))

    def set(self, gateway: Gateway, seen: TransformSupport) -> None:
        with self._lock:
            try:
                self._seen[gateway] = seen
            except TypeError:
                self._seen_ids[id(gateway)] = seen


TRANSFORMS = _TransformRegistry()


def _checked_increment(counter: "ShardedCounter", shard: int, amount: int) -> TransformSupport:
    """The first server-side increment on a gateway: in a transaction, write
    the shard whole with the count just read, plus the transform. A server
    that applies it stores count + amount; one that ignores it rewrites the
    same count. Either way nothing is lost, and the commit's transform
    results tell which server this is. One more lookup then shows whether
    the server kept ``count`` unindexed; if the layout wants it unindexed
    and it was not kept, the shard is rewritten as the layout says."""
    store = counter.store
    gateway = store.gateway
    key = counter.shard_key(shard)
    count = counter.layout.count_property
    token = gateway.begin_transaction()
    try:
        [raw] = gateway.lookup([key], transaction=token)
        value = 0 if raw is None else counter.count_of(from_raw(raw, store.schema))
        whole = to_raw(counter.shard_entity(shard, value), store.schema, store.namespace)
        mutation = Upsert(whole, transforms=(Increment(count, amount),))
    except BaseException:
        with contextlib.suppress(GDSError):
            gateway.rollback(token)
        raise
    result = gateway.commit([mutation], transaction=token)
    if not result.mutation_results[0].transform_results:
        seen = TransformSupport(applies=False)
        TRANSFORMS.set(gateway, seen)
        raise TransformsIgnored(
            f"{gateway!r} ignored the increment of {key} by {amount}; the shard was left as it was "
            "and nothing was counted"
        )
    try:
        [after] = gateway.lookup([key])
    except GDSError as exc:
        # The increment IS committed: an error now must neither make the
        # engine retry it (Contention: counted twice) nor report it as not
        # counted (Unavailable). Check the server again next time.
        log.info("could not read back %s after the first server-side increment (%s); will check again", key, exc)
        return TransformSupport(applies=True)
    seen = TransformSupport(applies=True, keeps_unindexed=after is None or count in after.unindexed)
    TRANSFORMS.set(gateway, seen)
    if not seen.keeps_unindexed and not counter.layout.count_indexed:
        log.info("%r indexes transformed values; server-side increments would index %s", gateway, count)
        with contextlib.suppress(GDSError):  # the increment is committed; this only restores the flag
            TRANSACTIONAL.add(counter, shard, 0)
    return seen


class ServerIncrement:
    """Explicitly chosen, it always uses transforms where they are applied,
    even where the server then indexes ``count`` (Cloud Datastore and
    Firestore do): the values stay exact and PHP reads them, but the shard
    no longer matches the PHP layout's index flags until next rewritten."""

    name = "increment"

    def add(self, counter: "ShardedCounter", shard: int, amount: int) -> None:
        gateway = counter.store.gateway
        seen = TRANSFORMS.get(gateway)
        if seen is not None and not seen.applies:
            raise TransformsIgnored(
                f"{gateway!r} does not apply increment transforms, so the server-side increment of "
                f"{counter.describe()} was not sent; nothing was counted (use strategy 'auto' or "
                "'transactional')"
            )
        if seen is None:
            _checked_increment(counter, shard, amount)
            return
        # The entity carries only the target: Store.increment masks the write
        # to it, so the stored count is kept and the transform adds to it.
        try:
            counter.store.increment(counter.shard_entity(shard, None), counter.layout.count_property, amount)
        except TransformsIgnored:
            TRANSFORMS.set(gateway, TransformSupport(applies=False))
            raise


class Auto:
    """Server-side increments where they store exactly the layout's data;
    transactions elsewhere."""

    name = "auto"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._warned: set[int] = set()

    def add(self, counter: "ShardedCounter", shard: int, amount: int) -> None:
        gateway = counter.store.gateway
        seen = TRANSFORMS.get(gateway)
        if seen is not None and not (seen.applies and (seen.keeps_unindexed or counter.layout.count_indexed)):
            TRANSACTIONAL.add(counter, shard, amount)
            return
        try:
            INCREMENT.add(counter, shard, amount)
        except TransformsIgnored:
            # Nothing was counted, so counting it another way now cannot
            # count it twice.
            gateway.stats.bump("counter.transform_fallbacks")
            if self._first_fallback(gateway):
                log.warning(
                    "%r ignores increment transforms (legacy Datastore emulator?); "
                    "counters on it now use transactions",
                    gateway,
                )
            TRANSACTIONAL.add(counter, shard, amount)

    def _first_fallback(self, gateway: Gateway) -> bool:
        with self._lock:
            if id(gateway) in self._warned:
                return False
            self._warned.add(id(gateway))
            return True


TRANSACTIONAL = Transactional()
INCREMENT = ServerIncrement()
AUTO = Auto()

#: Strategy names accepted by counters. "auto-grow" is "auto" plus shard
#: growth under contention (see ``AutoGrow``); the engine handles the growth.
STRATEGIES: dict[str, Strategy] = {
    "auto": AUTO,
    "auto-grow": AUTO,
    "transactional": TRANSACTIONAL,
    "increment": INCREMENT,
}


def get_strategy(strategy: "str | Strategy") -> Strategy:
    if isinstance(strategy, str):
        try:
            return STRATEGIES[strategy]
        except KeyError:
            raise BadValueError(
                f"unknown counter strategy {strategy!r}; choose one of {', '.join(sorted(STRATEGIES))}"
            ) from None
    if isinstance(strategy, Strategy):
        return strategy
    raise BadValueError(f"a strategy is a name or a Strategy, got {type(strategy).__name__} {strategy!r}")
