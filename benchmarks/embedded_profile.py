"""Where one embedded ``increment()`` spends its time, next to raw sqlite3.

    python benchmarks/embedded_profile.py [--increments 2000] [--threads 16] [--seconds 3] [--top 25]

On a SQLite file in a temporary folder (the engine's file settings: WAL,
``synchronous = FULL``), for a warm ``CounterShardDS("Contention", 1, 20)``
whose 20 shards are all written:

1. one thread: wall, user and system time per ``increment()``, ``add()``
   and ``get_count()``, and per raw sqlite3 upsert (``count = count + 1``,
   benchmarks/_common.py's baseline); the SQL statements one increment runs
   (SQLite's trace callback) and its Python calls (cProfile's count);
2. ``--threads`` writers on one gateway for ``--seconds``: increments per
   second, raw upserts per second (a connection per thread), and how many
   commits were grouped and total reads shared (``gateway.stats``);
3. ``--top`` functions by internal time under cProfile (which inflates
   Python's share: read it for where, not for how much).

Goal 4 of the performance issue is measured by benchmarks/contention.py;
this script is for finding out why a ratio is what it is.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import sqlite_connect, sqlite_upsert  # noqa: E402

from gds_counter import CounterShardDS  # noqa: E402
from gds_counter.counter.layout import PHP_ARTICLE  # noqa: E402
from gds_counter.gateway.embedded import EmbeddedGateway  # noqa: E402
from gds_counter.gateway.mutations import Upsert  # noqa: E402

TARGET = ("Contention", 1)


def per_call(label: str, op: Callable[[], object], n: int) -> None:
    wall, times = time.perf_counter(), os.times()
    for _ in range(n):
        op()
    after = os.times()
    print(f"  {label:24s} {(time.perf_counter() - wall) / n * 1e6:8.0f} us wall "
          f"{(after.user - times.user) / n * 1e6:6.0f} us user {(after.system - times.system) / n * 1e6:6.0f} us system")


def threaded(ops: list[Callable[[], object]], seconds: float) -> float:
    stop = time.perf_counter() + seconds
    counts = [0] * len(ops)

    def writer(i: int) -> None:
        while time.perf_counter() < stop:
            ops[i]()
            counts[i] += 1

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(len(ops))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(counts) / seconds


def warm_counter(path: str) -> tuple[EmbeddedGateway, CounterShardDS]:
    gateway = EmbeddedGateway(path)
    counter = CounterShardDS(*TARGET, 20, gateway=gateway)
    counter.increment()
    gateway.commit([Upsert(PHP_ARTICLE.shard_entity(counter.target, n, 1)) for n in range(1, 21)])
    for _ in range(200):
        counter.increment()
    return gateway, counter


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--increments", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    n = args.increments
    with tempfile.TemporaryDirectory(prefix="gds-profile-") as folder:
        gateway, counter = warm_counter(os.path.join(folder, "embedded.sqlite3"))
        raw = sqlite_connect(os.path.join(folder, "raw.sqlite3"))
        upsert = sqlite_upsert(raw, 20)
        print(f"one thread, {n} calls each:")
        per_call("raw sqlite3 upsert", upsert, n)
        per_call("add()", counter.add, n)
        per_call("get_count()", counter.get_count, n)
        per_call("increment()", counter.increment, n)

        statements: list[str] = []
        for conn in list(gateway._pool._idle):  # white box: the pool's idle connections
            conn.set_trace_callback(statements.append)
        counter.increment()
        for conn in list(gateway._pool._idle):
            conn.set_trace_callback(None)
        print(f"\nSQL statements of one increment() ({len(statements)}):")
        for sql in statements:
            print("  " + " ".join(sql.split())[:110])

        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(n):
            counter.increment()
        profiler.disable()
        stats = pstats.Stats(profiler)
        print(f"\nPython calls per increment(): {stats.total_calls / n:.0f}")  # type: ignore[attr-defined]

        gateway.stats.reset()
        rate = threaded([counter.increment] * args.threads, args.seconds)
        snapshot = gateway.stats.snapshot()
        conns = [sqlite_connect(os.path.join(folder, "raw.sqlite3")) for _ in range(args.threads)]
        raw_rate = threaded([sqlite_upsert(conn, 20) for conn in conns], args.seconds)
        print(f"\n{args.threads} threads, {args.seconds:g} s: increment() {rate:,.0f}/s, raw upserts {raw_rate:,.0f}/s "
              f"(ratio {rate / raw_rate:.2f}); commits {snapshot.get('rpc.commit', 0):,}, of them grouped "
              f"{snapshot.get('grouped_commits', 0):,}; total reads {snapshot.get('rpc.run_query', 0):,}, of them shared "
              f"{snapshot.get('shared_reads', 0):,}")
        for conn in [raw, *conns]:
            conn.close()
        gateway.close()
        if args.top:
            print(f"\ncProfile, {n} single-thread increments, top {args.top} by internal time:")
            stats.sort_stats("tottime").print_stats(args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
