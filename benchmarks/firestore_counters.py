"""Firestore's distributed counters (issue 39, goal 8): ours against the page's, one run.

    python benchmarks/firestore_counters.py [--quick] [--duration S] [--repeats N] [--warmup S]
        [--shards 10] [--writers 16] [--processes 4] [--rollup-shards 10000] [--max-age S]
        [--host HOST:PORT] [--project ID] [--out DIR] [--publish] [--compare FILE | --no-compare]
        [--markdown JSON]

Four series on the official Firestore emulator in native mode (started here
with ``gds_counter.emulators``, unless ``--host`` names a running one), each
run with 16 writer threads in 1 process AND with 4 processes x 4 threads
(writer processes started once, with ``spawn``; each opens its own gateway
or client):

  add                   DistributedCounter(path, 10).add()
  page-increment        the page's increment_counter(): update() with Increment(1) of a
                        random shard, run by google-cloud-firestore's Client
                        (benchmarks/_firestore_page.py; init_counter made the shards first)
  increment             DistributedCounter(path, 10).increment(), which returns the total
  page-increment-count  the page's increment_counter() then its get_count()
                        (list_documents, then a get() of each shard)

Goals (issue 39, goal 8), each ratio of two rates measured in one run:
  1  add / page-increment                      >= 1.0
  2  increment / page-increment-count          >= 3.0
  3  get_count(max_age=60) of a counter with 10,000 shards costs 1 RPC (a
     fresh rollup); the first exact read's RPCs and the page's get_count's
     are printed beside it
  4  nothing lost: every series' stored total (read by our reader and by
     the page's) = its acknowledged increments (+ at most the calls that
     raised), and every total increment() (or the page's get_count after
     its increment) returned includes every increment its process had
     acknowledged before the call

How: every series runs ``--warmup`` seconds in both layouts (not reported),
then ``--repeats`` rounds; a round runs every series for ``--duration``
seconds in both layouts, each goal's two series next to each other, and
alternate rounds run the layouts and the series in reverse order, so drift
hits numerators and denominators alike. A series' rate is the calls that
returned within its measured windows over the windows' time, pooled over
the rounds (``contention.py``'s rules); the single rounds' ratios give the
spread. RPCs and document reads and writes per call are counted from
``gateway.stats`` and, for the page, from google-cloud-firestore's GAPIC
calls counted alike (``_common.firestore_client``): what Firestore bills.
Each run counts in a database of its own on the emulator (``c<n>-<series>``),
so no run reads another's documents. The counter has ``--shards`` shards for
ours and for the page's.

``--compare`` (by default the previous ``firestore_counters.json`` in the
results folder, when run with the same settings) prints how far each goal
ratio moved. Results: ``benchmarks/results/firestore_counters.json`` and
``.txt``; ``--publish`` also writes them to docs/benchmarks/. The exit status
is 1 when anything of ours was lost, a returned total was stale, or our
reader and the page's disagreed.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import itertools
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    AGREEMENT,
    REPO,
    RESULTS,
    Layout,
    ReturnedTotals,
    agreement,
    command_line,
    environment,
    firestore_client,
    load_previous,
    pooled,
    progress,
    relative,
    script_parser,
    write_json,
)
from _firestore_page import PageClientCounter  # noqa: E402
from _firestore_report import markdown, report  # noqa: E402
from _windowed import PartResult, WindowedPart, ms, stale_fields  # noqa: E402
from _workers import WorkerPool  # noqa: E402

from gds_counter import DistributedCounter  # noqa: E402
from gds_counter._load import LoadResult  # noqa: E402
from gds_counter.emulators import DEFAULT_PROJECT, start_emulator  # noqa: E402
from gds_counter.gateway.mutations import Upsert  # noqa: E402
from gds_counter.gateway.stats import Stats  # noqa: E402

PUBLISHED = REPO / "docs" / "benchmarks"
NAME = "firestore_counters"
#: The counter document of every run (each run has a database of its own).
PATH = "counters/likes"
ROLLUP_PATH = "counters/big"


@attrs.frozen
class Series:
    name: str
    ours: bool
    #: Its call returns a total, checked against what its process had acknowledged.
    returns_total: bool
    label: str


SERIES = (
    Series("add", True, False, "DistributedCounter(path, 10).add()"),
    Series("page-increment", False, False, "the page's increment_counter()"),
    Series("increment", True, True, "DistributedCounter(path, 10).increment()"),
    Series("page-increment-count", False, True, "the page's increment_counter() + get_count()"),
)
BY_NAME = {s.name: s for s in SERIES}


@attrs.frozen
class Goal:
    number: int
    what: str
    numerator: str
    denominator: str
    need: float


GOALS = (
    Goal(1, "add() / the page's increment_counter()", "add", "page-increment", 1.0),
    Goal(2, "increment() / the page's increment + get_count", "increment", "page-increment-count", 3.0),
)


@attrs.frozen
class Where:
    """One run's storage, as plain data a writer process can reopen: a
    database of its own on the native-mode emulator at ``host``."""

    host: str
    project: str
    database: str

    def gateway(self) -> Any:
        from gds_counter.gateway.firestore import FirestoreGateway

        return FirestoreGateway(self.project, self.database, emulator_host=self.host)

    def client(self, stats: Stats | None = None) -> Any:
        return firestore_client(self.host, self.project, self.database, stats)


# --- one process's part of a run ------------------------------------------------------------


@attrs.frozen
class Job:
    series: str
    where: Where
    threads: int
    duration: float
    shards: int
    #: Index of this process's first writer among all the run's writers (seeds the page's shard choice).
    first_writer: int = 0


class Part(WindowedPart):
    """One process's share of one run (``_windowed``): its writers' calls,
    ours or the page's; the page's RPCs counted as our gateway counts its own."""

    def _ops(self, job: Job) -> list[Callable[[], Any]]:
        if BY_NAME[job.series].returns_total:
            self.totals = ReturnedTotals()
        if BY_NAME[job.series].ours:
            gateway = job.where.gateway()
            self.closers.append(gateway.close)
            self.stats = gateway.stats
            counter = DistributedCounter(PATH, job.shards, gateway=gateway)
            if self.totals is None:
                return [counter.add] * job.threads
            return [self.totals.wrap(counter.increment)] * job.threads
        self.stats = Stats()
        client = job.where.client(self.stats)
        self.closers.append(client.close)
        doc_ref = client.document(PATH)
        pages = [PageClientCounter(job.shards, random.Random(job.first_writer + i)) for i in range(job.threads)]
        if self.totals is None:
            return [functools.partial(page.increment_counter, doc_ref) for page in pages]

        def counted(page: PageClientCounter) -> Callable[[], int]:
            def call() -> int:
                page.increment_counter(doc_ref)
                return page.get_count(doc_ref)

            return call

        return [self.totals.wrap(counted(page)) for page in pages]


def prepare(job: Job) -> Part:
    return Part(job)


# --- one run, in the parent ------------------------------------------------------------------


def stored(where: Where, shards: int) -> dict[str, int]:
    """The counter's total after a run, read by a fresh reader of ours and
    by the page's ``get_count``: each must see every shard of both."""
    gateway = where.gateway()
    client = where.client()
    try:
        return {"ours_read": DistributedCounter(PATH, shards, gateway=gateway).get_count(),
                "page_read": PageClientCounter(shards).get_count(client.document(PATH))}
    finally:
        client.close()
        gateway.close()


