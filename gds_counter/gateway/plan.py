"""Plans: the rules of an operation, written once, run blocking or async.

A plan is a generator that says what it needs from storage instead of doing
the I/O itself: it yields an effect (``Op``: call the gateway; ``Sleep``:
wait; ``Call``: run a blocking function) and is sent back the result, or has
the error thrown in at that point, so its own ``try``/``except``/``with``
blocks work as in straight-line code. Plans compose with ``yield from``.

A layer above may add an effect of its own (``Step``): it is handed the
driver, to run plans of its own however it needs (the counter's combined
writes run one caller's write for several). This module knows nothing of
what such a step is for.

That is what lets the blocking API and ``gds_counter.aio`` share every rule
(validation, mapping, layouts, strategies, retry decisions): ``run`` drives
a plan against a blocking ``Gateway``; ``gds_counter.aio`` drives the very
same generator against an async gateway, awaiting each effect. Only the
drivers differ, and they hold no rules.

The typed helpers (``lookup``, ``commit``, ...) are the gateway calls a plan
may make, named and typed like the ``Gateway`` protocol's methods:
``found = yield from lookup(keys, transaction=token)``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Generator, Sequence, TypeVar, Union, cast

import attrs

from gds_counter.errors import GDSError
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import CommitResult, Mutation
from gds_counter.gateway.query import AggregationQuery, AggregationResult, Query, QueryResult
from gds_counter.gateway.values import RawEntity

log = logging.getLogger("gds_counter.gateway")

__all__ = [
    "Await",
    "Call",
    "Effect",
    "Op",
    "Plan",
    "Sleep",
    "Step",
    "allocate_ids",
    "arun",
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

#: The gateway methods an ``Op`` may name ("capabilities" is the property).
OP_NAMES = frozenset(
    {
        "lookup", "run_query", "run_aggregation", "begin_transaction", "commit", "rollback", "allocate_ids",
        "reserve_ids", "capabilities",
    }
)


def _check_op_name(name: str) -> None:
    if name not in OP_NAMES and not name.startswith("_"):
        raise ValueError(f"an Op names a gateway method {sorted(OP_NAMES)} or a hook (_name), got {name!r}")


@attrs.frozen
class Op:
    """Call ``name`` on the gateway the plan runs against: one of its
    public methods (``OP_NAMES``), or, for a gateway's own plans, one of its
    hooks (``_lookup``, ...), which are blocking or async with the gateway."""

    name: str = attrs.field(validator=lambda _, __, name: _check_op_name(name))
    args: tuple[Any, ...] = ()
    kwargs: tuple[tuple[str, Any], ...] = ()


@attrs.frozen
class Sleep:
    """Wait ``seconds`` (a backoff): ``time.sleep`` blocking, ``asyncio.sleep`` async."""

    seconds: float


@attrs.frozen
class Call:
    """Run a blocking function (a user's own strategy, say). The async
    drivers run it in a worker thread, never on the event loop."""

    function: Callable[[], Any]


@attrs.frozen
class Await:
    """Await what ``factory()`` returns (a caller's coroutine, such as the
    work of ``aio.Store.run_in_transaction``): for async drivers only."""

    factory: Callable[[], Awaitable[Any]]


class Step:
    """An effect defined by a layer above: the driver hands it a way to run
    plans (``drive``, blocking, or ``adrive``, awaited) against the same
    gateway, and sends the plan whatever it returns. Subclasses override
    both methods, so that a plan that yields one runs on either face."""

    def run(self, drive: Callable[["Plan[Any]"], Any]) -> Any:
        raise NotImplementedError

    async def arun(self, adrive: Callable[["Plan[Any]"], Awaitable[Any]]) -> Any:
        raise NotImplementedError


Effect = Union[Op, Sleep, Call, Await, Step]
Plan = Generator[Effect, Any, T]


# --- the calls a plan may make ---------------------------------------------------


def _op(name: str, *args: Any, **kwargs: Any) -> Plan[Any]:
    return (yield Op(name, args, tuple(kwargs.items())))


def lookup(keys: Sequence[Key], *, transaction: bytes | None = None) -> Plan[list[RawEntity | None]]:
    result: list[RawEntity | None] = yield from _op("lookup", list(keys), transaction=transaction)
    return result


def run_query(query: Query, *, transaction: bytes | None = None) -> Plan[QueryResult]:
    result: QueryResult = yield from _op("run_query", query, transaction=transaction)
    return result


def run_aggregation(aggregation: AggregationQuery, *, transaction: bytes | None = None) -> Plan[AggregationResult]:
    result: AggregationResult = yield from _op("run_aggregation", aggregation, transaction=transaction)
    return result


def begin_transaction(*, read_only: bool = False) -> Plan[bytes]:
    result: bytes = yield from _op("begin_transaction", read_only=read_only)
    return result


def commit(mutations: Sequence[Mutation], *, transaction: bytes | None = None) -> Plan[CommitResult]:
    result: CommitResult = yield from _op("commit", list(mutations), transaction=transaction)
    return result


def rollback(transaction: bytes) -> Plan[None]:
    yield from _op("rollback", transaction)


def allocate_ids(keys: Sequence[Key]) -> Plan[list[Key]]:
    result: list[Key] = yield from _op("allocate_ids", list(keys))
    return result


def reserve_ids(keys: Sequence[Key]) -> Plan[None]:
    yield from _op("reserve_ids", list(keys))


def capabilities() -> Plan[Capabilities]:
    """The gateway's capabilities (learned by a probe the first time)."""
    result: Capabilities = yield from _op("capabilities")
    return result


def sleep(seconds: float) -> Plan[None]:
    yield Sleep(seconds)


def call(function: Callable[[], T]) -> Plan[T]:
    result: T = yield Call(function)
    return result


def awaiting(factory: Callable[[], Awaitable[T]]) -> Plan[T]:
    result: T = yield Await(factory)
    return result


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


# --- the blocking driver ------------------------------------------------------------


def perform(gateway: Any, op: Op) -> Any:
    """Carry out one ``Op`` on a blocking gateway."""
    if op.name == "capabilities":
        return gateway.capabilities
    return getattr(gateway, op.name)(*op.args, **dict(op.kwargs))


def inline(gateway: Any, op: Op) -> "Plan[Any] | None":
    """The gateway's own plan for the public call ``op``, when it has one
    (``GatewayRules.plan_of``): the drivers run it in the same loop as the
    plan that yielded ``op``, so that one call is one ``run`` however deep
    the rules go. Looked up on the gateway's class, so that a wrapper that
    passes other attributes through (a fault injector) is called, not
    skipped."""
    plan_of = getattr(type(gateway), "plan_of", None)
    if plan_of is None or op.name.startswith("_"):
        return None
    inner: Plan[Any] | None = plan_of(gateway, op)
    return inner


class _Frames:
    """The plans one driver runs, the innermost last: the plan it was given
    and the gateway rule plans running inline for it (``inline``). ``next``
    resumes the innermost with what its last effect gave (``send``) or
    raised (``error``) and returns its next effect; a plan that returns or
    raises hands that to the one below, as ``yield from`` would."""

    __slots__ = ("stack", "send", "error", "result")

    def __init__(self, plan: Plan[Any]) -> None:
        self.stack: list[Plan[Any]] = [plan]
        self.send: Any = None
        self.error: BaseException | None = None
        self.result: Any = None

    def next(self) -> "Effect | None":
        """The next effect, or None once the outermost plan returned (its
        value in ``result``); an error it did not handle is raised."""
        while True:
            current = self.stack[-1]
            try:
                effect: Effect = current.send(self.send) if self.error is None else current.throw(self.error)
            except StopIteration as stop:
                self.stack.pop()
                self.send, self.error = stop.value, None
                if not self.stack:
                    self.result = stop.value
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

    def inlined(self, gateway: Any, op: "Op") -> bool:
        """Whether ``op`` is one of the gateway's rule plans, now pushed to
        run inline (as if the plan had ``yield from`` it)."""
        inner = inline(gateway, op)
        if inner is None:
            return False
        self.stack.append(inner)
        return True

    def __enter__(self) -> "_Frames":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        """An error that leaves the driver with plans still suspended (an
        interrupt that landed in the driver itself, between two effects)
        closes them here, innermost first, so that their ``finally`` and
        ``with`` blocks run now, in this thread, in order. Left to the
        garbage collector, they ran at a random later moment, in whatever
        thread collected them and under whatever lock it held: a shard
        chooser's ``give_back`` waited there for ever on the lock of the
        ``take`` it had interrupted."""
        while exc is not None and self.stack:
            plan = self.stack.pop()
            try:
                plan.close()
            except BaseException:  # noqa: B902  (another interrupt: the others are still closed, ``exc`` still raised)
                log.warning("closing an interrupted plan failed", exc_info=True)


def run(plan: Plan[T], gateway: Any, *, wait: Callable[[float], None] = time.sleep) -> T:
    """Drive ``plan`` against a blocking ``gateway``: each effect is carried
    out here, its result sent back (or its error thrown in), until the plan
    returns. A gateway call whose rules are a plan of the gateway's
    (``inline``) runs here too, as if the plan had ``yield from`` it.
    ``wait`` carries out ``Sleep`` (tests pass a fake clock's)."""
    with _Frames(plan) as frames:
        while (effect := frames.next()) is not None:
            try:
                if isinstance(effect, Op):
                    if not frames.inlined(gateway, effect):
                        frames.send = perform(gateway, effect)
                elif isinstance(effect, Sleep):
                    wait(effect.seconds)
                elif isinstance(effect, Call):
                    frames.send = effect.function()
                elif isinstance(effect, Step):
                    frames.send = effect.run(lambda planned: run(planned, gateway, wait=wait))
                elif isinstance(effect, Await):
                    raise TypeError("a blocking driver cannot await; use gds_counter.aio for coroutines")
                else:  # pragma: no cover  (a plan's own bug)
                    raise TypeError(f"a plan yielded {effect!r}, which is not an effect")
            except BaseException as exc:  # thrown into the plan, which may handle it
                frames.error = exc
        return cast(T, frames.result)


# --- the async driver ---------------------------------------------------------------


async def aperform(gateway: Any, op: Op) -> Any:
    """Carry out one ``Op`` on an async gateway (``learn_capabilities()``
    is how an async gateway answers "capabilities")."""
    if op.name == "capabilities":
        return await gateway.learn_capabilities()
    return await getattr(gateway, op.name)(*op.args, **dict(op.kwargs))


async def arun(plan: Plan[T], gateway: Any) -> T:
    """Drive ``plan`` against the async ``gateway`` until it returns: the
    same plan ``run`` drives, each effect awaited (and the gateway's own
    rule plans run inline, as ``run`` does). A ``Sleep`` is
    ``asyncio.sleep`` (other tasks run meanwhile), a ``Call`` (a blocking
    function, such as a user's own strategy with only ``add``) runs in a
    worker thread so the event loop never blocks. Errors, cancellation
    included, are thrown into the plan where its effect was yielded, so its
    cleanup (a rollback) still runs."""
    with _Frames(plan) as frames:
        while (effect := frames.next()) is not None:
            try:
                if isinstance(effect, Op):
                    if not frames.inlined(gateway, effect):
                        frames.send = await aperform(gateway, effect)
                elif isinstance(effect, Sleep):
                    await asyncio.sleep(effect.seconds)
                elif isinstance(effect, Call):
                    frames.send = await asyncio.to_thread(effect.function)
                elif isinstance(effect, Await):
                    frames.send = await effect.factory()
                elif isinstance(effect, Step):
                    frames.send = await effect.arun(lambda planned: arun(planned, gateway))
                else:  # pragma: no cover  (a plan's own bug)
                    raise TypeError(f"a plan yielded {effect!r}, which is not an effect")
            except BaseException as exc:  # thrown into the plan, which may handle it
                frames.error = exc
        return cast(T, frames.result)
