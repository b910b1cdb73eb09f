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

import functools
import time
import uuid
from collections import Counter

import pytest
from sizes import size

from gds_counter._load import start_load
from gds_counter.counter import CounterShardDS
from gds_counter.emulators import Emulator, EmulatorError, find_gcloud, launch_emulator
from gds_counter.errors import Contention, GatewayError, Unavailable
from gds_counter.gateway.keys import Key
from gds_counter.gds import RetryPolicy

pytestmark = [pytest.mark.emulator, pytest.mark.slow]

PROJECT = "gds-counter-restart"
TIMEOUT = 2.0  # the gateway's deadline per call, retries included
RETRY = RetryPolicy(attempts=3, initial=0.05, maximum=0.2)
#: An add makes at most RETRY.attempts attempts of a few calls, each bounded by TIMEOUT.
ADD_BOUND = RETRY.attempts * 3 * TIMEOUT + 2.0


def start_datastore_emulator(data_dir: str, host: str | None = None) -> Emulator:
    """The Datastore emulator storing on disk in ``data_dir``; on ``host``
    (the previous run's) to restart it in place. No gcloud: skipped (the
    project's conftest fails it under CI); gcloud there but no emulator: fails."""
    try:
        find_gcloud()
    except EmulatorError as exc:
        pytest.skip(str(exc))
    try:
        return launch_emulator("datastore", project=PROJECT, host=host, data_dir=data_dir)
    except EmulatorError as exc:
        pytest.fail(f"the restart emulator did not start: {exc}")


def test_the_gateway_recovers_after_the_server_restarts(tmp_path, tally):
    data_dir = str(tmp_path / "emulator-data")  # the on-disk store, kept across the restart
    emulator = start_datastore_emulator(data_dir)
    host = emulator.host
    gateway = emulator.gateway(namespace=f"restart-{uuid.uuid4().hex[:8]}", timeout=TIMEOUT)
    counter = CounterShardDS("restart", 1, gateway=gateway, strategy="transactional", retry=RETRY)
    # One writer adding 1 until stopped. Storage errors are recorded by type
    # (CommitUnknown: it may have been applied), with a short pause after
    # each; anything untyped is a bug and stops it (writer.unexpected).
    writer = start_load(lambda: functools.partial(counter.add, 1), counted=(Contention, GatewayError),
                        pause_after_error=0.05)
    try:
        warm = time.monotonic()
        while writer.ok < 20 and time.monotonic() - warm < 20:  # the emulator's JIT warms up
            time.sleep(0.1)
        assert writer.ok >= 20, writer.result()

        emulator.stop()  # SIGTERM to the group: the emulator saves its store and exits
        down_since = time.monotonic()
        # a call while the server is down fails with a typed error, within its deadline
        started = time.monotonic()
        with pytest.raises(Unavailable):
            gateway.lookup([Key.of("Probe", "x", namespace=gateway.namespace)])
        assert time.monotonic() - started < TIMEOUT + 1.0
        time.sleep(size(1.0, 3.0))  # down a while, the writer failing
        ok_while_down = writer.ok

        emulator = start_datastore_emulator(data_dir, host)  # same port, same data
        back_at = time.monotonic()
        while writer.ok == ok_while_down and time.monotonic() - back_at < 20:
            time.sleep(0.1)
        recovered_after = time.monotonic() - back_at
        assert writer.ok > ok_while_down, f"no recovery within 20 s: {writer.result().first_errors}"
        time.sleep(size(0.5, 1.5))  # and up a while

        writer.stop()
        assert writer.join(ADD_BOUND + 5), "the writer hung"
        assert not writer.unexpected, writer.unexpected
        result = writer.result()
        outcomes = Counter(result.errors, ok=result.ok)
        outcomes["unknown"] = outcomes.pop("CommitUnknown", 0)
        failures = result.failed
        assert failures > 0, "the downtime should have been seen"
        assert result.slowest_failure < ADD_BOUND, result.slowest_failure
        total = counter.get_count()
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
              f"{result.slowest_failure:.1f}s; first errors: {result.first_errors[:3]}")
        assert outcomes["ok"] <= total <= outcomes["ok"] + outcomes["unknown"], (dict(outcomes), total)
    finally:
        writer.stop()
        writer.join(ADD_BOUND + 5)
        gateway.close()
        emulator.stop()
