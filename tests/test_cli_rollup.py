"""``gds-counter count --max-age``, ``list --max-age``, ``rollup`` and
``size``: rollups and shard sizing from a shell (run in-process
against a SQLite file, and ``rollup`` twice at once as cron might)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time

import pytest

from gds_counter.cli import main
from gds_counter.counter import PHP_ARTICLE, CounterShardDS, size_shards
from gds_counter.counter import rollup as rollup_module
from gds_counter.gateway import open_gateway, plan
from gds_counter.gateway.query import Query


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'cli.sqlite3'}"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err, stdin=io.StringIO())
    return code, out.getvalue(), err.getvalue()


def _rollups(url: str) -> dict[str, int]:
    gateway = open_gateway(url)
    try:
        found = plan.run(plan.query_all(Query(PHP_ARTICLE.rollup_kind)), gateway)
        return {e.key.name: e.properties["total"] for e in found}
    finally:
        gateway.close()


def test_count_with_max_age_reads_the_rollup_and_says_when(url):
    run("--url", url, "increment", "Counter Test", "1", "-n", "3")
    code, out, _ = run("--url", url, "count", "Counter Test", "1", "--max-age", "60", "--json")
    first = json.loads(out)
    assert code == 0 and (first["count"], first["from_rollup"]) == (3, False)
    run("--url", url, "increment", "Counter Test", "1")
    code, out, _ = run("--url", url, "count", "Counter Test", "1", "--max-age", "60", "--json")
    assert json.loads(out) == {**first, "from_rollup": True}  # up to 60 s old: the rollup
    assert run("--url", url, "count", "Counter Test", "1") == (0, "4\n", "")  # exact
    assert run("--url", url, "count", "Counter Test", "1", "--max-age", "0") == (0, "4\n", "")


def test_list_with_max_age_finds_every_counter_by_key(url):
    for target_id, n in (("1", 2), ("2", 5), ("x_9", 1)):
        run("--url", url, "increment", "Counter Test", target_id, "-n", str(n))
    code, out, _ = run("--url", url, "list", "--max-age", "30", "--json")
    rows = json.loads(out)
    assert code == 0
    assert [(r["target"], r["count"]) for r in rows] == [("Counter Test_1", 2), ("Counter Test_2", 5), ("Counter Test_x_9", 1)]
    assert _rollups(url) == {"Counter Test_1": 2, "Counter Test_2": 5, "Counter Test_x_9": 1}
    code, out, _ = run("--url", url, "list", "--max-age", "30")
    assert out.splitlines()[0].split() == ["count", "as", "of", "(UTC)", "target"]
    assert out.splitlines()[1].split()[0] == "2" and out.splitlines()[1].endswith("Counter Test_1")


def test_rollup_refreshes_every_counter_and_skips_fresh_ones(url):
    for target_id in range(1, 31):  # more than one transaction's batch of 25
        run("--url", url, "increment", "Page", str(target_id), "-n", str(target_id))
    code, out, _ = run("--url", url, "rollup", "--json")
    assert code == 0 and json.loads(out) == {"counters": 30, "fresh": 0, "read": 30, "written": 30, "failed": 0}
    assert _rollups(url) == {f"Page_{n}": n for n in range(1, 31)}
    run("--url", url, "increment", "Page", "7", "-n", "100")
    assert json.loads(run("--url", url, "rollup", "--max-age", "3600", "--json")[1])["written"] == 0
    assert json.loads(run("--url", url, "rollup", "--json")[1])["written"] == 30  # --max-age 0: every one
    assert _rollups(url)["Page_7"] == 107


def test_two_rollup_runs_at_once_each_write_a_generation_once(tmp_path):
    url = f"sqlite:///{tmp_path / 'cron.sqlite3'}"
    for target_id in range(1, 61):
        run("--url", url, "increment", "Page", str(target_id))
    command = [sys.executable, "-m", "gds_counter", "--url", url, "rollup", "--json"]
    runs = [subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [process.communicate(timeout=120) for process in runs]
    assert [process.returncode for process in runs] == [0, 0], results
    reports = [json.loads(out) for out, _ in results]
    # Each run writes a counter's rollup only if no other run claimed the
    # generation it found: 60 when both found the same ones, up to 120 when
    # one run found what the other had just written (a newer generation).
    assert 60 <= sum(r["written"] for r in reports) <= 120 and all(r["counters"] == 60 for r in reports)
    assert _rollups(url) == {f"Page_{n}": 1 for n in range(1, 61)}


def test_rollup_exits_1_when_a_rollup_could_not_be_written(url):
    """Another process holds the file's write lock past the deadline: the
    totals are read, their rollups fail, and cron learns it from the code."""
    import sqlite3

    run("--url", url, "increment", "Page", "1")
    holder = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        began = time.monotonic()
        code, out, err = run("--url", url, "--timeout", "1", "rollup", "--json")
        took = time.monotonic() - began
        listed = run("--url", url, "--timeout", "1", "list", "--max-age", "0")
        took_list = time.monotonic() - began - took
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert code == 1, (out, err)
    assert json.loads(out) == {"counters": 1, "fresh": 0, "read": 1, "written": 0, "failed": 1}
    assert took < 10 and took_list < 10, (took, took_list)  # --timeout bounds the lock waits (30 s by default)
    assert listed[0] == 0 and "Page_1" in listed[1]  # list reads exactly; its rollup write is the one that failed
    code, out, _ = run("--url", url, "rollup", "--json")
    assert code == 0 and json.loads(out)["written"] == 1


def test_rollup_after_a_burst_of_max_age_zero_reads_writes_the_total(url):
    """Issue 36, defect 6: 130 times ``add(1)`` then
    ``get_count_as_of(max_age=0)`` spend the rollup's claims; ``rollup``
    then said "0 rollups written", exited 0, and ``count --max-age 3600``
    showed 120 of 130. It writes the total."""
    gateway = open_gateway(url)
    try:
        counter = CounterShardDS("Counter Test", 1, gateway=gateway)
        for _ in range(130):
            counter.add(1)
            counter.get_count_as_of(max_age=0)
    finally:
        gateway.close()
    code, out, err = run("--url", url, "rollup", "--json")
    assert code == 0 and json.loads(out)["written"] == 1, (out, err)
    code, out, _ = run("--url", url, "count", "Counter Test", "1", "--max-age", "3600", "--json")
    assert code == 0 and (json.loads(out)["count"], json.loads(out)["from_rollup"]) == (130, True)


def test_rollup_exits_1_naming_a_counter_its_claims_hold_back(url, monkeypatch):
    """A refresh writes past ``MAX_CLAIMS`` live claims, up to twice that
    many; one more is not written, and the run says which counter and why,
    and exits 1."""
    monkeypatch.setattr(rollup_module, "MAX_CLAIMS", 1)
    for _ in range(2):
        run("--url", url, "increment", "Page", "1")
        assert run("--url", url, "rollup", "--json")[0] == 0
    run("--url", url, "increment", "Page", "1")
    code, out, err = run("--url", url, "rollup", "--json")
    assert code == 1 and json.loads(out) == {"counters": 1, "fresh": 0, "read": 1, "written": 0, "failed": 1}
    assert "rollup: error: rollup not written: IK_CounterShardEntity 'Page_1'" in err and "2 claims" in err, err


def test_size_prints_the_shards_and_the_read_costs():
    code, out, _ = run("size", "--rate", "2500", "--json")
    assert code == 0 and json.loads(out) == {
        "rate": 2500.0, "per_shard": 1.0, "shards": 2500, "exact_reads": 2501, "exact_rpcs": 3,
        "rollup_reads": 1, "rollup_rpcs": 1}
    code, out, _ = run("size", "--rate", "40", "--per-shard", "5")
    assert code == 0 and "shards needed" in out and out.split("shards needed")[1].split()[0] == "8"
    code, _, err = run("size", "--rate", "20000")
    assert code == 2 and "20,000 shards" in err and "10,000" in err
    assert run("size", "--rate", "0")[0] == 2 and run("size")[0] == 2
    assert size_shards(0.5).shards == 1 and size_shards(10.0, 3.0).shards == 4
    assert run("plan", "--rate", "40")[0] == 2  # the old name is no alias: one name per idea
