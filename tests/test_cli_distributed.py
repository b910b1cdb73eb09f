"""The command on Firestore's distributed counters: a counter named by its
document ``PATH`` alone (no ``ID``) is the page's counter, on any storage,
and ``list`` and ``rollup`` cover them beside the PHP article's."""

from __future__ import annotations

import io
import json
import os
import random

import pytest

from gds_counter import DistributedCounter, open_gateway
from gds_counter.cli import main


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err, stdin=io.StringIO())
    return code, out.getvalue(), err.getvalue()


def test_a_path_names_the_pages_counter_and_the_library_reads_the_same(url):
    assert run("--url", url, "increment", "-n", "4", "counters/likes") == (0, "4\n", "")
    assert run("--url", url, "decrement", "counters/likes") == (0, "3\n", "")
    gateway = open_gateway(url)
    try:
        counter = DistributedCounter("counters/likes", gateway=gateway)
        assert counter.get_count() == 3
        counter.add(10)
    finally:
        gateway.close()
    code, out, _ = run("--url", url, "count", "--json", "counters/likes")
    assert (code, json.loads(out)) == (0, {"target": "counters/likes", "count": 13})
    code, out, _ = run("--url", url, "shards", "counters/likes")
    assert code == 0 and len(out.splitlines()) == 1 + 10 + 1  # a header, the page's 10 shards, the total


def test_the_command_follows_the_shard_count_the_counter_document_records(url):
    """An app's counter with 3 shards stays at 3: the command writes into
    the shards recorded on the counter document, never the default 10."""
    gateway = open_gateway(url)
    try:
        DistributedCounter("posts/p1", 3, gateway=gateway).add(1)
    finally:
        gateway.close()
    for _ in range(20):
        assert run("--url", url, "increment", "posts/p1")[0] == 0
    code, out, _ = run("--url", url, "shards", "--json", "posts/p1")
    assert code == 0 and len(json.loads(out)["shards"]) == 3


def test_list_and_rollup_cover_both_layouts(url):
    assert run("--url", url, "increment", "-n", "2", "Counter Test", "1")[0] == 0
    assert run("--url", url, "increment", "-n", "5", "a/b/c/d")[0] == 0
    code, out, _ = run("--url", url, "list", "--json")
    listed = {row["target"]: (row["count"], row["shards"], row["written"]) for row in json.loads(out)}
    assert (code, listed) == (0, {"Counter Test_1": (2, 20, 1), "a/b/c/d": (5, 10, 10)})
    code, out, _ = run("--url", url, "rollup", "--json")
    assert code == 0 and json.loads(out)["written"] == 2
    code, out, _ = run("--url", url, "list", "--json", "--max-age", "60")
    assert {row["target"]: row["count"] for row in json.loads(out)} == {"Counter Test_1": 2, "a/b/c/d": 5}


@pytest.mark.parametrize(
    "argv, message",
    [
        (("increment", "counters"), "needs an ID after it"),
        (("increment", "counters/likes/shards"), "names a collection"),
        (("count", "counters//likes/x"), "empty segment"),
        (("reset", "--yes", "a/__b__"), "reserved"),
        (("increase-shards", "--yes", "a/b", "0"), "at least 1"),
    ],
)
def test_bad_paths_exit_2_before_any_storage_is_opened(tmp_path, argv, message):
    target = tmp_path / "never.db"
    code, out, err = run("--url", f"sqlite:///{target}", *argv)
    assert (code, out) == (2, "")
    assert message in err
    assert not os.path.exists(target)


def test_reset_asks_first_and_keeps_the_shard_documents(url):
    rng = random.Random(3)
    for _ in range(5):
        run("--url", url, "increment", "-n", str(rng.randint(1, 9)), "counters/likes")
    code, _, err = run("--url", url, "reset", "counters/likes")
    assert code == 2 and "--yes" in err
    assert run("--url", url, "reset", "--yes", "counters/likes")[0] == 0
    code, out, _ = run("--url", url, "shards", "--json", "counters/likes")
    assert code == 0 and json.loads(out)["shards"] == [{"shard": n, "count": 0} for n in range(10)]


@pytest.mark.emulator
def test_the_command_on_firestore_in_native_mode(firestore_native_emulator, firestore_native_gateway, monkeypatch):
    """``--url firestore://PROJECT`` (the emulator through
    ``FIRESTORE_EMULATOR_HOST``): the page's documents, read back by the
    library on the same emulator."""
    for name, value in firestore_native_emulator.env.items():
        monkeypatch.setenv(name, value)
    url = f"firestore://{firestore_native_emulator.project}"
    assert run("--url", url, "increment", "-n", "3", "counters/likes") == (0, "3\n", "")
    assert run("--url", url, "increment", "counters/likes") == (0, "4\n", "")
    code, out, _ = run("--url", url, "list", "--json")
    assert (code, json.loads(out)) == (0, [{"target": "counters/likes", "count": 4, "shards": 10, "written": 10}])
    assert DistributedCounter("counters/likes", gateway=firestore_native_gateway).get_count() == 4
