"""Random shards against shard affinity, side by side in one run.

    python benchmarks/shard_choice.py [--quick] [--backend firestore[,sqlite]]
        [--strategy auto,transactional] [--threads 16] [--processes 4] [--shards 20]
        [--duration 4] [--repeats 3] [--warmup 1] [--json PATH] [--plot PATH]

Issue 24, goal 4: the shard chooser is pluggable (``ShardChooser``), and the
default is to be chosen by measurement. This runs the two choosers of
``counter.shard_choice`` on the same load, next to each other:

  random    ``RandomShards()``: a uniformly random shard per attempt, as the
            PHP and Google articles do
  affinity  ``AffinityShards``: a shard no other writer of this process
            holds, an arc of shards per process, moving off shards other
            processes use (the runtime's default)

Each writer process opens its own gateway and installs the chooser under
test on it (``Runtime(shards=RandomShards()).install(gw)``, or a fresh
default ``Runtime().install(gw)``) before building counters; every writer
thread then calls ``CounterShardDS(name, 1, 20, ...).increment()`` for
``--duration`` seconds. Two loads: ``--threads`` (16) threads in 1 process,
and ``--processes`` (4) processes x 16/4 threads, the processes started
once with ``spawn`` (``_workers.WorkerPool``; the 1-process load runs in
one of them too, so no load runs in the parent). Two strategies by
default, ``auto`` (the server-side increment on the Firestore emulator,
transactions on SQLite) and ``transactional`` (where a collision costs most
on a server with pessimistic locks); ``--strategy`` picks one.

Storage: the official Firestore emulator in Datastore mode (pessimistic
locks, like production; started through ``gds_counter.emulators`` as
``contention.py`` does) by default; ``--backend sqlite`` or
``--backend firestore,sqlite`` adds an SQLite file (the embedded engine).

How: ``--warmup`` seconds of every cell first (the emulator's JIT warms
up; not reported), then ``--repeats`` rounds. A round runs every (load,
strategy) cell with both choosers back to back, random first in even
rounds and affinity first in odd ones (and the cells in reverse order in
odd rounds), so slow drift hits both choosers alike. Every run counts on a
fresh counter in a namespace (or SQLite file) and a kind (``KIND_PFX``) of
its own: the emulator's queries slow down with every entity of the queried
kind in any namespace (see ``contention.py``), which would otherwise favour
whichever chooser runs first. One warm-up increment per process comes
before the clock (counted in the stored total, not in the rate).

What each row reports (per backend, load, strategy and chooser):
increments/s pooled over the rounds (the calls that returned within the
measured windows over the windows' time; a call stuck in a lock wait when
the window closes counts in the totals, not in the rate) and the rounds'
min-max; RPCs, entity reads and entity writes per increment (deltas of
``gateway.stats``, summed over the processes: what Datastore bills);
retried attempts (``counter.retries``) and shard moves
(``counter.shard_moves``); errors raised to callers; and the exactness
check: the stored total (read afterwards by a fresh reader) equals the
increments acknowledged. A row that is not exact is a defect, whatever its
speed: it is printed in capitals and the exit status is 1. The ratio
table gives affinity/random, pooled, with the per-round ratios' min-max.

``--quick``: 2 rounds x 1 s, no warm-up, strategy ``auto`` only (about
30 s on the emulator). Results: a table on stdout and, with ``--json``,
a record with the exact command line, the environment (Python, cores),
the settings and every run's numbers.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    Backend,
    BackendSpec,
    command_line,
    environment,
    open_backends,
    parse_choices,
    progress,
    script_parser,
    shard_entity_class,
    table,
    write_json,
)
from _workers import WorkerPool  # noqa: E402

from gds_counter._demo import new_figure  # noqa: E402
from gds_counter._load import percentile, run_load  # noqa: E402
from gds_counter.counter import CounterShardDS  # noqa: E402
from gds_counter.counter.runtime import Runtime  # noqa: E402
from gds_counter.counter.shard_choice import RandomShards  # noqa: E402
from gds_counter.errors import GDSError  # noqa: E402
from gds_counter.gds.store import Store  # noqa: E402

CHOOSERS = ("random", "affinity")
STRATEGIES = ("auto", "transactional")
BACKENDS = ("firestore", "sqlite")
#: The stats each run reports (deltas, summed over processes).
COUNTED = ("rpcs", "entity_reads", "entity_writes", "counter.retries", "counter.shard_moves")

QUICK = {"duration": 1.0, "repeats": 2, "warmup": 0.0, "strategy": "auto"}
FULL = {"duration": 4.0, "repeats": 3, "warmup": 1.0, "strategy": ",".join(STRATEGIES)}


def install_chooser(chooser: str, gateway: Any) -> Runtime:
    """A fresh runtime on ``gateway`` whose counters choose shards the
    ``chooser`` way (affinity: the runtime's default)."""
    if chooser == "random":
        return Runtime(shards=RandomShards()).install(gateway)
    if chooser == "affinity":
        return Runtime().install(gateway)
    raise ValueError(f"unknown chooser {chooser!r}")


# --- one process's part of a run (in a writer process) ---------------------------------------


@attrs.frozen
class Job:
    spec: BackendSpec
    chooser: str
    strategy: str
    threads: int
    duration: float
    shards: int
    name: str
    kind_prefix: str


class Part:
    """One process's writers, built and warmed up off the clock."""

    def __init__(self, job: Job) -> None:
        self.job = job
        self.gateway = job.spec.open_gateway()
        try:
            self.runtime = install_chooser(job.chooser, self.gateway)
            store = Store(shard_entity_class(job.kind_prefix), self.gateway)
            # One counter object per writer, as a web app builds one per
            # request; they share the gateway's runtime, hence its chooser.
            self.counters = [CounterShardDS(job.name, 1, job.shards, store=store, strategy=job.strategy)
                             for _ in range(job.threads)]
            self.counters[0].increment()  # channel, capability probe, config entity; off the clock
            self.in_window = [0] * job.threads
            self.window_end = 0.0
        except BaseException:
            self.gateway.close()
            raise

    def _op(self, slot: int) -> Callable[[], None]:
        increment = self.counters[slot].increment
        counts = self.in_window

        def call() -> None:
            increment()
            if time.perf_counter() <= self.window_end:
                counts[slot] += 1

        return call

    def run(self) -> dict[str, Any]:
        actual = type(self.runtime.shards).__name__
        ops = iter([self._op(i) for i in range(self.job.threads)])
        before = self.gateway.stats.snapshot()
        self.window_end = time.perf_counter() + self.job.duration
        load = run_load(lambda: next(ops), writers=self.job.threads, duration=self.job.duration,
                        counted=(GDSError,))
        after = self.gateway.stats.snapshot()
        return {
            "chooser_class": actual,
            "ok": load.ok,
            "in_window": sum(self.in_window),
            "failed": load.failed,
            "errors": dict(load.errors),
            "first_error": load.first_error,
            "warmup_calls": 1,
            "elapsed_s": load.elapsed,
            "latencies": load.latencies,
            "stats": {k: after.get(k, 0) - before.get(k, 0) for k in COUNTED},
        }

    def close(self) -> None:
        self.gateway.close()


def prepare(job: Job) -> Part:
    return Part(job)


# --- one run (in the parent) -------------------------------------------------------------------


@attrs.frozen
class Load:
    processes: int
    threads: int

    @property
    def name(self) -> str:
        return f"{self.processes}x{self.threads}"


_runs = itertools.count(1)


def stored_total(spec: BackendSpec, name: str, shards: int, prefix: str) -> int:
    gateway = spec.open_gateway()
    try:
        return CounterShardDS(name, 1, shards, store=Store(shard_entity_class(prefix), gateway)).get_count()
    finally:
        gateway.close()


def run_once(pool: WorkerPool, backend: Backend, load: Load, strategy: str, chooser: str, duration: float,
             shards: int, phase: str, repeat: int | None) -> dict[str, Any]:
    number = next(_runs)
    spec = backend.fresh(f"shards-{chooser}")
    prefix = f"S{number}_"
    name = f"ShardChoice{number}{chooser.title()}"
    if spec.kind == "sqlite":
        spec.open_gateway().close()  # create the file's tables before any clock starts
    jobs = [Job(spec, chooser, strategy, load.threads, duration, shards, name, prefix) for _ in range(load.processes)]
    parts = pool.run(jobs)
    wrong = {p["chooser_class"] for p in parts} - {"RandomShards" if chooser == "random" else "AffinityShards"}
    if wrong:
        raise RuntimeError(f"run {number} meant {chooser} but the counters used {wrong}")
    stats = {k: sum(p["stats"][k] for p in parts) for k in COUNTED}
    errors: collections.Counter[str] = collections.Counter()
    for p in parts:
        errors.update(p["errors"])
    ok = sum(p["ok"] for p in parts)
    warmup = sum(p["warmup_calls"] for p in parts)
    acked = ok + warmup
    stored = stored_total(spec, name, shards, prefix)
    latencies = sorted(x for p in parts for x in p["latencies"])
    in_window = sum(p["in_window"] for p in parts)
    return {
        "phase": phase, "repeat": repeat, "backend": backend.kind, "load": load.name,
        "processes": load.processes, "threads": load.threads, "strategy": strategy, "chooser": chooser,
        "counter": name, "kind_prefix": prefix, "namespace": spec.namespace,
        "window_s": duration, "in_window": in_window, "per_s": round(in_window / duration, 2),
        "ok": ok, "failed": sum(p["failed"] for p in parts), "errors": dict(errors),
        "first_error": next((p["first_error"] for p in parts if p["first_error"]), None),
        "elapsed_s": round(max(p["elapsed_s"] for p in parts), 3),
        "p50_ms": _ms(latencies, 0.50), "p99_ms": _ms(latencies, 0.99),
        "stats": stats, "warmup_calls": warmup, "acked": acked, "stored": stored, "exact": stored == acked,
    }


def _ms(ordered: list[float], q: float) -> float | None:
    """The ``q`` quantile of sorted latencies (``load.percentile``), in milliseconds."""
    value = percentile(ordered, q)
    return None if value is None else round(value * 1000, 2)


# --- the schedule and the summary -------------------------------------------------------------


Cell = tuple[str, Load, str]  # backend, load, strategy


def schedule(backends: list[str], loads: list[Load], strategies: list[str], repeats: int,
             warmup: float) -> list[tuple[str, int | None, Cell, str]]:
    """(phase, repeat, cell, chooser) in the order they run."""
    cells: list[Cell] = [(b, load, s) for b in backends for load in loads for s in strategies]
    turns: list[tuple[str, int | None, Cell, str]] = []
    if warmup:
        turns += [("warmup", None, cell, chooser) for cell in cells for chooser in CHOOSERS]
    for repeat in range(repeats):
        forward = repeat % 2 == 0
        for cell in cells if forward else cells[::-1]:
            for chooser in CHOOSERS if forward else CHOOSERS[::-1]:
                turns.append(("measure", repeat, cell, chooser))
    return turns


def summarize(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Per (backend, load, strategy, chooser) row, and per (backend, load,
    strategy) the ratio affinity / random."""
    measured = [r for r in runs if r["phase"] == "measure"]
    keys = list(dict.fromkeys((r["backend"], r["load"], r["strategy"]) for r in measured))
    rows, ratios = [], []
    for backend, load, strategy in keys:
        mine = [r for r in measured if (r["backend"], r["load"], r["strategy"]) == (backend, load, strategy)]
        pooled: dict[str, float] = {}
        for chooser in CHOOSERS:
            side = [r for r in mine if r["chooser"] == chooser]
            if not side:
                continue
            window = sum(r["window_s"] for r in side)
            rate = sum(r["in_window"] for r in side) / window
            pooled[chooser] = rate
            ok = sum(r["ok"] for r in side)

            def per(name: str, side: list[dict[str, Any]] = side, ok: int = ok) -> float | None:
                return round(sum(r["stats"][name] for r in side) / ok, 3) if ok else None

            errors: collections.Counter[str] = collections.Counter()
            for r in side:
                errors.update(r["errors"])
            rows.append({
                "backend": backend, "load": load, "strategy": strategy, "chooser": chooser,
                "rounds": len(side), "per_s": round(rate, 1),
                "min_per_s": min(r["per_s"] for r in side), "max_per_s": max(r["per_s"] for r in side),
                "rounds_per_s": [r["per_s"] for r in sorted(side, key=lambda r: r["repeat"])],
                "rpcs_per_inc": per("rpcs"), "reads_per_inc": per("entity_reads"),
                "writes_per_inc": per("entity_writes"),
                "retries": sum(r["stats"]["counter.retries"] for r in side),
                "retries_per_inc": per("counter.retries"),
                "shard_moves": sum(r["stats"]["counter.shard_moves"] for r in side),
                "errors": sum(r["failed"] for r in side), "errors_by_type": dict(errors),
                "p50_ms": statistics.median(r["p50_ms"] for r in side if r["p50_ms"] is not None)
                if any(r["p50_ms"] is not None for r in side) else None,
                "p99_ms": statistics.median(r["p99_ms"] for r in side if r["p99_ms"] is not None)
                if any(r["p99_ms"] is not None for r in side) else None,
                "ok": ok, "acked": sum(r["acked"] for r in side), "stored": sum(r["stored"] for r in side),
                "exact": "yes" if all(r["exact"] for r in side) else "NO",
            })
        if len(pooled) == 2:
            rounds = []
            for repeat in sorted({r["repeat"] for r in mine}):
                rate = {r["chooser"]: r["per_s"] for r in mine if r["repeat"] == repeat}
                if len(rate) == 2 and rate["random"]:
                    rounds.append(round(rate["affinity"] / rate["random"], 3))
            ratios.append({
                "backend": backend, "load": load, "strategy": strategy,
                "random_per_s": round(pooled["random"], 1), "affinity_per_s": round(pooled["affinity"], 1),
                "ratio": round(pooled["affinity"] / pooled["random"], 3) if pooled["random"] else None,
                "round_ratios": rounds,
                "min_ratio": min(rounds) if rounds else None, "max_ratio": max(rounds) if rounds else None,
            })
    return rows, ratios


def spread(low: Any, high: Any, digits: int) -> str:
    if low is None or high is None:
        return "n/a"
    return f"{low:,.{digits}f}-{high:,.{digits}f}"


def report(rows: list[dict[str, Any]], ratios: list[dict[str, Any]]) -> str:
    for row in rows:
        row["range"] = spread(row["min_per_s"], row["max_per_s"], 0)
    for ratio in ratios:
        ratio["range"] = spread(ratio["min_ratio"], ratio["max_ratio"], 2)
    first = table(rows, [
        ("backend", "backend", 0), ("load", "load", 0), ("strategy", "strategy", 0), ("chooser", "chooser", 0),
        ("per_s", "inc/s", 0), ("range", "rounds min-max", 0), ("rpcs_per_inc", "RPCs/inc", 2),
        ("reads_per_inc", "reads/inc", 2), ("writes_per_inc", "writes/inc", 2), ("retries", "retries", 0),
        ("shard_moves", "moves", 0), ("errors", "errors", 0), ("p99_ms", "p99 ms", 0), ("exact", "exact", 0),
    ])
    second = table(ratios, [
        ("backend", "backend", 0), ("load", "load", 0), ("strategy", "strategy", 0),
        ("random_per_s", "random inc/s", 0), ("affinity_per_s", "affinity inc/s", 0),
        ("ratio", "affinity/random", 2), ("range", "rounds min-max", 0),
    ])
    for item in (*rows, *ratios):
        item.pop("range")
    lines = [first, "", second]
    bad = [r for r in rows if r["exact"] != "yes"]
    if bad:
        lines += ["", "NOT EXACT: the stored total differs from the increments acknowledged in:"]
        lines += [f"  {r['backend']} {r['load']} {r['strategy']} {r['chooser']}: stored {r['stored']}, "
                  f"acknowledged {r['acked']}" for r in bad]
    else:
        lines += ["", "Exact: in every run the stored total equals the increments acknowledged."]
    return "\n".join(lines)


def plot(ratios: list[dict[str, Any]], rows: list[dict[str, Any]], path: Path) -> str:
    made = new_figure(10, 4.8)
    if isinstance(made, str):
        return made
    figure, save = made
    axes = figure.subplots(1, 1)
    labels = [f"{r['backend']}\n{r['load']}\n{r['strategy']}" for r in ratios]
    width = 0.38
    for offset, chooser, colour in ((-width / 2, "random", "#7f8c8d"), (width / 2, "affinity", "#2980b9")):
        found = {(r["backend"], r["load"], r["strategy"]): r for r in rows if r["chooser"] == chooser}
        mine = [found[(r["backend"], r["load"], r["strategy"])] for r in ratios]
        heights = [m["per_s"] for m in mine]
        low = [max(0.0, h - m["min_per_s"]) for h, m in zip(heights, mine)]
        high = [max(0.0, m["max_per_s"] - h) for h, m in zip(heights, mine)]
        bars = axes.bar([i + offset for i in range(len(mine))], heights, width, yerr=[low, high], capsize=3,
                        color=colour, label=chooser)
        axes.bar_label(bars, fmt="%.0f", padding=2, fontsize="small")
    axes.set_xticks(range(len(labels)), labels)
    axes.set_ylabel("increments/s (pooled; whiskers: rounds min-max)")
    axes.set_title("CounterShardDS.increment(), 20 shards: random shards vs affinity")
    axes.legend()
    save(path)
    return f"plot: {path}"


# --- the command -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK['repeats']} rounds x {QUICK['duration']:g} s, no warm-up, strategy auto "
                             "(explicit options still win)")
    parser.add_argument("--backend", default="firestore", help="comma-separated: firestore, sqlite (default firestore)")
    parser.add_argument("--strategy", help="comma-separated: auto, transactional (default both)")
    parser.add_argument("--threads", type=int, default=16, help="writer threads in all, per load (default 16)")
    parser.add_argument("--processes", type=int, default=4,
                        help="processes of the multi-process load (default 4; threads are split among them)")
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--duration", type=float, help=f"seconds per run (default {FULL['duration']:g})")
    parser.add_argument("--repeats", type=int, help=f"alternating rounds (default {FULL['repeats']})")
    parser.add_argument("--warmup", type=float, help=f"seconds of unreported warm-up per cell and chooser "
                                                     f"(default {FULL['warmup']:g})")
    parser.add_argument("--json", type=Path, help="write the record here")
    parser.add_argument("--plot", type=Path, help="draw the rates here (PNG; needs matplotlib)")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not args.duration > 0 or args.repeats < 1 or args.warmup < 0 or args.shards < 1:
        parser.error("need duration > 0, repeats >= 1, warmup >= 0, shards >= 1")
    if args.processes < 2 or args.threads < args.processes or args.threads % args.processes:
        parser.error(f"need --processes >= 2 dividing --threads, got {args.processes} and {args.threads}")
    if args.plot is not None and not args.plot.parent.is_dir():
        parser.error(f"--plot: the folder {args.plot.parent} does not exist")
    args.backends = parse_choices(args.backend, BACKENDS, "backend")
    args.strategies = parse_choices(args.strategy, STRATEGIES, "strategy")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    loads = [Load(1, args.threads), Load(args.processes, args.threads // args.processes)]
    turns = schedule(args.backends, loads, args.strategies, args.repeats, args.warmup)
    runs: list[dict[str, Any]] = []
    load_before = os.getloadavg()  # other work on the machine skews every figure: recorded
    began = time.perf_counter()
    with open_backends(args.backends) as backends, WorkerPool(args.processes, prepare) as pool:
        for phase, repeat, (backend, load, strategy), chooser in progress(turns, len(turns), "shard choice"):
            seconds = args.warmup if phase == "warmup" else args.duration
            run = run_once(pool, backends[backend], load, strategy, chooser, seconds, args.shards, phase, repeat)
            runs.append(run)
            if not run["exact"]:
                print(f"NOT EXACT: {backend} {load.name} {strategy} {chooser} round {repeat}: stored "
                      f"{run['stored']}, acknowledged {run['acked']}", file=sys.stderr)
    took = time.perf_counter() - began
    rows, ratios = summarize(runs)
    print(f"Shard choice: {args.shards} shards, increment() for {args.duration:g} s per run, {args.repeats} "
          f"alternating rounds (after {args.warmup:g} s of warm-up per cell and chooser); "
          f"{', '.join(args.backends)}; took {took:.0f} s")
    print(report(rows, ratios))
    if args.plot is not None:
        print(plot(ratios, rows, args.plot))
    if args.json is not None:
        for run in runs:
            run.pop("latencies", None)
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot", "backends", "strategies")}
        settings.update(backends=args.backends, strategies=args.strategies, loads=[load.name for load in loads])
        payload = {
            "command": command_line(None if argv is None else [sys.argv[0], *argv]),
            "environment": environment(), "settings": settings, "took_s": round(took, 1),
            "load_average": {"before": [round(x, 2) for x in load_before],
                             "after": [round(x, 2) for x in os.getloadavg()]},
            "rows": rows, "ratios": ratios, "runs": runs,
        }
        print(f"record: {write_json(args.json, payload)}", file=sys.stderr)
    return 0 if all(row["exact"] == "yes" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
