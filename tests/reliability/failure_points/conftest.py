"""The failure-point results of a run, per mechanism.

Each mechanism's test adds its summary here; at the end of the run they
are printed as a table and, when ``GDS_FAILURE_POINTS_RESULTS`` names a
file, written there as JSON (the README's reliability table lists these
counts)::

    GDS_FAILURE_POINTS_RESULTS=failure-points.json pytest tests/reliability/failure_points
"""

from __future__ import annotations

import json
import os
import threading
from typing import Any

import pytest

from failure_points.accounting import Summary

_lock = threading.Lock()
RESULTS: dict[str, Summary] = {}

COLUMNS = ("points", "injections", "calls", "lost", "double", "untruthful", "stale", "hung")


class Results:
    def add(self, mechanism: str, summary: Summary) -> None:
        with _lock:
            RESULTS.setdefault(mechanism, Summary()).add(summary)


@pytest.fixture
def failure_point_results() -> Results:
    return Results()


def table() -> str:
    lines = ["| mechanism | " + " | ".join(COLUMNS) + " |", "|" + "---|" * (len(COLUMNS) + 1)]
    for mechanism, summary in sorted(RESULTS.items()):
        row = summary.as_dict()
        lines.append(f"| {mechanism} | " + " | ".join(str(row[c]) for c in COLUMNS) + " |")
    return "\n".join(lines)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RESULTS:
        return
    terminalreporter.write_sep("=", "failure points")
    terminalreporter.write_line(table())
    path = os.environ.get("GDS_FAILURE_POINTS_RESULTS")
    if path:
        data = {mechanism: summary.as_dict() for mechanism, summary in sorted(RESULTS.items())}
        with open(path, "w", encoding="utf-8") as out:
            json.dump(data, out, indent=2, sort_keys=True)
        terminalreporter.write_line(f"written to {path}")
