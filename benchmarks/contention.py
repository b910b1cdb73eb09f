"""Sharded counters under contention: our strategies against the articles.

    python benchmarks/contention.py [--quick] [--backend sqlite,firestore]
        [--shards 1,5,20,100] [--strategy transactional,increment,auto,auto-grow,general]
        [--writers 16] [--processes 1] [--duration 5 | --count N]

W writers increment one counter for a fixed time (or count). Each run
reports increments/s, aborts and retries, RPCs and entity reads/writes per
increment (from ``gateway.stats``), p50/p99 latency, and checks that the
final count equals the increments reported successful.

Series (ours):
  transactional, increment, auto, auto-grow   CounterShardDS (PHP layout) with that strategy
  general                                     GeneralCounter (ndb layout), default strategy
Baselines, in the same run:
  php-article   the PHP article's increment, ported literally (lookup + non-transactional
                upsert + count query): its LOST increments are reported
  ndb           the Google article's general counter with google-cloud-ndb (emulators only)
  raw           the ceiling: google-cloud-datastore's Client.put of a new entity per call
                (emulators only)
  raw-gapic     the same commits through the gateway (GAPIC, raw protobufs; SQLite: plain commits)
  The ratios use the faster of the two as the ceiling.

Writers call ``counter.add()`` (no read back), the hot path of a counter.
Results: benchmarks/results/contention.json and contention.png.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BACKENDS,
    EMULATED,
    RESULTS,
    BackendSpec,
    NdbGeneralCounter,
    PhpArticleCounter,
    command_line,
    environment,
    open_backends,
    parse_choices,
    parse_ints,
    progress,
    raw_count,
    raw_writer,
    table,
    write_json,
)

from gds_counter.counter import CounterShardDS, GeneralCounter  # noqa: E402
from gds_counter.demo import new_figure  # noqa: E402
from gds_counter.load import LoadResult, run_load  # noqa: E402

OURS = ("transactional", "increment", "auto", "auto-grow", "general")
BASELINES = ("php-article", "ndb", "raw", "raw-gapic")
CEILINGS = ("raw", "raw-gapic")
TARGET = ("Contention", 1)
GENERAL_NAME = "contention"


# --- one run -----------------------------------------------------------------------------


class Workload:
    """One series on one backend, with the shards it is given. Opened once
    per writer process; ``make_op`` is called once per writer thread."""

    def __init__(self, series: str, shards: int | None, spec: BackendSpec) -> None:
        self.series = series
        self.shards = shards
        self.spec = spec
        self.gateway = spec.open_gateway()
        self.stats_tracked = series not in ("ndb", "raw")
        self._ndb: NdbGeneralCounter | None = None
        self._counter: Any = None
        if series in OURS:
            if series == "general":
                self._counter = GeneralCounter(GENERAL_NAME, num_shards=shards, gateway=self.gateway)
            else:
                self._counter = CounterShardDS(*TARGET, num_shards=shards, gateway=self.gateway, strategy=series)
        elif series == "ndb":
            self._ndb = NdbGeneralCounter(spec)
        elif series in CEILINGS:
            self._raw = raw_writer(spec, self.gateway, google_client=series == "raw")

    def prepare(self) -> None:
        """Before the clock starts, in the parent process."""
        if self._ndb is not None:
            self._ndb.set_num_shards(GENERAL_NAME, self.shards or 20)

    def make_op(self) -> Callable[[], Any]:
        if self._counter is not None:
            return self._counter.add
        if self._ndb is not None:
            ndb = self._ndb
            return lambda: ndb.increment(GENERAL_NAME)
        if self.series == "php-article":
            return PhpArticleCounter(*TARGET, num_shards=self.shards or 20, gateway=self.gateway).increment
        return self._raw()

    def final_count(self) -> int:
        if self._counter is not None:
            return self._counter.get_count()
        if self._ndb is not None:
            return self._ndb.get_count(GENERAL_NAME)
        if self.series == "php-article":
            return CounterShardDS(*TARGET, num_shards=self.shards or 20, gateway=self.gateway).get_count()
        return raw_count(self.gateway, self.spec.namespace)

    def close(self) -> None:
        self.gateway.close()


def run_group(series: str, shards: int | None, spec: BackendSpec, writers: int,
              duration: float | None, count: int | None) -> tuple[LoadResult, dict[str, int]]:
    """One writer process's share of a run (also called in-process).

    One warm-up increment comes first, off the clock and out of the stats
    but counted in the final total: it opens channels and does the
    once-per-process work (our strategies' transform check, ndb's context)
    so that the run measures the steady state.
    """
    workload = Workload(series, shards, spec)
    try:
        workload.make_op()()
        workload.gateway.stats.reset()
        load = run_load(workload.make_op, writers=writers, duration=duration, count=count)
        load.warmup = 1
        return load, workload.gateway.stats.snapshot()
    finally:
        workload.close()


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def run_one(series: str, shards: int | None, spec: BackendSpec, args: argparse.Namespace,
            pool: concurrent.futures.Executor | None) -> dict[str, Any]:
    main = Workload(series, shards, spec)
    try:
        main.prepare()
        if pool is None:
            load, stats = run_group(series, shards, spec, args.writers, args.duration, args.count)
        else:
            writers = _split(args.writers, args.processes)
            counts = _split(args.count, args.processes) if args.count else [None] * args.processes
            futures = [pool.submit(run_group, series, shards, spec, w, args.duration, c)
                       for w, c in zip(writers, counts) if w]
            load, stats = LoadResult(), {}
            for future in futures:
                part, part_stats = future.result()
                load.merge(part)
                for name, value in part_stats.items():
                    stats[name] = stats.get(name, 0) + value
        final = main.final_count()
    finally:
        main.close()
    return _row(series, shards, spec, args, load, stats if main.stats_tracked else None, final)


def _row(series: str, shards: int | None, spec: BackendSpec, args: argparse.Namespace,
         load: LoadResult, stats: dict[str, int] | None, final: int) -> dict[str, Any]:
    ok = load.ok
    expected = ok + load.warmup

    def per(name: str) -> float | None:
        return None if stats is None or not ok else stats.get(name, 0) / ok

    retries = aborts = None
    if stats is not None:
        retries = stats.get("counter.retries", 0) + stats.get("retries", 0)
        # every retry followed an aborted attempt, and so did each increment
        # that ran out of attempts (or that made auto-grow add shards)
        aborts = retries + load.errors.get("Contention", 0) + stats.get("counter.grown", 0)
    return {
        "backend": spec.kind,
        "series": series,
        "kind": "ours" if series in OURS else "baseline",
        "shards": shards,
        "writers": args.writers,
        "processes": args.processes,
        "elapsed_s": round(load.elapsed, 3),
        "ok": ok,
        "failed": load.failed,
        "errors": dict(load.errors),
        "first_error": load.first_error,
        "per_s": round(load.rate, 2),
        "aborts": aborts,
        "retries": retries,
        "rpcs_per_inc": per("rpcs"),
        "reads_per_inc": per("entity_reads"),
        "writes_per_inc": per("entity_writes"),
        "p50_ms": load.latency_ms(0.50),
        "p99_ms": load.latency_ms(0.99),
        "warmup": load.warmup,
        "final_count": final,
        "lost": expected - final,
        "stats": stats,
    }


# --- the whole benchmark -------------------------------------------------------------------


def plan(args: argparse.Namespace) -> list[tuple[str, str, int | None]]:
    runs: list[tuple[str, str, int | None]] = []
    for backend in args.backend:
        for shards in args.shards:
            for series in args.strategy:
                runs.append((backend, series, shards))
            runs.append((backend, "php-article", shards))
            if backend in EMULATED and not args.no_ndb:
                runs.append((backend, "ndb", shards))
        if backend in EMULATED:
            runs.append((backend, "raw", None))
        runs.append((backend, "raw-gapic", None))
    return runs


def _find(rows: list[dict[str, Any]], backend: str, series: str, shards: int | None) -> dict[str, Any] | None:
    return next((r for r in rows if r["backend"] == backend and r["series"] == series and r["shards"] == shards), None)


def ratios(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Ratios within this run: ours over each baseline, shard count by shard count."""
    out: list[dict[str, Any]] = []

    def add(backend: str, what: str, shards: Any, num: dict[str, Any] | None, den: dict[str, Any] | None) -> None:
        if num is None or den is None or not den["per_s"]:
            return
        out.append({"backend": backend, "ratio": what, "shards": shards, "ours_per_s": num["per_s"],
                    "baseline_per_s": den["per_s"], "x": round(num["per_s"] / den["per_s"], 2)})

    for backend in args.backend:
        ceilings = [r for r in (_find(rows, backend, name, None) for name in CEILINGS) if r is not None]
        raw = max(ceilings, key=lambda r: r["per_s"]) if ceilings else None
        for shards in args.shards:
            for series in ("auto", "general", "increment"):
                add(backend, f"{series} / php-article", shards, _find(rows, backend, series, shards),
                    _find(rows, backend, "php-article", shards))
            for series in ("general", "auto", "transactional"):
                add(backend, f"{series} / ndb", shards, _find(rows, backend, series, shards),
                    _find(rows, backend, "ndb", shards))
            for series in ("increment", "general"):
                add(backend, f"{series} (no read) / raw ceiling", shards, _find(rows, backend, series, shards), raw)
        low = min(args.shards)
        for shards in args.shards:
            for series in ("general", "auto"):
                add(backend, f"{series}@{shards} / ndb@{low} (unsharded article)", shards,
                    _find(rows, backend, series, shards), _find(rows, backend, "ndb", low))
    return out


