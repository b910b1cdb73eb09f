"""The gds-counter command, run in-process against a SQLite file, plus one
run of the installed console script."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gds_counter import __version__
from gds_counter.cli import main


@pytest.fixture
def url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'cli.sqlite3'}"


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err, stdin=io.StringIO())  # stdin: not a terminal
    return code, out.getvalue(), err.getvalue()


def test_increment_count_shards_reset(url):
    assert run("--url", url, "increment", "Counter Test", "1") == (0, "1\n", "")
    assert run("--url", url, "increment", "Counter Test", "1", "-n", "4") == (0, "5\n", "")
    assert run("--url", url, "count", "Counter Test", "1") == (0, "5\n", "")
    assert run("--url", url, "count", "Counter Test", "1", "--method", "query") == (0, "5\n", "")
    code, out, _ = run("--url", url, "shards", "Counter Test", "1")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["shard", "count"]
    assert [int(line.split()[0]) for line in lines[1:-1]] == list(range(1, 21))
    assert sum(int(line.split()[1]) for line in lines[1:-1]) == 5
    assert lines[-1].split() == ["total", "5"]
    assert run("--url", url, "reset", "Counter Test", "1", "--yes")[0] == 0
    assert run("--url", url, "count", "Counter Test", "1") == (0, "0\n", "")


def test_increase_shards(url):
    assert run("--url", url, "increase-shards", "Counter Test", "1", "30") == (0, "30\n", "")
    code, out, _ = run("--url", url, "shards", "Counter Test", "1")
    assert len(out.splitlines()) == 30 + 2
    code, out, err = run("--url", url, "increase-shards", "Counter Test", "1", "25")
    assert code == 2 and out == ""
    assert "30" in err and "25" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["increment"],
        ["increment", "Counter Test"],
        ["increment", "Counter Test", "1", "-n", "x"],
        ["frobnicate", "a", "1"],
        ["increment", "", "1"],
        ["increase-shards", "Counter Test", "1", "0"],
        ["increment", "Counter Test", "1", "--strategy", "fast"],
    ],
)
def test_usage_and_bad_input_exit_2(url, argv, capsys):
    code, out, err = run("--url", url, *argv)
    captured = capsys.readouterr()  # argparse writes its usage to sys.stderr
    assert code == 2
    assert out == ""
    assert "Traceback" not in err + captured.err


def test_runtime_errors_exit_1_without_traceback(tmp_path):
    # A file that is not a database: storage failed at run time, naming the file.
    (tmp_path / "junk.db").write_bytes(b"this is not a SQLite database" * 100)
    code, out, err = run("--url", f"sqlite:///{tmp_path / 'junk.db'}", "count", "a", "1")
    assert code == 1 and out == ""
    assert "error" in err and str(tmp_path / "junk.db") in err and "Traceback" not in err


def test_a_missing_directory_is_bad_input_naming_the_absolute_path(tmp_path):
    code, out, err = run("--url", f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}", "count", "a", "1")
    assert code == 2 and out == ""
    assert f"its directory {tmp_path / 'no' / 'such'} does not exist" in err and "Traceback" not in err
    assert not (tmp_path / "no").exists()


def test_corrupt_data_exits_1(tmp_path):
    # A corrupt shard is a runtime data problem: exit 1 and name the shard.
    from gds_counter.gateway import open_gateway
    from gds_counter.gateway.keys import Key
    from gds_counter.gateway.mutations import Upsert
    from gds_counter.gateway.values import RawEntity

    url = f"sqlite:///{tmp_path / 'c.sqlite3'}"
    gateway = open_gateway(url)
    gateway.commit([Upsert(RawEntity(Key.of("IK_CounterShardEntity", "a_1_3"), {"target": "a_1", "count": 1.5}))])
    gateway.close()
    code, out, err = run("--url", url, "count", "a", "1")
    assert code == 1 and "a_1_3" in err and "CorruptDataError" in err


def test_bad_url_exits_2(tmp_path):
    code, _, err = run("--url", "nosuch://x", "count", "a", "1")
    assert code == 2 and "nosuch://x" in err


def test_gds_url_environment_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("GDS_URL", f"sqlite:///{tmp_path / 'env.sqlite3'}")
    assert run("increment", "Counter Test", "1", "-n", "3") == (0, "3\n", "")
    assert (tmp_path / "env.sqlite3").exists()


def test_version():
    code, out, _ = run("--version")
    assert code == 0


def test_installed_console_script(tmp_path):
    script = Path(sys.executable).with_name("gds-counter")
    env = {k: v for k, v in os.environ.items() if k not in ("GDS_URL", "DATASTORE_EMULATOR_HOST")}
    first = subprocess.run([str(script), "increment", "Counter Test", "1"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=120)
    assert (first.returncode, first.stdout) == (0, "1\n"), first.stderr
    second = subprocess.run([str(script), "count", "Counter Test", "1"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=120)
    assert (second.returncode, second.stdout) == (0, "1\n")
    assert (tmp_path / "gds_counter.sqlite3").exists()  # the embedded default, in the working directory
    version = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and __version__ in version.stdout
