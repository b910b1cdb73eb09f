"""Reliability tests: faults, crashes, restarts, hostile input, load.

Every test adds what it actually did (faults injected, crashes survived,
hostile inputs tried, increments lost, double counts) to one session-wide
tally. The tally is printed as a table at the end of the run and, when
``GDS_RELIABILITY_RESULTS`` names a file, written there as JSON::

    GDS_RELIABILITY_RESULTS=reliability.json pytest tests/reliability
"""

from __future__ import annotations

import json
import os
import threading
from collections import Counter
from typing import Any

import pytest


class Tally:
    """Thread-safe session totals, plus one row per test area."""

    FIELDS = (
        "operations",
        "faults_injected",
        "crashes_survived",
        "hostile_inputs",
        "increments_lost",
        "double_counts",
        "reported_unknown",
    )

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: dict[str, Counter[str]] = {}
        self.faults: Counter[str] = Counter()

    def add(self, area: str, **counts: int) -> None:
        with self._lock:
            row = self.rows.setdefault(area, Counter())
            for name, value in counts.items():
                if name not in self.FIELDS:
                    raise KeyError(f"unknown tally field {name!r}")
                row[name] += int(value)

    def add_faults(self, area: str, injected: dict[str, int]) -> None:
        with self._lock:
            self.faults.update(injected)
        self.add(area, faults_injected=sum(injected.values()))

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            rows = {area: {f: row.get(f, 0) for f in self.FIELDS} for area, row in sorted(self.rows.items())}
            totals = {f: sum(r[f] for r in rows.values()) for f in self.FIELDS}
            return {"rows": rows, "totals": totals, "faults_by_kind": dict(sorted(self.faults.items()))}

    def table(self) -> str:
        data = self.as_dict()
        head = ("area",) + self.FIELDS
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for area, row in data["rows"].items():
            lines.append("| " + " | ".join([area] + [str(row[f]) for f in self.FIELDS]) + " |")
        lines.append("| **total** | " + " | ".join(str(data["totals"][f]) for f in self.FIELDS) + " |")
        if data["faults_by_kind"]:
            lines.append("")
            lines.append("faults by kind: " + ", ".join(f"{k}={v}" for k, v in data["faults_by_kind"].items()))
        return "\n".join(lines)


TALLY = Tally()


@pytest.fixture
def tally() -> Tally:
    return TALLY


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not TALLY.rows:
        return
    terminalreporter.write_sep("=", "reliability results")
    terminalreporter.write_line(TALLY.table())
    path = os.environ.get("GDS_RELIABILITY_RESULTS")
    if path:
        with open(path, "w", encoding="utf-8") as out:
            json.dump(TALLY.as_dict(), out, indent=2, sort_keys=True)
        terminalreporter.write_line(f"written to {path}")