def goals(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """The issue's goals, checked on this run's Firestore-emulator figures.

    "The article's transactional algorithm" is the Google article's ndb
    counter (the PHP article's increment has no transaction at all); "ours,
    default strategy" is measured for both classes: GeneralCounter (ndb
    layout: "auto" sends server-side increments) and CounterShardDS (PHP
    layout: "auto" keeps ``count`` unindexed, so on Firestore it uses
    transactions).
    """
    out: list[dict[str, Any]] = []
    backend = "firestore"

    def check(goal: str, who: str, shards: Any, value: float | None, need: float) -> None:
        out.append({"goal": goal, "series": who, "shards": shards,
                    "measured": None if value is None else round(value, 2), "need": need,
                    "met": None if value is None else value >= need})

    def rate(series: str, shards: int) -> float | None:
        row = _find(rows, backend, series, shards)
        return None if row is None else row["per_s"]

    def over(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else a / b

    # Two ceilings: google-cloud-datastore's own Client.put (what the issue
    # names), and the same commits through our GAPIC gateway (the lightest
    # client, so the stricter bar).
    for name in CEILINGS:
        ceiling = _find(rows, backend, name, None)
        for shards in args.shards:
            for series in ("general", "increment", "auto"):
                check(f"no-read increment >= 0.9 x {name} ceiling", series, shards,
                      over(rate(series, shards), ceiling["per_s"] if ceiling else None), 0.9)
    for series in ("general", "auto"):
        check(">= 10 x the article's transactional algorithm (ndb) at 20 shards", series, 20,
              over(rate(series, 20), rate("ndb", 20)), 10.0)
        for shards in args.shards:
            check(">= 1 x the ndb anchor at equal shards", series, shards, over(rate(series, shards), rate("ndb", shards)), 1.0)
    for row in rows:
        if row["kind"] == "ours":
            out.append({"goal": "no lost increments", "series": f"{row['backend']} {row['series']}",
                        "shards": row["shards"], "measured": row["lost"], "need": 0, "met": row["lost"] == 0})
    return out


GOAL_COLUMNS = [("goal", "goal", 0), ("series", "series", 0), ("shards", "shards", 0),
                ("measured", "measured", 2), ("need", "need", 1), ("met", "met", 0)]

COLUMNS = [
    ("backend", "backend", 0), ("series", "series", 0), ("shards", "shards", 0), ("per_s", "incr/s", 1),
    ("ok", "ok", 0), ("failed", "failed", 0), ("aborts", "aborts", 0), ("retries", "retries", 0),
    ("rpcs_per_inc", "RPC/inc", 2), ("reads_per_inc", "reads/inc", 2), ("writes_per_inc", "writes/inc", 2),
    ("p50_ms", "p50 ms", 1), ("p99_ms", "p99 ms", 1), ("final_count", "final", 0), ("lost", "lost", 0),
]
RATIO_COLUMNS = [("backend", "backend", 0), ("ratio", "ratio", 0), ("shards", "shards", 0),
                 ("ours_per_s", "ours/s", 1), ("baseline_per_s", "baseline/s", 1), ("x", "x", 2)]


def plot(rows: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> str:
    made = new_figure(6.5 * len(args.backend), 4.8)
    if isinstance(made, str):
        return made
    figure, save = made
    axes = figure.subplots(1, len(args.backend), squeeze=False)[0]
    for ax, backend in zip(axes, args.backend):
        for series in (*args.strategy, "php-article", "ndb"):
            points = sorted((r["shards"], r["per_s"]) for r in rows if r["backend"] == backend and r["series"] == series)
            if points:
                style = "--" if series in BASELINES else "-"
                ax.plot([p[0] for p in points], [p[1] for p in points], style, marker="o", label=series)
        for name, color in zip(CEILINGS, ("black", "grey")):
            raw = _find(rows, backend, name, None)
            if raw is not None:
                ax.axhline(raw["per_s"], color=color, linestyle=":", label=f"{name} ceiling")
        ax.set_xscale("log")
        ax.set_yscale("log")  # the slow series are the story; a linear axis flattens them
        ax.set_xticks(args.shards, [str(s) for s in args.shards])
        ax.set_xlabel("shards")
        ax.set_ylabel("increments counted per second")
        ax.set_title(f"{backend}: {args.writers} writers")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    save(path)
    return f"plot: {path}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help="a short run for CI: firestore+sqlite, shards 1,20,100, 1 s per run (< 3 min)")
    parser.add_argument("--backend", help=f"comma-separated, from {','.join(BACKENDS)} (default: all)")
    parser.add_argument("--shards", help="comma-separated shard counts (default 1,5,20,100)")
    parser.add_argument("--strategy", help=f"comma-separated, from {','.join(OURS)} (default: all)")
    parser.add_argument("--writers", type=int, default=16, help="writer threads in all (default 16)")
    parser.add_argument("--processes", type=int, default=1, help="spread the writers over this many processes")
    parser.add_argument("--duration", type=float, help="seconds per run (default 5; --quick 1)")
    parser.add_argument("--count", type=int, help="increments per run instead of a duration")
    parser.add_argument("--no-ndb", action="store_true", help="skip the google-cloud-ndb baseline")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    args.backend = parse_choices(args.backend or ("firestore,sqlite" if args.quick else ",".join(BACKENDS)),
                                 BACKENDS, "backend")
    args.shards = parse_ints(args.shards or ("1,20,100" if args.quick else "1,5,20,100"))
    args.strategy = parse_choices(args.strategy or ",".join(OURS), OURS, "strategy")
    if args.count is not None and args.duration is not None:
        parser.error("give --duration or --count, not both")
    if args.count is None and args.duration is None:
        args.duration = 1.0 if args.quick else 5.0
    if args.writers < 1 or args.processes < 1 or args.processes > args.writers:
        parser.error("need writers >= processes >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    rows: list[dict[str, Any]] = []
    runs = plan(args)
    pool = None
    if args.processes > 1:
        pool = concurrent.futures.ProcessPoolExecutor(args.processes, mp_context=multiprocessing.get_context("spawn"))
    try:
        with open_backends(args.backend) as backends:
            bar = progress(runs, len(runs), "contention")
            for backend, series, shards in bar:
                if hasattr(bar, "set_postfix_str"):
                    bar.set_postfix_str(f"{backend} {series} {shards or ''}")
                spec = backends[backend].fresh(series)
                rows.append(run_one(series, shards, spec, args, pool))
    finally:
        if pool is not None:
            pool.shutdown()
    found = ratios(rows, args)
    checked = goals(rows, args)
    print()
    print(table(rows, COLUMNS))
    print()
    print("Ratios (same run, same machine):")
    print(table(found, RATIO_COLUMNS))
    print()
    print("Goals (Firestore emulator figures of this run; lost increments on every backend):")
    print(table([g for g in checked if g["goal"] != "no lost increments"], GOAL_COLUMNS))
    ours_lost = [r for r in rows if r["kind"] == "ours" and r["lost"] != 0]
    article_lost = sum(r["lost"] for r in rows if r["series"] == "php-article")
    print()
    print(f"lost increments, our strategies: {sum(r['lost'] for r in ours_lost)} "
          f"({'none' if not ours_lost else 'IN ' + ', '.join(r['series'] for r in ours_lost)}); "
          f"the PHP article's algorithm lost {article_lost}")
    errors = {f"{r['backend']} {r['series']} {r['shards']}": r["first_error"] for r in rows if r["first_error"]}
    for where, error in errors.items():
        print(f"first error, {where}: {error}")
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / "contention.png"
    print(plot(rows, args, png))
    payload = {
        "benchmark": "contention",
        "command": command_line(),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": environment(),
        "wall_seconds": round(time.monotonic() - began, 1),
        "runs": rows,
        "ratios": found,
        "goals": checked,
    }
    print(f"json: {write_json(args.out / 'contention.json', payload)}")
    print(f"took {time.monotonic() - began:.0f} s")
    return 1 if ours_lost else 0


if __name__ == "__main__":
    sys.exit(main())
