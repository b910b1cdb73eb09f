"""Run the scenarios of one mechanism and one fault, in a process of its own.

Each pytest test of ``test_failure_points`` starts one of these per fault
(in parallel: a stall mostly sleeps), so that a fork, a crash, a hung
thread or a stray interrupt never reaches pytest's own process, and a
mechanism's whole run is bounded from outside. Also the way to reproduce
one scenario by hand (from ``tests/reliability``)::

    python -m failure_points.runner --point combined_writes.writes --fault interrupt --face threads --backend memory

Prints (or writes, ``--out``) the outcomes as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Iterator

from failure_points.harness import Scenario, run_scenario
from failure_points.points import FAULTS, POINTS, points_of
from failure_points.tracer import Point

__all__ = ["plan", "repro"]

#: A scenario whose point was not reached is tried again this many times
#: (reaching a waiting point needs callers to overlap, which timing decides).
TRIES = 3


def plan(point: Point, fault: str) -> Iterator[Scenario]:
    """The scenarios that inject ``fault`` at ``point``: every face that
    reaches it; in memory where that reaches it (fastest), on a file for a
    fork (where the connection pool's fork handling matters) and a crash
    (where another process carries on)."""
    faces = point.faces
    if fault == "cancel":
        faces = tuple(face for face in faces if face == "aio")
    elif fault in ("stall", "crash"):
        faces = faces[:1]  # one face: a stall costs its length, a crash a process
    if fault in ("fork", "crash"):
        backend = "sqlite" if "sqlite" in point.backends else ""
    else:
        backend = point.backends[0]
    if not backend:
        return
    for face in faces:
        yield Scenario(point, fault, face, backend, workers=point.crowd)


def repro(scenario: Scenario) -> str:
    return (f"cd tests/reliability && python -m failure_points.runner --point {scenario.point.name} "
            f"--fault {scenario.fault} --face {scenario.face} --backend {scenario.backend}")


def run(scenarios: list[Scenario]) -> list[dict[str, object]]:
    results = []
    for scenario in scenarios:
        for attempt in range(TRIES):
            if attempt:
                scenario.nth = 1  # reach it at all
            outcome = run_scenario(scenario)
            if outcome.fired:
                break
        data = outcome.as_dict()
        data["repro"] = repro(scenario)
        data["failed"] = outcome.failed
        results.append(data)
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mechanism")
    parser.add_argument("--point")
    parser.add_argument("--fault", choices=FAULTS, required=True)
    parser.add_argument("--face", choices=("threads", "aio"))
    parser.add_argument("--backend", choices=("memory", "sqlite"))
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.point:
        points = [p for p in POINTS if p.name == args.point]
        if not points:
            parser.error(f"no point named {args.point!r}")
    else:
        points = points_of(args.mechanism)
    scenarios = [s for p in points for s in plan(p, args.fault)]
    if args.point and (args.face or args.backend):
        chosen = [s for s in scenarios if (not args.face or s.face == args.face)]
        scenarios = chosen or [Scenario(points[0], args.fault, args.face or points[0].faces[0], args.backend or "memory")]
        if args.backend:
            for s in scenarios:
                s.backend = args.backend
    results = run(scenarios)
    text = json.dumps(results, indent=1)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        print(text)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
    # Out at once: a hung caller's worker thread (an executor joins its
    # threads at exit) must not keep the process, and its hang is reported.
    os._exit(0)
