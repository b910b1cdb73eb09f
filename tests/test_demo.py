"""``gds-counter demo --quick``: the workshop in one command, and the load
runner (``gds_counter._load``) it shares with the benchmarks and the
reliability tests."""

from __future__ import annotations

import ast
import io
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import gds_counter
from gds_counter._demo import run_demo
from gds_counter._load import LoadResult, percentile, run_load, start_load
from gds_counter.counter import CounterShardDS
from gds_counter.errors import BadValueError, Contention, GDSError

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


@pytest.mark.full  # the quick run: the same demo in process, above
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
    import gds_counter._demo as demo

    monkeypatch.setattr(demo, "new_figure", lambda *size: "matplotlib is not installed")
    lines: list[str] = []
    result = run_demo(lines.append, quick=True, plot=tmp_path / "x.png",
                      settings=demo.Settings(writers=4, seconds=0.5))
    assert result.all_counted
    assert result.plot is None
    assert "No plot: matplotlib is not installed" in lines
    assert not (tmp_path / "x.png").exists()
    [lookup, query, cached, page] = result.reads
    assert (lookup[1], query[1], cached[1], page[1]) == (1, 1, 0, 1)  # RPCs
    assert lookup[2] == 21 and cached[2] == 0  # 20 shards + the config entity; a cached read is free


def test_step_text_reports_what_was_measured(tmp_path):
    lines: list[str] = []
    result = run_demo(lines.append, plot=None, settings=demo_module().Settings(writers=4, seconds=0.5))
    text = "\n".join(lines)
    assert "here: the same one" not in text and "so refusals" not in text
    # It says how shards are chosen as the code chooses them, not as the articles do.
    assert "it chooses shards as a separate process does" in text
    assert "Each instance starts\n   at a place of its own on the ring of shards" in text
    assert "each retry, picks a\n   random shard" not in text
    one, sharded, server = result.steps
    assert f"conflicting attempts retried with backoff: {one.retries}" in text
    assert f"{sharded.load.rate / one.load.rate:.1f}x the increments per second of step 1." in text
    refused = (f"{server.load.failed} were refused even without a read" if server.load.failed
               else "None was refused in this run.")
    assert refused in text
    assert (f"{server.per_increment(server.rpcs):.2f} RPCs per counted increment, against "
            f"{sharded.per_increment(sharded.rpcs):.2f} with transactions in step 2.") in text


def test_each_modelled_app_instance_chooses_shards_as_a_process_of_its_own(tmp_path):
    """The demo's writers stand for separate app instances, so they must not
    share this process's shard order: instances started together begin at
    different shards, as processes with consecutive ids do (test_affinity),
    instead of all taking the first shard of one order and meeting there.
    Without that the sharded step measured no gain on the Firestore emulator
    (1.1/s on 20 shards against 1.0/s on one entity): every instance met the
    others on one shard and waited out its lock."""
    demo = demo_module()
    storage = demo._Storage(None, rate=1e9, folder=str(tmp_path))  # no write limit: only the choice counts
    gateways = storage.open(8)
    try:
        for gateway in gateways:  # each instance counts once, one after the other
            CounterShardDS("Workshop", 20, num_shards=20, gateway=gateway, strategy="transactional").add()
        shards = dict(CounterShardDS("Workshop", 20, num_shards=20, gateway=gateways[0]).shards())
    finally:
        for gateway in gateways:
            gateway.close()
    assert sum(shards.values()) == 8
    assert sorted(count for count in shards.values() if count) == [1] * 8, shards


def demo_module():
    import gds_counter._demo as demo

    return demo


