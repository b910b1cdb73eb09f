"""Failure points at the Firestore gateway's RPCs, on the official emulator
in native mode (issue 39).

``DistributedCounter``'s callers meet each fault of ``FIRESTORE_FAULTS`` at
each point of the mechanism ``firestore`` (``points.POINTS``: any RPC as it
is sent, the recording transaction's begin, a read of the total, a commit as
it is sent and once it was applied): an interrupt on the thread face, a
cancellation on the asyncio face (the thread face has none) and a stall
past the callers' deadline on the thread face. Then every call is
accounted for as in ``test_failure_points``: none hangs, every returned
increment is stored exactly once, every error's class tells the truth
about whether it was stored, the cache shows the stored total, and every
shard document the counter documents record exists.

The scenarios run in this process, one after another, each on an emulator
cleared first (native mode has no namespaces). No fork and no crash here:
those are the embedded engine's (``test_failure_points``), where a child
or a second process shares the storage. The quick run injects at one
point (``QUICK_POINT``), the full one (``pytest --full``) at every point.
"""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest
from sizes import full

from failure_points.harness import Scenario, run_scenario
from failure_points.points import FIRESTORE_FAULTS, POINTS
from failure_points.runner import TRIES
from failure_points.test_failure_points import summarize

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

MECHANISM = "firestore"
#: The quick run's point: a commit was applied, its caller not answered.
QUICK_POINT = "firestore.committed"


def scenarios(fault: str, url: str) -> Iterator[Scenario]:
    points = [point for point in POINTS if point.name.split(".")[0] == MECHANISM]
    if not full():
        points = [point for point in points if point.name == QUICK_POINT]
    face = "aio" if fault == "cancel" else "threads"
    for point in points:
        yield Scenario(point, fault, face, "firestore", url=url)


def repro(scenario: Scenario) -> str:
    return (f"pytest tests/reliability/failure_points/test_firestore_points.py --full -k {scenario.fault}"
            f"  # {scenario.label}")


@pytest.mark.parametrize("fault", FIRESTORE_FAULTS)
def test_firestore_failure_points(fault: str, firestore_native_emulator: Any, monkeypatch: pytest.MonkeyPatch,
                                  failure_point_results: Any) -> None:
    for name, value in firestore_native_emulator.env.items():  # firestore://PROJECT finds the emulator so
        monkeypatch.setenv(name, value)
    outcomes: list[dict[str, Any]] = []
    for scenario in scenarios(fault, f"firestore://{firestore_native_emulator.project}"):
        for attempt in range(TRIES):
            if attempt:
                scenario.nth = 1  # reach it at all
            firestore_native_emulator.clear()
            outcome = run_scenario(scenario)
            if outcome.fired:
                break
        data = outcome.as_dict()
        data["repro"] = repro(scenario)
        data["failed"] = outcome.failed
        outcomes.append(data)
    summary = summarize(outcomes)
    failure_point_results.add(MECHANISM, summary)
    assert not summary.unreached, f"points no scenario reached (moved or renamed code?): {summary.unreached}"
    assert not summary.failures, (
        f"{MECHANISM} / {fault}: {summary.lost} lost, {summary.double} double-counted, {summary.untruthful} "
        f"untruthful, {summary.stale} stale, {summary.hung} hung of {summary.calls} calls:\n"
        + "\n".join(json.dumps(failure) for failure in summary.failures)
    )


def test_a_transaction_interrupted_as_its_commit_is_sent_is_rolled_back(firestore_native_gateway: Any) -> None:
    """An interrupt (or any exception that is no answer of the server) as
    a transaction's commit is about to be sent: the transaction's rollback
    must still be sent. Native mode locks what a transaction read; left
    open, the transaction held its lock on the counter document until it
    expired, and every other transaction on it waited and failed
    ("Transaction lock timeout", ``Contention``): the harness's interrupt
    at ``firestore.commits`` found it, as every later recording of the
    counter failing past its deadline. (The commit had used its
    transaction up before it was sent, so the rollback was skipped.)"""
    from failure_points.tracer import Trap
    from gds_counter.gateway import plan
    from gds_counter.gateway.keys import Key
    from gds_counter.gateway.mutations import Upsert
    from gds_counter.gateway.values import RawEntity

    key = Key.of("counters", "likes")
    [commits] = [point for point in POINTS if point.name == "firestore.commits"]

    def record(token: bytes) -> Any:
        [found] = yield from plan.lookup([key], transaction=token)  # locks the document
        return [Upsert(RawEntity(key, {"num_shards": 1 + (found.properties["num_shards"] if found else 0)}))]

    def interrupt(frame: Any) -> None:
        raise KeyboardInterrupt("injected as the commit is sent")

    trap = Trap(commits, interrupt)
    trap.install_here()  # this thread only
    try:
        with pytest.raises(KeyboardInterrupt):
            plan.run(plan.in_transaction(record), firestore_native_gateway)
    finally:
        trap.uninstall()
    assert trap.fired
    plan.run(plan.in_transaction(record), firestore_native_gateway)  # the document is not locked
    assert firestore_native_gateway.lookup([key])[0].properties == {"num_shards": 1}
