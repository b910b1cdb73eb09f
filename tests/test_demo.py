"""``gds-counter demo --quick``: the workshop in one command."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

from gds_counter.demo import LoadResult, hammer, percentile, run_demo

FINAL = re.compile(r"^\s+(?P<title>.+?)\s+final count\s+(?P<final>\d+) = counted\s+(?P<counted>\d+)\s+ok$", re.M)


def _check_output(text: str) -> None:
    finals = FINAL.findall(text)
    assert [title for title, _, _ in finals] == ["one entity", "sharded", "server-side increment"]
    for _, final, counted in finals:
        assert final == counted and int(final) > 0
    assert "MODEL" in text  # the write limit is labelled as a model
    assert "RPCs" in text and "entity reads" in text


def test_demo_quick_in_process(tmp_path):
    from gds_counter.cli import main

    out = io.StringIO()
    plot = tmp_path / "demo.png"
    assert main(["demo", "--quick", "--plot", str(plot)], out=out) == 0
    text = out.getvalue()
    _check_output(text)
    assert plot.exists() and plot.stat().st_size > 0
    assert f"Plot saved to {plot.resolve()}" in text


def test_demo_quick_as_a_command(tmp_path):
    env = dict(os.environ)
    for name in ("GDS_URL", "DATASTORE_EMULATOR_HOST"):
        env.pop(name, None)
    done = subprocess.run(
        [sys.executable, "-m", "gds_counter.cli", "demo", "--quick", "--no-plot"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    _check_output(done.stdout)
    assert list(tmp_path.iterdir()) == []  # no plot, no stray database in the working directory


def test_run_demo_reports_results_and_skips_the_plot_without_matplotlib(tmp_path, monkeypatch):
    import gds_counter.demo as demo

    monkeypatch.setattr(demo, "new_figure", lambda *size: "matplotlib is not installed")
    lines: list[str] = []
    result = run_demo(lines.append, quick=True, plot=tmp_path / "x.png",
                      settings=demo.Settings(writers=4, seconds=0.5))
    assert result.all_counted
    assert result.plot is None
    assert "No plot: matplotlib is not installed" in lines
    assert not (tmp_path / "x.png").exists()
    [lookup, cached, query, page] = result.reads
    assert (lookup[1], cached[1], query[1], page[1]) == (1, 0, 1, 1)  # RPCs


def test_hammer_counts_successes_and_failures_by_type():
    calls = iter(range(1000))

    def make_op():
        def op():
            if next(calls) % 4 == 0:
                raise ValueError("every fourth call fails")

        return op

    result = hammer(make_op, writers=3, count=40)
    assert result.ok + result.failed == 40
    assert result.errors["ValueError"] == result.failed == 10
    assert "every fourth call fails" in (result.first_error or "")
    assert len(result.latencies) == result.ok


def test_percentile_is_nearest_rank():
    data = [float(i) for i in range(1, 101)]
    assert percentile(data, 0.5) == 50.0
    assert percentile(data, 0.99) == 99.0
    assert percentile([], 0.5) is None
    merged = LoadResult(ok=1, elapsed=2.0)
    merged.merge(LoadResult(ok=3, elapsed=1.0))
    assert (merged.ok, merged.elapsed, merged.rate) == (4, 2.0, 2.0)
