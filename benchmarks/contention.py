"""The performance issue's goals, measured side by side in one run.

    python benchmarks/contention.py [--quick] [--duration S] [--repeats N] [--warmup S]
        [--shards 20] [--writers 16] [--processes 4] [--out DIR] [--publish]
        [--compare FILE | --no-compare]

Seven series, each run with 16 writer threads in 1 process AND with 4
processes x 4 threads (writer processes are started once, with ``spawn``;
each opens its own gateway or client):

  increment      CounterShardDS("Contention", 1, 20).increment(), defaults   Firestore emulator
  add            CounterShardDS("Contention", 1, 20).add(), defaults         Firestore emulator
  transactional  CounterShardDS(..., strategy="transactional").increment()   Firestore emulator
  php-article    the PHP article's increment() ported literally to           Firestore emulator
                 google-cloud-datastore's Client: the target query
                 (getCount), a lookup by key name, a blind
                 non-transactional put; it loses increments (reported)
  raw-put        Client.put of one entity of 20 per commit (writer i       Firestore emulator
                 writes entity i mod 20): the ceiling
  embedded       CounterShardDS("Contention", 1, 20).increment(), defaults   SQLite file
  sqlite-upsert  raw sqlite3 "INSERT ... ON CONFLICT DO UPDATE SET count =   SQLite file
                 count + 1", a connection per thread, the embedded engine's
                 file settings (WAL, synchronous=FULL, busy timeout)

Goals, each a ratio of rates in one run (1x16: 1 process x 16 threads;
4x4: 4 processes x 4 threads):
                                              1x16    4x4
  1  increment / php-article, with nothing    >= 3.5  >= 3.0  (issue 38)
     lost and no error raised to callers
  2  add / raw-put                            >= 3.0  >= 0.9  (1x16: issue 38)
  3  transactional / php-article              >= 1.0  >= 1.0
  4  embedded / sqlite-upsert                 >= 1.0  >= 0.8  (issue 38)
  5  no guarantee weakened: every increment of ours counted exactly once or
     raised (stored total = acknowledged), every total increment() returned
     includes every increment its process had acknowledged before the call
     (strong consistency; checked on every call), the lookup and the query
     agree on the final total, and our reader counts every shard the PHP
     writers wrote (equal to the PHP reader's total)

How: the emulator starts, every Firestore series runs ``--warmup`` seconds
in both layouts (the emulator's JIT warms up; not reported), then
``--repeats`` rounds. A round runs every series for ``--duration`` seconds
in both layouts, the two series of each ratio next to each other;
alternate rounds run the layouts and the series in reverse order, so slow
drift hits numerators and denominators alike. A series' rate is pooled over
its rounds (the calls that returned within the measured windows over the
windows' time: one long run cut into alternating pieces), and a goal's figure is the ratio of two pooled
rates; the ratios within each round give the spread (min-max), and their
median is recorded too. Each run counts increments/s, RPCs and entity
reads/writes (``gateway.stats``; Google's client is counted the same way),
errors, and lost increments (acknowledged minus stored). Each run has a
namespace (or SQLite file) and a kind (``KIND_PFX``) of its own. One
warm-up call per process comes before the clock; it is counted in the
stored total, not in the rate. SQLite files are in the temporary folder,
normally on disk, where ``synchronous=FULL`` pays an fsync per commit:
goal 4's ratio rises as fsyncs get slower (both sides wait for them), so
each round also times 50 single-thread upserts (one commit, one fsync each)
on a fresh file there and the report gives their median.

``--compare`` (by default the previous ``contention.json`` in the results
folder, when it was run with the same settings) prints how far each goal
ratio moved from that run: the check that the figures are reproducible.
Results: ``benchmarks/results/contention.json`` and ``.png`` (``--publish``
also writes ``docs/benchmarks/contention.json``, ``.txt`` and ``.png``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    AGREEMENT,
    RAW_KIND,
    REPO,
    RESULTS,
    Backend,
    BackendSpec,
    Layout,
    PhpArticleClient,
    ReturnedTotals,
    agreement,
    command_line,
    environment,
    fmt,
    google_client,
    load_previous,
    open_backends,
    parse_choices,
    pooled,
    progress,
    raw_put,
    relative,
    shard_entity_class,
    sqlite_connect,
    sqlite_total,
    sqlite_upsert,
    table,
    verdict,
    write_json,
)
from _windowed import PartResult, WindowedPart, ms, stale_fields  # noqa: E402
from _workers import WorkerPool  # noqa: E402

from gds_counter._demo import new_figure  # noqa: E402
from gds_counter._load import LoadResult  # noqa: E402
from gds_counter.counter import CounterShardDS  # noqa: E402
from gds_counter.gateway.stats import Stats  # noqa: E402
from gds_counter.gds.store import Store  # noqa: E402

TARGET = ("Contention", 1)
PUBLISHED = REPO / "docs" / "benchmarks"


@attrs.frozen
class Series:
    name: str
    backend: str
    ours: bool
    label: str


SERIES = (
    Series("increment", "firestore", True, "CounterShardDS().increment()"),
    Series("php-article", "firestore", False, "the PHP article's increment()"),
    Series("transactional", "firestore", True, 'increment(), strategy="transactional"'),
    Series("add", "firestore", True, "CounterShardDS().add()"),
    Series("raw-put", "firestore", False, "raw Client.put, 1 entity of 20"),
    Series("embedded", "sqlite", True, "CounterShardDS().increment(), SQLite"),
    Series("sqlite-upsert", "sqlite", False, "raw sqlite3 upsert"),
)
BY_NAME = {s.name: s for s in SERIES}
#: Series whose call returns the total (checked for strong consistency).
RETURNS_TOTAL = ("increment", "transactional", "embedded")


@attrs.frozen
class Goal:
    number: int
    what: str
    numerator: str
    denominator: str
    #: At least this ratio, in every layout but those ``by_layout`` names.
    need: float
    #: The numerator must also lose nothing and raise nothing.
    clean: bool = False
    #: Layout ("1x16": processes x threads) -> its own need (issue 38's).
    by_layout: dict[str, float] = attrs.field(factory=dict)

    def need_in(self, layout: str) -> float:
        return self.by_layout.get(layout, self.need)


#: Goals 1, 2 and 4 in the 16-thread layouts are issue 38's (speed), the
#: rest the performance issue's first floors.
GOALS = (
    Goal(1, "default increment() / PHP article's algorithm", "increment", "php-article", 1.0, clean=True,
         by_layout={"1x16": 3.5, "4x4": 3.0}),
    Goal(2, "default add() / raw puts", "add", "raw-put", 0.9, by_layout={"1x16": 3.0}),
    Goal(3, "transactional increment() / PHP article's algorithm", "transactional", "php-article", 1.0),
    Goal(4, "embedded increment() / raw sqlite3 upserts", "embedded", "sqlite-upsert", 0.5,
         by_layout={"1x16": 1.0, "4x4": 0.8}),
)


# --- one part of a run, in a writer process ------------------------------------------------


@attrs.frozen
class Job:
    series: str
    spec: BackendSpec
    threads: int
    duration: float
    shards: int
    #: The run's kind prefix (KIND_PFX): see ``run_cell``.
    kind_prefix: str = ""
    #: Index of this process's first writer among all the run's writers.
    first_writer: int = 0


class Part(WindowedPart):
    """One process's share of one run (``_windowed``): its writers' calls."""

    def _ops(self, job: Job) -> list[Callable[[], Any]]:
        series, spec, n = job.series, job.spec, job.threads
        if series in ("php-article", "raw-put"):
            self.stats = Stats()
            client = google_client(spec, self.stats)
            self.closers.append(client.close)
            if series == "php-article":
                kind = shard_entity_class(job.kind_prefix).kind()
                return [PhpArticleClient(client, *TARGET, job.shards, kind).increment for _ in range(n)]
            return [raw_put(client, job.first_writer + i, job.shards, job.kind_prefix + RAW_KIND) for i in range(n)]
        if series == "sqlite-upsert":
            conns = [sqlite_connect(spec.location) for _ in range(n)]
            self.closers.extend(conn.close for conn in conns)
            return [sqlite_upsert(conn, job.shards) for conn in conns]
        gateway = spec.open_gateway()
        self.closers.append(gateway.close)
        self.stats = gateway.stats
        strategy = "transactional" if series == "transactional" else "auto"
        store = Store(shard_entity_class(job.kind_prefix), gateway)
        counter = CounterShardDS(*TARGET, job.shards, store=store, strategy=strategy)
        if series == "add":
            return [counter.add] * n
        self.totals = ReturnedTotals()
        return [self.totals.wrap(counter.increment)] * n


def prepare(job: Job) -> Part:
    return Part(job)


# --- one run, in the parent ------------------------------------------------------------------


def _setup(series: str, spec: BackendSpec) -> None:
    """Create the storage before the writers open it, so no part's clock
    includes creating tables."""
    if series == "sqlite-upsert":
        sqlite_connect(spec.location).close()
    elif series == "embedded":
        spec.open_gateway().close()


def _stored(series: str, spec: BackendSpec, shards: int, prefix: str) -> dict[str, Any]:
    """What the storage holds after a run, read by a fresh reader."""
    if series == "raw-put":
        return {"stored": None}
    if series == "sqlite-upsert":
        return {"stored": sqlite_total(spec.location)}
    gateway = spec.open_gateway()
    try:
        entity_class = shard_entity_class(prefix)
        ours = CounterShardDS(*TARGET, shards, store=Store(entity_class, gateway))
        total = ours.get_count()  # the PHP layout's default read: the article's target query
        lookup = ours.get_count(method="lookup")
        if series != "php-article":
            return {"stored": total, "lookup_total": lookup}
        client = google_client(spec)
        try:
            php = PhpArticleClient(client, *TARGET, shards, entity_class.kind()).get_count()  # the PHP reader's
        finally:
            client.close()
        return {"stored": php, "ours_read": total, "lookup_total": lookup}
    finally:
        gateway.close()


_cells = itertools.count(1)


def run_cell(pool: WorkerPool, backend: Backend, series: str, layout: Layout, duration: float,
             shards: int, phase: str, repeat: int | None) -> dict[str, Any]:
    """One run of one series in one layout, in a namespace (or SQLite file)
    of its own and with a kind of its own: ``KIND_PFX`` ``"R<n>_"``. The
    Firestore emulator's query time grows with every entity of the queried
    kind in ALL namespaces, deleted ones included (measured: 20 shards in
    each of 2,000 namespaces took a 20-shard target query from about 3 ms
    to about 60 ms; entities of other kinds hardly matter), so with one kind for the whole benchmark each run would query
    more slowly than the one before it."""
    spec = backend.fresh(series)
    prefix = f"R{next(_cells)}_"
    _setup(series, spec)
    jobs = [Job(series, spec, layout.threads, duration, shards, prefix, first_writer=p * layout.threads)
            for p in range(layout.processes)]
    parts: list[PartResult] = pool.run(jobs)
    load = LoadResult()
    stats: dict[str, int] | None = {} if all(p.stats is not None for p in parts) else None
    for part in parts:
        load.merge(part.load)
        if stats is not None and part.stats is not None:
            for name, value in part.stats.items():
                stats[name] = stats.get(name, 0) + value
    row = _row(series, layout, phase, repeat, duration, load, stats, parts, _stored(series, spec, shards, prefix))
    row["kind_prefix"] = prefix
    return row


def _row(series: str, layout: Layout, phase: str, repeat: int | None, window: float, load: LoadResult,
         stats: dict[str, int] | None, parts: list[PartResult], stored: dict[str, Any]) -> dict[str, Any]:
    ok = load.ok
    in_window = sum(p.in_window for p in parts)

    def per(name: str) -> float | None:
        return None if stats is None or not ok else round(stats.get(name, 0) / ok, 3)

    acked = ok + load.warmup
    total = stored["stored"]
    row: dict[str, Any] = {
        "phase": phase,
        "repeat": repeat,
        "series": series,
        "backend": BY_NAME[series].backend,
        "layout": layout.name,
        "processes": layout.processes,
        "threads": layout.threads,
        "window_s": window,
        "in_window": in_window,
        "per_s": round(in_window / window, 2),
        "elapsed_s": round(load.elapsed, 3),
        "ok": ok,
        "per_s_until_last_returned": round(load.rate, 2),
        "failed": load.failed,
        "errors": dict(load.errors),
        "first_error": load.first_error,
        "rpcs_per_inc": per("rpcs"),
        "reads_per_inc": per("entity_reads"),
        "writes_per_inc": per("entity_writes"),
        "retries": None if stats is None else stats.get("counter.retries", 0) + stats.get("retries", 0),
        "p50_ms": ms(load.latency_ms(0.50)),
        "p99_ms": ms(load.latency_ms(0.99)),
        "warmup_calls": load.warmup,
        "acked": acked,
        **stored,
        "lost": None if total is None else acked - total,
        "stats": stats,
    }
    if series in RETURNS_TOTAL:
        row.update(stale_fields(parts))
    return row


def commit_latency(backend: Backend, calls: int = 50) -> float:
    """Milliseconds one thread takes for one autocommitted upsert on a fresh
    file with the engine's settings (median of ``calls``): about one fsync."""
    path = backend.fresh("commit-probe").location
    conn = sqlite_connect(path)
    try:
        upsert = sqlite_upsert(conn, 20)
        for _ in range(5):
            upsert()
        took = []
        for _ in range(calls):
            began = time.perf_counter()
            upsert()
            took.append(time.perf_counter() - began)
        return round(statistics.median(took) * 1000, 3)
    finally:
        conn.close()