_runs = itertools.count(1)


def run_cell(pool: WorkerPool, emulator: Any, series: str, layout: Layout, duration: float, shards: int,
             phase: str, repeat: int | None) -> dict[str, Any]:
    """One run of one series in one layout, in a database of its own."""
    where = Where(emulator.host, emulator.project, f"c{next(_runs)}-{series}")
    if not BY_NAME[series].ours:  # the page's writers update: its shards must exist first
        client = where.client()
        try:
            PageClientCounter(shards).init_counter(client.document(PATH))
        finally:
            client.close()
    jobs = [Job(series, where, layout.threads, duration, shards, p * layout.threads) for p in range(layout.processes)]
    parts: list[PartResult] = pool.run(jobs)
    load, stats = LoadResult(), Stats()
    for part in parts:
        load.merge(part.load)  # warm-up calls included
        for name, value in part.stats.items():
            stats.bump(name, value)
    totals = stored(where, shards)
    acked = load.ok + load.warmup
    row: dict[str, Any] = {
        "phase": phase, "repeat": repeat, "series": series, "layout": layout.name, "database": where.database,
        "window_s": duration, "in_window": sum(p.in_window for p in parts),
        "per_s": round(sum(p.in_window for p in parts) / duration, 2),
        "ok": load.ok, "failed": load.failed, "errors": dict(load.errors), "first_error": load.first_error,
        "warmup_calls": load.warmup, "acked": acked, **totals,
        "stored": totals["ours_read"] if BY_NAME[series].ours else totals["page_read"],
        "p50_ms": ms(load.latency_ms(0.50)), "p99_ms": ms(load.latency_ms(0.99)),
        "stats": stats.snapshot(),
    }
    row["lost"] = acked - row["stored"]
    for key, name in (("rpcs_per_call", "rpcs"), ("reads_per_call", "entity_reads"), ("writes_per_call", "entity_writes")):
        row[key] = round(row["stats"][name] / load.ok, 3) if load.ok else None
    if BY_NAME[series].returns_total:
        row.update(stale_fields(parts))
    return row


