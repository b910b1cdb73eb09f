"""The benchmarks still run (tiny settings, SQLite only) and write their
records. No figure is asserted: figures belong in the benchmark output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"

pytestmark = pytest.mark.slow


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_contention_on_sqlite_loses_nothing_of_ours(tmp_path):
    done = _run("contention.py", "--backend", "sqlite", "--shards", "1,5", "--duration", "0.3",
                "--writers", "4", "--out", str(tmp_path))
    record = json.loads((tmp_path / "contention.json").read_text())
    assert record["command"].startswith("python benchmarks/contention.py")
    assert {"python", "platform", "cpu_count", "packages", "git_commit"} <= set(record["environment"])
    ours = [run for run in record["runs"] if run["kind"] == "ours"]
    assert {run["series"] for run in ours} == {"transactional", "increment", "auto", "auto-grow", "general"}
    assert all(run["lost"] == 0 and run["final_count"] == run["ok"] + run["warmup"] for run in ours)
    assert {run["series"] for run in record["runs"] if run["kind"] == "baseline"} == {"php-article", "raw-gapic"}
    assert "Ratios" in done.stdout and "lost increments, our strategies: 0" in done.stdout


def test_contention_with_processes(tmp_path):
    _run("contention.py", "--backend", "sqlite", "--shards", "5", "--strategy", "auto", "--count", "40",
         "--writers", "4", "--processes", "2", "--out", str(tmp_path))
    runs = json.loads((tmp_path / "contention.json").read_text())["runs"]
    [auto] = [run for run in runs if run["series"] == "auto"]
    assert auto["ok"] + auto["failed"] == 40 and auto["lost"] == 0 and auto["warmup"] == 2


def test_reads_on_sqlite(tmp_path):
    _run("reads.py", "--shards", "1,30", "--counters", "25", "--quick", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "reads.json").read_text())["rows"]
    lookup = {row["shards"]: row for row in rows if row["method"] == "get_count (lookup)"}
    assert lookup[1]["rpcs"] == lookup[30]["rpcs"] == 1
    [batch] = [row for row in rows if row["method"] == "get_counts (one batch)"]
    assert batch["rpcs"] == 1 and batch["entity_reads"] == 25 * 21


@pytest.mark.emulator
def test_mapper_overhead_on_the_datastore_emulator(tmp_path):
    _run("mapper_overhead.py", "--entities", "20", "--batch", "10", "--rounds", "1", "--out", str(tmp_path))
    record = json.loads((tmp_path / "mapper_overhead.json").read_text())
    rpcs = {row["step"]: row["rpcs"] for row in record["rows"]}
    assert rpcs == {"upsert single": 20, "upsert batch": 2, "fetch single": 20, "fetch batch": 2}
    assert all(row["ours_s"] > 0 and row["google_s"] > 0 for row in record["rows"])