# --- the whole benchmark -----------------------------------------------------------------------


def schedule(args: argparse.Namespace) -> list[tuple[str, int | None, Layout, str]]:
    """(phase, repeat, layout, series) in the order they run."""
    layouts = [Layout(1, args.writers), Layout(args.processes, args.writers // args.processes)]
    cells: list[tuple[str, int | None, Layout, str]] = []
    chosen = [s for s in SERIES if s.name in args.series]
    if args.warmup:
        cells += [("warmup", None, layout, s.name) for layout in layouts for s in chosen if s.backend == "firestore"]
    for repeat in range(args.repeats):
        forward = repeat % 2 == 0
        for layout in layouts if forward else layouts[::-1]:
            for series in chosen if forward else chosen[::-1]:
                cells.append(("measure", repeat, layout, series.name))
    return cells


def _measured(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if r["phase"] == "measure"]


def _rate(rows: list[dict[str, Any]], series: str, layout: str, repeat: int) -> float | None:
    for r in rows:
        if r["series"] == series and r["layout"] == layout and r["repeat"] == repeat:
            return float(r["per_s"])
    return None


def summarize(rows: list[dict[str, Any]], layouts: list[str]) -> list[dict[str, Any]]:
    """Per series and layout: the rate over all rounds, the spread of the
    rounds, and the totals of what went wrong."""
    out = []
    for series in SERIES:
        for layout in layouts:
            mine = [r for r in _measured(rows) if r["series"] == series.name and r["layout"] == layout]
            if not mine:
                continue
            rates = [r["per_s"] for r in mine]

            def median_of(key: str) -> float | None:
                values = [r[key] for r in mine if r.get(key) is not None]
                return round(statistics.median(values), 3) if values else None

            def per_increment(name: str) -> float | None:  # over every round
                if any(r["stats"] is None for r in mine) or not sum(r["ok"] for r in mine):
                    return None
                return round(sum(r["stats"].get(name, 0) for r in mine) / sum(r["ok"] for r in mine), 3)

            lost = [r["lost"] for r in mine if r["lost"] is not None]
            out.append({
                "series": series.name, "backend": series.backend, "layout": layout, "rounds": len(mine),
                "per_s": _round(pooled(mine, series.name, layout), 1), "median_per_s": round(statistics.median(rates), 1),
                "min_per_s": min(rates), "max_per_s": max(rates),
                "rpcs_per_inc": per_increment("rpcs"), "reads_per_inc": per_increment("entity_reads"),
                "writes_per_inc": per_increment("entity_writes"), "p50_ms": median_of("p50_ms"),
                "p99_ms": median_of("p99_ms"),
                "retries": sum(r["retries"] or 0 for r in mine) if any(r["retries"] is not None for r in mine) else None,
                "ok": sum(r["ok"] for r in mine), "acked": sum(r["acked"] for r in mine),
                "failed": sum(r["failed"] for r in mine),
                "lost": sum(lost) if lost else None,
                "stale_totals": sum(r.get("stale_totals", 0) for r in mine) if series.name in RETURNS_TOTAL else None,
            })
    return out


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def check_goals(rows: list[dict[str, Any]], layouts: list[str], repeats: int) -> list[dict[str, Any]]:
    measured = _measured(rows)
    out: list[dict[str, Any]] = []
    for goal in GOALS:
        for layout in layouts:
            ratios = []
            for repeat in range(repeats):
                num, den = _rate(measured, goal.numerator, layout, repeat), _rate(measured, goal.denominator, layout, repeat)
                if num is not None and den:
                    ratios.append(num / den)
            num_rate, den_rate = pooled(measured, goal.numerator, layout), pooled(measured, goal.denominator, layout)
            ratio = num_rate / den_rate if ratios and num_rate is not None and den_rate else None
            numerator_rows = [r for r in measured if r["series"] == goal.numerator and r["layout"] == layout]
            lost = sum(r["lost"] or 0 for r in numerator_rows)
            failed = sum(r["failed"] for r in numerator_rows)
            need = goal.need_in(layout)
            met: bool | None = None if ratio is None else ratio >= need  # None: not run (--series)
            notes = []
            if goal.clean and (lost or failed):
                met = False
                notes.append(f"lost {lost}, errors {failed}")
            out.append({
                "goal": goal.number, "what": goal.what, "layout": layout,
                "numerator": goal.numerator, "denominator": goal.denominator,
                "ratio": None if ratio is None else round(ratio, 3), "need": need,
                "met": met, "numerator_per_s": _round(num_rate, 1), "denominator_per_s": _round(den_rate, 1),
                "median_of_rounds": round(statistics.median(ratios), 3) if ratios else None,
                "rounds": [round(x, 3) for x in ratios],
                "min": round(min(ratios), 3) if ratios else None, "max": round(max(ratios), 3) if ratios else None,
                "spread": round((max(ratios) - min(ratios)) / ratio, 3) if ratios and ratio else None,
                "notes": "; ".join(notes),
            })
    out.append(_guarantees(measured))
    return out


def _guarantees(measured: list[dict[str, Any]]) -> dict[str, Any]:
    ours = [r for r in measured if BY_NAME[r["series"]].ours]
    problems: list[str] = []
    for r in ours:
        where = f"{r['series']} {r['layout']} round {r['repeat']}"
        extra = r["stored"] - r["acked"]
        if extra < 0:
            problems.append(f"{where}: {-extra} acknowledged increments not stored")
        if extra > r["failed"]:
            problems.append(f"{where}: {extra} more stored than acknowledged (only {r['failed']} raised)")
        if r.get("lookup_total") is not None and r["lookup_total"] != r["stored"]:
            problems.append(f"{where}: lookup total {r['lookup_total']} != query total {r['stored']}")
        if r.get("stale_totals"):
            problems.append(f"{where}: {r['stale_totals']} stale totals ({r['first_stale']})")
    php = [r for r in measured if r["series"] == "php-article"]
    for r in php:
        if r["ours_read"] != r["stored"]:
            problems.append(f"php-article {r['layout']} round {r['repeat']}: our reader counted {r['ours_read']}, "
                            f"the PHP reader {r['stored']}")
    checked = sum(r.get("totals_checked", 0) for r in ours)
    acked = sum(r["acked"] for r in ours)
    summary = (f"{acked:,} acknowledged increments of ours: stored total = acknowledged in {len(ours)} of {len(ours)} runs"
               if not problems else "; ".join(problems[:5]))
    summary += (f"; {checked:,} returned totals checked, none stale" if checked and not any("stale" in p for p in problems)
                else "")
    summary += f"; our reader matched the PHP reader in {sum(r['ours_read'] == r['stored'] for r in php)} of {len(php)} PHP runs"
    return {"goal": 5, "what": "no guarantee weakened", "layout": "both", "ratio": None, "need": None,
            "met": not problems, "notes": summary, "problems": problems}


def verdicts(goals: list[dict[str, Any]]) -> dict[int, bool | None]:
    """Per goal: met in every layout (True), missed in one (False), or not
    run (None: its series were left out with --series)."""
    out: dict[int, bool | None] = {}
    for g in goals:
        if g["met"] is None:
            out.setdefault(g["goal"], None)
        else:
            out[g["goal"]] = g["met"] and out.get(g["goal"]) is not False
    return out


#: What two runs must share for their goal ratios to be compared.
COMPARABLE = ("duration", "repeats", "warmup", "shards", "writers", "processes", "series")


GOAL_COLUMNS = [("goal", "goal", 0), ("what", "what", 0), ("layout", "procs x threads", 0), ("ratio", "ratio", 2),
                ("need", "need", 1), ("verdict", "", 0), ("range", "rounds min-max", 0), ("spread", "spread", 0)]
SERIES_COLUMNS = [
    ("series", "series", 0), ("backend", "backend", 0), ("layout", "procs x threads", 0), ("per_s", "incr/s", 1),
    ("range", "min-max", 0), ("rpcs_per_inc", "RPC/inc", 2), ("reads_per_inc", "reads/inc", 2),
    ("writes_per_inc", "writes/inc", 2), ("retries", "retries", 0), ("failed", "errors", 0), ("lost", "lost", 0),
    ("stale_totals", "stale", 0), ("p50_ms", "p50 ms", 1), ("p99_ms", "p99 ms", 1),
]
AGREEMENT_COLUMNS = [("goal", "goal", 0), ("layout", "procs x threads", 0), ("previous", "previous", 2),
                     ("this", "this run", 2), ("apart", "apart", 0), ("verdict", "", 0)]


def report(goals: list[dict[str, Any]], series: list[dict[str, Any]], agreed: list[dict[str, Any]],
           compared: str, commit_ms: list[float], args: argparse.Namespace) -> list[str]:
    lines = [f"Goals: Firestore emulator (SQLite for goal 4), {args.shards} shards, {args.writers} writers; "
             f"{args.repeats} alternating rounds x {fmt(args.duration)} s per series and layout "
             f"(after {fmt(args.warmup)} s of warm-up per Firestore series and layout); ratio = rate over all "
             "rounds / rate over all rounds; min-max = the ratios of single rounds", ""]
    shown = []
    for g in goals:
        if g["goal"] == 5:
            continue
        shown.append({**g, "verdict": verdict(g["met"]),
                      "range": f"{g['min']:.2f}-{g['max']:.2f}" if g["min"] is not None else "n/a",
                      "spread": f"{g['spread']:.0%}" if g["spread"] is not None else "n/a",
                      "what": g["what"] + (f" ({g['notes']})" if g["notes"] else "")})
    lines.append(table(shown, GOAL_COLUMNS))
    five = goals[-1]
    if commit_ms:
        lines += ["", f"Goal 4 depends on the disk: one autocommitted upsert by one thread (a commit and its fsync, "
                  f"in {tempfile.gettempdir()}) took {statistics.median(commit_ms):.2f} ms "
                  f"(median of the rounds; {min(commit_ms):.2f}-{max(commit_ms):.2f}); the slower the fsync, "
                  "the closer the ratio comes to 1, since both sides wait for it"]
    lines += ["", f"Goal 5, no guarantee weakened: {verdict(five['met'])}: {five['notes']}"]
    by_goal = verdicts(goals)
    met = [n for n, ok in by_goal.items() if ok]
    missed = [str(n) for n, ok in by_goal.items() if ok is False]
    unrun = [str(n) for n, ok in by_goal.items() if ok is None]
    lines += ["", f"Goals met: {len(met)} of {len(by_goal)}" + (f"; missed: {', '.join(missed)}" if missed else "")
              + (f"; not run: {', '.join(unrun)}" if unrun else "")]
    lines += ["", f"Reproducibility: {compared}"]
    if agreed:
        rows = [{**a, "apart": f"{a['apart']:.0%}", "verdict": "agree" if a["agree"] else "DISAGREE"} for a in agreed]
        lines += [table(rows, AGREEMENT_COLUMNS),
                  f"every goal ratio within {AGREEMENT:.0%} of the previous run: "
                  f"{'yes' if all(a['agree'] for a in agreed) else 'NO'} "
                  f"(largest gap {max(a['apart'] for a in agreed):.0%})"]
    lines += ["", "Series (rate and per-increment figures over all rounds, min-max of single rounds, "
              "latencies the median of the rounds'; errors, lost and stale totals over rounds; "
              "lost = acknowledged - stored; RPCs counted by gateway.stats, Google's client's alike):"]
    rows = [{**s, "range": f"{s['min_per_s']:,.0f}-{s['max_per_s']:,.0f}"} for s in series]
    lines.append(table(rows, SERIES_COLUMNS))
    php_lost = [s for s in series if s["series"] == "php-article"]
    if php_lost:
        lines += ["", "The PHP article's algorithm lost " + ", ".join(
            f"{s['lost']:,} of {s['acked']:,} acknowledged increments ({s['layout']})" for s in php_lost) + " (its non-transactional read-modify-write)."]
    return lines


def plot(goals: list[dict[str, Any]], series: list[dict[str, Any]], args: argparse.Namespace, path: Path) -> str:
    made = new_figure(12.5, 4.8)
    if isinstance(made, str):
        return made
    figure, save = made
    left, right = figure.subplots(1, 2, width_ratios=[1.15, 1])
    layouts = sorted({g["layout"] for g in goals if g["goal"] != 5}, key=lambda name: int(name.split("x")[0]))
    ratio_goals = [g for g in GOALS]
    width = 0.8 / len(layouts)
    colours = ("tab:blue", "tab:orange")
    for j, layout in enumerate(layouts):
        xs, heights, low, high, hatch = [], [], [], [], []
        for i, goal in enumerate(ratio_goals):
            [g] = [x for x in goals if x["goal"] == goal.number and x["layout"] == layout]
            if g["ratio"] is None:
                continue
            xs.append(i + (j - (len(layouts) - 1) / 2) * width)
            heights.append(g["ratio"])
            # the pooled ratio may lie outside the single rounds' range: no negative whisker
            low.append(max(0.0, g["ratio"] - g["min"]))
            high.append(max(0.0, g["max"] - g["ratio"]))
            hatch.append(g["met"] is False)
        processes, threads = layout.split("x")
        bars = left.bar(xs, heights, width * 0.95, yerr=[low, high], capsize=3, color=colours[j % 2],
                        label=f"{processes} process{'es' if processes != '1' else ''} x {threads} threads")
        for bar, missed, value, top in zip(bars, hatch, heights, high):
            if missed:
                bar.set_hatch("//")
                bar.set_edgecolor("black")
            left.annotate(f"{value:.2f}", (bar.get_x() + bar.get_width() / 2, value + top), ha="center",
                          va="bottom", fontsize="small", xytext=(0, 2), textcoords="offset points")
    for i, goal in enumerate(ratio_goals):
        for j, layout in enumerate(layouts):  # each layout's bar has its own threshold
            x = i + (j - (len(layouts) - 1) / 2) * width
            left.hlines(goal.need_in(layout), x - width / 2, x + width / 2, colors="red", linestyles="--",
                        label="threshold" if i == 0 and j == 0 else None)

    def needs(goal: Goal) -> str:
        return " / ".join(f"{goal.need_in(layout):g}" for layout in layouts)

    left.set_xticks(range(len(ratio_goals)),
                    [f"{g.number}. {g.numerator}\n/ {g.denominator}\n(need {needs(g)})" for g in ratio_goals],
                    fontsize="small")
    left.set_ylabel("ratio over all rounds\n(whiskers: single rounds, min-max)")
    left.grid(axis="y", alpha=0.3)
    left.legend(fontsize="small", loc="upper right")
    by_goal = verdicts(goals)
    met = sum(1 for ok in by_goal.values() if ok)
    missed_where = [f"{g['goal']} ({g['layout']})" for g in goals if g["met"] is False]
    # Two lines: on one, a long list of missed goals ran off the figure's left edge.
    left.set_title(f"{met} of {len(by_goal)} goals met (5, the guarantees: {verdict(by_goal.get(5))})"
                   + (f"\nmissed, hatched: {', '.join(missed_where)}" if missed_where else ""), fontsize="medium")
    names = [s.name for s in SERIES]
    for j, layout in enumerate(layouts):
        rows = {s["series"]: s for s in series if s["layout"] == layout}
        ys = [i + (j - (len(layouts) - 1) / 2) * width for i in range(len(names))]
        values = [rows[n]["per_s"] if n in rows else 0 for n in names]
        bars = right.barh(ys, values, width * 0.95, color=colours[j % 2], label=layout)
        for bar, value in zip(bars, values):
            if value:
                right.annotate(f"{value:,.0f}", (value, bar.get_y() + bar.get_height() / 2), va="center",
                               fontsize="x-small", xytext=(2, 0), textcoords="offset points")
    right.set_yticks(range(len(names)), [f"{s.name} ({'SQLite' if s.backend == 'sqlite' else 'Firestore'})"
                                         for s in SERIES], fontsize="small")
    right.invert_yaxis()
    right.set_xscale("log")
    biggest = max((s["per_s"] or 0 for s in series), default=0)
    if biggest:
        right.set_xlim(right=biggest * 4)
    right.set_xlabel("increments (puts, upserts) per second, over all rounds")
    right.grid(axis="x", alpha=0.3)
    right.set_title("what the ratios are made of", fontsize="medium")
    figure.suptitle(f"Sharded counter goals, measured side by side: {args.shards} shards, {args.writers} writers "
                    f"in 1 process and in {args.processes} processes; {args.repeats} alternating rounds x "
                    f"{fmt(args.duration)} s", fontsize="medium")
    save(path)
    return f"plot: {relative(path)}"


QUICK = {"duration": 4.0, "repeats": 4, "warmup": 2.0}
FULL = {"duration": 5.0, "repeats": 12, "warmup": 5.0}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK['repeats']} rounds x {QUICK['duration']:g} s, {QUICK['warmup']:g} s warm-up "
                             f"(under 5 minutes); the default is {FULL['repeats']} x {FULL['duration']:g} s, "
                             f"{FULL['warmup']:g} s warm-up")
    parser.add_argument("--duration", type=float, help="seconds per series, layout and round")
    parser.add_argument("--repeats", type=int, help="alternating rounds (each series' rate is pooled over them)")
    parser.add_argument("--warmup", type=float, help="seconds of unreported warm-up per Firestore series and layout")
    parser.add_argument("--shards", type=int, default=20, help="shards of every counter (default 20)")
    parser.add_argument("--writers", type=int, default=16, help="writer threads in all (default 16)")
    parser.add_argument("--processes", type=int, default=4, help="processes of the second layout (default 4)")
    parser.add_argument("--series", help=f"comma-separated, from {','.join(BY_NAME)} (default: all; the "
                                         "emulator starts only for Firestore series)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    parser.add_argument("--publish", action="store_true", help="also write docs/benchmarks/contention.{json,txt,png}")
    parser.add_argument("--compare", type=Path, help="a previous contention.json to compare the goal ratios with "
                                                     "(default: the one in the results folder, if same settings)")
    parser.add_argument("--no-compare", action="store_true", help="compare with no previous run")
    parser.add_argument("--markdown", type=Path, metavar="JSON",
                        help="print docs/performance.md's tables from a recorded run (docs/benchmarks/contention.json) and exit")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if not args.duration > 0 or args.repeats < 1 or args.warmup < 0 or args.shards < 1:
        parser.error("need duration > 0, repeats >= 1, warmup >= 0, shards >= 1")
    if args.writers < 1 or args.processes < 1 or args.writers % args.processes:
        parser.error("need writers >= 1 split evenly over processes >= 1")
    args.series = parse_choices(args.series or ",".join(BY_NAME), list(BY_NAME), "series")
    if args.compare is not None and args.no_compare:
        parser.error("give --compare or --no-compare, not both")
    return args


LABELS = {
    1: "1. `CounterShardDS(...).increment()`, defaults / the PHP article's algorithm",
    2: "2. `add()`, defaults / raw puts (`Client.put`, 1 entity of 20 per commit)",
    3: '3. `strategy="transactional"` `increment()` / the PHP article\'s algorithm',
    4: "4. embedded `increment()` / raw sqlite3 upserts",
}


def markdown(payload: dict[str, Any]) -> str:
    """docs/performance.md's tables, from a recorded run."""
    goals = payload["goals"]
    layouts = sorted({g["layout"] for g in goals if g["goal"] != 5}, key=lambda name: int(name.split("x")[0]))

    def heading(layout: str) -> str:
        processes, threads = layout.split("x")
        return f"{processes} process{'es' if processes != '1' else ''} × {threads} threads"

    out = [f"| goal | {' | '.join(heading(layout) for layout in layouts)} | need | |",
           "| --- |" + " --- |" * (len(layouts) + 2)]
    by_goal = verdicts(goals)
    for number, label in LABELS.items():
        cells = []
        for layout in layouts:
            [g] = [x for x in goals if x["goal"] == number and x["layout"] == layout]
            cell = "n/a" if g["ratio"] is None else f"{g['ratio']:.2f} ({g['min']:.2f}–{g['max']:.2f})"
            cells.append(cell if g["met"] is not False else f"**{cell}**")
        need = " / ".join(f"{g['need']:.1f}" for layout in layouts for g in goals if g["goal"] == number and g["layout"] == layout)
        out.append(f"| {label} | {' | '.join(cells)} | ≥ {need} | {verdict(by_goal[number])} |")
    five = goals[-1]
    ours = [r for r in payload["runs"] if r["phase"] == "measure" and BY_NAME[r["series"]].ours]
    cells = []
    for layout in layouts:
        runs = [r for r in ours if r["layout"] == layout]
        lost = sum(r["lost"] or 0 for r in runs)
        stale = sum(r.get("stale_totals", 0) for r in runs)
        checked = sum(r.get("totals_checked", 0) for r in runs)
        cells.append(f"{lost:,} lost, {stale:,} stale of {checked:,} totals")
    out.append(f"| 5. no guarantee weakened (our series) | {' | '.join(cells)} | 0 | {verdict(five['met'])} |")
    out += ["", f"Goal 5: {five['notes']}."]
    agreed = payload.get("agreement", {}).get("ratios") or []
    if agreed:
        gap = max(a["apart"] for a in agreed)
        out += ["", f"Every goal ratio {'was' if all(a['agree'] for a in agreed) else 'was NOT'} within "
                f"{payload['agreement']['limit']:.0%} of the run before it (largest gap {gap:.0%}): "
                + ", ".join(f"{a['goal']} ({a['layout']}) {a['previous']:.2f} then {a['this']:.2f}" for a in agreed)
                + "."]
    out += ["", f"| series | {' | '.join(heading(layout) + ', /s' for layout in layouts)} | RPCs per call "
            f"({' / '.join(layouts)}) | lost |",
            "| --- |" + " --- |" * (len(layouts) + 2)]
    for series in SERIES:
        mine = {s["layout"]: s for s in payload["series"] if s["series"] == series.name}
        if not mine:
            continue
        rates = [f"{mine[layout]['per_s']:,.0f}" if layout in mine else "n/a" for layout in layouts]
        rpcs = [mine[layout]["rpcs_per_inc"] for layout in layouts if layout in mine]
        lost = [s for s in mine.values() if s["lost"] is not None]
        lost_text = ("n/a" if not lost else ", ".join(f"{s['lost']:,} of {s['acked']:,}" for s in lost)
                     if any(s["lost"] for s in lost) else "0")
        rpc_text = "n/a" if None in rpcs else " / ".join(f"{r:.2f}" for r in rpcs)
        out.append(f"| `{series.name}`: {series.label} | {' | '.join(rates)} | {rpc_text} | {lost_text} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    began = time.monotonic()
    previous, compared = load_previous(args, args.out / "contention.json", "contention-goals", COMPARABLE)
    cells = schedule(args)
    layouts = sorted({layout.name for _, _, layout, _ in cells}, key=lambda name: int(name.split("x")[0]))
    rows: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    kinds = sorted({BY_NAME[name].backend for name in args.series})
    with open_backends(kinds) as backends, WorkerPool(args.processes, prepare) as pool:
        bar = progress(cells, len(cells), "contention")
        for phase, repeat, layout, series in bar:
            if hasattr(bar, "set_postfix_str"):
                bar.set_postfix_str(f"{phase} {'' if repeat is None else repeat} {layout.name} {series}")
            duration = args.warmup if phase == "warmup" else args.duration
            if phase == "measure" and "sqlite" in backends and not any(p["repeat"] == repeat for p in probes):
                probes.append({"repeat": repeat, "commit_ms": commit_latency(backends["sqlite"])})
            rows.append(run_cell(pool, backends[BY_NAME[series].backend], series, layout, duration, args.shards,
                                 phase, repeat))
    goals = check_goals(rows, layouts, args.repeats)
    series = summarize(rows, layouts)
    agreed = agreement(goals, None if previous is None else previous.get("goals", []), ("goal", "layout"))
    commit_ms = [p["commit_ms"] for p in probes]
    lines = report(goals, series, agreed, compared, commit_ms, args)
    wall = time.monotonic() - began
    lines += ["", f"command: {command_line()}", f"took {wall:.0f} s"]
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": "contention-goals",
        "command": command_line(),
        "settings": {k: (relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": environment(),
        "wall_seconds": round(wall, 1),
        "goals": goals,
        "agreement": {"with": compared, "limit": AGREEMENT, "ratios": agreed,
                      "previous": None if previous is None else {
                          "command": previous.get("command"), "when": previous.get("environment", {}).get("when"),
                          "git_commit": previous.get("environment", {}).get("git_commit")}},
        "series": series,
        "commit_probes": probes,
        "runs": rows,
    }
    targets = [args.out] + ([PUBLISHED] if args.publish else [])
    for folder in targets:
        print(plot(goals, series, args, folder / "contention.png"))
        print(f"json: {relative(write_json(folder / 'contention.json', payload))}")
    if args.publish:
        (PUBLISHED / "contention.txt").write_text("\n".join(lines) + "\n")
        print(f"text: {relative(PUBLISHED / 'contention.txt')}")
    return 0 if goals[-1]["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
