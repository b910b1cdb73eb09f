"""``gds-counter --timeout`` bounds the whole command (issue 23, item 12).

One command makes several Datastore calls: the capability probe, reads,
a commit, and the counter's retries of a storage that is unavailable. A
timeout per call let ``--timeout 3`` run for 15 s against a closed port
and the default 30 for nearly a minute. The command now has one deadline
and every call gets only the time left, so it fails by then, with exit 1
and a message that names the error class (which tells whether anything
was written) and the storage.

Two ways a server is unreachable: a closed port (connections refused at
once, so calls fail fast and are retried) and a server that takes the TCP
connection but never answers (what a blackholed address looks like from
the client: every call waits for its deadline). The latter is a local
socket that listens and never accepts, so the test needs no network.

Each command runs in a subprocess, as users run it; the time spent in
``cli.main`` is measured there (the interpreter's start and the imports
come before any deadline can start), and the whole process's wall time is
checked too, with a generous margin for a loaded machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
from sizes import params

TIMEOUT = 3.0
#: Time main() may take past --timeout: the last attempt's own floor, closing
#: the channel, and a loaded machine. Far less than a second call's timeout.
MAIN_MARGIN = 1.5
#: The whole process: the same plus the interpreter's start, imports and exit.
WALL_MARGIN = 6.0

DRIVER = """
import json, sys, time
from gds_counter import cli
began = time.monotonic()
code = cli.main(sys.argv[2:])
took = time.monotonic() - began
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "took": took}, f)
"""

COMMANDS = [
    ("increment", "x", "1"),
    ("count", "x", "1"),
    ("list",),
    ("increase-shards", "x", "1", "30"),
]


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port nothing listens on: every connection is refused at once."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    yield port


@pytest.fixture
def silent_listener() -> Iterator[socket.socket]:
    """A socket that takes TCP connections and never says a word: gRPC's
    handshake never completes, as with a blackholed address."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    try:
        yield listener
    finally:
        listener.close()


@pytest.fixture
def silent_port(silent_listener: socket.socket) -> int:
    port: int = silent_listener.getsockname()[1]
    return port


def run_bounded(port: int, argv: tuple[str, ...], tmp_path: Path) -> tuple[dict, str, float]:
    env = {k: v for k, v in os.environ.items() if k not in ("GDS_URL", "DATASTORE_PROJECT_ID")}
    env["DATASTORE_EMULATOR_HOST"] = f"127.0.0.1:{port}"
    result = tmp_path / "result.json"
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(result), "--url", "datastore://p", "--timeout", f"{TIMEOUT:g}", *argv],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,  # a hang fails, it does not block
    )
    wall = time.monotonic() - began
    assert done.returncode == 0, done.stderr  # the driver itself ran to the end
    assert done.stdout == ""  # no data printed for a command that failed
    return json.loads(result.read_text()), done.stderr, wall


def check(port: int, argv: tuple[str, ...], tmp_path: Path, errors: tuple[str, ...]) -> None:
    outcome, err, wall = run_bounded(port, argv, tmp_path)
    assert outcome["code"] == 1, err  # a run-time failure, not bad input
    assert outcome["took"] < TIMEOUT + MAIN_MARGIN, (outcome["took"], err)
    assert wall < TIMEOUT + WALL_MARGIN, (wall, err)
    last = err.strip().splitlines()[-1]
    assert last.startswith(tuple(f"gds-counter {argv[0]}: error: {name}:" for name in errors)), last
    assert f"the Datastore emulator at 127.0.0.1:{port}" in last  # names the storage it tried


@pytest.mark.slow
@pytest.mark.parametrize("argv", params(COMMANDS, quick=COMMANDS[:1]), ids=[c[0] for c in COMMANDS])
def test_a_refused_connection_fails_the_command_by_its_timeout(closed_port, argv, tmp_path):
    """Refused connections are retried (nothing was sent, so even a commit
    may be), by the gateway and by the counter: all within one deadline.
    ``Unavailable``: nothing was written."""
    check(closed_port, argv, tmp_path, ("Unavailable",))


@pytest.mark.slow
@pytest.mark.parametrize("argv", params(COMMANDS, quick=COMMANDS[:1]), ids=[c[0] for c in COMMANDS])
def test_a_server_that_never_answers_fails_the_command_by_its_timeout(silent_port, argv, tmp_path):
    """Every call waits until the deadline; the command makes no second
    call after it. A commit that timed out may have arrived, so it is
    ``CommitUnknown``; reads are ``Unavailable``."""
    check(silent_port, argv, tmp_path, ("Unavailable", "CommitUnknown"))


def test_ctrl_c_exits_130_with_one_line_and_no_traceback(silent_listener, silent_port, tmp_path):
    """Ctrl-C on a command waiting for a server that never answers: the
    status a shell expects, 130, and one line on stderr, not a Python
    traceback. (A server, not SQLite's write lock: SQLite waits for its lock
    inside C, where an interrupt lands only when the wait ends.)"""
    import signal

    env = {k: v for k, v in os.environ.items() if k not in ("GDS_URL", "DATASTORE_PROJECT_ID")}
    env["DATASTORE_EMULATOR_HOST"] = f"127.0.0.1:{silent_port}"
    script = Path(sys.executable).with_name("gds-counter")
    # As from a terminal: SIGINT at its default, whatever this process set
    # (Python leaves SIGINT alone when it starts with it ignored).
    command = subprocess.Popen([str(script), "--url", "datastore://p", "--timeout", "60", "increment", "x", "1"],
                               cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # Started, past its imports, and waiting for the server (a fixed
        # sleep could end during the imports on a loaded machine).
        silent_listener.settimeout(60)
        connection, _ = silent_listener.accept()
        with connection:  # held open, silent, until the command has ended
            command.send_signal(signal.SIGINT)
            out, err = command.communicate(timeout=30)
    finally:
        command.kill()
        command.wait()
    assert command.returncode == 130, (out, err)
    assert "Traceback" not in err and err.count("\n") == 1 and "interrupted" in err, err
    assert out == ""
