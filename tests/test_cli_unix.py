"""gds-counter as a Unix command: how sqlite URLs map to files, malformed
URLs and names refused with exit 2 before anything is written, quiet exit on
a closed pipe, -v anywhere, warnings where the storage chosen is a surprise,
--timeout, --json, list, decrement and confirmations.

Exit codes and pipes are checked on the installed script in a subprocess, as
users run it; the rest in-process through ``cli.main``."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gds_counter.cli import EXIT_BROKEN_PIPE, main
from gds_counter.counter import CounterShardDS
from gds_counter.counter.layout import PHP_ARTICLE
from gds_counter.gateway import open_gateway
from gds_counter.gateway.mutations import Upsert

SCRIPT = Path(sys.executable).with_name("gds-counter")
CHOOSERS = ("GDS_URL", "DATASTORE_EMULATOR_HOST", "DATASTORE_PROJECT_ID", "GOOGLE_CLOUD_PROJECT")


class Terminal(io.StringIO):
    """stdin on a terminal, with the user's answers already typed."""

    def isatty(self) -> bool:
        return True


def run(*argv: str, stdin: io.StringIO | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err, stdin=stdin or io.StringIO())
    return code, out.getvalue(), err.getvalue()


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CHOOSERS}
    env.update(extra)
    return env


def script(*argv: str, cwd: Path, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *argv], cwd=cwd, env=env or clean_env(), capture_output=True, text=True,
                          timeout=120, **kwargs)


@pytest.fixture(autouse=True)
def _no_storage_from_the_environment(monkeypatch, tmp_path):
    for name in CHOOSERS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'cli.sqlite3'}"  # tmp_path is absolute: four slashes


# --- sqlite URLs and paths ---------------------------------------------------------------


def test_three_slashes_are_relative_to_the_working_directory_four_are_absolute(tmp_path):
    (tmp_path / "sub").mkdir()
    assert run("--url", "sqlite:///sub/rel.db", "increment", "a", "1")[0] == 0
    assert (tmp_path / "sub" / "rel.db").exists()
    assert run("--url", f"sqlite:///{tmp_path}/abs.db", "increment", "a", "1")[0] == 0
    assert (tmp_path / "abs.db").exists()


