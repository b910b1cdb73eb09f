"""A writer process for test_stalled_lock_holder: run as a script.

    python stalled_writer.py DB_PATH SECONDS THREADS DEADLINE_S BUSY_S

THREADS threads ``add(1)`` to one counter for SECONDS. A watchdog gives up
on any call that has run DEADLINE_S: it raises KeyboardInterrupt in that
thread (as a caller's deadline or a Ctrl-C would). SQLite's busy timeout is
BUSY_S. Prints one JSON line: how many calls returned (``acked``), how many
raised an error that says nothing was stored (``not_stored``), and how many
may have been stored (``maybe``: CommitUnknown, or an interrupt whose note
does not say "NOT written"; "WAS written" counts as acked).
"""

from __future__ import annotations

import ctypes
import json
import sys
import threading
import time

from gds_counter.gateway.embedded import _connections


def main() -> None:
    path, seconds, threads, deadline_s, busy_s = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
    _connections.BUSY_TIMEOUT_S = busy_s  # before the gateway opens its connections
    from gds_counter.counter import CounterShardDS
    from gds_counter.errors import BadValueError, CommitUnknown, Contention, Unavailable
    from gds_counter.gateway.embedded import EmbeddedGateway
    from gds_counter.gds import RetryPolicy

    gateway = EmbeddedGateway(path)
    counter = CounterShardDS("stalled", 4, gateway=gateway, retry=RetryPolicy(attempts=2, initial=0.01, maximum=0.05))
    tally = {"acked": 0, "not_stored": 0, "maybe": 0}
    lock = threading.Lock()
    started: dict[int, float] = {}  # thread ident -> when its call began
    stop = time.monotonic() + seconds

    def count(outcome: str) -> None:
        with lock:
            tally[outcome] += 1

    def loop() -> None:
        me = threading.get_ident()
        while time.monotonic() < stop:
            try:
                started[me] = time.monotonic()
                try:
                    counter.add(1)
                finally:
                    started.pop(me, None)
                count("acked")
            except (Contention, Unavailable, BadValueError):
                count("not_stored")
            except CommitUnknown:
                count("maybe")
            except KeyboardInterrupt as exc:
                said = " ".join(getattr(exc, "__notes__", []))
                count("acked" if "WAS written" in said else "not_stored" if "NOT written" in said else "maybe")

    def watchdog() -> None:
        while time.monotonic() < stop + 2 * busy_s + deadline_s:
            now = time.monotonic()
            for ident, began in list(started.items()):
                if now - began > deadline_s and started.get(ident) == began:
                    started.pop(ident, None)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(KeyboardInterrupt))
            time.sleep(0.01)

    workers = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    dog = threading.Thread(target=watchdog, daemon=True)
    print("ready", flush=True)
    for thread in workers:
        thread.start()
    dog.start()
    for thread in workers:
        thread.join()
    print(json.dumps(tally), flush=True)


if __name__ == "__main__":
    main()
