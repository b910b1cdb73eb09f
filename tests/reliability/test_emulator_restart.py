"""The Datastore gateway across a server restart.

A dedicated Datastore emulator (not the session ones other tests share) is
started with an on-disk store, a writer thread increments a counter through
it, the emulator is stopped and, a few seconds later, started again on the
SAME port with the same data directory. Why the Datastore emulator: it keeps
its data across a clean restart when it stores on disk, so the count can be
reconciled exactly over the whole run; the Firestore emulator always starts
empty.

What must hold:

* while the server is down every call fails with a typed error
  (``Unavailable``, ``CommitUnknown``, or ``GatewayError`` naming a deadline)
  and returns within its deadline: nothing hangs;
* once the server is back, the same gateway (same gRPC channel) recovers;
* the total is at least the increments that returned and at most those plus
  the ones reported unknown.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import pytest

from gds_counter.counter import CounterShardDS
from gds_counter.errors import CommitUnknown, Contention, GatewayError, Unavailable
from gds_counter.gateway.base import Key
from gds_counter.gds import RetryPolicy
from gds_counter.testing import Emulator

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

PROJECT = "gds-counter-restart"
TIMEOUT = 2.0  # the gateway's deadline per call, retries included
RETRY = RetryPolicy(attempts=3, initial=0.05, maximum=0.2)
#: An add makes at most RETRY.attempts attempts of a few calls, each bounded by TIMEOUT.
ADD_BOUND = RETRY.attempts * 3 * TIMEOUT + 2.0


def _ready(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}/", timeout=1) as response:  # noqa: S310 - loopback
            return response.read().strip() == b"Ok"
    except (urllib.error.URLError, OSError, ValueError):
        return False


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_datastore_emulator(host: str, data_dir: str, log_path: Path) -> Emulator:
    gcloud = os.environ.get("GDS_GCLOUD") or shutil.which("gcloud")
    if not gcloud:
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail("gcloud is not on PATH (CI=true: emulator tests may not be skipped)")
        pytest.skip("gcloud is not on PATH")
    command = [
        gcloud, "--quiet", "beta", "emulators", "datastore", "start", "--consistency=1.0",
        f"--host-port={host}", f"--project={PROJECT}", f"--data-dir={data_dir}",
    ]
    env = dict(os.environ, CLOUDSDK_CORE_DISABLE_PROMPTS="1")
    env.pop("DATASTORE_EMULATOR_HOST", None)
    with open(log_path, "ab") as log_file:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
    emulator = Emulator("datastore", host, PROJECT, log_path, process)
    deadline = time.monotonic() + 60
    while not _ready(host):
        if process.poll() is not None or time.monotonic() > deadline:
            emulator.stop()
            pytest.fail(f"the restart emulator did not start:\n{emulator.log_tail()}")
        time.sleep(0.1)
    return emulator


class Writer(threading.Thread):
    """Adds 1 in a loop and records what each call reported, and how long it took."""

    def __init__(self, counter: CounterShardDS) -> None:
        super().__init__(daemon=True)
        self.counter = counter
        self.stop = threading.Event()
        self.outcomes: Counter[str] = Counter()
        self.slowest_failure = 0.0
        self.last_ok = 0.0
        self.errors: list[str] = []
        self.unexpected: list[BaseException] = []

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                self.counter.add(1)
            except CommitUnknown as exc:
                self.outcomes["unknown"] += 1
                self._failed(started, exc)
            except (Unavailable, Contention, GatewayError) as exc:
                self.outcomes[type(exc).__name__] += 1
                self._failed(started, exc)
            except BaseException as exc:  # anything untyped is a bug
                self.unexpected.append(exc)
                return
            else:
                self.outcomes["ok"] += 1
                self.last_ok = time.monotonic()

    def _failed(self, started: float, exc: BaseException) -> None:
        self.slowest_failure = max(self.slowest_failure, time.monotonic() - started)
        if len(self.errors) < 5:
            self.errors.append(f"{type(exc).__name__}: {exc}")
        time.sleep(0.05)


def test_the_gateway_recovers_after_the_server_restarts(tmp_path, tally):
    data_dir = tempfile.mkdtemp(prefix="gds-restart-")
    host = f"127.0.0.1:{_free_port()}"
    log_path = tmp_path / "emulator.log"
    emulator = start_datastore_emulator(host, data_dir, log_path)
    gateway = emulator.gateway(namespace=f"restart-{uuid.uuid4().hex[:8]}", timeout=TIMEOUT)
    writer = Writer(CounterShardDS("restart", 1, gateway=gateway, strategy="transactional", retry=RETRY))
    try:
        writer.start()
        warm = time.monotonic()
        while writer.outcomes["ok"] < 20 and time.monotonic() - warm < 20:  # the emulator's JIT warms up
            time.sleep(0.1)
        assert writer.outcomes["ok"] >= 20, (dict(writer.outcomes), writer.errors)

        emulator.stop()  # SIGTERM to the group: the emulator saves its store and exits
        down_since = time.monotonic()
        # a call while the server is down fails with a typed error, within its deadline
        started = time.monotonic()
        with pytest.raises(Unavailable):
            gateway.lookup([Key.of("Probe", "x", namespace=gateway.namespace)])
        assert time.monotonic() - started < TIMEOUT + 1.0
        time.sleep(3.0)
        ok_while_down = writer.outcomes["ok"]

        emulator = start_datastore_emulator(host, data_dir, log_path)  # same port, same data
        back_at = time.monotonic()
        while writer.outcomes["ok"] == ok_while_down and time.monotonic() - back_at < 20:
            time.sleep(0.1)
        recovered_after = time.monotonic() - back_at
        assert writer.outcomes["ok"] > ok_while_down, f"no recovery within 20 s: {writer.errors}"
        time.sleep(1.5)

        writer.stop.set()
        writer.join(ADD_BOUND + 5)
        assert not writer.is_alive(), "the writer hung"
        assert not writer.unexpected, writer.unexpected
        outcomes = writer.outcomes
        failures = sum(n for kind, n in outcomes.items() if kind != "ok")
        assert failures > 0, "the downtime should have been seen"
        assert writer.slowest_failure < ADD_BOUND, writer.slowest_failure
        total = writer.counter.get_count()
        tally.add(
            "Datastore emulator stopped and restarted under a writer",
            operations=sum(outcomes.values()),
            crashes_survived=1,
            increments_lost=max(0, outcomes["ok"] - total),
            double_counts=max(0, total - outcomes["ok"] - outcomes["unknown"]),
            reported_unknown=outcomes["unknown"],
        )
        print(f"\nrestart: outcomes={dict(outcomes)} total={total} down {back_at - down_since:.1f}s, "
              f"recovered {recovered_after:.1f}s after the server was back, slowest failure "
              f"{writer.slowest_failure:.1f}s; first errors: {writer.errors[:3]}")
        assert outcomes["ok"] <= total <= outcomes["ok"] + outcomes["unknown"], (dict(outcomes), total)
    finally:
        writer.stop.set()
        writer.join(ADD_BOUND + 5)
        gateway.close()
        emulator.stop()
        shutil.rmtree(data_dir, ignore_errors=True)
