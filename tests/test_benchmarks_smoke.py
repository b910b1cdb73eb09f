"""The benchmarks still run (tiny settings, SQLite only) and write their
records. No figure is asserted: figures belong in the benchmark output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sizes import size

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"

pytestmark = pytest.mark.slow

#: Rounds of the serve benchmark on the server alone (their median is reported).
ROUNDS = size(1, 3)


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


SQLITE_ONLY = ("--series", "embedded,sqlite-upsert", "--duration", "0.3", "--repeats", "2", "--warmup", "0",
               "--writers", "4", "--processes", "2")


def test_contention_goals_on_sqlite(tmp_path):
    done = _run("contention.py", *SQLITE_ONLY, "--out", str(tmp_path))
    record = json.loads((tmp_path / "contention.json").read_text())
    assert record["command"].startswith("python benchmarks/contention.py")
    assert {"python", "platform", "cpu_count", "packages", "git_commit"} <= set(record["environment"])
    runs = record["runs"]
    # both series, both layouts (1 x 4 and 2 x 2), both rounds
    assert {(r["series"], r["layout"], r["repeat"]) for r in runs} == {
        (s, layout, repeat) for s in ("embedded", "sqlite-upsert") for layout in ("1x4", "2x2") for repeat in (0, 1)}
    for run in runs:
        assert run["ok"] > 0 and run["failed"] == 0
        assert run["stored"] == run["acked"] == run["ok"] + run["warmup_calls"] and run["lost"] == 0
    embedded = [r for r in runs if r["series"] == "embedded"]
    assert all(r["totals_checked"] == r["ok"] and r["stale_totals"] == 0 for r in embedded)
    # At most one commit each (increments that overlap share one), and at
    # most one target query each (increments that finish together share
    # one read of the total).
    assert all(0 < r["rpcs_per_inc"] <= 2 for r in embedded)
    goals = {(g["goal"], g["layout"]): g for g in record["goals"]}
    assert goals[(4, "1x4")]["ratio"] > 0 and len(goals[(4, "2x2")]["rounds"]) == 2
    assert goals[(1, "1x4")]["met"] is None  # its series were not run
    assert goals[(5, "both")]["met"] is True
    assert "Goals met:" in done.stdout and "no previous run to compare with" in done.stdout
    assert (tmp_path / "contention.png").exists() or "matplotlib is not installed" in done.stdout

    # a second run with the same settings reports how far each goal ratio moved
    again = _run("contention.py", *SQLITE_ONLY, "--out", str(tmp_path))
    assert "compared with" in again.stdout
    agreement = json.loads((tmp_path / "contention.json").read_text())["agreement"]
    assert {(a["goal"], a["layout"]) for a in agreement["ratios"]} == {(4, "1x4"), (4, "2x2")}

    # docs/performance.md's tables come from a recorded run
    tables = _run("contention.py", "--markdown", str(tmp_path / "contention.json")).stdout
    assert "| 4. embedded `increment()` / raw sqlite3 upserts |" in tables and "of the run before it" in tables


@pytest.mark.emulator
@pytest.mark.full  # the quick run: the SQLite series above
def test_contention_every_series_on_the_emulator(tmp_path):
    _run("contention.py", "--duration", "0.3", "--repeats", "1", "--warmup", "0", "--writers", "2",
         "--processes", "2", "--no-compare", "--out", str(tmp_path))
    record = json.loads((tmp_path / "contention.json").read_text())
    runs = {(r["series"], r["layout"]): r for r in record["runs"]}
    assert len(runs) == 14
    for (series, _), run in runs.items():
        assert run["ok"] > 0
        if series in ("increment", "add", "transactional", "embedded"):
            assert run["lost"] == 0
    assert runs[("php-article", "1x2")]["ours_read"] == runs[("php-article", "1x2")]["stored"]
    assert runs[("add", "2x1")]["rpcs_per_inc"] == 1 and runs[("raw-put", "2x1")]["rpcs_per_inc"] == 1
    assert runs[("php-article", "2x1")]["rpcs_per_inc"] == 3  # query, lookup, commit
    assert [g["goal"] for g in record["goals"]] == [1, 1, 2, 2, 3, 3, 4, 4, 5]


LONE_SMALL = ("--series", "file,memory", "--calls", "20", "--rounds", "5", "--warmup", "10")
LONE_FILE_OPS = ("add", "increment", "get_count", "upsert", "select")


def test_lone_call_on_sqlite_and_memory(tmp_path):
    """The lone-call benchmark's record holds every round of every series,
    ours and raw, on a SQLite file and on memory; what each storage holds
    is exactly what was acknowledged; the ratios come with their rounds and
    the goals with a verdict; a second run compares each ratio with the
    first; the docs tables come from the record. No figure is asserted."""
    done = _run("lone_call.py", *LONE_SMALL, "--out", str(tmp_path))
    record = json.loads((tmp_path / "lone_call.json").read_text())
    assert record["benchmark"] == "lone-call" and record["command"].startswith("python benchmarks/lone_call.py")
    assert {"python", "platform", "cpu_count", "packages", "git_commit"} <= set(record["environment"])
    rounds = record["rounds"]
    expected = {("file", op) for op in LONE_FILE_OPS} | {("memory", op) for op in (*LONE_FILE_OPS, "dict")}
    assert {(r["storage"], r["op"], r["repeat"]) for r in rounds} == {
        (storage, op, repeat) for storage, op in expected for repeat in range(5)}
    assert all(r["calls"] == 20 and r["wall_s"] > 0 and r["user_s"] >= 0 and r["system_s"] >= 0 for r in rounds)
    # alternate rounds run the series in reverse order
    order = [[(r["storage"], r["op"]) for r in rounds if r["repeat"] == repeat] for repeat in (0, 1)]
    assert order[1] == order[0][::-1]

    # nothing lost: every counter, raw table and dict holds what was acknowledged
    exact = {(e["storage"], e["op"]): e for e in record["exact"]}
    assert set(exact) == {(s, op) for s in ("file", "memory") for op in ("add", "increment", "upsert")} | {
        ("memory", "dict")}
    for e in exact.values():
        assert e["exact"] is True and e["stored"] == e["acked"] >= 10 + 5 * 20
        assert e["lookup"] in (None, e["stored"])
    assert record["wrong_totals"] == []

    series = {(s["storage"], s["op"]): s for s in record["series"]}
    assert set(series) == expected
    for s in series.values():
        assert s["calls"] == 100 and s["wall_us"] > 0 and s["median_us"] <= s["p90_us"]
    assert series[("file", "upsert")]["statements_per_call"] == 1.0  # the raw baseline is one statement
    assert series[("memory", "dict")]["statements_per_call"] is None
    assert all(series[(storage, op)]["statements_per_call"] >= 1 and series[(storage, op)]["rpcs_per_call"] > 0
               for storage in ("file", "memory") for op in ("add", "increment", "get_count"))

    ratios = {(r["storage"], r["ours"], r["raw"]): r for r in record["ratios"]}
    assert set(ratios) == {("file", "add", "upsert"), ("file", "increment", "upsert"), ("file", "get_count", "select"),
                           ("memory", "add", "upsert"), ("memory", "add", "dict"),
                           ("memory", "increment", "upsert"), ("memory", "get_count", "select")}
    for r in ratios.values():
        assert len(r["rounds"]) == 5 and r["min"] <= r["max"] and r["ratio"] > 0
        assert isinstance(r["library_cpu_us"], float)
    goals = {key: r for key, r in ratios.items() if r["need"] is not None}
    assert {key: r["need"] for key, r in goals.items()} == {("file", "add", "upsert"): 1.5,
                                                            ("memory", "add", "upsert"): 20.0}
    assert all(r["met"] == (r["ratio"] <= r["need"]) for r in goals.values())
    assert "Goals met:" in done.stdout and "Exact: yes" in done.stdout
    assert "no previous run to compare with" in done.stdout
    assert (tmp_path / "lone_call.txt").read_text().startswith("Lone call, one thread")

    # a second run with the same settings reports how far each ratio moved
    again = _run("lone_call.py", *LONE_SMALL, "--out", str(tmp_path))
    assert "compared with" in again.stdout
    agreement = json.loads((tmp_path / "lone_call.json").read_text())["agreement"]
    assert {(a["storage"], a["ours"], a["raw"]) for a in agreement["ratios"]} == set(ratios)

    tables = _run("lone_call.py", "--markdown", str(tmp_path / "lone_call.json")).stdout
    assert "| file | `add()` / raw sqlite3 upsert |" in tables and "of the run before it" in tables


def test_lone_call_refuses_fewer_than_five_rounds(tmp_path):
    """Fewer than five alternating rounds give no median worth a ratio: refused
    before anything runs."""
    done = subprocess.run([sys.executable, str(BENCH / "lone_call.py"), "--rounds", "4", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "rounds >= 5" in done.stderr
    assert not (tmp_path / "lone_call.json").exists()


@pytest.mark.emulator
@pytest.mark.full  # the quick run: SQLite and memory above
def test_lone_call_on_the_emulator(tmp_path):
    """On the Firestore emulator: ours against Google's raw client, every
    call acknowledged stored, the RPCs of each call counted."""
    _run("lone_call.py", "--series", "emulator", "--emulator-calls", "5", "--rounds", "5", "--warmup", "3",
         "--no-compare", "--out", str(tmp_path))
    record = json.loads((tmp_path / "lone_call.json").read_text())
    ops = ("add", "increment", "get_count", "put", "lookup")
    assert {(r["storage"], r["op"], r["repeat"]) for r in record["rounds"]} == {
        ("emulator", op, repeat) for op in ops for repeat in range(5)}
    exact = {e["op"]: e for e in record["exact"]}
    assert set(exact) == {"add", "increment", "put"}
    assert all(e["exact"] is True and e["stored"] == e["acked"] >= 3 + 5 * 5 for e in exact.values())
    assert record["wrong_totals"] == []
    series = {s["op"]: s for s in record["series"]}
    assert series["put"]["rpcs_per_call"] == series["lookup"]["rpcs_per_call"] == 1  # one commit, one lookup
    assert all(series[op]["rpcs_per_call"] > 0 and series[op]["statements_per_call"] is None for op in ops)
    assert {(r["ours"], r["raw"]) for r in record["ratios"]} == {("add", "put"), ("increment", "put"),
                                                                  ("get_count", "lookup")}


FIRESTORE_SERIES = ("add", "page-increment", "increment", "page-increment-count")


@pytest.mark.emulator
def test_firestore_counters_on_the_native_emulator(tmp_path, firestore_native_emulator):
    """Issue 39's goal 8 benchmark, tiny, on the plugin's native-mode
    emulator (``--host``): every series of ours and of the page's in both
    layouts and both rounds, each run stored exactly what it acknowledged
    and both readers agree; the page's RPCs are counted as Firestore bills
    them; the 10,000-shard read (here 300) is measured exact, then from a
    fresh rollup in 1 RPC; the docs tables come from the record. No
    figure is asserted."""
    emulator = firestore_native_emulator
    done = _run("firestore_counters.py", "--host", emulator.host, "--project", emulator.project, "--duration", "0.3",
                "--repeats", "2", "--warmup", "0", "--writers", "2", "--processes", "2", "--rollup-shards", "300",
                "--out", str(tmp_path))
    record = json.loads((tmp_path / "firestore_counters.json").read_text())
    assert record["command"].startswith("python benchmarks/firestore_counters.py")
    runs = record["runs"]
    assert {(r["series"], r["layout"], r["repeat"]) for r in runs} == {
        (s, layout, repeat) for s in FIRESTORE_SERIES for layout in ("1x2", "2x1") for repeat in (0, 1)}
    assert len({r["database"] for r in runs}) == len(runs)  # each run in a database of its own
    for run in runs:
        assert run["ok"] > 0 and run["failed"] == 0, run
        assert run["stored"] == run["acked"] == run["ok"] + run["warmup_calls"] and run["lost"] == 0
        assert run["ours_read"] == run["page_read"]
        if run["series"] in ("increment", "page-increment-count"):
            assert run["totals_checked"] == run["ok"] and run["stale_totals"] == 0
        if run["series"] == "page-increment":
            assert run["rpcs_per_call"] == run["writes_per_call"] == 1  # one update
        if run["series"] == "page-increment-count":
            # the update, one page of list_documents (10 shards listed), a get of each
            assert run["rpcs_per_call"] == 12 and run["reads_per_call"] == 20
    goals = {(g["goal"], g["layout"]): g for g in record["goals"]}
    assert set(goals) == {(goal, layout) for goal in (1, 2) for layout in ("1x2", "2x1")}
    assert all(g["ratio"] > 0 and len(g["rounds"]) == 2 and g["need"] in (1.0, 3.0) for g in goals.values())
    reads = record["rollup"]["reads"]
    assert {r["total"] for r in reads.values()} == {record["rollup"]["expected"]}
    assert reads["exact"]["reads"] == 300 and reads["page_get_count"]["rpcs"] > 300
    assert reads["fresh_rollup"]["rpcs"] == reads["fresh_rollup"]["reads"] == 1 and record["rollup"]["met"] is True
    assert record["exact"]["met"] is True and "Exact (goal 4): yes" in done.stdout

    tables = _run("firestore_counters.py", "--markdown", str(tmp_path / "firestore_counters.json")).stdout
    assert "| 1. add() / the page's increment_counter() |" in tables and "fresh rollup | 1 | 1 |" in tables


def test_reads_on_sqlite(tmp_path):
    _run("reads.py", "--shards", "1,30", "--counters", "25", "--quick", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "reads.json").read_text())["rows"]
    lookup = {row["shards"]: row for row in rows if row["method"] == "get_count (lookup)"}
    assert lookup[1]["rpcs"] == lookup[30]["rpcs"] == 1
    [batch] = [row for row in rows if row["method"] == "get_counts (one batch)"]
    assert batch["rpcs"] == 1 and batch["entity_reads"] == 25 * 21


def test_counter_layer_on_memory_and_a_file(tmp_path):
    _run("counter_layer.py", "--calls", "20", "--rounds", "1", "--json", str(tmp_path / "lone.json"))
    record = json.loads((tmp_path / "lone.json").read_text())
    assert [row["backend"] for row in record["rows"]] == [
        "memory", "memory, storage stubbed", "sqlite file", "memory add, file upsert"]
    assert record["rows"][1]["add"]["python_calls"] > 0
    under_fsync = record["rows"].pop()
    for call in ("add", "raw_upsert", "add_then_upsert"):
        assert under_fsync[call]["cpu_us"] >= 0 and under_fsync[call]["python_calls"] > 0
    assert under_fsync["python_under_fsync"]["python_calls"] == under_fsync["add"]["python_calls"]
    del record["rows"][1]
    for row in record["rows"]:
        for call in ("add", "get_count", "increment", "hook_upsert"):
            assert row[call]["cpu_us"] >= 0 and row[call]["python_calls"] > 0


@pytest.mark.emulator
@pytest.mark.full  # the quick run: the other benchmarks' smokes
def test_mapper_overhead_on_the_datastore_emulator(tmp_path):
    _run("mapper_overhead.py", "--entities", "20", "--batch", "10", "--rounds", "1", "--out", str(tmp_path))
    record = json.loads((tmp_path / "mapper_overhead.json").read_text())
    rpcs = {row["step"]: row["rpcs"] for row in record["rows"]}
    assert rpcs == {"upsert single": 20, "upsert batch": 2, "fetch single": 20, "fetch batch": 2}
    assert all(row["ours_s"] > 0 and row["google_s"] > 0 for row in record["rows"])


def test_shard_choice_on_sqlite(tmp_path):
    done = _run("shard_choice.py", "--backend", "sqlite", "--quick", "--duration", "0.3", "--threads", "4",
                "--processes", "2", "--json", str(tmp_path / "shard_choice.json"))
    record = json.loads((tmp_path / "shard_choice.json").read_text())
    assert record["command"].startswith("python benchmarks/shard_choice.py")
    assert {"python", "platform", "cpu_count", "packages", "git_commit"} <= set(record["environment"])
    runs = record["runs"]
    # both choosers, both loads (1 x 4 and 2 x 2), both rounds, the chooser order alternating
    assert {(r["chooser"], r["load"], r["repeat"]) for r in runs} == {
        (c, load, repeat) for c in ("random", "affinity") for load in ("1x4", "2x2") for repeat in (0, 1)}
    assert [r["chooser"] for r in runs if r["repeat"] == 0][:2] == ["random", "affinity"]
    assert [r["chooser"] for r in runs if r["repeat"] == 1][:2] == ["affinity", "random"]
    assert len({r["counter"] for r in runs}) == len(runs)  # a fresh counter per run
    for run in runs:
        assert run["ok"] > 0 and run["failed"] == 0
        assert run["warmup_calls"] == run["processes"]  # one increment per process before the clock
        assert run["stored"] == run["acked"] == run["ok"] + run["warmup_calls"]
        assert run["stats"]["rpcs"] > 0
    rows = {(r["load"], r["chooser"]): r for r in record["rows"]}
    assert set(rows) == {(load, c) for load in ("1x4", "2x2") for c in ("random", "affinity")}
    assert all(r["exact"] == "yes" and r["rpcs_per_inc"] > 0 for r in rows.values())
    ratios = {r["load"]: r for r in record["ratios"]}
    assert set(ratios) == {"1x4", "2x2"} and all(r["ratio"] > 0 and len(r["round_ratios"]) == 2
                                                  for r in ratios.values())
    assert "affinity/random" in done.stdout and "Exact:" in done.stdout


@pytest.mark.full  # the quick run: the contention and shard-choice smokes on SQLite
def test_scale_curve_and_read_costs(tmp_path):
    done = _run("scale.py", "--shards", "1,3", "--duration", "0.5", "--processes", "2", "--threads", "2",
                "--json", str(tmp_path / "scale.json"), "--plot", str(tmp_path / "scale.png"))
    record = json.loads((tmp_path / "scale.json").read_text())
    assert record["command"].startswith("python benchmarks/scale.py")
    assert record["entity_writes_per_second"] == 2.0
    assert [p["shards"] for p in record["points"]] == [1, 3]
    for point in record["points"]:
        assert point["exact"] is True and point["ideal"] == point["shards"] * 2.0
        assert point["increments_per_second"] > 0 and point["combined_increments_per_second"] > 0
    reads = {r["read"]: r for r in record["reads"]}
    assert reads["rollup, max_age=3600"]["entity_reads"] == 1 and reads["rollup, max_age=3600"]["rpcs"] == 1
    assert reads["exact: batched lookup"]["entity_reads"] == 10_001
    assert "all exact" in done.stdout
    assert (tmp_path / "scale.png").exists() or "matplotlib is not installed" in done.stdout


def _serve_record(tmp_path, targets, repeats=1):
    done = _run("serve.py", "--targets", targets, "--threads", "2", "--duration", "0.2", "--php-seconds", "0.2",
                "--repeats", str(repeats), "--json", str(tmp_path / "serve.json"))
    return done, json.loads((tmp_path / "serve.json").read_text())


def test_serve_benchmark_on_the_server_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("PHP_GDS_SRC", raising=False)
    done, record = _serve_record(tmp_path, "serve", repeats=ROUNDS)
    assert record["command"].startswith("python benchmarks/serve.py --targets serve")
    assert {"python", "platform", "cpu_count", "packages", "git_commit"} <= set(record["environment"])
    [(target, serve)] = record["results"].items()
    assert target == "serve" and serve["command"].startswith("gds-counter serve --port ")
    assert 0 < serve["startup_http_s"] <= serve["startup_grpc_s"]
    assert serve["rss_idle_mb"] > 0 and serve["rss_load_peak_mb"] > 0 and serve["rss_after_load_mb"] > 0
    for name in ("puts", "lookups", "queries"):
        assert serve["rates"][name]["calls"] > 0 and serve["rates"][name]["failed"] == 0
        each = serve["rates"][name]["each"]
        assert len(each) == ROUNDS and serve["rates"][name]["per_second"] == sorted(each)[ROUNDS // 2] > 0  # the median
    assert serve["rates"]["php_increments"] == {"per_second": None, "reason": "PHP_GDS_SRC not set"}
    goals = {g["goal"].split()[0]: g for g in record["goals"]}
    assert goals["start-up"]["value"] == serve["startup_grpc_s"] and goals["start-up"]["met"] in (True, False)
    assert goals["resident"]["met"] in (True, False)
    assert all(goals[f"{name}/s"]["met"] is None for name in ("puts", "lookups", "queries", "php_increments"))
    assert "Goals (gds-counter serve):" in done.stdout and "not measured" in done.stdout
    assert "PHP_GDS_SRC not set" in done.stdout


@pytest.mark.emulator
@pytest.mark.full  # the quick run: the server alone above
def test_serve_benchmark_against_the_firestore_emulator(tmp_path, monkeypatch):
    monkeypatch.delenv("PHP_GDS_SRC", raising=False)
    _, record = _serve_record(tmp_path, "serve,firestore")
    results = record["results"]
    assert list(results) == ["serve", "firestore"]
    assert results["firestore"]["command"].startswith("gcloud ") and results["firestore"]["rss_idle_mb"] > 0
    goals = {g["goal"].split()[0]: g for g in record["goals"]}
    for name in ("puts", "lookups", "queries"):
        ratio = results["serve"]["rates"][name]["per_second"] / results["firestore"]["rates"][name]["per_second"]
        assert goals[f"{name}/s"]["value"] == pytest.approx(ratio) and goals[f"{name}/s"]["met"] == (ratio >= 1)
    assert goals["php_increments/s"]["met"] is None
