"""One event loop against a thread pool: increments per second of the
asyncio face (``gds_counter.aio``, 64 concurrent tasks) and of the blocking
API (16 threads), on the Firestore emulator and on the embedded engine.

Both series count into the same kind of counter (``CounterShardDS``, 20
shards, strategy "auto") in the same run, in alternating rounds (async
first in even rounds, threads first in odd ones), each round on fresh data
(a namespace or a SQLite file, and a kind prefix, of its own), so that drift of the machine
or of the emulator hits both alike; each series first runs ``--warmup``
seconds unrecorded (the emulator's JVM is slow at first). A series' rate is pooled over its
rounds: all increments that returned within the measured windows over all
measured time; single rounds give the spread. Every call is counted: RPCs
per increment come from the gateways' own stats, and after each round the
stored total must equal the increments acknowledged (nothing lost, nothing
counted twice).

The acceptance of issue 15: on the Firestore emulator the async rate is at
least the 16-thread rate measured in the same run.

    python benchmarks/async_vs_threads.py                 # 4 rounds x 5 s per series and backend
    python benchmarks/async_vs_threads.py --quick         # 2 rounds x 2 s
    python benchmarks/async_vs_threads.py --backends sqlite --rounds 1 --duration 0.5 --out /tmp/x

Writes ``async_vs_threads.json`` (and ``async_vs_threads.png`` when
matplotlib, the ``bench`` extra, is installed) to ``--out``
(default ``docs/benchmarks``).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import (  # noqa: E402
    REPO,
    BackendSpec,
    command_line,
    environment,
    open_backends,
    parse_choices,
    progress,
    shard_entity_class,
    table,
    write_json,
)
from gds_counter import aio  # noqa: E402
from gds_counter._demo import new_figure  # noqa: E402
from gds_counter.counter import CounterShardDS  # noqa: E402
from gds_counter.gds.store import Store  # noqa: E402

BACKENDS = ("firestore", "sqlite")
LABELS = {"firestore": "Firestore emulator", "sqlite": "embedded (SQLite file)"}
SERIES = ("async", "threads")


def _prefix(spec: BackendSpec) -> str:
    """A kind of its own per run: the Firestore emulator's queries slow down
    with every entity of their kind in any namespace, so a shared kind would
    make each round slower than the one before (see contention.py)."""
    tag = spec.namespace or Path(spec.location).stem
    return "R" + "".join(ch for ch in tag if ch.isalnum())[-12:] + "_"


def _async_gateway(spec: BackendSpec) -> Any:
    if spec.kind == "sqlite":
        return aio.ThreadedGateway(spec.open_gateway(), owns=True)
    return aio.AsyncDatastoreGateway(spec.project, spec.namespace, emulator_host=spec.location)


def run_async(spec: BackendSpec, tasks: int, duration: float) -> dict[str, Any]:
    """``tasks`` coroutines on one event loop, each awaiting increments
    until the window closes."""

    async def main() -> dict[str, Any]:
        async with _async_gateway(spec) as gateway:
            store = aio.Store(shard_entity_class(_prefix(spec)), gateway)
            counter = aio.CounterShardDS("Bench", 1, store=store)
            await counter.increment()  # the first contact (probe, channel) is not measured
            gateway.stats.reset()
            tally = {"ok": 0, "calls": 0}
            deadline = time.monotonic() + duration

            async def worker() -> None:
                while time.monotonic() < deadline:
                    await counter.increment()
                    tally["calls"] += 1
                    if time.monotonic() <= deadline:
                        tally["ok"] += 1

            await asyncio.gather(*(worker() for _ in range(tasks)))
            rpcs = gateway.stats.snapshot().get("rpcs", 0)
            return {**tally, "rpcs": rpcs, "stored": await counter.get_count()}

    return asyncio.run(main())


def run_threads(spec: BackendSpec, threads: int, duration: float) -> dict[str, Any]:
    """``threads`` threads of the blocking API, each calling increment()
    until the window closes."""
    gateway = spec.open_gateway()
    try:
        counter = CounterShardDS("Bench", 1, store=Store(shard_entity_class(_prefix(spec)), gateway))
        counter.increment()
        gateway.stats.reset()
        tally = {"ok": 0, "calls": 0}
        lock = threading.Lock()
        deadline = time.monotonic() + duration

        def worker() -> None:
            while time.monotonic() < deadline:
                counter.increment()
                in_window = time.monotonic() <= deadline
                with lock:
                    tally["calls"] += 1
                    tally["ok"] += in_window

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for thread in pool:
            thread.start()
        for thread in pool:
            thread.join()
        rpcs = gateway.stats.snapshot().get("rpcs", 0)
        return {**tally, "rpcs": rpcs, "stored": counter.get_count()}
    finally:
        gateway.close()


def measure(
    backends: list[str], rounds: int, duration: float, tasks: int, threads: int, warmup: float
) -> list[dict[str, Any]]:
    runs: list[dict[str, Any]] = []
    turns = [(kind, r, series) for kind in backends for r in range(rounds)
            for series in (SERIES if r % 2 == 0 else SERIES[::-1])]
    with open_backends(backends) as started:
        for kind in backends:  # warm-up, not recorded: the emulator's JVM starts slow
            for series in SERIES:
                if warmup > 0:
                    spec = started[kind].fresh(f"warmup-{series}")
                    (run_async(spec, tasks, warmup) if series == "async" else run_threads(spec, threads, warmup))
        for kind, round_, series in progress(turns, len(turns), "rounds"):
            spec = started[kind].fresh(f"{series}-{round_}")
            if series == "async":
                result = run_async(spec, tasks, duration)
            else:
                result = run_threads(spec, threads, duration)
            result.update(
                backend=kind, series=series, round=round_, seconds=duration,
                concurrency=tasks if series == "async" else threads,
                rate=result["ok"] / duration,
                rpcs_per_inc=result["rpcs"] / result["calls"] if result["calls"] else None,
                lost=result["calls"] + 1 - result["stored"],  # +1: the unmeasured first increment
            )
            runs.append(result)
    return runs


def summarize(runs: list[dict[str, Any]], backends: list[str]) -> list[dict[str, Any]]:
    """A series' pooled rate over its rounds, with the single rounds' range."""
    rows = []
    for kind in backends:
        for series in SERIES:
            mine = [r for r in runs if r["backend"] == kind and r["series"] == series]
            rates = [r["rate"] for r in mine]
            calls = sum(r["calls"] for r in mine)
            rows.append({
                "backend": kind, "series": series, "concurrency": mine[0]["concurrency"],
                "rate": sum(r["ok"] for r in mine) / sum(r["seconds"] for r in mine),
                "low": min(rates), "high": max(rates), "median": statistics.median(rates),
                "rpcs_per_inc": sum(r["rpcs"] for r in mine) / calls if calls else None,
                "lost": sum(r["lost"] for r in mine), "rounds": len(mine),
            })
    return rows


def verdicts(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for kind in dict.fromkeys(row["backend"] for row in rows):
        rate = {row["series"]: row["rate"] for row in rows if row["backend"] == kind}
        ratio = rate["async"] / rate["threads"] if rate["threads"] else None
        out.append({"backend": kind, "async_over_threads": ratio,
                    "met": ratio is not None and ratio >= 1.0 if kind == "firestore" else None})
    return out


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> str:
    made = new_figure(8.0, 4.5)
    if isinstance(made, str):
        return made
    figure, save = made
    axes = figure.subplots()
    kinds = list(dict.fromkeys(row["backend"] for row in rows))
    width = 0.38
    for offset, series in ((-width / 2, "async"), (width / 2, "threads")):
        mine = [next(r for r in rows if r["backend"] == k and r["series"] == series) for k in kinds]
        xs = [i + offset for i in range(len(kinds))]
        heights = [r["rate"] for r in mine]
        errors = [[max(0.0, r["rate"] - r["low"]) for r in mine], [max(0.0, r["high"] - r["rate"]) for r in mine]]
        label = f"one event loop, {mine[0]['concurrency']} tasks" if series == "async" else \
            f"blocking API, {mine[0]['concurrency']} threads"
        bars = axes.bar(xs, heights, width, yerr=errors, capsize=4, label=label)
        axes.bar_label(bars, labels=[f"{h:,.0f}/s" for h in heights], padding=14)
    axes.set_xticks(range(len(kinds)), [LABELS.get(k, k) for k in kinds])
    axes.set_ylabel("increment() per second (pooled; whiskers: single rounds)")
    axes.set_title(title)
    axes.legend(loc="upper right")
    axes.margins(y=0.2)
    save(path)
    return f"plot: {path}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default=",".join(BACKENDS), help="firestore,sqlite (default both)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds per series and backend")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per round")
    parser.add_argument("--tasks", type=int, default=64, help="concurrent increments on the event loop")
    parser.add_argument("--threads", type=int, default=16, help="threads of the blocking API")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of each series first, not recorded")
    parser.add_argument("--quick", action="store_true", help="2 rounds x 2 s, 1 s warm-up")
    parser.add_argument("--out", default=str(REPO / "docs" / "benchmarks"), help="where the JSON and PNG go")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.warmup = 2, 2.0, 1.0
    backends = parse_choices(args.backends, BACKENDS, "backend")
    runs = measure(backends, args.rounds, args.duration, args.tasks, args.threads, args.warmup)
    rows = summarize(runs, backends)
    judged = verdicts(rows)
    print(table(rows, [("backend", "backend", 0), ("series", "series", 0), ("concurrency", "at once", 0),
                       ("rate", "inc/s", 1), ("low", "min round", 1), ("high", "max round", 1),
                       ("rpcs_per_inc", "RPCs/inc", 2), ("lost", "lost", 0), ("rounds", "rounds", 0)]))
    for verdict in judged:
        met = {True: "MET", False: "MISSED", None: "(no goal)"}[verdict["met"]]
        ratio = verdict["async_over_threads"]
        print(f"{verdict['backend']}: async / threads = {ratio:.2f} {met}" if ratio else f"{verdict['backend']}: n/a")
    out = Path(args.out)
    record = {"command": command_line(argv and [sys.argv[0], *argv]), "environment": environment(),
              "settings": {"rounds": args.rounds, "duration": args.duration, "warmup": args.warmup, "tasks": args.tasks,
                           "threads": args.threads, "backends": backends},
              "series": rows, "verdicts": judged, "runs": runs}
    print(f"record: {write_json(out / 'async_vs_threads.json', record)}")
    firestore = next((v for v in judged if v["backend"] == "firestore"), None)
    title = "increment(): one event loop vs threads"
    if firestore and firestore["async_over_threads"]:
        title += f" (Firestore emulator: async/threads = {firestore['async_over_threads']:.2f})"
    print(plot(rows, out / "async_vs_threads.png", title))
    lost = sum(row["lost"] for row in rows)
    if lost:
        print(f"LOST OR DOUBLE-COUNTED: {lost} increments", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