# --- goal 3: a rollup read at 10,000 shards --------------------------------------------------


def _read(stats: Stats, read: Callable[[], int]) -> dict[str, Any]:
    stats.reset()
    began = time.perf_counter()
    total = read()
    took = time.perf_counter() - began
    counted = stats.snapshot()
    return {"total": total, "rpcs": counted["rpcs"], "reads": counted["entity_reads"],
            "writes": counted["entity_writes"], "seconds": round(took, 3)}


def rollup_reads(emulator: Any, shards: int, max_age: float) -> dict[str, Any]:
    """A counter with ``shards`` shards, each holding 1 to 7: the RPCs and
    document reads of its first exact read (``get_count()``), of the first
    ``get_count(max_age=...)`` (no rollup yet: exact, then the rollup is
    written), of the next one (a fresh rollup: the goal, 1 RPC), and of the
    page's ``get_count`` of the same counter."""
    where = Where(emulator.host, emulator.project, "rollup")
    gateway = where.gateway()
    stats = Stats()
    client = where.client(stats)
    try:
        counter = DistributedCounter(ROLLUP_PATH, 10, gateway=gateway)
        counter.increase_shards(shards)
        numbers = counter.layout.shard_numbers(shards)
        documents = [counter.layout.shard_entity(counter.name, n, n % 7 + 1) for n in numbers]
        for start in range(0, len(documents), 500):
            gateway.commit([Upsert(document) for document in documents[start : start + 500]])
        expected = sum(n % 7 + 1 for n in numbers)
        reads = {
            "exact": _read(gateway.stats, counter.get_count),
            "first_max_age": _read(gateway.stats, lambda: counter.get_count(max_age=max_age)),
            "fresh_rollup": _read(gateway.stats, lambda: counter.get_count(max_age=max_age)),
            "page_get_count": _read(stats, lambda: PageClientCounter(shards).get_count(client.document(ROLLUP_PATH))),
        }
    finally:
        client.close()
        gateway.close()
    fresh = reads["fresh_rollup"]
    wrong = [name for name, r in reads.items() if r["total"] != expected]
    return {"goal": 3, "what": "a fresh rollup read costs 1 RPC", "shards": shards, "max_age": max_age, "expected": expected, "reads": reads, "wrong_totals": wrong,
            "ratio": None, "need": 1, "met": fresh["rpcs"] == 1 and not wrong}


# --- the whole benchmark ------------------------------------------------------------------------


