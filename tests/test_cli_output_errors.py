"""gds-counter when its result cannot be printed: the write was stored, so
the command must say so, or a script that retries counts twice.

``increment ... > /dev/full`` once exited 1 with only ``OSError: [Errno
28] No space left on device``, yet the increment was stored. Now, when a
change was stored and only writing its result to stdout failed, one line
on stderr says that it WAS stored (the amount, the counter, the new total)
and then the output error; the exit status stays 1 (a run-time failure,
whose message tells whether anything was stored, as for
``TotalUnavailable``). A closed pipe keeps its own status, 141, with the
same line when a change was stored. A read that cannot be printed claims
nothing was stored.

Run as users run it: the installed script in a subprocess, stdout on the
real ``/dev/full`` (Linux's device that refuses every write), with Python's
stdout unbuffered (the error comes from the print) and buffered (it comes
from the flush at the end).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gds_counter.cli import main

SCRIPT = Path(sys.executable).with_name("gds-counter")
CHOOSERS = ("GDS_URL", "DATASTORE_EMULATOR_HOST", "DATASTORE_PROJECT_ID", "GOOGLE_CLOUD_PROJECT")

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")


@pytest.fixture(params=["unbuffered", "buffered"])
def env(request) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (*CHOOSERS, "PYTHONUNBUFFERED")}
    if request.param == "unbuffered":
        env["PYTHONUNBUFFERED"] = "1"
    return env


def to_full(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    with open("/dev/full", "w") as full:
        return subprocess.run([str(SCRIPT), *argv], cwd=cwd, env=env, stdout=full, stderr=subprocess.PIPE,
                              stdin=subprocess.DEVNULL, text=True, timeout=120)


def count(cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run([str(SCRIPT), "count", "a", "1"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_an_increment_that_cannot_be_printed_says_it_was_stored(tmp_path, env):
    done = to_full(["increment", "a", "1", "-n", "5"], tmp_path, env)
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr  # one line, no traceback, no "Exception ignored" at exit
    line = lines[0]
    assert line.startswith("gds-counter increment: error: ")
    assert "the increment by 5 of 'a_1' WAS stored" in line and "new total 5" in line
    assert "No space left on device" in line
    assert count(tmp_path, env) == "5\n"  # it was: a retry would count it twice


def test_a_decrement_and_a_reset_say_so_too(tmp_path, env):
    assert subprocess.run([str(SCRIPT), "increment", "a", "1", "-n", "7"], cwd=tmp_path, env=env,
                          capture_output=True, timeout=120).returncode == 0
    done = to_full(["decrement", "a", "1", "-n", "2", "--json"], tmp_path, env)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "the decrement by 2 of 'a_1' WAS stored (new total 5" in done.stderr
    done = to_full(["reset", "a", "1", "--yes"], tmp_path, env)
    assert done.returncode == 1 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "gds-counter reset: error: the reset of 'a_1' WAS stored" in done.stderr
    assert "No space left on device" in done.stderr
    assert count(tmp_path, env) == "0\n"


def test_a_read_that_cannot_be_printed_claims_nothing_stored(tmp_path, env):
    assert subprocess.run([str(SCRIPT), "increment", "a", "1"], cwd=tmp_path, env=env, capture_output=True,
                          timeout=120).returncode == 0
    done = to_full(["count", "a", "1"], tmp_path, env)
    assert done.returncode == 1
    assert len(done.stderr.splitlines()) == 1, done.stderr
    assert "No space left on device" in done.stderr and "stored" not in done.stderr


def test_an_increment_whose_reader_went_away_exits_141_and_says_it_was_stored(tmp_path):
    """The closed pipe keeps its status (what a shell shows for SIGPIPE);
    a read says nothing (``gds-counter list | head``), a stored change says
    so, since ``| true`` threw away the only sign that it was."""
    proc = subprocess.Popen([str(SCRIPT), "increment", "a", "1", "-n", "3"], cwd=tmp_path,
                            env={k: v for k, v in os.environ.items() if k not in CHOOSERS},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141
    assert len(err.splitlines()) == 1 and "the increment by 3 of 'a_1' WAS stored (new total 3" in err, err


class _InterruptedOutput(io.StringIO):
    """stdout where Ctrl-C lands while the result is being printed."""

    def write(self, text: str) -> int:
        raise KeyboardInterrupt


def test_ctrl_c_while_printing_a_stored_increment_says_it_was_stored(tmp_path):
    err = io.StringIO()
    url = f"sqlite:///{tmp_path / 'c.db'}"
    code = main(["--url", url, "increment", "a", "1", "-n", "4"], out=_InterruptedOutput(), err=err,
                stdin=io.StringIO())
    assert code == 130
    assert len(err.getvalue().splitlines()) == 1
    assert "interrupted" in err.getvalue() and "the increment by 4 of 'a_1' WAS stored" in err.getvalue()


def test_a_rollup_that_cannot_be_printed_says_its_rollups_were_written(tmp_path, env):
    """``rollup > /dev/full`` wrote the rollups and said only that writing to
    stdout failed."""
    assert to_full(["increment", "a", "1", "-n", "3"], tmp_path, env).returncode == 1  # (stored; its print failed)
    done = to_full(["rollup"], tmp_path, env)
    assert done.returncode == 1
    assert "1 rollups WERE written, but writing the result to stdout failed" in done.stderr, done.stderr
