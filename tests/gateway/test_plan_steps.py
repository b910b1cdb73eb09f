"""A layer above the gateway may add an effect of its own (``plan.Step``):
each driver hands it a way to run plans on the same gateway, and sends its
answer back into the plan that yielded it. The counter's combined writes
are one; the storage layer knows nothing of what a step is for."""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable

import pytest

from gds_counter.gateway import plan
from gds_counter.gateway.keys import Key


class Twice(plan.Step):
    """Runs ``inner`` twice with whichever driver runs the plan, and answers
    both results, marking which face ran it."""

    def __init__(self, inner: Callable[[], plan.Plan[Any]]) -> None:
        self.inner = inner

    def run(self, drive: Callable[[plan.Plan[Any]], Any]) -> Any:
        return ("blocking", drive(self.inner()), drive(self.inner()))

    async def arun(self, adrive: Callable[[plan.Plan[Any]], Awaitable[Any]]) -> Any:
        return ("async", await adrive(self.inner()), await adrive(self.inner()))


def _lookups() -> plan.Plan[Any]:
    found = yield from plan.lookup([Key.of("K", "a")])
    return len(found)


def _outer() -> plan.Plan[Any]:
    answer = yield Twice(_lookups)
    return answer


class Blocking:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def lookup(self, keys: list[Key], *, transaction: bytes | None = None) -> list[None]:
        self.calls.append("lookup")
        return [None] * len(keys)


class Awaited:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def lookup(self, keys: list[Key], *, transaction: bytes | None = None) -> list[None]:
        self.calls.append("lookup")
        return [None] * len(keys)


def test_a_step_runs_its_plans_on_the_blocking_gateway_and_answers_the_plan():
    gateway = Blocking()
    assert plan.run(_outer(), gateway) == ("blocking", 1, 1)
    assert gateway.calls == ["lookup", "lookup"]


def test_the_same_step_runs_its_plans_awaited_on_an_async_gateway():
    gateway = Awaited()
    assert asyncio.run(plan.arun(_outer(), gateway)) == ("async", 1, 1)
    assert gateway.calls == ["lookup", "lookup"]


def test_a_step_that_raises_has_its_error_thrown_into_the_plan_where_it_was_yielded():
    class Refuses(plan.Step):
        def run(self, drive: Callable[[plan.Plan[Any]], Any]) -> Any:
            raise LookupError("refused")

    def caught() -> plan.Plan[str]:
        try:
            yield Refuses()
        except LookupError as exc:
            return f"caught {exc}"
        return "not raised"

    assert plan.run(caught(), Blocking()) == "caught refused"
    with pytest.raises(NotImplementedError):
        asyncio.run(plan.arun(caught(), Awaited()))  # a step that left arun undefined says so


class Interrupt(BaseException):
    """Stands for a KeyboardInterrupt that lands in the driver itself."""


def test_an_interrupt_between_two_effects_closes_the_suspended_plans_at_once_innermost_first(monkeypatch):
    """An interrupt that lands in the driver, not in an effect, is not
    thrown into the plan: the plans still suspended are closed before it
    leaves the driver, so their ``finally`` blocks run now and in order
    (left to the garbage collector, they ran later, in any thread, under
    any lock that thread held)."""
    cleaned: list[str] = []

    def inner() -> plan.Plan[Any]:
        try:
            yield from plan.lookup([Key.of("K", "a")])
            yield from plan.lookup([Key.of("K", "b")])
        finally:
            cleaned.append("inner")

    def outer() -> plan.Plan[Any]:
        try:
            yield from inner()
        finally:
            cleaned.append("outer")

    real_next = plan._Frames.next
    effects: list[object] = []

    def next_then_interrupted(frames: Any) -> Any:
        effect = real_next(frames)
        effects.append(effect)
        if len(effects) == 2:
            raise Interrupt  # after the plan yielded its second effect, before it was carried out
        return effect

    monkeypatch.setattr(plan._Frames, "next", next_then_interrupted)
    suspended = outer()  # still referenced here, as a cycle would keep it: only the driver can close it now
    with pytest.raises(Interrupt):
        plan.run(suspended, Blocking())
    assert cleaned == ["inner", "outer"]
    assert suspended.gi_frame is None


def test_a_transaction_plan_closed_midway_closes_without_asking_for_anything():
    """A plan is closed, not driven, when its event loop is closed with its
    task pending. Its transaction's rollback cannot be sent then; asking for
    it raised "generator ignored GeneratorExit" (asyncio's warning of a
    destroyed task, then this RuntimeError) and left the transaction open
    for the gateway's lifetime (the fresh user's closed loops: 5
    transactions still holding their connections)."""

    def work(token: bytes) -> plan.Plan[list[Any]]:
        yield from plan.lookup([Key.of("K", 1)], transaction=token)
        return []

    planned = plan.in_transaction(work)
    assert isinstance(next(planned), plan.GatewayCall)  # begin
    assert isinstance(planned.send(b"token"), plan.GatewayCall)  # the lookup, in the transaction
    planned.close()  # raised RuntimeError before
