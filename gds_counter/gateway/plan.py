"""Plans: the rules of an operation, written once, run blocking or async.

A plan is a generator that says what it needs from storage instead of doing
the I/O itself: it yields an effect and is sent back the answer, or has the
error thrown in at that point, so its own ``try``/``except``/``with`` blocks
work as in straight-line code. Plans compose with ``yield from``.

The effects (``gateway._effects``) are typed: each is an ``Ask[R]`` whose
answer is an ``R``, asked for with ``ask`` (the one place where what a
generator is sent becomes an ``R``). The gateway's calls are one class each
(``gateway._calls``: ``Lookup``, ``Commit``, ...), made by the helpers a
plan calls, named and typed like the ``Gateway`` protocol's methods:
``found = yield from lookup(keys, transaction=token)``. Inside a gateway
the rules ask for its backend's hooks the same way (``gateway._hooks``).
Besides, ``Sleep`` (a backoff), ``Call`` (a blocking function) and
``Await`` (a caller's coroutine).

A layer above may add an effect of its own (``Step``): it is handed the
driver, to run plans of its own however it needs (the counter's combined
writes run one caller's write for several). This module knows nothing of
what such a step is for.

That is what lets the blocking API and ``gds_counter.aio`` share every rule
(validation, mapping, layouts, strategies, retry decisions): ``run`` drives
a plan against a blocking ``Gateway``; ``arun`` drives the very same
generator against an async gateway, awaiting each effect. Only the drivers
differ, and they hold no rules: each effect performs itself (``perform``,
``aperform``), and a gateway's rule plan for a call is the gateway's
(``GatewayRules.rule_plan``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable, Sequence, TypeVar

from gds_counter.errors import GDSError
from gds_counter.gateway._calls import (
    GatewayCall,
    allocate_ids,
    begin_transaction,
    capabilities,
    commit,
    lookup,
    reserve_ids,
    rollback,
    run_aggregation,
    run_query,
)
from gds_counter.gateway._contract import AsyncGateway, Gateway
from gds_counter.gateway._effects import Ask, Await, Call, Effect, Plan, Sleep, Step, ask
from gds_counter.gateway._hooks import Hook
from gds_counter.gateway._rules import GatewayRules
from gds_counter.gateway.mutations import Mutation
from gds_counter.gateway.query import Query, QueryResult
from gds_counter.gateway.values import RawEntity

log = logging.getLogger("gds_counter.gateway")

__all__ = [
    "Ask",
    "Await",
    "Call",
    "Effect",
    "Plan",
    "Sleep",
    "Step",
    "allocate_ids",
    "arun",
    "ask",
    "awaiting",
    "begin_transaction",
    "call",
    "capabilities",
    "commit",
    "in_transaction",
    "just",
    "next_batch",
    "query_all",
    "query_batches",
    "lookup",
    "reserve_ids",
    "rollback",
    "run",
    "run_aggregation",
    "run_query",
    "sleep",
]

T = TypeVar("T")


def sleep(seconds: float) -> Plan[None]:
    yield Sleep(seconds)


def call(function: Callable[[], T]) -> Plan[T]:
    return ask(Call(function))


def awaiting(factory: Callable[[], Awaitable[T]]) -> Plan[T]:
    return ask(Await(factory))


def just(value: T) -> Plan[T]:
    """A plan that needs nothing and returns ``value``."""
    return value
    yield  # pragma: no cover  (makes this a generator)


# --- plans every layer shares -----------------------------------------------------


def in_transaction(work: Callable[[bytes], Plan[Sequence[Mutation]]]) -> Plan[None]:
    """One attempt at a read-write transaction: the plan ``work(token)``
    reads with the token and returns what to write, which is committed
    atomically. Any error rolls the transaction back (freeing a locking
    server's locks at once) and is raised; ``Contention`` means it is safe
    to try again."""
    token = yield from begin_transaction()
    try:
        mutations = yield from work(token)
        yield from commit(mutations, transaction=token)
    except GeneratorExit:
        # Closed, not driven any more (its event loop closed with the task
        # pending): no rollback can be sent from here. The gateway ends a
        # transaction nothing references (the embedded engine) or it times
        # out (Datastore); yielding here raised "generator ignored
        # GeneratorExit" and kept it open.
        raise
    except BaseException:
        try:
            yield from rollback(token)  # a no-op once the commit used it up
        except GDSError:
            pass
        raise


def next_batch(query: Query, result: QueryResult, remaining: int | None) -> Query | None:
    """The query that continues ``query`` after its batch ``result`` (with
    ``remaining`` results of its limit still wanted, None for no limit), or
    None when it is finished: php-gds stopped at the first batch, silently
    truncating results; every reader here follows them all."""
    if not result.more_results or result.end_cursor is None or (remaining is not None and remaining <= 0):
        return None
    return query.replace(start_cursor=result.end_cursor, offset=0, limit=remaining)


def query_batches(query: Query, *, transaction: bytes | None = None) -> Plan[list[QueryResult]]:
    """Every batch of ``query``, to the end or to its limit."""
    batches: list[QueryResult] = []
    remaining = query.limit
    current: Query | None = query
    while current is not None:
        result = yield from run_query(current, transaction=transaction)
        batches.append(result)
        if remaining is not None:
            remaining -= len(result.entities)
        current = next_batch(current, result, remaining)
    return batches


def query_all(query: Query, *, transaction: bytes | None = None) -> Plan[list[RawEntity]]:
    """Every result of ``query``, across all batches."""
    batches = yield from query_batches(query, transaction=transaction)
    return [entity for batch in batches for entity in batch.entities]


# --- the drivers -------------------------------------------------------------------


class _Frames:
    """The plans one driver runs, the innermost last: the plan it was given
    and the gateway rule plans running inline for it (``rule_plan``).
    ``next`` resumes the innermost with what its last effect gave
    (``send``) or raised (``error``) and returns its next effect; a plan
    that returns or raises hands that to the one below, as ``yield from``
    would."""

    __slots__ = ("stack", "send", "error", "result")

    def __init__(self, plan: Plan[object]) -> None:
        self.stack: list[Plan[object]] = [plan]
        self.send: object = None
        self.error: BaseException | None = None
        self.result: object = None

    def next(self) -> Effect | None:
        """The next effect, or None once the outermost plan returned (its
        value in ``result``); an error it did not handle is raised."""
        while True:
            current = self.stack[-1]
            try:
                effect: Effect = current.send(self.send) if self.error is None else current.throw(self.error)
            except StopIteration as stop:
                self.stack.pop()
                value: object = stop.value
                self.send, self.error = value, None
                if not self.stack:
                    self.result = value
                    return None
                continue
            except BaseException as exc:
                self.stack.pop()
                if not self.stack:
                    raise
                self.send, self.error = None, exc
                continue
            self.send, self.error = None, None
            return effect

    def inlined(self, gateway: object, call: GatewayCall[object]) -> bool:
        """Whether ``call`` is one of the gateway's rule plans, now pushed
        to run inline (as if the plan had ``yield from`` it). A wrapper
        that is not a ``GatewayRules`` (a fault injector) is called, not
        skipped."""
        if not isinstance(gateway, GatewayRules):
            return False
        inner = gateway.rule_plan(call)
        if inner is None:
            return False
        self.stack.append(inner)
        return True

    def close(self) -> None:
        """An error that leaves the driver with plans still suspended (an
        interrupt that landed in the driver itself, between two effects)
        closes them here, innermost first, so that their ``finally`` and
        ``with`` blocks run now, in this thread, in order. Left to the
        garbage collector, they ran at a random later moment, in whatever
        thread collected them and under whatever lock it held: a shard
        chooser's ``give_back`` waited there for ever on the lock of the
        ``take`` it had interrupted. (The drivers call it from an ``except``
        of their whole loop: a ``with`` cost two calls more per run.)"""
        while self.stack:
            plan = self.stack.pop()
            try:
                plan.close()
            except BaseException:  # noqa: B902  (another interrupt: the others are still closed, the error still raised)
                log.warning("closing an interrupted plan failed", exc_info=True)


class _Drive:
    """What a ``Step`` is handed to run plans on the blocking driver's gateway."""

    __slots__ = ("gateway", "wait")

    def __init__(self, gateway: Gateway | None, wait: Callable[[float], None]) -> None:
        self.gateway, self.wait = gateway, wait

    def __call__(self, plan: Plan[T]) -> T:
        return run(plan, self.gateway, wait=self.wait)


class _ADrive:
    """What a ``Step`` is handed to run plans on the async driver's gateway."""

    __slots__ = ("gateway",)

    def __init__(self, gateway: AsyncGateway) -> None:
        self.gateway = gateway

    def __call__(self, plan: Plan[T]) -> Awaitable[T]:
        return arun(plan, self.gateway)


def run(plan: Plan[T], gateway: Gateway | None, *, wait: Callable[[float], None] = time.sleep) -> T:
    """Drive ``plan`` against a blocking ``gateway``: each effect is carried
    out here, its result sent back (or its error thrown in), until the plan
    returns (``gateway`` None: a plan that makes no gateway call). A
    gateway call whose rules are a plan of the gateway's
    (``GatewayRules.rule_plan``) runs here too, as if the plan had
    ``yield from`` it; a backend hook (``Hook``), which only such a plan
    asks for, is performed on the gateway. ``wait`` carries out ``Sleep``
    (tests pass a fake clock's)."""

    frames = _Frames(plan)
    try:
        while (effect := frames.next()) is not None:
            try:
                if isinstance(effect, GatewayCall):
                    if not frames.inlined(gateway, effect):
                        if gateway is None:
                            raise TypeError(f"a plan run with no gateway asked for {effect!r}")
                        frames.send = effect.perform(gateway)
                elif isinstance(effect, Hook):
                    frames.send = effect.perform(gateway)
                elif isinstance(effect, Sleep):
                    wait(effect.seconds)
                elif isinstance(effect, Call):
                    frames.send = effect.function()
                elif isinstance(effect, Step):
                    frames.send = effect.run(_Drive(gateway, wait))
                elif isinstance(effect, Await):
                    raise TypeError("a blocking driver cannot await; use gds_counter.aio for coroutines")
                else:  # pragma: no cover  (a plan's own bug)
                    raise TypeError(f"a plan yielded {effect!r}, which is not an effect")
            except BaseException as exc:  # thrown into the plan, which may handle it
                frames.error = exc
    except BaseException:
        frames.close()
        raise
    result: T = frames.result  # type: ignore[assignment]  # (what the plan returned: a T)
    return result


async def arun(plan: Plan[T], gateway: AsyncGateway) -> T:
    """Drive ``plan`` against the async ``gateway`` until it returns: the
    same plan ``run`` drives, each effect awaited (and the gateway's own
    rule plans run inline, as ``run`` does). A ``Sleep`` is
    ``asyncio.sleep`` (other tasks run meanwhile), a ``Call`` (a blocking
    function, such as a user's own strategy with only ``add``) runs in a
    worker thread so the event loop never blocks. Errors, cancellation
    included, are thrown into the plan where its effect was yielded, so its
    cleanup (a rollback) still runs."""

    frames = _Frames(plan)
    try:
        while (effect := frames.next()) is not None:
            try:
                if isinstance(effect, GatewayCall):
                    if not frames.inlined(gateway, effect):
                        frames.send = await effect.aperform(gateway)
                elif isinstance(effect, Hook):
                    frames.send = await effect.aperform(gateway)
                elif isinstance(effect, Sleep):
                    await asyncio.sleep(effect.seconds)
                elif isinstance(effect, Call):
                    frames.send = await asyncio.to_thread(effect.function)
                elif isinstance(effect, Await):
                    frames.send = await effect.factory()
                elif isinstance(effect, Step):
                    frames.send = await effect.arun(_ADrive(gateway))
                else:  # pragma: no cover  (a plan's own bug)
                    raise TypeError(f"a plan yielded {effect!r}, which is not an effect")
            except BaseException as exc:  # thrown into the plan, which may handle it
                frames.error = exc
    except BaseException:
        frames.close()
        raise
    result: T = frames.result  # type: ignore[assignment]  # (what the plan returned: a T)
    return result
