"""benchmarks/async_vs_threads.py still runs (tiny settings, the embedded
engine only) and writes its record. No figure is asserted: figures belong
in the benchmark's output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent.parent / "benchmarks" / "async_vs_threads.py"


@pytest.mark.slow
def test_async_vs_threads_runs_and_records_both_series(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--backends", "sqlite", "--rounds", "2", "--duration", "0.3",
         "--warmup", "0", "--tasks", "8", "--threads", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    record = json.loads((tmp_path / "async_vs_threads.json").read_text())
    assert record["command"].startswith("python benchmarks/async_vs_threads.py")
    assert {(r["series"], r["round"]) for r in record["runs"]} == {(s, n) for s in ("async", "threads") for n in (0, 1)}
    for run in record["runs"]:
        assert run["calls"] >= run["ok"] > 0 and run["lost"] == 0  # stored = acknowledged + the warm-up increment
        # At most one commit each (increments that overlap share one), and
        # at most one target query each (increments that finish together
        # share one read of the total).
        assert 0 < run["rpcs_per_inc"] <= 2
    assert [v["backend"] for v in record["verdicts"]] == ["sqlite"]
    assert (tmp_path / "async_vs_threads.png").exists() or "matplotlib is not installed" in done.stdout
