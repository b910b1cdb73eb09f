"""The embedded engine's lone call: this tree beside another, side by side.

    python benchmarks/engine_lone_call.py [--before PATH] [--rounds 5] [--calls 2000] [--threads 16] [--seconds 3]
    PYTHONPATH=. python benchmarks/engine_lone_call.py --parts

Each round runs one subprocess per tree, alternating (``--before``, a
checkout of another commit, imports its own ``gds_counter``; without it
only this tree is measured). A subprocess measures, on memory
(``memory://``) and on a SQLite file in a temporary folder (the engine's
settings: WAL, ``synchronous = FULL``), for a warm
``CounterShardDS("Contention", 1, 20)`` whose shards are all written:

1. per call, wall, user and system time (``getrusage``) of ``add(1)``,
   ``get_count()`` and ``increment()``; of the engine alone (its hooks
   ``_commit`` of the masked increment ``add()`` sends, and ``_run_query``
   of the target query ``get_count()`` sends); and of a raw sqlite3
   upsert on the same storage (``count = count + 1``, autocommitted;
   benchmarks/_common.py);
2. on the file, ``--threads`` threads calling ``increment()`` for
   ``--seconds``, and as many raw upserts on a connection each.

It prints, per tree, the median of the rounds. ``--parts`` instead times
each step of the engine's commit of one ``add()`` alone, in the tree it
imports (the least of 7 repeats of ``timeit``; docs/performance.md, "What the lone
call pays"). The machine's other load
moves single figures by tens of percent (the file's fsync most): read the
trees against each other, in one run, never against an older run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import sqlite_connect, sqlite_upsert  # noqa: E402
from embedded_profile import threaded  # noqa: E402

TARGET = ("Contention", 1)


def per_call(op: Callable[[], object], n: int) -> tuple[float, float, float]:
    """Wall, user and system microseconds per call of ``op`` (``getrusage``:
    ``os.times`` counts in 10 ms ticks)."""
    wall, times = time.perf_counter(), resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(n):
        op()
    after = resource.getrusage(resource.RUSAGE_SELF)
    return ((time.perf_counter() - wall) / n * 1e6, (after.ru_utime - times.ru_utime) / n * 1e6,
            (after.ru_stime - times.ru_stime) / n * 1e6)


def measure(storage: str, folder: str, calls: int) -> dict[str, tuple[float, float, float]]:
    """Per-call times of the counter's calls, the engine's hooks and raw sqlite3 on ``storage``."""
    from gds_counter import CounterShardDS
    from gds_counter.counter.layout import PHP_ARTICLE
    from gds_counter.gateway.embedded import EmbeddedGateway
    from gds_counter.gateway.keys import Key
    from gds_counter.gateway.mutations import Increment, Upsert
    from gds_counter.gateway.query import PropertyFilter, Query
    from gds_counter.gateway.values import RawEntity

    gateway = EmbeddedGateway(None if storage == "memory" else os.path.join(folder, "engine.sqlite3"))
    counter = CounterShardDS(*TARGET, 20, gateway=gateway)
    gateway.commit([Upsert(PHP_ARTICLE.shard_entity(counter.target, n, 1)) for n in range(1, 21)])
    for _ in range(300):
        counter.add(1)
    kind, target = PHP_ARTICLE.shard_entity(counter.target, 1, 1).key.kind, f"{TARGET[0]}_{TARGET[1]}"
    mutations = [[Upsert(RawEntity(Key.of(kind, f"{target}_{n}"), {"target": target}, frozenset({"count"})),
                         property_mask=("target",), transforms=(Increment("count", 1),))] for n in range(1, 21)]
    query = Query(kind, filter=PropertyFilter("target", "=", target))
    turn = iter(range(10**9))
    raw = sqlite_connect(":memory:" if storage == "memory" else os.path.join(folder, "raw.sqlite3"))
    upsert = sqlite_upsert(raw, 20)
    for _ in range(300):
        upsert()
    out = {
        "raw sqlite3 upsert": per_call(upsert, calls),
        "add(1)": per_call(lambda: counter.add(1), calls),
        "get_count()": per_call(counter.get_count, calls),
        "increment()": per_call(counter.increment, calls),
        "engine commit (add's)": per_call(lambda: gateway._commit(mutations[next(turn) % 20], None), calls),
        "engine query (get_count's)": per_call(lambda: gateway._run_query(query, None), calls),
    }
    raw.close()
    gateway.close()
    return out


def parts(storage: str, folder: str) -> dict[str, float]:
    """CPU microseconds (user and system: ``time.process_time``, whose
    total is exact where ``getrusage``'s split between them is sampled) of
    each step of the engine's commit of one ``add()``, for the whole commit
    also its wall time (on a file mostly ``COMMIT``'s fsync); then of the
    query of one ``get_count()``: the whole, its SQL, its rows made."""
    import timeit

    from gds_counter.gateway.embedded import EmbeddedGateway, _storage
    from gds_counter.gateway.embedded._encoding import key_bytes
    from gds_counter.gateway.embedded._engine import for_another
    from gds_counter.gateway.embedded._group_commit import GroupCommit
    from gds_counter.gateway.keys import Key
    from gds_counter.gateway.mutations import Increment, Upsert
    from gds_counter.gateway.values import RawEntity

    gateway = EmbeddedGateway(None if storage == "memory" else os.path.join(folder, f"parts-{storage}.sqlite3"))
    key = Key.of("IK_CounterShardEntity", "Contention_1_1")
    mutation = Upsert(RawEntity(key, {"target": "Contention_1"}, frozenset({"count"})), property_mask=("target",),
                      transforms=(Increment("count", 1),))
    for _ in range(300):
        gateway._commit([mutation], None)

    def best(op: Callable[[], object], n: int = 2000, timer: Callable[[], float] = time.process_time) -> float:
        return min(timeit.repeat(op, number=n, repeat=7, timer=timer)) / n * 1e6

    def commit() -> None:
        gateway._commit([mutation], None)

    out: dict[str, float] = {
        "the whole commit (EmbeddedGateway._commit)": best(commit, 500),
        "  its wall time": best(commit, 500, time.perf_counter),
    }

    def lease() -> None:
        with gateway._db():
            pass

    out["lend and give back a connection (Lease)"] = best(lease)
    if storage == "file":
        group = GroupCommit()
        out["group commit, a lone writer (no-op write)"] = best(lambda: group.commit([], gateway._pool.write_lock, lambda take: take(), for_another))
    kb = key_bytes(key)
    with gateway._db() as conn:
        timeout = conn.busy_timeout

        def empty_write() -> None:
            with _storage.write_transaction(conn, timeout):
                conn.execute("COMMIT")

        out["BEGIN IMMEDIATE .. COMMIT, nothing written" + (" (+ busy handler pair)" if timeout else "")] = best(empty_write)
        conn.execute("BEGIN IMMEDIATE")
        try:
            if storage == "file":
                out["UPDATE meta (commit number)"] = best(lambda: conn.execute(
                    "UPDATE meta SET value = value + 1 WHERE name = 'commit_seq' RETURNING value").fetchall())
                out["check the file is still the one opened (2 stat)"] = best(lambda: gateway._pool.check_file(conn))
            out["SELECT the stored text"] = best(lambda: conn.execute("SELECT data FROM entities WHERE key_bytes = ?", (kb,)).fetchone())
            text = conn.execute("SELECT data FROM entities WHERE key_bytes = ?", (kb,)).fetchone()[0]
            out["UPDATE the row"] = best(lambda: conn.execute(
                "UPDATE entities SET version = ?, written_at = ?, data = ? WHERE key_bytes = ?", (1, 0.0, text, kb)))
            out["upsert() whole: mask, transform, checks, JSON, index, 2 statements"] = best(
                lambda: _storage.upsert(conn, mutation, key, 1, 0.0, gateway._decodings))
        finally:
            conn.execute("ROLLBACK")
    # get_count()'s query: the target query over the 20 shards
    from gds_counter.gateway.query import PropertyFilter, Query

    gateway._commit([Upsert(RawEntity(Key.of(key.kind, f"Contention_1_{n}"), {"target": "Contention_1", "count": n},
                                      frozenset({"count"}))) for n in range(1, 21)], None)
    query = Query(key.kind, filter=PropertyFilter("target", "=", "Contention_1"))
    compiled = gateway._queries.compiled(query)
    out["the whole query of get_count() (EmbeddedGateway._run_query, 20 rows)"] = best(lambda: gateway._run_query(query, None), 1000)
    with gateway._db() as conn:
        out["  its SQL, executed and fetched"] = best(lambda: conn.execute(compiled.sql, compiled.params).fetchall(), 1000)
        out["  its SQL and its 20 rows made (QueryBatches.batch: entity, Doc, Row each)"] = best(
            lambda: gateway._queries.batch(conn, query, compiled), 1000)
    gateway.close()
    return out


def child(calls: int, threads: int, seconds: float) -> dict[str, Any]:
    from gds_counter import CounterShardDS
    from gds_counter.counter.layout import PHP_ARTICLE
    from gds_counter.gateway.embedded import EmbeddedGateway
    from gds_counter.gateway.mutations import Upsert

    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gds-lone-") as folder:
        for storage in ("memory", "file"):
            result[storage] = measure(storage, folder, calls)
        gateway = EmbeddedGateway(os.path.join(folder, "threads.sqlite3"))
        counter = CounterShardDS(*TARGET, 20, gateway=gateway)
        gateway.commit([Upsert(PHP_ARTICLE.shard_entity(counter.target, n, 1)) for n in range(1, 21)])
        rate = threaded([counter.increment] * threads, seconds)
        conns = [sqlite_connect(os.path.join(folder, "raw.sqlite3")) for _ in range(threads)]
        raw_rate = threaded([sqlite_upsert(conn, 20) for conn in conns], seconds)
        for conn in conns:
            conn.close()
        gateway.close()
        result["threads"] = {"increment()/s": rate, "raw upserts/s": raw_rate, "ratio": rate / raw_rate}
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", help="a checkout of another commit, measured beside this tree")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--parts", action="store_true", help="time each step of the engine's commit, this tree only")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.parts:
        with tempfile.TemporaryDirectory(prefix="gds-parts-") as folder:
            for storage in ("memory", "file"):
                print(f"{storage}: CPU us per step (least of 7)")
                for name, us in parts(storage, folder).items():
                    print(f"  {name:72s} {us:7.1f}")
        return 0
    if args.child:
        print(json.dumps(child(args.calls, args.threads, args.seconds)))
        return 0
    trees = {"this tree": str(HERE.parent)}
    if args.before:
        trees = {"before": os.path.abspath(args.before), **trees}
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    for _ in range(args.rounds):
        for label, tree in trees.items():
            command = [sys.executable, __file__, "--child", "--calls", str(args.calls), "--threads", str(args.threads),
                       "--seconds", str(args.seconds)]
            done = subprocess.run(command, env={**os.environ, "PYTHONPATH": tree}, cwd=tree, capture_output=True, text=True,
                                  check=True)
            runs[label].append(json.loads(done.stdout))
    print(f"median of {args.rounds} round(s), per call: wall / user / system us")
    for storage in ("memory", "file"):
        print(f"\n{storage}:")
        for name in runs[next(iter(trees))][0][storage]:
            cells = []
            for label in trees:
                median = [statistics.median(run[storage][name][i] for run in runs[label]) for i in range(3)]
                cells.append(f"{label} {median[0]:6.0f} / {median[1]:4.0f} / {median[2]:3.0f}")
            print(f"  {name:28s} " + "    ".join(cells))
    print(f"\n{args.threads} threads on one file, {args.seconds:g} s:")
    for label in trees:
        rates = {k: statistics.median(run["threads"][k] for run in runs[label]) for k in ("increment()/s", "raw upserts/s", "ratio")}
        print(f"  {label}: increment() {rates['increment()/s']:,.0f}/s, raw upserts {rates['raw upserts/s']:,.0f}/s, "
              f"ratio {rates['ratio']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
