"""How one attempt adds an amount to one shard.

A strategy gets a ``Shard`` (which gateway, which layout, which counter,
which shard number) and makes exactly one attempt: it commits the amount or
raises. Retrying on a fresh random shard is the engine's job, which keeps
"counted exactly once or raised" in one place. Strategies never call back
into the counter.

* ``transactional``: read the shard and write it back in a transaction.
  Works on every gateway; costs a begin, a lookup and a commit.
* ``increment``: a server-side increment transform, one commit, no read.
  Raises ``TransformsIgnored`` where the server drops transforms (the legacy
  Datastore emulator), so nothing is ever reported that was not stored. The
  gateway knows that before the first real write: it probes once, on a
  throwaway entity (``BaseGateway.capabilities``), because such a server
  also ignores the property mask and would otherwise overwrite the shard.
* ``auto``: ``increment`` wherever the server applies transforms,
  ``transactional`` elsewhere. Measured on the Firestore emulator, the
  server-side increment is tens of times faster than a transaction (see the
  docs/performance.md). Its one cost: where the server indexes a
  transformed value (the Firestore emulator does; production does not
  document it), a PHP-layout shard's ``count`` is stored indexed until PHP
  next rewrites the shard. Values stay exact and PHP reads and writes them
  unchanged. ``transactional`` keeps php-gds's flags exactly.
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

import attrs
from typing_extensions import TypeIs

from gds_counter._checks import INT64_MAX, INT64_MIN
from gds_counter.counter.layout import Layout
from gds_counter.errors import BadValueError, CountSaturated, TransformsIgnored
from gds_counter.gateway import plan
from gds_counter.gateway.base import Gateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Mutation, Upsert, path_of
from gds_counter.gateway.values import RawEntity, seal

__all__ = ["STRATEGIES", "PlannedStrategy", "Shard", "Strategy", "Wrote"]


@attrs.frozen
class Shard:
    """One shard to write: all a strategy is given."""

    #: The gateway ``add`` writes through (a blocking one; a plan is run
    #: against whichever gateway its driver holds, blocking or async).
    gateway: Gateway
    layout: Layout
    target: str
    number: int
    namespace: str = ""
    #: Built once per shard (a counter keeps its ``Shard``s): checking and
    #: building a key on every attempt was a tenth of an embedded increment.
    key: Key = attrs.field(
        default=attrs.Factory(lambda self: self.layout.shard_key(self.target, self.number, self.namespace), takes_self=True),
        eq=False,
    )

    #: What every server-side increment of this shard sends but its amount,
    #: built once: the entity holding only the target, and the property
    #: mask naming its properties (so the stored count is kept).
    increment_base: tuple[RawEntity, tuple[str, ...]] = attrs.field(
        init=False, eq=False, repr=False,
        default=attrs.Factory(lambda self: _increment_base(self.entity(None)), takes_self=True),
    )

    def entity(self, count: int | None) -> RawEntity:
        return self.layout.shard_entity_at(self.key, self.target, count)

    def __str__(self) -> str:
        return f"shard {self.number} of {self.layout.shard_kind} {self.target!r}"


def _increment_base(entity: RawEntity) -> tuple[RawEntity, tuple[str, ...]]:
    """Sealed (``values.seal``): checked here, once per shard, not at each
    commit; the amount, which changes, is checked at each."""
    return seal(entity), tuple(sorted(map(path_of, entity.properties)))


class Wrote(NamedTuple):
    """What an attempt's ``plan_add`` may return: the count it found in the
    shard and the count it stored. A count this process did not leave
    there tells the shard chooser that another writer uses the shard."""

    found: int
    stored: int


@runtime_checkable
class Strategy(Protocol):
    """One attempt on one shard. A strategy may also be a
    ``PlannedStrategy``: the built-in ones are, and that is what lets
    ``gds_counter.aio`` run them on non-blocking I/O; the asyncio face
    refuses one with only ``add``."""

    name: str

    def add(self, shard: Shard, amount: int) -> None:
        """Commit ``amount`` to ``shard`` once, or raise (``Contention`` when
        another writer won; it is then safe to retry). ``amount`` may be the
        sum of several callers' amounts (combined writes): each
        of them gets what this attempt ends in."""


@runtime_checkable
class PlannedStrategy(Strategy, Protocol):
    """A strategy whose attempt is also a plan (``gds_counter.gateway.plan``),
    which may return a ``Wrote`` (what it found and stored)."""

    def plan_add(self, shard: Shard, amount: int) -> plan.Plan[Wrote | None]:
        """``add`` as a plan."""
        ...


def is_planned(strategy: Strategy) -> TypeIs[PlannedStrategy]:
    """Whether ``strategy`` is a ``PlannedStrategy``: the built-in ones at
    once, a user's own by the protocol check (which costs microseconds, so
    a counter asks once, when it is made)."""
    return isinstance(strategy, _BUILT_IN) or isinstance(strategy, PlannedStrategy)


def planned(strategy: Strategy) -> PlannedStrategy:
    """The strategy as a ``PlannedStrategy``: itself when it is one, else
    its blocking ``add`` run as a ``Call`` (which reports nothing)."""
    if is_planned(strategy):
        return strategy
    return _BlockingAdd(strategy)


class _BlockingAdd:
    """A strategy with only a blocking ``add``, its attempt as a plan."""

    def __init__(self, strategy: Strategy) -> None:
        self.strategy = strategy
        self.name = strategy.name

    def add(self, shard: Shard, amount: int) -> None:
        self.strategy.add(shard, amount)

    def plan_add(self, shard: Shard, amount: int) -> plan.Plan[Wrote | None]:
        yield from plan.call(lambda: self.strategy.add(shard, amount))
        return None


class Transactional:
    name = "transactional"

    def add(self, shard: Shard, amount: int) -> None:
        plan.run(self.plan_add(shard, amount), shard.gateway)

    def plan_add(self, shard: Shard, amount: int) -> plan.Plan[Wrote]:
        found: list[int] = []

        def write(token: bytes) -> plan.Plan[list[Mutation]]:
            [stored] = yield from plan.lookup([shard.key], transaction=token)
            found[:] = [shard.layout.count_of(stored)]
            count = found[0] + amount
            # The sum is computed here, exactly: reaching a bound is an
            # ordinary success; passing one is refused before the commit.
            if not INT64_MIN <= count <= INT64_MAX:
                raise BadValueError(f"adding {amount} to {shard} ({shard.key}) would pass 64 bits; nothing was written")
            return [Upsert(shard.entity(count))]

        yield from plan.in_transaction(write)
        return Wrote(found[0], found[0] + amount)


class ServerIncrement:
    """Explicitly chosen, it always uses transforms where they are applied,
    even where the server then indexes ``count`` (the Firestore emulator
    does; production does not document it, see the module docstring): the
    values stay exact and PHP reads them, but such a shard no longer
    matches the PHP layout's index flags until next rewritten."""

    name = "increment"

    def add(self, shard: Shard, amount: int) -> None:
        plan.run(self.plan_add(shard, amount), shard.gateway)

    def plan_add(self, shard: Shard, amount: int) -> plan.Plan[Wrote]:
        capabilities = yield from plan.capabilities()
        if not capabilities.applies_transforms:
            raise TransformsIgnored(
                f"{shard.gateway!r} does not apply increment transforms, so the server-side increment of "
                f"{shard} was not sent; nothing was counted (use strategy 'auto' or 'transactional')"
            )
        return (yield from self.applied(shard, amount))

    def applied(self, shard: Shard, amount: int) -> plan.Plan[Wrote]:
        """The increment, on a gateway known to apply transforms."""
        # The entity carries only the target; the mask keeps the stored count
        # and the transform adds to it (a missing count counts as 0).
        entity, mask = shard.increment_base
        mutation = Upsert(entity, property_mask=mask, transforms=(Increment(path_of(shard.layout.count_property), amount),))
        [result] = (yield from plan.commit([mutation])).mutation_results
        if result.transform_results is None:
            raise TransformsIgnored(f"the server ignored the increment of {shard} by {amount}; nothing was counted")
        [value] = result.transform_results
        if (amount > 0 and value == INT64_MAX) or (amount < 0 and value == INT64_MIN):
            # Datastore saturates an integer increment at the 64-bit bounds
            # instead of failing: the commit was applied, but the amount may
            # have been cut short. That is not BadValueError (which means
            # nothing was written, and invites writing the amount again).
            raise CountSaturated(
                f"the increment of {shard} ({shard.key}) by {amount} WAS written, and the shard now holds "
                f"{value}, a 64-bit bound where the server's increment saturates: the amount may have been "
                "cut short. Do not retry it; the shard needs repair"
            )
        return Wrote(value - amount, value)


class Auto:
    """Server-side increments where the server applies them; transactions
    elsewhere."""

    name = "auto"

    def add(self, shard: Shard, amount: int) -> None:
        plan.run(self.plan_add(shard, amount), shard.gateway)

    def plan_add(self, shard: Shard, amount: int) -> plan.Plan[Wrote]:
        capabilities = yield from plan.capabilities()  # asked once: the chosen one does not ask again
        if capabilities.applies_transforms:
            return (yield from INCREMENT.applied(shard, amount))
        return (yield from TRANSACTIONAL.plan_add(shard, amount))


_BUILT_IN = (Transactional, ServerIncrement, Auto)

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
