"""The harness itself: it reaches the line it names, it fails loudly when
that line is gone, and its accounting cannot be fooled (a double count, a
lost increment or a lying error is never read as fine)."""

from __future__ import annotations

import threading

import pytest

from failure_points.accounting import Call, amount_of, classify, classify_forked, stored_times
from failure_points.points import POINTS
from failure_points.tracer import Point, Trap, resolve


def sample(values: list[int]) -> int:
    """A stand-in for product code: the tracer stops it at its marked line."""
    total = 0
    for value in values:
        total += value  # the marked line
    return total


MARKED = Point("sample.adds", __name__, "sample", r"line:# the marked line")


def test_every_named_point_is_in_todays_source() -> None:
    """A refactor that renames a function or rewrites a marked line breaks
    this at once (before any scenario runs), so a point is never silently
    skipped."""
    for point in POINTS:
        resolve(point)
    assert len({point.name for point in POINTS}) == len(POINTS), "point names must be unique"


def test_a_point_that_is_gone_is_refused() -> None:
    with pytest.raises(LookupError):
        resolve(Point("sample.gone", __name__, "sample", r"line:no such line"))
    with pytest.raises(AttributeError):
        resolve(Point("sample.missing", __name__, "no_such_function", "call"))


def test_the_action_runs_once_at_the_nth_reach_and_raises_into_the_frame() -> None:
    """Raising in the trace function raises in the traced frame, at that
    line: the third addition never happens, in the thread that reached it."""
    seen: list[int] = []

    def action(frame: object) -> None:
        seen.append(threading.get_ident())
        raise KeyboardInterrupt("injected")

    trap = Trap(MARKED, action, nth=3)
    box: list[object] = []

    def victim() -> None:
        try:
            box.append(sample([1, 10, 100, 1000]))
        except KeyboardInterrupt as exc:
            box.append(exc)

    trap.install()
    try:
        thread = threading.Thread(target=victim)
        thread.start()
    finally:
        trap.uninstall()
    thread.join(10)
    assert not thread.is_alive()
    assert isinstance(box[0], KeyboardInterrupt)
    assert trap.fired and trap.hits == 3 and seen == [thread.ident]


def test_an_action_that_does_not_apply_waits_for_the_next_reach() -> None:
    reached: list[int] = []

    def action(frame: object) -> bool | None:
        reached.append(frame.f_locals["value"])  # type: ignore[attr-defined]
        return False if frame.f_locals["value"] < 100 else None  # type: ignore[attr-defined]

    trap = Trap(MARKED, action, nth=1)
    trap.install_here()
    try:
        assert sample([1, 10, 100, 1000]) == 1111
    finally:
        trap.uninstall()
    assert reached == [1, 10, 100] and trap.fired


def test_amounts_tell_how_often_each_call_was_stored() -> None:
    """Powers of four: a call stored twice shows as a 2 in its own digit,
    not as another call stored once (which powers of two would show)."""
    calls = [Call(i, outcome="ok") for i in range(5)]
    honest = sum(amount_of(i) for i in range(5))
    assert all(classify(call, honest) == "ok" for call in calls)
    doubled = honest + amount_of(2)
    assert stored_times(doubled, 2) == 2 and stored_times(doubled, 3) == 1
    assert classify(calls[2], doubled) == "double"
    lost = honest - amount_of(4)
    assert classify(calls[4], lost) == "lost"
    with pytest.raises(ValueError):
        amount_of(31)


@pytest.mark.parametrize(
    "outcome, stored, verdict",
    [
        ("Contention", 1, "untruthful"),  # said "not stored", was
        ("Contention", 0, "ok"),
        ("Unavailable", 1, "untruthful"),
        ("BadValueError", 1, "untruthful"),
        ("TransformsIgnored", 1, "untruthful"),
        ("TotalUnavailable", 0, "untruthful"),  # said "stored", was not
        ("TotalUnavailable", 1, "ok"),
        ("CountSaturated", 0, "untruthful"),
        ("CommitUnknown", 0, "ok"),  # "maybe": either is the truth
        ("CommitUnknown", 1, "ok"),
        ("Interrupted", 1, "ok"),
        ("Cancelled", 0, "ok"),
        ("Killed", 1, "ok"),
        ("RuntimeError", 0, "untruthful"),  # not a GDSError: nothing said
        ("hung", 1, "hung"),
        ("Cancelled", 2, "double"),  # twice is wrong whatever the caller saw
    ],
)
def test_each_outcome_is_judged_by_what_its_class_promises(outcome: str, stored: int, verdict: str) -> None:
    call = Call(3, outcome=outcome)
    assert classify(call, stored * amount_of(3) + amount_of(0)) == verdict


def test_an_increment_must_return_a_total_holding_its_own_amount_once() -> None:
    call = Call(1, outcome="ok", returned_total=amount_of(0))
    assert classify(call, amount_of(0) + amount_of(1)) == "stale"
    call.returned_total = amount_of(0) + amount_of(1)
    assert classify(call, amount_of(0) + amount_of(1)) == "ok"


@pytest.mark.parametrize(
    "parent, child, stored, verdict",
    [
        ("ok", "GatewayError", 1, "ok"),  # the child refused, the parent stored it
        ("ok", "TotalUnavailable", 1, "ok"),  # forked after the write: both truly say "stored" of one write
        ("ok", "ok", 2, "double"),  # the child committed its copy too
        ("ok", "GatewayError", 0, "lost"),  # the parent's acknowledged commit is gone
        ("GatewayError", "GatewayError", 1, "untruthful"),  # both said "not stored", and it was
        ("ok", "RuntimeError", 1, "untruthful"),  # not a GDSError in the child
        ("ok", "hung", 1, "hung"),
        ("Interrupted", "GatewayError", 1, "ok"),
    ],
)
def test_a_call_forked_inside_is_judged_on_both_sides(parent: str, child: str, stored: int, verdict: str) -> None:
    """A fork made inside a call (``Point.fork_here``) leaves one call going
    on in two processes: together they may store it once at most, and what
    each side says must fit what the one total shows."""
    total = stored * amount_of(2) + amount_of(0)
    assert classify_forked(Call(2, outcome=parent), Call(2, outcome=child, where="child"), total) == verdict
