"""Ctrl-C at random moments into a program counting: run as a script.

    python interrupted_counter.py URL CALLS BESIDE MAX_DELAY_S SEED [CACHE]

The main thread calls ``add(1)`` CALLS times on one counter; before each,
a timer (SIGALRM) is set to raise KeyboardInterrupt after a random delay
of up to MAX_DELAY_S, so the interrupt lands anywhere: in the counter, the
rounds, the pool, the group commit, SQLite, ``threading`` itself. BESIDE
threads increment the same counter meanwhile (with ``cache=CACHE`` when
given, as the main thread). An error that is not a ``GDSError``, in any
thread, fails the run (status 3). Each call's deadline is
5 s; if any call runs for 30 s,
every thread's stack is printed and the process exits with status 1.
Prints one JSON line: calls that returned (``acked``), calls that raised
an error saying the outcome is unknown or were interrupted (``maybe``),
interrupts sent (``interrupts``), and the total stored (``stored``), read
back once no interrupt can land any more.
"""

from __future__ import annotations

import faulthandler
import json
import random
import signal
import sys
import threading

from gds_counter import CounterShardDS, RetryPolicy, open_gateway
from gds_counter.errors import CommitUnknown, GDSError

#: Each call's deadline; a call still running HANG_S later hangs.
RETRY = RetryPolicy(deadline=5.0)
HANG_S = 30.0


def main() -> None:
    url, calls, beside, max_delay, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
    cache = sys.argv[6] if len(sys.argv) > 6 else None
    dice = random.Random(seed)
    gateway = open_gateway(url)
    counter = CounterShardDS("interrupted", 2, gateway=gateway, retry=RETRY, cache=cache)
    armed = [False]
    counts = {"acked": 0, "maybe": 0, "interrupts": 0}
    lock = threading.Lock()
    foreign: list[str] = []  # errors that are not GDSErrors, from any thread

    def on_alarm(signum: int, frame: object) -> None:
        if armed[0]:
            counts["interrupts"] += 1
            raise KeyboardInterrupt

    signal.signal(signal.SIGALRM, on_alarm)
    stop = threading.Event()

    def count_beside() -> None:
        other = CounterShardDS("interrupted", 2, gateway=gateway, retry=RETRY, cache=cache)
        while not stop.is_set():
            try:
                other.add(1)
                outcome = "acked"
            except CommitUnknown:
                outcome = "maybe"
            except GDSError:
                continue  # an error that says nothing was stored
            except Exception as exc:  # noqa: B902  (not a GDSError: what the promise rules out)
                foreign.append(f"{type(exc).__name__}: {exc}")
                continue
            with lock:
                counts[outcome] += 1

    threads = [threading.Thread(target=count_beside, daemon=True) for _ in range(beside)]
    for thread in threads:
        thread.start()
    for _ in range(calls):
        faulthandler.dump_traceback_later(HANG_S, exit=True)
        outcome = "maybe"
        try:
            try:
                armed[0] = True
                signal.setitimer(signal.ITIMER_REAL, dice.random() * max_delay)
                counter.add(1)
                outcome = "acked"
            except CommitUnknown:
                pass
            except GDSError as exc:  # an error that says nothing was stored
                outcome = "not stored"
                print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
            except Exception as exc:  # noqa: B902  (not a GDSError: what the promise rules out)
                outcome = "not stored"
                foreign.append(f"{type(exc).__name__}: {exc}")
            finally:
                armed[0] = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except KeyboardInterrupt:
            outcome = "maybe"  # (what a note on it says is not parsed here: counted as unknown)
        if outcome != "not stored":
            with lock:
                counts[outcome] += 1
    stop.set()
    for thread in threads:
        thread.join(HANG_S)
        if thread.is_alive():
            faulthandler.dump_traceback(all_threads=True)
            sys.exit(1)
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    stored = counter.get_count()
    faulthandler.cancel_dump_traceback_later()
    gateway.close()
    print(json.dumps(dict(counts, stored=stored)))
    if foreign:
        print(f"errors that are not GDSErrors: {foreign[:5]}", file=sys.stderr)
        sys.exit(3)


if __name__ == "__main__":
    main()
