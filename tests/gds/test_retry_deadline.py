"""The deadline a retry loop states for the storage waits of its attempts
(``_process.deadlines``), and what a lone call no longer pays for it.

A counter's call states its policy's deadline from its start
(``deadlines.bounded``); its retry loop (``gds.transaction.retry_plan``)
then states the same deadline again for each attempt, counted from the
attempt's start: never sooner than the call's. Stating it changed nothing
but cost a context variable's set and reset per attempt, so ``limit``
leaves a deadline that is as soon or sooner alone (and says so, None), and
``restore`` of that None is nothing to undo. A sooner deadline is still
stated, and undone, as before.
"""

from __future__ import annotations

import time

import pytest

from gds_counter import CounterShardDS, open_gateway
from gds_counter._process import deadlines
from gds_counter.errors import Contention
from gds_counter.gateway import plan
from gds_counter.gds.transaction import RetryPolicy, retry_plan


def test_a_later_deadline_inside_a_sooner_one_changes_nothing_and_needs_no_undoing():
    """Under a deadline 1 s away, a limit 10 s away is no limit at all: it
    is not set (None), the sooner one stands, and restoring the None keeps
    it standing."""
    outer = deadlines.limit(time.monotonic() + 1.0)
    try:
        assert outer is not None
        before = deadlines.remaining(100.0)
        inner = deadlines.limit(time.monotonic() + 10.0)
        assert inner is None
        assert deadlines.remaining(100.0) <= before
        deadlines.restore(inner)
        assert 0 < deadlines.remaining(100.0) <= before
    finally:
        deadlines.restore(outer)
    assert deadlines.remaining(100.0) == 100.0


def test_a_sooner_deadline_inside_a_later_one_is_stated_and_undone():
    """The other way round the inner deadline bounds the waits until it is
    restored, and then the outer one bounds them again."""
    outer = deadlines.limit(time.monotonic() + 10.0)
    try:
        inner = deadlines.limit(time.monotonic() + 0.5)
        assert inner is not None
        assert deadlines.remaining(100.0) <= 0.5
        deadlines.restore(inner)
        assert 0.5 < deadlines.remaining(100.0) <= 10.0
    finally:
        deadlines.restore(outer)


def test_each_attempt_of_a_retry_loop_waits_within_the_callers_deadline_and_no_longer_after_it():
    """What the attempts see: the caller's 0.3 s deadline, not the policy's
    30 s (the policy's is later, so it is not stated); the loop retries
    within it (drawing its backoff only once an attempt failed) and the
    caller's deadline is all that is left once the loop ended."""
    seen: list[float] = []

    def attempt() -> plan.Plan[int]:
        seen.append(deadlines.remaining(100.0))
        if len(seen) < 3:
            raise Contention("busy")
        return len(seen)
        yield  # pragma: no cover  (a plan)

    policy = RetryPolicy(attempts=5, initial=0.001, maximum=0.002, deadline=30.0)
    token = deadlines.limit(time.monotonic() + 0.3)
    try:
        assert plan.run(retry_plan(attempt, policy), None) == 3
        assert all(0 < left <= 0.3 for left in seen)
        assert 0 < deadlines.remaining(100.0) <= 0.3
    finally:
        deadlines.restore(token)
    assert deadlines.remaining(100.0) == 100.0


@pytest.mark.parametrize("deadline", [None, 30.0])
def test_a_counters_add_leaves_no_deadline_behind(deadline):
    """After an ``add`` (its call's deadline and its retry loop's, or none),
    the thread's storage waits are unbounded again."""
    counter = CounterShardDS("Deadline", 1, 5, gateway=open_gateway("memory://"), retry=RetryPolicy(deadline=deadline))
    counter.add(2)
    counter.add(3)
    assert deadlines.remaining(100.0) == 100.0
    assert counter.get_count() == 5
