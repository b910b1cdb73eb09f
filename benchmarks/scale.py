"""The scaling curve: increments per second against the shard count, under
the embedded engine's model of Datastore's per-entity write rate; and what
an exact read costs at 10,000 shards against a rollup read.

    python benchmarks/scale.py [--quick] [--rate 2] [--shards 1,5,20,50,100,200]
        [--processes 4] [--threads 16] [--duration 8] [--json PATH] [--plot PATH]

Write curve: for each shard count, a fresh SQLite file opened by every
writer process as ``EmbeddedGateway(path, entity_writes_per_second=RATE)``
(the teaching model: a shard written again sooner than 1/RATE seconds
after its last write is ``Contention``, as a Datastore entity pushed past
its sustained write rate is), and ``--processes`` x ``--threads`` writers
calling ``CounterShardDS("Scale", S, num_shards=S).add()`` for
``--duration`` seconds, twice: with one commit per call
(``Runtime(combine_writes=False)``: the sharding alone, the curve the
goal is about) and with the library's defaults (the overlapping calls of
a process combined into one commit, so a call can outrun the model). A
writer retries ``Contention`` as the library does (``RetryPolicy``: a
fresh shard each attempt, with backoff). Recorded per point and series:
increments/s (calls that returned), shard writes/s, the ideal ``S x
RATE`` and the efficiency (one commit each over the ideal), calls that
raised, writer CPU (seconds of CPU per second of wall time, summed over
the writer processes; the machine has ``os.cpu_count()`` cores), the
model's aborts, and exactness (the stored total equals the calls that
returned).

Read costs: one counter with 10,000 shards (1..7 each) on the embedded
engine, read exactly with the article's query and with the batched lookup,
then from a fresh rollup: entity reads, RPCs and milliseconds of each.

Writer processes are started once with ``spawn`` (``_workers.WorkerPool``)
and reused; the parent only prepares files and reads totals. Results:
``--json`` (the record: command, environment, settings, every point) and
``--plot`` (PNG; needs matplotlib, the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import command_line, environment, fmt, parse_ints, progress, script_parser, table, write_json
from _workers import WorkerPool

from gds_counter._demo import new_figure

QUICK = {"duration": 2.0, "shards": "1,5,20"}
FULL = {"duration": 8.0, "shards": "1,5,20,50,100,200"}


class Writers:
    """One writer process's part of a point: its gateway and threads."""

    def __init__(self, job: dict[str, Any]) -> None:
        from gds_counter.counter import CounterShardDS, Runtime
        from gds_counter.gateway.embedded import EmbeddedGateway
        from gds_counter.gds import RetryPolicy

        self.job = job
        self.gateway = EmbeddedGateway(job["path"], entity_writes_per_second=job["rate"])
        Runtime(combine_writes=job["combine"]).install(self.gateway)
        # Patient enough that a call almost never runs out of attempts while
        # every shard is busy; the backoff keeps the aborted attempts from
        # eating the CPU the writes need.
        retry = RetryPolicy(attempts=60, initial=0.002, maximum=0.25, deadline=60.0)
        self.counter = CounterShardDS("Scale", job["shards"], num_shards=job["shards"], gateway=self.gateway,
                                      retry=retry)
        self.counter.get_count()  # opened, warmed, off the clock

    def run(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.job["duration"]
        ok, failed = [0] * self.job["threads"], [0] * self.job["threads"]
        errors: collections.Counter[str] = collections.Counter()

        def write(i: int) -> None:
            while time.monotonic() < deadline:
                try:
                    self.counter.add()
                    ok[i] += 1
                except Exception as exc:  # noqa: BLE001 - counted; the stored total says if it was written
                    failed[i] += 1
                    errors[type(exc).__name__] += 1

        cpu = time.process_time()
        began = time.monotonic()
        threads = [threading.Thread(target=write, args=(i,)) for i in range(self.job["threads"])]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.monotonic() - began
        stats = self.gateway.stats.snapshot()
        return {"ok": sum(ok), "failed": sum(failed), "wall": wall, "cpu": time.process_time() - cpu,
                "aborts": stats.get("write_rate_aborts", 0), "writes": stats.get("entity_writes", 0),
                "errors": dict(errors)}

    def close(self) -> None:
        self.gateway.close()


def run_series(pool: WorkerPool, path: str, shards: int, combine: bool, args: argparse.Namespace) -> dict[str, Any]:
    """One series of a point: every writer for ``--duration`` seconds on a fresh file."""
    from gds_counter.counter import CounterShardDS
    from gds_counter.gateway.embedded import EmbeddedGateway

    EmbeddedGateway(path).close()  # the file and its tables made once, before every writer opens it
    jobs = [{"path": path, "rate": args.rate, "shards": shards, "threads": args.threads, "duration": args.duration,
             "combine": combine} for _ in range(args.processes)]
    parts = pool.run(jobs)
    wall = max(part["wall"] for part in parts)
    ok = sum(part["ok"] for part in parts)
    reader = EmbeddedGateway(path)
    try:
        stored = CounterShardDS("Scale", shards, num_shards=shards, gateway=reader).get_count()
    finally:
        reader.close()
    return {"per_s": ok / wall, "writes_per_s": sum(part["writes"] for part in parts) / wall, "calls": ok,
            "failed": sum(part["failed"] for part in parts), "aborts": sum(part["aborts"] for part in parts),
            "cpu": sum(part["cpu"] for part in parts) / wall, "exact": stored == ok,
            "errors": dict(sum((collections.Counter(part["errors"]) for part in parts), collections.Counter()))}


def run_point(pool: WorkerPool, folder: Path, shards: int, args: argparse.Namespace) -> dict[str, Any]:
    """A shard count: one commit per call (the sharding alone), then the
    library's defaults (overlapping calls of a process combined into one
    commit), each on a file of its own."""
    alone = run_series(pool, str(folder / f"alone-{shards}.sqlite3"), shards, False, args)
    combined = run_series(pool, str(folder / f"combined-{shards}.sqlite3"), shards, True, args)
    ideal = shards * args.rate
    return {
        "shards": shards, "ideal": ideal,
        "increments_per_second": round(alone["per_s"], 1), "efficiency": round(alone["per_s"] / ideal, 3),
        "shard_writes_per_second": round(alone["writes_per_s"], 1),
        "writer_cpu": round(alone["cpu"], 2), "model_aborts": alone["aborts"], "failed": alone["failed"], "errors": alone["errors"],
        "combined_increments_per_second": round(combined["per_s"], 1),
        "combined_shard_writes_per_second": round(combined["writes_per_s"], 1),
        "combined_writer_cpu": round(combined["cpu"], 2), "combined_failed": combined["failed"],
        "combined_errors": combined["errors"],
        "exact": alone["exact"] and combined["exact"],
    }


def read_costs(folder: Path) -> list[dict[str, Any]]:
    """10,000 shards read exactly (query, lookup) and from a fresh rollup."""
    from gds_counter.counter import CounterShardDS
    from gds_counter.gateway.embedded import EmbeddedGateway
    from gds_counter.gateway.mutations import Upsert

    gateway = EmbeddedGateway(str(folder / "reads.sqlite3"))
    try:
        counter = CounterShardDS("Reads", 1, gateway=gateway)
        counter.increase_shards(10_000)
        numbers = counter.layout.shard_numbers(10_000)
        shards = [counter.layout.shard_entity(counter.name, n, n % 7 + 1) for n in numbers]
        for start in range(0, len(shards), 500):
            gateway.commit([Upsert(shard) for shard in shards[start : start + 500]])
        expected = sum(n % 7 + 1 for n in numbers)
        counter.get_count(max_age=3600)  # the rollup, written
        rows = []
        for label, read in (("exact: the article's query", lambda: counter.get_count(method="query")),
                            ("exact: batched lookup", lambda: counter.get_count(method="lookup")),
                            ("rollup, max_age=3600", lambda: counter.get_count(max_age=3600))):
            read()  # warm
            gateway.stats.reset()
            began = time.perf_counter()
            total = read()
            ms = (time.perf_counter() - began) * 1000
            stats = gateway.stats.snapshot()
            if total != expected:
                raise SystemExit(f"{label}: read {total}, stored {expected}")
            rows.append({"read": label, "entity_reads": stats["entity_reads"], "rpcs": stats["rpcs"], "ms": round(ms, 1)})
        return rows
    finally:
        gateway.close()


def plot(points: list[dict[str, Any]], rate: float, path: Path) -> str:
    made = new_figure(8, 4.8)
    if isinstance(made, str):
        return made
    figure, save = made
    axes = figure.subplots(1, 1)
    shards = [p["shards"] for p in points]
    axes.plot(shards, [p["ideal"] for p in points], "--", color="#7f8c8d", label=f"ideal: shards x {rate:g} writes/s")
    axes.plot(shards, [0.8 * p["ideal"] for p in points], ":", color="#bdc3c7", label="0.8 x ideal (the goal)")
    axes.plot(shards, [p["increments_per_second"] for p in points], "o-", color="#2980b9",
              label="measured: one commit per call")
    axes.plot(shards, [p["combined_increments_per_second"] for p in points], "s-", color="#27ae60",
              label="measured: defaults (overlapping calls combined)")
    for p in points:
        axes.annotate(f"{p['efficiency']:.0%}", (p["shards"], p["increments_per_second"]), textcoords="offset points",
                      xytext=(4, -12), fontsize="small")
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("shards")
    axes.set_ylabel("increments/s (calls that returned)")
    axes.set_title(f"CounterShardDS.add() under the per-entity write-rate model ({rate:g} writes/s per shard)")
    axes.legend()
    save(path)
    return f"plot: {path}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help=f"shards {QUICK['shards']}, {QUICK['duration']:g} s each")
    parser.add_argument("--rate", type=float, default=2.0, help="the model's writes per second per entity (default 2)")
    parser.add_argument("--shards", help=f"comma-separated shard counts (default {FULL['shards']})")
    parser.add_argument("--processes", type=int, default=4, help="writer processes (default 4)")
    parser.add_argument("--threads", type=int, default=16, help="writer threads per process (default 16)")
    parser.add_argument("--duration", type=float, help=f"seconds per point (default {FULL['duration']:g})")
    parser.add_argument("--no-reads", action="store_true", help="skip the 10,000-shard read costs")
    parser.add_argument("--json", type=Path, help="write the record here")
    parser.add_argument("--plot", type=Path, help="draw the curve here (PNG; needs matplotlib)")
    args = parser.parse_args(argv)
    defaults = QUICK if args.quick else FULL
    args.duration = args.duration if args.duration is not None else defaults["duration"]
    args.shard_counts = parse_ints(args.shards or str(defaults["shards"]))
    if not (args.rate > 0 and args.duration > 0 and args.processes >= 1 and args.threads >= 1):
        parser.error("need --rate > 0, --duration > 0, --processes >= 1, --threads >= 1")
    for target in (args.json, args.plot):
        if target is not None and not target.parent.is_dir():
            parser.error(f"the folder {target.parent} does not exist")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gds-scale-") as tmp, WorkerPool(args.processes, Writers) as pool:
        folder = Path(tmp)
        points = [run_point(pool, folder, shards, args)
                  for shards in progress(args.shard_counts, len(args.shard_counts), "scale")]
        reads = [] if args.no_reads else read_costs(folder)
    took = time.perf_counter() - began
    print(f"Scaling: {args.processes} processes x {args.threads} threads calling add() for {args.duration:g} s per "
          f"point, {args.rate:g} writes/s per shard (the embedded engine's model); took {took:.0f} s")
    print(table(points, [("shards", "shards", 0), ("ideal", "ideal/s", 1), ("increments_per_second", "one commit each/s", 1),
                         ("efficiency", "of ideal", 3), ("model_aborts", "model aborts", 0),
                         ("writer_cpu", "CPU (cores)", 2), ("combined_increments_per_second", "combined/s", 1),
                         ("combined_shard_writes_per_second", "combined writes/s", 1),
                         ("combined_writer_cpu", "CPU (cores)", 2), ("failed", "raised", 0), ("exact", "exact", 0)]))
    if reads:
        print("\nOne read of a counter with 10,000 shards (embedded engine):")
        print(table(reads, [("read", "read", 0), ("entity_reads", "entity reads", 0), ("rpcs", "RPCs", 0), ("ms", "ms", 1)]))
    if args.plot is not None:
        print(plot(points, args.rate, args.plot))
    if args.json is not None:
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "plot")}
        payload = {"command": command_line(None if argv is None else [sys.argv[0], *argv]),
                   "environment": environment(), "settings": settings, "took_s": round(took, 1),
                   "entity_writes_per_second": args.rate, "points": points, "reads": reads}
        print(f"record: {write_json(args.json, payload)}", file=sys.stderr)
    exact = all(point["exact"] for point in points)
    if not exact:
        print("NOT EXACT: a stored total differs from the calls that returned", file=sys.stderr)
    print(f"\n{'all exact' if exact else 'NOT all exact'}; "
          f"efficiency {', '.join(fmt(p['efficiency'], 2) for p in points)} at {', '.join(str(p['shards']) for p in points)} shards")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