def layouts_of(args: argparse.Namespace) -> list[Layout]:
    found = [Layout(1, args.writers), Layout(args.processes, args.writers // args.processes)]
    return list(dict.fromkeys(found))


def schedule(args: argparse.Namespace) -> list[tuple[str, int | None, Layout, str]]:
    """(phase, repeat, layout, series) in the order they run; each goal's
    two series are next to each other (SERIES' order)."""
    layouts = layouts_of(args)
    cells: list[tuple[str, int | None, Layout, str]] = []
    if args.warmup:
        cells += [("warmup", None, layout, s.name) for layout in layouts for s in SERIES]
    for repeat in range(args.repeats):
        forward = repeat % 2 == 0
        for layout in layouts if forward else layouts[::-1]:
            for s in SERIES if forward else SERIES[::-1]:
                cells.append(("measure", repeat, layout, s.name))
    return cells


def summarize(rows: list[dict[str, Any]], layouts: list[str]) -> list[dict[str, Any]]:
    out = []
    for s in SERIES:
        for layout in layouts:
            mine = [r for r in rows if r["series"] == s.name and r["layout"] == layout]
            if not mine:
                continue
            ok = sum(r["ok"] for r in mine)

            def per_call(name: str) -> float | None:
                return round(sum(r["stats"][name] for r in mine) / ok, 3) if ok else None

            rates = [r["per_s"] for r in mine]
            rate = pooled(mine, s.name, layout)
            out.append({
                "series": s.name, "label": s.label, "ours": s.ours, "layout": layout, "rounds": len(mine),
                "per_s": None if rate is None else round(rate, 1), "min_per_s": min(rates), "max_per_s": max(rates),
                "rpcs_per_call": per_call("rpcs"), "reads_per_call": per_call("entity_reads"),
                "writes_per_call": per_call("entity_writes"),
                "p50_ms": round(statistics.median(r["p50_ms"] for r in mine if r["p50_ms"] is not None), 2) if ok else None,
                "p99_ms": round(statistics.median(r["p99_ms"] for r in mine if r["p99_ms"] is not None), 2) if ok else None,
                "ok": ok, "acked": sum(r["acked"] for r in mine), "failed": sum(r["failed"] for r in mine),
                "lost": sum(r["lost"] for r in mine),
                "stale_totals": sum(r["stale_totals"] for r in mine) if s.returns_total else None,
                "totals_checked": sum(r["totals_checked"] for r in mine) if s.returns_total else None,
            })
    return out


def check_goals(rows: list[dict[str, Any]], layouts: list[str], repeats: int) -> list[dict[str, Any]]:
    out = []
    for goal in GOALS:
        for layout in layouts:
            ratios = []
            for repeat in range(repeats):
                mine = [r for r in rows if r["repeat"] == repeat]
                num, den = pooled(mine, goal.numerator, layout), pooled(mine, goal.denominator, layout)
                if num is not None and den:
                    ratios.append(num / den)
            num_rate, den_rate = pooled(rows, goal.numerator, layout), pooled(rows, goal.denominator, layout)
            ratio = num_rate / den_rate if num_rate is not None and den_rate else None
            out.append({
                "goal": goal.number, "what": goal.what, "layout": layout, "numerator": goal.numerator,
                "denominator": goal.denominator, "ratio": None if ratio is None else round(ratio, 3),
                "need": goal.need, "met": None if ratio is None else ratio >= goal.need,
                "numerator_per_s": None if num_rate is None else round(num_rate, 1),
                "denominator_per_s": None if den_rate is None else round(den_rate, 1),
                "rounds": [round(x, 3) for x in ratios],
                "min": round(min(ratios), 3) if ratios else None, "max": round(max(ratios), 3) if ratios else None,
                "median_of_rounds": round(statistics.median(ratios), 3) if ratios else None,
            })
    return out


def exactness(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Goal 4: stored = acknowledged (a call that raised may or may not have
    been stored), both readers agree, no stale total; for every series, the
    page's included (its update is atomic: it should lose nothing)."""
    problems: list[str] = []
    ours_wrong = False  # anything wrong that is ours: a loss or stale total of ours, or our reader's miss
    for r in rows:
        where = f"{r['series']} {r['layout']} round {r['repeat']}"
        found = len(problems)
        extra = r["stored"] - r["acked"]
        if extra < 0:
            problems.append(f"{where}: {-extra} acknowledged increments not stored")
        if extra > r["failed"]:
            problems.append(f"{where}: {extra} more stored than acknowledged (only {r['failed']} raised)")
        if r.get("stale_totals"):
            problems.append(f"{where}: {r['stale_totals']} stale totals ({r['first_stale']})")
        ours_wrong = ours_wrong or (BY_NAME[r["series"]].ours and len(problems) > found)
        if r["ours_read"] != r["page_read"]:
            problems.append(f"{where}: our reader counted {r['ours_read']}, the page's {r['page_read']}")
            ours_wrong = True
    ours = [r for r in rows if BY_NAME[r["series"]].ours]
    page = [r for r in rows if not BY_NAME[r["series"]].ours]
    checked = sum(r.get("totals_checked", 0) for r in rows)
    notes = (f"stored = acknowledged in {sum(r['stored'] == r['acked'] for r in rows)} of {len(rows)} runs "
             f"({sum(r['acked'] for r in ours):,} increments of ours, {sum(r['acked'] for r in page):,} of the page's); "
             f"our reader = the page's reader in {sum(r['ours_read'] == r['page_read'] for r in rows)} of {len(rows)}; "
             f"{checked:,} returned totals checked, {sum(r.get('stale_totals', 0) for r in rows)} stale")
    return {"goal": 4, "what": "nothing lost, no stale total", "layout": "both", "ratio": None, "need": None,
            "met": not problems, "ours_exact": not ours_wrong, "notes": notes, "problems": problems}


QUICK = {"duration": 2.0, "repeats": 2, "warmup": 1.0}
FULL = {"duration": 4.0, "repeats": 6, "warmup": 3.0}
#: What two runs must share for their goal ratios to be compared.
COMPARABLE = ("duration", "repeats", "warmup", "shards", "writers", "processes")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help=f"the small run: {QUICK} (default {FULL})")
    parser.add_argument("--duration", type=float, help="seconds per series, layout and round")
    parser.add_argument("--repeats", type=int, help="alternating rounds (each series' rate is pooled over them)")
    parser.add_argument("--warmup", type=float, help="seconds of unreported warm-up per series and layout")
    parser.add_argument("--shards", type=int, default=10, help="shards of ours and of the page's (default 10)")
    parser.add_argument("--writers", type=int, default=16, help="writer threads in all (default 16)")
    parser.add_argument("--processes", type=int, default=4,
                        help="processes of the second layout (default 4; 1: only the 1-process layout)")
    parser.add_argument("--rollup-shards", type=int, default=10_000,
                        help="shards of goal 3's counter (default 10,000; 0 leaves goal 3 out)")
    parser.add_argument("--max-age", type=float, default=60.0, help="goal 3's max_age in seconds (default 60)")
    parser.add_argument("--host", help="a running native-mode Firestore emulator (host:port); default: start one")
    parser.add_argument("--project", default=DEFAULT_PROJECT, help="its project id, with --host")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    parser.add_argument("--publish", action="store_true", help=f"also write docs/benchmarks/{NAME}.{{json,txt}}")
    parser.add_argument("--compare", type=Path, help=f"a previous {NAME}.json to compare the goal ratios with")
    parser.add_argument("--no-compare", action="store_true", help="compare with no previous run")
    parser.add_argument("--markdown", type=Path, metavar="JSON", help="print docs tables from a recorded run and exit")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if not args.duration > 0 or args.repeats < 1 or args.warmup < 0 or args.shards < 1 or args.rollup_shards < 0:
        parser.error("need duration > 0, repeats >= 1, warmup >= 0, shards >= 1, rollup shards >= 0")
    if args.writers < 1 or args.processes < 1 or args.writers % args.processes:
        parser.error("need writers >= 1 split evenly over processes >= 1")
    if args.compare is not None and args.no_compare:
        parser.error("give --compare or --no-compare, not both")
    return args


@contextlib.contextmanager
def emulator_for(args: argparse.Namespace) -> Iterator[Any]:
    """The emulator named by ``--host``, or one started (and stopped) here."""
    if args.host:
        yield Where(args.host, args.project, "")
        return
    with start_emulator("firestore-native") as emulator:
        yield emulator


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    began = time.monotonic()
    previous, compared = load_previous(args, args.out / f"{NAME}.json", NAME, COMPARABLE)
    cells = schedule(args)
    layouts = [layout.name for layout in layouts_of(args)]
    rows: list[dict[str, Any]] = []
    with emulator_for(args) as emulator, WorkerPool(args.processes, prepare) as pool:
        bar = progress(cells, len(cells), NAME)
        for phase, repeat, layout, series in bar:
            duration = args.warmup if phase == "warmup" else args.duration
            rows.append(run_cell(pool, emulator, series, layout, duration, args.shards, phase, repeat))
        rollup = rollup_reads(emulator, args.rollup_shards, args.max_age) if args.rollup_shards else None
    measured = [r for r in rows if r["phase"] == "measure"]
    goals = check_goals(measured, layouts, args.repeats)
    payload: dict[str, Any] = {
        "benchmark": NAME,
        "command": command_line(),
        "settings": {k: (relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": environment(),
        "wall_seconds": 0.0,
        "goals": goals,
        "rollup": rollup,
        "exact": exactness(measured),
        "agreement": {"with": compared, "limit": AGREEMENT,
                      "ratios": agreement(goals, None if previous is None else previous.get("goals", []),
                                          ("goal", "layout"))},
        "series": summarize(measured, layouts),
        "runs": rows,
    }
    payload["wall_seconds"] = round(time.monotonic() - began, 1)
    lines = report(payload) + ["", f"command: {payload['command']}", f"took {payload['wall_seconds']:.0f} s"]
    print("\n".join(lines))
    for folder in [args.out] + ([PUBLISHED] if args.publish else []):
        print(f"json: {relative(write_json(folder / f'{NAME}.json', payload))}")
        (folder / f"{NAME}.txt").write_text("\n".join(lines) + "\n")
        print(f"text: {relative(folder / f'{NAME}.txt')}")
    return 0 if payload["exact"]["ours_exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
