"""The process a ``crash`` scenario kills: it runs the scenario's callers on
the SQLite file it is given, with the trap armed to SIGKILL this process at
the point, and tells its parent on stdout, line by line as it happens, which
calls started and how each ended (``start {json}``, ``done {json}``), so
that the parent knows exactly which calls were in flight when it died.
``end {json}`` means the point was never reached. Run by ``harness``."""

from __future__ import annotations

import json
import os
import sys
import threading

from failure_points.accounting import Call
from failure_points.harness import Scenario, run_scenario
from failure_points.points import POINTS

_out = threading.Lock()


def _say(kind: str, call: Call) -> None:
    line = json.dumps({"index": call.index, "outcome": call.outcome, "seconds": call.seconds,
                       "returned_total": call.returned_total})
    with _out:
        sys.stdout.write(f"{kind} {line}\n")
        sys.stdout.flush()


def main() -> None:
    spec = json.loads(sys.argv[1])
    point = next(p for p in POINTS if p.name == spec["point"])
    scenario = Scenario(point, "crash", spec["face"], "sqlite", workers=spec["workers"],
                        per_worker=spec["per_worker"], cache=spec["cache"], nth=spec["nth"])
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    outcome = run_scenario(scenario, directory=spec["directory"], report=_say)
    sys.stdout.write("end " + json.dumps({"hits": outcome.hits, "fired": outcome.fired}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
    os._exit(0)  # a hung caller's thread must not keep the process
