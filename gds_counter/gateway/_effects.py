"""The kinds of effect a plan may yield, and the one place a plan asks for one.

A plan (``gateway.plan``) is a generator that yields effects and is sent
each one's answer. Every effect but a backoff (``Sleep``) is an ``Ask[R]``:
it names, in its type, what its answer is. ``ask(effect)`` yields it and
returns the answer as an ``R``; it holds the one cast from what a generator
is sent (``object``: the driver sends whatever the effect's ``perform``
returned) to the ``R`` the effect promised, so that every plan above reads
typed values and mypy follows them.

The kinds here know nothing of storage: ``Call`` (a blocking function),
``Await`` (a caller's coroutine, for async drivers), ``Step`` (an effect of
a layer above, which runs plans of its own). A gateway's calls
(``gateway._calls``) and its backends' hooks (``gateway._hooks``) are
``Ask`` subclasses too, each able to perform itself.
"""

from __future__ import annotations

import dataclasses
from typing import Awaitable, Callable, Generator, Generic, Protocol, TypeVar, Union

from typing_extensions import TypeAlias

__all__ = ["ADrive", "Ask", "Await", "Call", "Drive", "Effect", "Plan", "Sleep", "Step", "ask"]

T = TypeVar("T")
R = TypeVar("R", covariant=True)


class Ask(Generic[R]):
    """An effect whose answer, sent back to the plan, is an ``R``."""

    __slots__ = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Sleep:
    """Wait ``seconds`` (a backoff): ``time.sleep`` blocking, ``asyncio.sleep`` async."""

    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class Call(Ask[R]):
    """Run a blocking function (a user's own strategy, say). The async
    drivers run it in a worker thread, never on the event loop."""

    function: Callable[[], R]


@dataclasses.dataclass(frozen=True, slots=True)
class Await(Ask[R]):
    """Await what ``factory()`` returns (a caller's coroutine, such as the
    work of ``aio.Store.run_in_transaction``): for async drivers only."""

    factory: Callable[[], Awaitable[R]]


class Drive(Protocol):
    """Run a plan to its end on the driver's gateway, blocking."""

    def __call__(self, plan: "Plan[T]") -> T: ...


class ADrive(Protocol):
    """Run a plan to its end on the driver's gateway, awaited."""

    def __call__(self, plan: "Plan[T]") -> Awaitable[T]: ...


class Step(Ask[R]):
    """An effect defined by a layer above: the driver hands it a way to run
    plans (``drive``, blocking, or ``adrive``, awaited) against the same
    gateway, and sends the plan whatever it returns. Subclasses override
    both methods, so that a plan that yields one runs on either face."""

    __slots__ = ()

    def run(self, drive: Drive) -> R:
        raise NotImplementedError

    async def arun(self, adrive: ADrive) -> R:
        raise NotImplementedError


Effect = Union[Ask[object], Sleep]
#: A plan returning ``T``: it yields effects and is sent their answers.
#: (A string, so that under the strict check the alias itself holds no Any.)
Plan: TypeAlias = "Generator[Effect, object, T]"


def ask(effect: Ask[T]) -> Plan[T]:
    """Yield ``effect`` and return its answer, an ``R`` as its type says
    (the drivers send what the effect's own ``perform`` returned)."""
    answer: T = yield effect  # type: ignore[assignment]  # (the one cast: not ``typing.cast``, a call each time)
    return answer