def test_an_absolute_path_written_with_three_slashes_names_what_was_tried_and_the_fix(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    wanted = tmp_path / "a.db"
    relative = str(wanted).lstrip("/")  # sqlite:///tmp/... : relative to the working directory
    done = script("--url", f"sqlite:///{relative}", "count", "a", "1", cwd=tmp_path / "elsewhere")
    assert done.returncode == 2 and done.stdout == ""
    assert str(tmp_path / "elsewhere" / relative) in done.stderr  # the absolute path it tried
    assert f"sqlite:////{relative}" in done.stderr  # and the four-slash fix
    assert "Traceback" not in done.stderr
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_help_says_how_sqlite_urls_map_to_files(tmp_path):
    done = script("--help", cwd=tmp_path)
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert "sqlite:///x.db (x.db in the working directory)" in text
    assert "four slashes" in text


@pytest.mark.parametrize(
    "bad_url, named",
    [
        ("sqlite:rel.db", "sqlite:rel.db"),
        ("sqlite://rel.db", "sqlite://rel.db"),
        ("sqlite:///", "names no file"),
        ("sqlite:///:memory:", "memory://"),
        ("sqlite:///x.db?namspace=a", "namspace"),
        ("sqlite:///x.db?namespace", "malformed query"),
        ("memory://?namespace=__x__", "'__x__'"),
        ("memory://somewhere", "memory://somewhere"),
        ("datastore://", "names no project"),
        ("datastore://my-project/extra", "datastore://my-project/extra"),
        ("datastore://user@project", "datastore://***@project"),
        ("datastore://p?database=Bad", "'Bad'"),
        ("datastore://p?database=(other)", "'(other)'"),
        ("datastore://p?database=a(b", "'a(b'"),
        ("datastore://p?namespace=a/b", "'a/b'"),
        ("nosuch://x", "nosuch://x"),
        ("sqlite:///h.db#frag", "fragment"),
        ("sqlite:///h.db?namespace=a#frag", "fragment"),
        ("memory://?project=", "project is empty"),
        ("sqlite:///h.db?project=", "project is empty"),
        ("datastore://p?database=", "database is empty"),
    ],
)
def test_malformed_urls_exit_2_before_anything_is_written(tmp_path, bad_url, named):
    code, out, err = run("--url", bad_url, "increment", "a", "1")
    assert code == 2 and out == ""
    assert named in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no database file, no directory


def test_the_default_database_spelled_default_is_the_default_database(firestore_emulator, monkeypatch):
    """``database=(default)`` (Firestore's name for it) counts where
    ``database`` left out does, rather than failing at every call."""
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", firestore_emulator.host)
    url = f"datastore://{firestore_emulator.project}?namespace=cli-{os.getpid()}-{time.monotonic_ns()}"
    assert run("--url", url + "&database=(default)", "increment", "a", "1") == (0, "1\n", "")
    assert run("--url", url, "count", "a", "1") == (0, "1\n", "")


def test_a_malformed_gds_url_is_refused_the_same_way(tmp_path, monkeypatch):
    monkeypatch.setenv("GDS_URL", "sqlite:x.db")
    code, out, err = run("increment", "a", "1")
    assert code == 2 and out == "" and "'sqlite:x.db'" in err
    assert list(tmp_path.iterdir()) == []


def test_an_empty_url_is_refused_not_taken_as_the_default(tmp_path, capsys):
    code, out, _ = run("--url", "", "increment", "a", "1")
    assert code == 2 and out == "" and "empty" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_help_lists_every_exit_status(tmp_path):
    """The statuses the README documents, Ctrl-C's 130 included."""
    done = script("--help", cwd=tmp_path)
    text = " ".join(done.stdout.split())
    assert done.returncode == 0
    for status in ("0 done", "1 failed at run time", "2 bad usage", "130 interrupted", "141 stdout closed"):
        assert status in text, (status, text)


def test_the_renamed_sizing_command_says_its_new_name(tmp_path):
    """``plan`` became ``size`` (no alias: one name per idea); who types
    the old name is told the new one in one line, exit 2."""
    done = script("plan", "--rate", "10", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "'plan'" in done.stderr and "'size'" in done.stderr
    assert list(tmp_path.iterdir()) == []
    other = script("nosuch", cwd=tmp_path)  # any other unknown command: argparse's message, no hint
    assert other.returncode == 2 and "invalid choice: 'nosuch'" in other.stderr and "it is now" not in other.stderr


def test_a_malformed_url_exits_2_from_the_installed_script(tmp_path):
    done = script("--url", "sqlite:rel.db", "count", "a", "1", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert "sqlite:rel.db" in done.stderr and "IndexError" not in done.stderr


def test_a_path_that_is_a_directory_is_refused(tmp_path):
    code, _, err = run("--url", f"sqlite:///{tmp_path}", "count", "a", "1")
    assert code == 2 and f"{tmp_path}, which is a directory" in err


@pytest.mark.parametrize("target", [("__a", "_"), ("", "1"), ("a", ""), ("x" * 1600, "1")])
def test_bad_target_names_exit_2_before_the_storage_is_even_created(tmp_path, url, target):
    code, out, err = run("--url", url, "increment", *target)
    assert code == 2 and out == ""
    assert "Traceback" not in err
    assert not (tmp_path / "cli.sqlite3").exists()
    if target[0] == "__a":
        assert "'__a__' is reserved" in err


@pytest.mark.parametrize(
    "argv, named",
    [
        (["increase-shards", "a", "1", "0"], "at least 1, got 0"),
        (["increase-shards", "a", "1", "1000000"], "MAX_SHARDS"),
        (["increment", "a", "1", "-n", "99999999999999999999"], "99999999999999999999"),
        (["decrement", "a", "1", "-n", "99999999999999999999"], "99999999999999999999"),
        (["increment", "a", "1", "-n", "-99999999999999999999"], "-99999999999999999999"),
        (["reset", "a", "1"], "--yes"),  # stdin is not a terminal: nobody can confirm
        (["increase-shards", "a", "1", "500"], "--yes"),
    ],
)
def test_refused_input_leaves_no_database_file(tmp_path, url, argv, named):
    """Amounts, shard counts and unconfirmed changes are refused with exit 2
    before the storage is opened: an SQLite URL names a file that opening
    creates, and a refusal must leave nothing behind (the library's own
    checks, run before the gateway is)."""
    code, out, err = run("--url", url, *argv)
    assert code == 2 and out == "", err
    assert named in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_a_reserved_target_is_refused_by_the_installed_script(tmp_path):
    done = script("increment", "__a", "_", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert "__a__" in done.stderr
    assert list(tmp_path.iterdir()) == []


# --- pipes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("argv", [["shards", "a", "1"], ["list"], ["demo", "--quick", "--no-plot"]])
def test_a_closed_pipe_ends_the_command_quietly_with_141(tmp_path, argv):
    if argv[0] != "demo":
        assert script("increment", "a", "1", cwd=tmp_path).returncode == 0
    # The reader is gone before the first write: the worst case of `| head`.
    proc = subprocess.Popen([str(SCRIPT), *argv], cwd=tmp_path, env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == EXIT_BROKEN_PIPE == 141
    assert err == ""


def test_head_reads_what_it_wants(tmp_path):
    assert script("increment", "a", "1", cwd=tmp_path).returncode == 0
    done = subprocess.run(f"'{SCRIPT}' shards a 1 | head -2", shell=True, cwd=tmp_path, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[0].split() == ["shard", "count"]
    assert done.stderr == ""


# --- logging and warnings --------------------------------------------------------------------


@pytest.mark.parametrize("where", ["before", "after"])
def test_v_logs_the_storage_chosen_before_or_after_the_command(tmp_path, url, where):
    argv = ["-v", "--url", url, "count", "a", "1"] if where == "before" else ["--url", url, "count", "a", "1", "-v"]
    code, out, err = run(*argv)
    assert (code, out) == (0, "0\n")
    assert f"storage: the SQLite file {tmp_path / 'cli.sqlite3'}" in err


def test_v_counts_on_both_sides(url):
    code, _, err = run("-v", "--url", url, "count", "a", "1", "-v")
    assert code == 0 and "INFO gds_counter.gateway: storage:" in err  # -vv's format names the logger


def test_without_v_nothing_is_logged(url):
    assert run("--url", url, "count", "a", "1") == (0, "0\n", "")


def test_the_default_file_is_named_at_v(tmp_path):
    code, _, err = run("-v", "count", "a", "1")
    assert code == 0 and f"{tmp_path / 'gds_counter.sqlite3'} (from the default)" in err


def test_google_cloud_project_without_a_url_warns_that_counting_stays_local(tmp_path, monkeypatch):
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "my-project")
    code, out, err = run("increment", "a", "1")
    assert (code, out) == (0, "1\n")
    assert "WARNING" in err and "NOT in Cloud Datastore" in err and "datastore://my-project" in err
    assert str(tmp_path / "gds_counter.sqlite3") in err


def test_memory_url_warns_that_the_data_goes_with_the_process():
    code, out, err = run("--url", "memory://", "increment", "a", "1")
    assert (code, out) == (0, "1\n")
    assert "WARNING" in err and "gone when gds-counter exits" in err


def test_an_unreachable_emulator_is_named_and_timeout_bounds_the_wait(tmp_path):
    env = clean_env(DATASTORE_EMULATOR_HOST="127.0.0.1:9")
    began = time.monotonic()
    done = script("-v", "--timeout", "1", "count", "A", "1", cwd=tmp_path, env=env)
    took = time.monotonic() - began
    assert done.returncode == 1 and done.stdout == ""
    assert "storage: the Datastore emulator at 127.0.0.1:9" in done.stderr  # -v says which
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("gds-counter count: error: Unavailable") and "127.0.0.1:9" in last
    assert took < 20, took  # not the default 30 s of retries


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_bad_timeouts_exit_2(url, value, capsys):
    code, out, _ = run("--timeout", value, "--url", url, "count", "a", "1")
    assert code == 2 and out == ""
    assert value in capsys.readouterr().err  # argparse names it


# --- commands: decrement, --json, list ----------------------------------------------------------


def test_decrement_and_json_everywhere(url):
    assert run("--url", url, "increment", "Counter Test", "1", "-n", "5", "--json") == (
        0, '{"target": "Counter Test_1", "amount": 5, "count": 5}\n', "")
    code, out, _ = run("--url", url, "decrement", "Counter Test", "1", "-n", "2", "--json")
    assert (code, json.loads(out)) == (0, {"target": "Counter Test_1", "amount": -2, "count": 3})
    assert run("--url", url, "decrement", "Counter Test", "1") == (0, "2\n", "")
    code, out, _ = run("--url", url, "count", "Counter Test", "1", "--json")
    assert json.loads(out) == {"target": "Counter Test_1", "count": 2}
    code, out, _ = run("--url", url, "shards", "Counter Test", "1", "--json")
    shards = json.loads(out)
    assert shards["count"] == 2 and sum(s["count"] for s in shards["shards"]) == 2
    assert [s["shard"] for s in shards["shards"]][:20] == list(range(1, 21))
    code, out, _ = run("--url", url, "increase-shards", "Counter Test", "1", "30", "--json")
    assert json.loads(out) == {"target": "Counter Test_1", "shards": 30}
    code, out, _ = run("--url", url, "reset", "Counter Test", "1", "--yes", "--json")
    assert json.loads(out) == {"target": "Counter Test_1", "count": 0}


def test_list_groups_the_shard_kind_by_target(tmp_path, url):
    assert run("--url", url, "list") == (0, "count  shards  written  target\n", "")
    assert run("--url", url, "list", "--json") == (0, "[]\n", "")
    gateway = open_gateway(url)
    try:
        CounterShardDS("Counter Test", 1, gateway=gateway).add(3)
        CounterShardDS("like", "tea", gateway=gateway).add(2)
        # a PHP writer with NUM_SHARDS = 40 wrote shard 35, which no config records
        gateway.commit([Upsert(PHP_ARTICLE.shard_entity("like_tea", 35, 4))])
    finally:
        gateway.close()
    code, out, err = run("--url", url, "list", "--json")
    assert code == 0
    rows = {row["target"]: row for row in json.loads(out)}
    assert rows["Counter Test_1"]["count"] == 3
    assert rows["like_tea"]["count"] == 6 and rows["like_tea"]["written"] == 2
    assert rows["like_tea"]["shards"] == 20  # configured: nothing recorded, so the default every reader uses
    # shard 35 is counted, and the warning says why a lookup read would miss it
    assert "like_tea has shard 35, beyond the 20 shards it is configured for" in err
    code, out, _ = run("--url", url, "list")
    lines = out.splitlines()
    assert lines[0].split() == ["count", "shards", "written", "target"]
    assert lines[1].split(maxsplit=3) == ["3", "20", "1", "Counter Test_1"]  # a target keeps its spaces
    assert lines[2].split() == ["6", "20", "2", "like_tea"]


def test_list_shows_the_configured_shard_count_and_the_shards_written(url):
    """After ``increase-shards 40`` a counter is spread over 40 shards
    (readers look up 40, writers pick among 40), however few of them an
    increment has written yet; ``list`` shows both numbers, in text and in
    JSON, for counters with no shard written yet too."""
    for _ in range(3):
        assert run("--url", url, "increment", "like", "tea")[0] == 0
    assert run("--url", url, "increase-shards", "like", "tea", "40") == (0, "40\n", "")
    assert run("--url", url, "increase-shards", "fresh", "1", "30") == (0, "30\n", "")
    code, out, _ = run("--url", url, "list", "--json")
    assert code == 0
    rows = {row["target"]: row for row in json.loads(out)}
    assert rows["like_tea"]["shards"] == 40 and rows["like_tea"]["count"] == 3
    assert 1 <= rows["like_tea"]["written"] <= 3  # one shard per increment at most
    assert rows["fresh_1"] == {"target": "fresh_1", "count": 0, "shards": 30, "written": 0}
    code, out, _ = run("--url", url, "list")
    table = {line.split()[-1]: line.split()[:-1] for line in out.splitlines()[1:]}
    assert table["like_tea"][:2] == ["3", "40"]
    assert table["fresh_1"] == ["0", "30", "0"]


# --- confirmations ---------------------------------------------------------------------------------


def test_reset_asks_on_a_terminal_and_refuses_elsewhere(url):
    assert run("--url", url, "increment", "a", "1", "-n", "4")[0] == 0
    code, out, err = run("--url", url, "reset", "a", "1")  # stdin is not a terminal
    assert code == 2 and out == "" and "--yes" in err
    code, out, err = run("--url", url, "reset", "a", "1", stdin=Terminal("n\n"))
    assert code == 1 and out == "" and "[y/N]" in err and "nothing was changed" in err
    assert run("--url", url, "count", "a", "1")[1] == "4\n"
    code, out, err = run("--url", url, "reset", "a", "1", stdin=Terminal("y\n"))
    assert code == 0 and out == "reset 'a_1'\n"
    assert run("--url", url, "count", "a", "1")[1] == "0\n"


def test_reset_without_yes_from_the_installed_script_is_refused(tmp_path):
    assert script("increment", "a", "1", cwd=tmp_path).returncode == 0
    done = script("reset", "a", "1", cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert done.returncode == 2 and "--yes" in done.stderr
    assert script("count", "a", "1", cwd=tmp_path).stdout == "1\n"


def test_many_shards_ask_first_and_say_what_reads_will_cost(url):
    assert run("--url", url, "increase-shards", "a", "1", "100") == (0, "100\n", "")  # at the threshold: no question
    code, out, err = run("--url", url, "increase-shards", "a", "1", "1500")
    assert code == 2 and out == ""
    assert "1501 entities" in err and "2 lookup RPCs" in err and "--yes" in err
    code, out, err = run("--url", url, "increase-shards", "a", "1", "101", stdin=Terminal("yes\n"))
    assert (code, out) == (0, "101\n") and "102 entities" in err and "1 lookup RPC" in err
    assert run("--url", url, "increase-shards", "a", "1", "150", "--yes") == (0, "150\n", "")

