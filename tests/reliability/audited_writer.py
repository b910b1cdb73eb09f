"""A writer process for test_stalled_lock_holder's audited test: run as a script.

    python audited_writer.py DB_PATH STRATEGY SECONDS THREADS OUT_PATH BUSY_S DEADLINE_S
    python audited_writer.py DB_PATH STRATEGY stall BUSY_S DEADLINE_S

Every call ``add(1)``s to one counter with combined writes off (one commit
per call), and the commit writes one row ``(pid, call)`` into the file's
``audit`` table in its own transaction, so the file itself says how many
times each call was applied, whatever the callers were told. (Recorded
after the call's mutations were applied and before COMMIT: a commit rolled
back takes its row with it.)

A writer runs THREADS threads for SECONDS and writes OUT_PATH, a JSON
object with its pid and each call's outcome: ``acked`` (returned), ``not_stored`` (``Contention``,
``Unavailable``: nothing applied), ``maybe`` (``CommitUnknown``) or
``other``. The ``stall`` role adds in one thread, printing ``acked CALL``
after each return (``failed CALL`` after an error); each line on its stdin arms it to stop itself
(SIGSTOP) inside its next write transaction, after ``BEGIN IMMEDIATE``
and before ``COMMIT``, printing ``holding CALL`` first.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

from gds_counter.gateway.embedded import _connections

COUNTER = "stalled"
SHARDS = 4


def audited(gateway: Any) -> threading.local:
    """Record each applied commit in ``audit`` (see the module docstring);
    returns the thread-local whose ``call`` names the calling thread's call."""
    local = threading.local()
    calls: dict[int, int] = {}  # id of a commit's mutation list -> its call (a group writer writes others')
    apply, mutate = gateway._apply, gateway._mutate

    def _apply(mutations: Any, txn: Any) -> Any:
        calls[id(mutations)] = local.call
        try:
            return apply(mutations, txn)
        finally:
            calls.pop(id(mutations), None)

    def _mutate(conn: Any, mutations: Any, *args: Any) -> Any:
        out = mutate(conn, mutations, *args)
        conn.execute("INSERT INTO audit (pid, call) VALUES (?, ?)", (os.getpid(), calls.get(id(mutations), -1)))
        return out

    gateway._apply, gateway._mutate = _apply, _mutate
    return local


def main() -> None:
    path, strategy = sys.argv[1], sys.argv[2]
    stall = sys.argv[3] == "stall"
    busy_s, deadline_s = float(sys.argv[-2]), float(sys.argv[-1])
    _connections.BUSY_TIMEOUT_S = busy_s  # before the gateway opens its connections
    from gds_counter.counter import CounterShardDS
    from gds_counter.counter.runtime import Runtime
    from gds_counter.errors import BadValueError, CommitUnknown, Contention, Unavailable
    from gds_counter.gateway.embedded import EmbeddedGateway
    from gds_counter.gds import RetryPolicy

    gateway = EmbeddedGateway(path)
    Runtime(combine_writes=False).install(gateway)
    counter = CounterShardDS(COUNTER, SHARDS, gateway=gateway, strategy=strategy, retry=RetryPolicy(deadline=deadline_s))
    local = audited(gateway)
    numbers = iter(range(1, 10**9))
    numbering = threading.Lock()

    def next_call() -> int:
        with numbering:
            local.call = next(numbers)
        return int(local.call)

    if stall:
        armed = threading.Event()
        check_file = gateway._pool.check_file

        def stop_inside(conn: Any) -> None:  # called inside the write transaction, just before COMMIT
            if armed.is_set():
                armed.clear()
                print("holding", local.call, flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            check_file(conn)

        gateway._pool.check_file = stop_inside

        def adding() -> None:
            while True:
                call = next_call()
                try:
                    counter.add(1)
                except Exception:  # noqa: BLE001 - its outcome is a line; only "acked" calls are checked
                    print("failed", call, flush=True)
                else:
                    print("acked", call, flush=True)

        threading.Thread(target=adding, daemon=True).start()
        for _ in sys.stdin:
            armed.set()
        return

    seconds, threads, out_path = float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    outcomes: dict[int, str] = {}
    stop = time.monotonic() + seconds

    def loop() -> None:
        while time.monotonic() < stop:
            call = next_call()
            try:
                counter.add(1)
                outcome = "acked"
            except (Contention, Unavailable, BadValueError):
                outcome = "not_stored"
            except CommitUnknown:
                outcome = "maybe"
            except Exception:  # noqa: BLE001 - reported as such; the test fails on it
                outcome = "other"
            outcomes[call] = outcome

    workers = [threading.Thread(target=loop) for _ in range(threads)]
    print("ready", flush=True)
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    with open(out_path, "w", encoding="utf-8") as out:
        json.dump({"pid": os.getpid(), "strategy": strategy, "outcomes": outcomes}, out)


if __name__ == "__main__":
    main()
