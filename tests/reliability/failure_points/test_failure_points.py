"""Failure points of every concurrency mechanism (issue 23, "Beyond the list").

For each mechanism, at every point where it blocks or hands work over
(``points.POINTS``), each fault is injected in turn (``harness``): an
interrupt, a task cancellation, a fork, a stall past the callers' deadline
and a crash of a process. After each, three things must hold for every
call of the scenario, the forked child's included:

1. no call hangs: each ends within its bound;
2. every increment that returned is stored exactly once (and none is
   stored twice, whatever its caller saw), and ``increment()`` returned a
   total holding its own amount once; with the cache, the cached total is
   the stored one once the calls ended;
3. every error's class tells the truth about whether the amount was stored.

And every named point must be reached: a point the code no longer has, or
no scenario reaches, fails its mechanism rather than testing nothing. The
full run (``pytest --full``) injects at every point; the quick run at one
point of each mechanism (``QUICK_POINTS``), every fault.

The scenarios of one mechanism run in processes of their own, one per
fault, side by side (a stall mostly sleeps). A failing scenario is listed
with the command that reproduces it alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from sizes import full

from failure_points.accounting import Summary
from failure_points.points import FAULTS, MECHANISMS, points_of

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() and SIGKILL (POSIX)"),
    pytest.mark.slow,
]

HERE = Path(__file__).resolve().parent
#: A mechanism's runners must all end within this (they bound each scenario themselves).
RUNNER_BOUND = 600
#: The quick run's point of each mechanism: one that every fault its faces
#: allow reaches at once. (The asyncio face's fork at the group commit's
#: ``queued`` and ``writes`` is reached by no scenario and costs three tries.)
QUICK_POINTS = {
    "affinity": "affinity.wrote",
    "aio": "aio.in_worker",
    "cache": "cache.write_ends",
    "combined_writes": "combined_writes.written",
    "documents": "documents.creates",
    "group_commit": "group_commit.write_lock",
    "lone": "lone.registers",
    "pool": "pool.release",
    "rounds": "rounds.start",
    "shared_reads": "shared_reads.answers",
}


def test_the_quick_run_has_a_point_of_every_mechanism() -> None:
    """A mechanism added without a quick point failed the quick run only
    (a KeyError), never the full one: both runs check it here."""
    assert sorted(QUICK_POINTS) == sorted(MECHANISMS)


def chosen_points(mechanism: str) -> list[str]:
    """The points of ``mechanism`` this run injects at: all in the full run."""
    names = [point.name for point in points_of(mechanism)]
    if full():
        return names
    assert QUICK_POINTS[mechanism] in names, f"{QUICK_POINTS[mechanism]} is not a point of {mechanism}"
    return [QUICK_POINTS[mechanism]]


def _run_mechanism(mechanism: str) -> tuple[list[dict[str, Any]], list[str]]:
    """Every fault's runner for ``mechanism``, side by side: their outcomes,
    and what went wrong with the runners themselves."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(HERE.parent), env.get("PYTHONPATH", "")) if p)
    problems: list[str] = []
    outcomes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="failure-points-") as directory:
        running = []
        for fault in FAULTS:
            out = os.path.join(directory, f"{fault}.json")
            which = ["--mechanism", mechanism] if full() else ["--point", *chosen_points(mechanism)]
            command = [sys.executable, "-m", "failure_points.runner", *which, "--fault", fault, "--out", out]
            running.append((fault, out, subprocess.Popen(
                command, cwd=HERE.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        for fault, out, process in running:
            try:
                log, _ = process.communicate(timeout=RUNNER_BOUND)
            except subprocess.TimeoutExpired:
                process.kill()
                log, _ = process.communicate()
                problems.append(f"{fault}: the runner did not end within {RUNNER_BOUND} s (a hang)")
            if process.returncode != 0 or not os.path.exists(out):
                problems.append(f"{fault}: the runner failed ({process.returncode}): {log[-2000:]}")
                continue
            with open(out, encoding="utf-8") as results:
                outcomes += json.load(results)
    return outcomes, problems


def summarize(outcomes: list[dict[str, Any]]) -> Summary:
    summary = Summary()
    for outcome in outcomes:
        verdicts = outcome["verdicts"]
        if outcome["fired"]:
            summary.points.add(outcome["point"])
            summary.injections += 1
        else:
            summary.unreached.append(f"{outcome['point']} / {outcome['fault']} / {outcome['face']}")
        summary.calls += sum(verdicts.values())
        for name in ("lost", "double", "untruthful", "stale", "hung"):
            setattr(summary, name, getattr(summary, name) + verdicts.get(name, 0))
        if outcome["failed"]:
            summary.failures.append({
                "scenario": f"{outcome['point']} / {outcome['fault']} / {outcome['face']} on {outcome['backend']}",
                "verdicts": {k: v for k, v in verdicts.items() if k != "ok"},
                "notes": outcome["notes"],
                "repro": outcome["repro"],
            })
    return summary


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_failure_points(mechanism: str, failure_point_results: Any) -> None:
    outcomes, problems = _run_mechanism(mechanism)
    summary = summarize(outcomes)
    failure_point_results.add(mechanism, summary)
    assert not problems, "\n".join(problems)
    never = sorted(set(chosen_points(mechanism)) - summary.points)
    assert not never, f"points no scenario reached (moved or renamed code?): {never}"
    assert not summary.failures, (
        f"{mechanism}: {summary.lost} lost, {summary.double} double-counted, {summary.untruthful} untruthful, "
        f"{summary.stale} stale, {summary.hung} hung of {summary.calls} calls:\n"
        + "\n".join(json.dumps(failure) for failure in summary.failures)
    )
