"""What the counter layer costs a lone call: CPU per call, above the storage.

    python benchmarks/counter_layer.py [--calls N] [--firestore | --emulator-host HOST:PORT] [--json PATH]

For one warm counter (the PHP article's, 20 shards), called by one thread
with nothing else running: a lone ``add(1)``, ``get_count()`` and
``increment()``, on ``memory://`` and on a SQLite file (and with
``--firestore`` on the Firestore emulator in Datastore mode, which it
starts): CPU per call (user + system, ``time.process_time``) and wall time
per call, best of several rounds, and the Python calls one call makes
(``cProfile``'s count); and a lone ``add(1)`` on ``memory://`` whose
storage is stubbed out (the commit hook answers with a running count):
the counter layer alone. Beside them, the same write sent straight to the
backend's commit hook (the upsert with its increment transform, no rules,
no counter): what storage alone costs, so that "call minus hook" is the
library above the storage (docs/performance.md, "What the lone call pays").
And the memory ``add(1)`` once more, each call followed by a raw sqlite3
upsert on a file (WAL, ``synchronous=FULL``: a commit and its fsync), beside
that upsert alone: the same Python costs more when every call meets an
fsync (``python under fsync``: the pair minus the upsert), which is what a
lone ``add()`` on a file pays above its SQL.

It uses the public API but for the hook, so the same file measures an
older commit too (``PYTHONPATH=<other checkout> python benchmarks/counter_layer.py``):
before and after a change, side by side, in one session.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from gds_counter import CounterShardDS, open_gateway
from gds_counter.gateway.mutations import Increment, Upsert

WARM = 300


def per_call(call: Callable[[], Any], calls: int, rounds: int) -> tuple[float, float]:
    """Best (CPU µs, wall µs) per call over ``rounds`` rounds of ``calls`` calls."""
    for _ in range(min(WARM, calls)):
        call()
    best_cpu = best_wall = float("inf")
    for _ in range(rounds):
        cpu0, wall0 = time.process_time(), time.perf_counter()
        for _ in range(calls):
            call()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
        best_cpu, best_wall = min(best_cpu, cpu / calls * 1e6), min(best_wall, wall / calls * 1e6)
    return best_cpu, best_wall


def python_calls(call: Callable[[], Any], calls: int = 200) -> float:
    """Python function calls (and built-ins) one warm call makes."""
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(calls):
        call()
    profile.disable()
    return pstats.Stats(profile).total_calls / calls  # type: ignore[attr-defined]


def hook_upsert(counter: CounterShardDS) -> Callable[[], Any]:
    """The counter's write sent to the backend's commit hook directly."""
    gateway = counter.gateway
    layout = counter.layout
    entity = layout.shard_entity_at(layout.shard_key(counter.name, layout.first_shard, counter.namespace), counter.name, None)
    mutation = Upsert(entity, property_mask=tuple(sorted(entity.properties)), transforms=(Increment(layout.count_property, 1),))
    return lambda: gateway._commit([mutation], None)  # type: ignore[attr-defined]


def stub_storage(gateway: Any) -> None:
    """Answer ``gateway``'s commit hook with a stub that stores nothing but
    each shard's running count (what an increment transform returns): the
    counter layer alone, rules included, with no storage under it."""
    counts: dict[Any, int] = {}

    def commit(mutations: list[Any], txn: Any) -> list[tuple[Any, tuple[int, ...]]]:
        written = []
        for mutation in mutations:
            key = mutation.entity.key
            counts[key] = counts.get(key, 0) + sum(t.amount for t in mutation.transforms)
            written.append((key, (counts[key],) if mutation.transforms else ()))
        return written

    gateway._commit = commit


def measure_stubbed(calls: int, rounds: int) -> dict[str, Any]:
    """A lone ``add(1)`` on a ``memory://`` gateway of its own (not the
    shared one the other rows use) with the storage stubbed out."""
    counter = CounterShardDS("Lone", 1, 20, gateway=open_gateway("memory://"))
    counter.add(1)
    stub_storage(counter.gateway)
    call = lambda: counter.add(1)  # noqa: E731
    cpu, wall = per_call(call, calls, rounds)
    return {"backend": "memory, storage stubbed", "add": {"cpu_us": round(cpu, 1), "wall_us": round(wall, 1),
                                                          "python_calls": round(python_calls(call), 1)}}


def measure(label: str, url: Any, calls: int, rounds: int) -> dict[str, Any]:
    counter = CounterShardDS("Lone", 1, 20, gateway=url)
    counter.add(1)
    row: dict[str, Any] = {"backend": label}
    for name, call in (("add", lambda: counter.add(1)), ("get_count", counter.get_count),
                       ("increment", counter.increment), ("hook_upsert", hook_upsert(counter))):
        cpu, wall = per_call(call, calls, rounds)
        row[name] = {"cpu_us": round(cpu, 1), "wall_us": round(wall, 1), "python_calls": round(python_calls(call), 1)}
    return row


def measure_under_fsync(folder: str, calls: int, rounds: int) -> dict[str, Any]:
    """A memory ``add(1)`` alone, a raw upsert on a file alone, and the two
    in turn; ``python_under_fsync`` is the pair minus the upsert."""
    import sqlite3

    raw = sqlite3.connect(f"{folder}/raw.sqlite3", isolation_level=None)
    raw.execute("PRAGMA journal_mode = WAL")
    raw.execute("PRAGMA synchronous = FULL")
    raw.execute("CREATE TABLE shard (k INTEGER PRIMARY KEY, v INTEGER)")
    turn = [0]

    def upsert() -> None:
        turn[0] += 1
        raw.execute("INSERT INTO shard VALUES (?, 1) ON CONFLICT(k) DO UPDATE SET v = v + 1", (turn[0] % 20,))

    counter = CounterShardDS("Lone", 1, 20, gateway="memory://")
    counter.add(1)
    row: dict[str, Any] = {"backend": "memory add, file upsert"}
    for name, call in (("add", lambda: counter.add(1)), ("raw_upsert", upsert),
                       ("add_then_upsert", lambda: (counter.add(1), upsert()))):
        cpu, wall = per_call(call, calls, rounds)
        row[name] = {"cpu_us": round(cpu, 1), "wall_us": round(wall, 1), "python_calls": round(python_calls(call), 1)}
    row["python_under_fsync"] = {
        key: round(row["add_then_upsert"][key] - row["raw_upsert"][key], 1) for key in ("cpu_us", "wall_us")
    } | {"python_calls": row["add"]["python_calls"]}
    raw.close()
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="calls per round (default 2000; a tenth on the emulator)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--firestore", action="store_true", help="also on the Firestore emulator (Datastore mode)")
    parser.add_argument("--emulator-host", help="also on the emulator already running at HOST:PORT (not started here)")
    parser.add_argument("--json", type=Path, help="write the rows here too")
    args = parser.parse_args(argv)
    rows = [measure("memory", "memory://", args.calls, args.rounds), measure_stubbed(args.calls, args.rounds)]
    with tempfile.TemporaryDirectory() as folder:
        rows.append(measure("sqlite file", f"sqlite:///{folder}/lone.sqlite3", args.calls // 2, args.rounds))
        rows.append(measure_under_fsync(folder, args.calls // 2, args.rounds))
    if args.emulator_host:
        from gds_counter.emulators import DEFAULT_PROJECT
        from gds_counter.gateway.datastore import DatastoreGateway

        gateway = DatastoreGateway(project=DEFAULT_PROJECT, emulator_host=args.emulator_host)
        rows.append(measure("firestore emulator", gateway, max(50, args.calls // 10), args.rounds))
    if args.firestore:
        from gds_counter.emulators import start_emulator

        with start_emulator("firestore") as emulator:
            rows.append(measure("firestore emulator", emulator.gateway(), max(50, args.calls // 10), args.rounds))
    print(f"{'backend':20} {'call':12} {'cpu µs':>8} {'wall µs':>8} {'py calls':>9}")
    for row in rows:
        for name in ("add", "get_count", "increment", "hook_upsert", "raw_upsert", "add_then_upsert", "python_under_fsync"):
            if name not in row:
                continue
            found = row[name]
            print(f"{row['backend']:20} {name:12} {found['cpu_us']:8.1f} {found['wall_us']:8.1f} {found['python_calls']:9.1f}")
    if args.json:
        args.json.write_text(json.dumps({"python": sys.version.split()[0], "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