def test_the_plot_shows_the_model_limit_the_values_and_says_what_it_shows(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    demo = demo_module()
    figures = []
    real = demo.new_figure

    def keep(*size):
        made = real(*size)
        figures.append(made[0])
        return made

    monkeypatch.setattr(demo, "new_figure", keep)
    settings = demo.Settings(writers=4, seconds=0.5, rate=5)
    result = run_demo(lambda line: None, plot=tmp_path / "p.png", settings=settings)
    assert (tmp_path / "p.png").stat().st_size > 0
    [figure] = figures
    writing, cost = figure.axes
    limit = [line for line in writing.get_lines() if list(line.get_ydata()) == [5, 5]]
    assert len(limit) == 1 and "modelled limit of one entity: 5 writes/s" in limit[0].get_label()
    labels = [text.get_text() for text in writing.texts]
    assert labels == [f"{step.load.rate:.1f}/s" for step in result.steps]
    assert [text.get_text() for text in cost.texts] == [f"{s.per_increment(s.rpcs):.2f}" for s in result.steps]
    title = figure._suptitle.get_text()
    assert "4 writer threads" in title and "0.5 s per step" in title and "MODEL (5 writes/s" in title
    assert "increments counted per second" in writing.get_title()
    assert "RPCs per counted increment" in cost.get_title()


@pytest.mark.parametrize(
    "option",
    [["--writers", "0"], ["--writers", "-2"], ["--writers", "1.5"], ["--seconds", "0"], ["--seconds", "nan"],
     ["--rate", "0"], ["--rate", "inf"], ["--rate", "x"]],
)
def test_bad_demo_options_exit_2_naming_the_value(option, capsys):
    from gds_counter.cli import main

    out = io.StringIO()
    assert main(["demo", "--no-plot", *option], out=out) == 2
    err = capsys.readouterr().err
    assert out.getvalue() == ""  # refused before the demo started
    assert f"argument {option[0]}" in err and repr(option[1]) in err
    assert "Settings(" not in err


def test_bad_settings_in_code_are_refused_clearly():
    demo = demo_module()
    for field, value in (("writers", 0), ("seconds", 0.0), ("rate", -1.0), ("writers", 2.5), ("shards", 0)):
        with pytest.raises(BadValueError, match=f"demo's {field} must be a positive"):
            demo.Settings(**{field: value})


def test_a_plot_in_a_missing_directory_is_refused_before_the_demo_runs(tmp_path):
    from gds_counter.cli import main

    out, err = io.StringIO(), io.StringIO()
    target = tmp_path / "nonexistent" / "dir" / "x.png"
    assert main(["demo", "--quick", "--plot", str(target)], out=out, err=err) == 2
    assert out.getvalue() == ""
    assert f"the directory {target.parent} does not exist" in err.getvalue()
    assert not (tmp_path / "nonexistent").exists()
    assert main(["demo", "--quick", "--plot", str(tmp_path)], out=out, err=err) == 2
    assert "is the directory" in err.getvalue()


def test_git_ignores_what_the_demo_and_the_cli_leave_behind():
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    names = ["gds_counter_demo.png", "gds_counter.sqlite3", "gds_counter.sqlite3-wal", "gds_counter.sqlite3-shm",
             "x.db-wal", "x.db-shm", "x.db-journal"]
    done = subprocess.run(["git", "check-ignore", *names], cwd=root, capture_output=True, text=True)
    assert done.stdout.split() == names


def test_the_product_never_imports_test_tooling():
    """The demo and the CLI are product code: no import of gds_counter.testing
    (fixtures, fault injection) anywhere outside that package."""
    package = Path(gds_counter.__file__).parent
    offenders = []
    for path in package.rglob("*.py"):
        if "testing" in path.relative_to(package).parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            if any(name == "gds_counter.testing" or name.startswith("gds_counter.testing.") for name in names):
                offenders.append(f"{path.relative_to(package)}:{node.lineno}")
    assert offenders == []


# --- the load runner -------------------------------------------------------------------


def test_run_load_counts_successes_and_failures_by_type():
    calls = iter(range(1000))
    lock = threading.Lock()

    def make_op():
        def op():
            with lock:
                n = next(calls)
            if n % 4 == 0:
                raise ValueError("every fourth call fails")

        return op

    result = run_load(make_op, writers=3, count=40)
    assert result.ok + result.failed == 40
    assert result.errors["ValueError"] == result.failed == 10
    assert "every fourth call fails" in (result.first_error or "")
    assert len(result.first_errors) == 5  # the first few, not all ten
    assert len(result.latencies) == result.ok
    assert result.slowest_failure > 0


def test_one_writer_runs_in_order_in_the_calling_thread():
    seen = []
    result = run_load(lambda: lambda: seen.append((len(seen), threading.current_thread())), count=5)
    assert seen == [(i, threading.current_thread()) for i in range(5)]
    assert result.ok == 5 and result.failed == 0


def test_an_exception_outside_counted_stops_the_load_and_is_raised():
    calls = []

    def op():
        calls.append(1)
        if len(calls) == 3:
            raise KeyError("a bug, not load")
        raise Contention("busy", attempts=1)

    with pytest.raises(KeyError, match="a bug"):
        run_load(lambda: op, count=10, counted=(Contention,))
    assert len(calls) == 3
    with pytest.raises(KeyError):
        calls.clear()
        run_load(lambda: op, writers=2, duration=5.0, counted=(GDSError,))


def test_duration_and_rate():
    """``rate`` puts each writer's calls on a fixed schedule, 1/rate apart
    from the start, and ``duration`` ends the schedule: a writer makes the
    calls whose slots fall inside the duration, however late it runs
    (it catches up), and never a call before its slot. Checked on the calls
    themselves, not on how long the machine took."""
    rate, duration = 20, 0.325  # slots at 0, 0.05, ..., 0.30 s: 7 per writer
    slots = 7
    started: dict[str, list[float]] = {}
    lock = threading.Lock()

    def make_op():
        def op():
            with lock:
                started.setdefault(threading.current_thread().name, []).append(time.perf_counter())

        return op

    before = time.perf_counter()
    done: list[LoadResult] = []
    runner = threading.Thread(target=lambda: done.append(run_load(make_op, writers=2, duration=duration, rate=rate)),
                              daemon=True)
    runner.start()
    runner.join(120)  # a bound, not a speed check: a load that never ends fails here
    assert done, "run_load(duration=...) did not end"
    [result] = done
    assert result.ok == 2 * slots
    assert sorted(len(calls) for calls in started.values()) == [slots, slots]
    for calls in started.values():
        for k, at in enumerate(calls):
            assert at - before >= k / rate - 0.001  # never ahead of its slot (a timed wait may wake a hair early)
    assert result.elapsed >= (slots - 1) / rate
    both = run_load(lambda: lambda: None, duration=5.0, count=7)  # whichever ends first
    assert both.ok == 7


def test_start_load_runs_until_stopped_and_counts_live():
    calls = iter(range(10**9))

    def flaky():
        if next(calls) % 3 == 0:  # next() on one shared iterator: atomic under the GIL
            raise Contention("busy", attempts=1)

    load = start_load(lambda: flaky, writers=2, counted=(Contention,), pause_after_error=0.001)
    deadline = time.monotonic() + 5
    while load.ok < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert load.running and load.ok >= 20
    load.stop()
    assert load.join(5)
    assert not load.running and not load.unexpected
    result = load.result()
    assert result.ok >= 20 and set(result.errors) <= {"Contention"}
    assert result.elapsed > 0


def test_bad_load_settings_are_refused():
    for kwargs in ({"writers": 0, "count": 1}, {"count": -1}, {"duration": 0}, {"count": 1, "rate": 0},
                   {"count": 1, "pause_after_error": -1}, {}):
        with pytest.raises(BadValueError):
            run_load(lambda: lambda: None, **kwargs)


def test_percentile_is_nearest_rank():
    data = [float(i) for i in range(1, 101)]
    assert percentile(data, 0.5) == 50.0
    assert percentile(data, 0.99) == 99.0
    assert percentile([], 0.5) is None
    merged = LoadResult(ok=1, elapsed=2.0, first_errors=["A: a"])
    merged.merge(LoadResult(ok=3, elapsed=1.0, first_errors=["B: b"], slowest_failure=0.5))
    assert (merged.ok, merged.elapsed, merged.rate) == (4, 2.0, 2.0)
    assert merged.first_errors == ["A: a", "B: b"] and merged.slowest_failure == 0.5
