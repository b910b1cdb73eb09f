"""The lone call: time and library CPU per call, ours against raw, one thread.

    python benchmarks/lone_call.py [--quick] [--series file,memory,emulator] [--calls N]
        [--emulator-calls N] [--rounds N] [--warmup N] [--shards 20] [--out DIR] [--publish]
        [--compare FILE | --no-compare] [--markdown JSON]

One thread, warm, each call of ours beside the least raw code that does the
same work on the same storage:

  storage    ours (CounterShardDS(...), 20 shards)    raw
  file       add(1), increment(), get_count()         sqlite3 upsert "count = count + 1" (WAL,
             on a SQLite file in the temporary        synchronous=FULL, autocommit: _common.py's),
             folder (sqlite:///...)                   a sqlite3 SELECT of the 20 rows
  memory     the same, on memory://                   the same upsert and SELECT on :memory:, and a
                                                      Python dict increment (the floor)
  emulator   the same, on the Firestore emulator      google.cloud.datastore Client.put of one
             in Datastore mode (started here)         entity; Client.get_multi of the 20 entities

Every series first makes ``--warmup`` calls (the read counter's shards, and
the raw rows, are all written before that), then ``--rounds`` rounds
(at least 5) of ``--calls`` calls each (``--emulator-calls`` on the
emulator); alternate rounds run the series in reverse order, so drift hits
ours and raw alike. Per round and series: wall time (perf_counter), user
and system CPU of the process (getrusage: the client library's threads
included), RPCs per call (``gateway.stats``; Google's client counted the
same way), and, after the rounds, SQL statements per call (SQLite's trace
callback on every connection the process opened). Per series: wall time
per call over all rounds (total over calls), the median and p90 of the
rounds' means, user and system CPU per call. Per ratio: ours / raw wall
time over all rounds, the single rounds' ratios (min-max), and library CPU
= our CPU per call - the raw baseline's CPU per call.

Goals (issue 38), as ratios of wall time per call:
  file    add() / raw sqlite3 upsert              <= 1.5
  memory  add() / raw in-memory sqlite3 upsert    <= 20

Nothing lost: after the rounds, what each storage holds is read back
(a fresh gateway, or connection, where the storage outlives it) and must
equal the calls acknowledged: the total of each counter by query and by
lookup, the raw tables' sums, the raw put's last value; every total
``increment()`` returned must be one more than the one before, every
``get_count()`` the read counter's total (checked inside the timed calls:
a comparison, well under a microsecond). The exit status is 1 otherwise.

``--compare`` (by default the previous ``lone_call.json`` in the results
folder, when run with the same settings) prints how far each ratio moved.
Results: ``benchmarks/results/lone_call.json`` and ``.txt``; ``--publish``
also writes ``docs/benchmarks/lone_call.json`` and ``.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import random
import resource
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import attrs

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    AGREEMENT,
    RAW_KIND,
    REPO,
    RESULTS,
    SQLITE_TABLE,
    agreement,
    command_line,
    environment,
    google_client,
    load_previous,
    open_backends,
    parse_choices,
    raw_put,
    relative,
    script_parser,
    sqlite_connect,
    sqlite_upsert,
    table,
    verdict,
    write_json,
)

from gds_counter import CounterShardDS, open_gateway  # noqa: E402
from gds_counter.gateway.base import Gateway  # noqa: E402
from gds_counter.gateway.stats import Stats  # noqa: E402

PUBLISHED = REPO / "docs" / "benchmarks"
STORAGES = ("file", "memory", "emulator")
#: The counters: one each for add() and increment(), so each total is
#: checked alone, and one whose shards are all written for get_count().
TARGETS = {"add": ("Lone", 1), "increment": ("Lone", 2), "get_count": ("Lone", 3)}
OURS = tuple(TARGETS)


@attrs.frozen
class Ratio:
    storage: str
    ours: str
    raw: str
    #: The goal: at most this many times the raw call's time (None: shown, no goal).
    need: float | None = None


RATIOS = (
    Ratio("file", "add", "upsert", 1.5),
    Ratio("file", "increment", "upsert"),
    Ratio("file", "get_count", "select"),
    Ratio("memory", "add", "upsert", 20.0),
    Ratio("memory", "add", "dict"),
    Ratio("memory", "increment", "upsert"),
    Ratio("memory", "get_count", "select"),
    Ratio("emulator", "add", "put"),
    Ratio("emulator", "increment", "put"),
    Ratio("emulator", "get_count", "lookup"),
)
LABELS = {
    "add": "CounterShardDS(...).add(1)", "increment": "CounterShardDS(...).increment()",
    "get_count": "CounterShardDS(...).get_count()", "upsert": "raw sqlite3 upsert",
    "select": "raw sqlite3 SELECT of the rows", "dict": "raw Python dict increment",
    "put": "raw Client.put of one entity", "lookup": "raw Client.get_multi of the entities",
}


# --- SQL statements, counted -----------------------------------------------------------------


class StatementCounter:
    """Keeps every sqlite3 connection the process opens while ``installed``
    (ours and raw alike), so that ``per_call`` can count the statements a
    call runs with SQLite's trace callback, set only while it counts."""

    def __init__(self) -> None:
        self.connections: list[sqlite3.Connection] = []
        self.statements = 0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        original = sqlite3.connect

        def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            conn = original(*args, **kwargs)
            self.connections.append(conn)
            return conn

        sqlite3.connect = connect  # type: ignore[assignment]
        try:
            yield
        finally:
            sqlite3.connect = original

    def _seen(self, _sql: str) -> None:
        self.statements += 1

    def per_call(self, op: Callable[[], Any], calls: int) -> float:
        traced = []
        for conn in self.connections:
            with contextlib.suppress(sqlite3.ProgrammingError):  # closed
                conn.set_trace_callback(self._seen)
                traced.append(conn)
        self.statements = 0
        try:
            for _ in range(calls):
                op()
        finally:
            for conn in traced:
                with contextlib.suppress(sqlite3.ProgrammingError):
                    conn.set_trace_callback(None)
        return self.statements / calls


# --- one storage's series ---------------------------------------------------------------------


class Series:
    """One storage's calls, ours and raw, each counted as it is acknowledged;
    ``stored()`` reads back what the storage holds."""

    def __init__(self, storage: str, shards: int, stack: contextlib.ExitStack, where: Any) -> None:
        self.storage = storage
        self.shards = shards
        self.stack = stack
        self.ops: dict[str, Callable[[], Any]] = {}
        self.stats: dict[str, Stats] = {}  # op -> what counts its RPCs
        self.acked: dict[str, int] = {}
        self.wrong: list[str] = []  # totals that were not what they had to be
        self.url = ""
        self.spec: Any = None
        if storage == "emulator":
            self.spec = where.fresh("lone")
            gateway = self._gateway(self.spec.open_gateway())
        else:
            self.url = "memory://" if storage == "memory" else f"sqlite:///{where.fresh('lone').location}"
            gateway = self._gateway(open_gateway(self.url))
        self.gateway = gateway
        self._ours(gateway)
        if storage == "emulator":
            self._raw_emulator()
        else:
            self._raw_sqlite(":memory:" if storage == "memory" else where.fresh("raw").location)

    def _gateway(self, gateway: Gateway) -> Gateway:
        self.stack.callback(gateway.close)
        return gateway

    def _counter(self, op: str, gateway: Gateway) -> CounterShardDS:
        return CounterShardDS(*TARGETS[op], self.shards, gateway=gateway)

    def _ours(self, gateway: Gateway) -> None:
        adder, incrementer, reader = (self._counter(op, gateway) for op in OURS)
        while any(count == 0 for _, count in reader.shards(method="lookup")):
            reader.add(1)
        self.read_total = sum(count for _, count in reader.shards(method="lookup"))
        last = [0]

        def increment() -> None:
            total = incrementer.increment()
            last[0] += 1
            if total != last[0] and len(self.wrong) < 5:
                self.wrong.append(f"{self.storage} increment() returned {total}, expected {last[0]}")
            last[0] = total

        def get_count() -> None:
            total = reader.get_count()
            if total != self.read_total and len(self.wrong) < 5:
                self.wrong.append(f"{self.storage} get_count() returned {total}, expected {self.read_total}")

        self.ops.update({"add": lambda: adder.add(1), "increment": increment, "get_count": get_count})
        self.stats.update(dict.fromkeys(OURS, gateway.stats))

    def _raw_sqlite(self, path: str) -> None:
        conn = sqlite_connect(path)
        self.stack.callback(conn.close)
        self.raw_path = path
        self.raw_conn = conn
        names = [f"Raw_1_{n}" for n in range(1, self.shards + 1)]
        conn.executemany(f"INSERT OR IGNORE INTO {SQLITE_TABLE} (name, count) VALUES (?, 0)", [(n,) for n in names])
        select = f"SELECT name, count FROM {SQLITE_TABLE} WHERE name IN ({', '.join('?' * len(names))})"

        def read() -> int:
            return sum(count for _, count in conn.execute(select, names))

        self.ops.update({"upsert": sqlite_upsert(conn, self.shards), "select": read})
        if self.storage == "memory":
            counts: dict[str, int] = dict.fromkeys(names, 0)
            def bump() -> None:  # the same random row as the upsert's
                name = random.choice(names)
                counts[name] = counts[name] + 1

            self.counts = counts
            self.ops["dict"] = bump

    def _raw_emulator(self) -> None:
        from google.cloud import datastore

        stats = Stats()
        client = google_client(self.spec, stats)
        self.stack.callback(client.close)
        self.client = client
        keys = [client.key(RAW_KIND, f"Raw_1_{n}") for n in range(1, self.shards + 1)]
        entities = []
        for key in keys:
            entity = datastore.Entity(key, exclude_from_indexes=("count",))
            entity.update({"target": "Raw_1", "count": 0})
            entities.append(entity)
        client.put_multi(entities)
        self.put_key = keys[0]  # raw_put's writer 0 writes the first of them

        def lookup() -> int:
            return sum(int(e["count"]) for e in client.get_multi(keys))

        self.ops.update({"put": raw_put(client, 0, self.shards), "lookup": lookup})
        self.stats.update({"put": stats, "lookup": stats})

    def run(self, op: str, calls: int) -> None:
        call = self.ops[op]
        for _ in range(calls):
            call()
        self.acked[op] = self.acked.get(op, 0) + calls

    def stored(self) -> list[dict[str, Any]]:
        """What the storage holds against what was acknowledged."""
        rows = []
        reader = (self._gateway(self.spec.open_gateway()) if self.storage == "emulator"
                  else self.gateway if self.storage == "memory" else self._gateway(open_gateway(self.url)))
        for op in ("add", "increment"):
            counter = self._counter(op, reader)
            rows.append(_exact(self.storage, op, self.acked.get(op, 0), counter.get_count(),
                               counter.get_count(method="lookup")))
        if self.storage == "emulator":
            entity = self.client.get(self.put_key)
            rows.append(_exact(self.storage, "put", self.acked.get("put", 0), int(entity["count"])))
            return rows
        if self.storage == "file":
            conn = sqlite_connect(self.raw_path)
            self.stack.callback(conn.close)
        else:
            conn = self.raw_conn
        total = conn.execute(f"SELECT coalesce(sum(count), 0) FROM {SQLITE_TABLE}").fetchone()[0]
        rows.append(_exact(self.storage, "upsert", self.acked.get("upsert", 0), int(total)))
        if self.storage == "memory":
            rows.append(_exact(self.storage, "dict", self.acked.get("dict", 0), sum(self.counts.values())))
        return rows


def _exact(storage: str, op: str, acked: int, stored: int, lookup: int | None = None) -> dict[str, Any]:
    return {"storage": storage, "op": op, "acked": acked, "stored": stored, "lookup": lookup,
            "exact": stored == acked and lookup in (None, stored)}


# --- timing --------------------------------------------------------------------------------------


def timed(series: Series, op: str, calls: int, repeat: int) -> dict[str, Any]:
    """One round of one series: ``calls`` calls, timed and counted."""
    stats = series.stats.get(op)
    rpcs = None if stats is None else stats["rpcs"]
    gc.collect()
    before, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    series.run(op, calls)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_SELF)
    return {"storage": series.storage, "op": op, "repeat": repeat, "calls": calls, "wall_s": round(wall, 6),
            "user_s": round(after.ru_utime - before.ru_utime, 6),
            "system_s": round(after.ru_stime - before.ru_stime, 6),
            "rpcs": None if stats is None or rpcs is None else stats["rpcs"] - rpcs}


def _us(seconds: float, calls: int) -> float:
    return round(seconds / calls * 1e6, 2)


def summarize(rounds: list[dict[str, Any]], statements: dict[tuple[str, str], float]) -> list[dict[str, Any]]:
    out = []
    for storage, op in dict.fromkeys((r["storage"], r["op"]) for r in rounds):
        mine = [r for r in rounds if r["storage"] == storage and r["op"] == op]
        calls = sum(r["calls"] for r in mine)
        means = sorted(r["wall_s"] / r["calls"] * 1e6 for r in mine)
        p90 = statistics.quantiles(means, n=10, method="inclusive")[8] if len(means) > 1 else means[0]
        user, system = sum(r["user_s"] for r in mine), sum(r["system_s"] for r in mine)
        rpcs = None if any(r["rpcs"] is None for r in mine) else round(sum(r["rpcs"] for r in mine) / calls, 3)
        out.append({"storage": storage, "op": op, "ours": op in OURS, "label": LABELS[op], "rounds": len(mine),
                    "calls": calls, "wall_us": _us(sum(r["wall_s"] for r in mine), calls),
                    "median_us": round(statistics.median(means), 2), "p90_us": round(p90, 2),
                    "user_us": _us(user, calls), "system_us": _us(system, calls), "cpu_us": _us(user + system, calls),
                    "rpcs_per_call": rpcs, "statements_per_call": statements.get((storage, op))})
    return out


def ratios(rounds: list[dict[str, Any]], series: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by = {(s["storage"], s["op"]): s for s in series}
    out = []
    for r in RATIOS:
        ours, raw = by.get((r.storage, r.ours)), by.get((r.storage, r.raw))
        if ours is None or raw is None:
            continue
        per_round = []
        for repeat in sorted({x["repeat"] for x in rounds}):
            [a] = [x for x in rounds if (x["storage"], x["op"], x["repeat"]) == (r.storage, r.ours, repeat)]
            [b] = [x for x in rounds if (x["storage"], x["op"], x["repeat"]) == (r.storage, r.raw, repeat)]
            per_round.append(round((a["wall_s"] / a["calls"]) / (b["wall_s"] / b["calls"]), 3))
        ratio = round(ours["wall_us"] / raw["wall_us"], 3)
        out.append({"storage": r.storage, "ours": r.ours, "raw": r.raw, "ratio": ratio, "need": r.need,
                    "met": None if r.need is None else ratio <= r.need, "rounds": per_round,
                    "min": min(per_round), "max": max(per_round), "ours_us": ours["wall_us"], "raw_us": raw["wall_us"],
                    "library_cpu_us": round(ours["cpu_us"] - raw["cpu_us"], 2)})
    return out


# --- the whole benchmark ---------------------------------------------------------------------------


def measure(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[tuple[str, str], float], list[dict[str, Any]], list[str]]:
    counter = StatementCounter()
    rounds: list[dict[str, Any]] = []
    statements: dict[tuple[str, str], float] = {}
    kinds = (["sqlite"] if "file" in args.series else []) + (["firestore"] if "emulator" in args.series else [])
    with counter.installed(), open_backends(kinds) as backends, contextlib.ExitStack() as stack:
        where = {"file": backends.get("sqlite"), "memory": None, "emulator": backends.get("firestore")}
        chosen = [Series(storage, args.shards, stack, where[storage]) for storage in args.series]
        calls = {s.storage: args.emulator_calls if s.storage == "emulator" else args.calls for s in chosen}
        for s in chosen:
            for op in s.ops:
                s.run(op, args.warmup)
        for repeat in range(args.rounds):
            forward = repeat % 2 == 0
            for s in chosen if forward else chosen[::-1]:
                ops = list(s.ops)
                for op in ops if forward else ops[::-1]:
                    rounds.append(timed(s, op, calls[s.storage], repeat))
        for s in chosen:
            if s.storage != "emulator":
                for op in s.ops:
                    if op != "dict":
                        statements[(s.storage, op)] = round(
                            counter.per_call(functools.partial(s.run, op, 1), min(100, calls[s.storage])), 2)
        exact = [row for s in chosen for row in s.stored()]
        wrong = [w for s in chosen for w in s.wrong]
    return rounds, statements, exact, wrong


RATIO_COLUMNS = [("storage", "storage", 0), ("what", "ours / raw", 0), ("ours_us", "ours us", 1),
                 ("raw_us", "raw us", 1), ("ratio", "ratio", 2), ("range", "rounds min-max", 0),
                 ("library_cpu_us", "library CPU us", 1), ("goal", "goal", 0), ("verdict", "", 0)]
SERIES_COLUMNS = [("storage", "storage", 0), ("label", "call", 0), ("wall_us", "us/call", 1),
                  ("median_us", "median", 1), ("p90_us", "p90", 1), ("user_us", "user us", 1),
                  ("system_us", "system us", 1), ("statements_per_call", "SQL/call", 2),
                  ("rpcs_per_call", "RPC/call", 2)]
AGREEMENT_COLUMNS = [("storage", "storage", 0), ("what", "ours / raw", 0), ("previous", "previous", 2),
                     ("this", "this run", 2), ("apart", "apart", 0), ("verdict", "", 0)]


def report(payload: dict[str, Any], compared: str) -> list[str]:
    s = payload["settings"]
    lines = [f"Lone call, one thread, warm ({s['warmup']} calls each first): {s['rounds']} alternating rounds x "
             f"{s['calls']} calls ({s['emulator_calls']} on the emulator), {s['shards']} shards; us = wall time "
             "per call over all rounds; median and p90 of the rounds' means; CPU of the process (getrusage); "
             "library CPU = ours - raw, CPU per call", ""]
    shown = [{**r, "what": f"{r['ours']} / {r['raw']}", "range": f"{r['min']:.2f}-{r['max']:.2f}",
              "goal": "-" if r["need"] is None else f"<= {r['need']:g}",
              "verdict": "" if r["need"] is None else verdict(r["met"])} for r in payload["ratios"]]
    lines += [table(shown, RATIO_COLUMNS), "", table(payload["series"], SERIES_COLUMNS), ""]
    goals = [r for r in payload["ratios"] if r["need"] is not None]
    lines.append(f"Goals met: {sum(bool(r['met']) for r in goals)} of {len(goals)} run"
                 + ("" if goals else " (their series were left out with --series)")
                 + "".join(f"; {r['storage']} {r['ours']} / {r['raw']} {r['ratio']:.2f} (need <= {r['need']:g}): "
                           f"{verdict(r['met'])}" for r in goals))
    exact = payload["exact"]
    bad = [e for e in exact if not e["exact"]] + payload["wrong_totals"]
    lines.append(f"Exact: {'yes' if not bad else 'NO'}: stored = acknowledged in {sum(e['exact'] for e in exact)} "
                 f"of {len(exact)} series ({sum(e['acked'] for e in exact):,} calls)"
                 + ("" if not payload["wrong_totals"] else "; " + "; ".join(payload["wrong_totals"])))
    lines += ["", f"Reproducibility: {compared}"]
    agreed = payload["agreement"]["ratios"]
    if agreed:
        rows = [{**a, "what": f"{a['ours']} / {a['raw']}", "apart": f"{a['apart']:.0%}",
                 "verdict": "agree" if a["agree"] else "DISAGREE"} for a in agreed]
        lines.append(table(rows, AGREEMENT_COLUMNS))
    return lines


def markdown(payload: dict[str, Any]) -> str:
    """docs/performance.md's tables, from a recorded run."""
    out = ["| storage | ours / raw | µs per call, ours / raw | ratio (rounds) | library CPU, µs per call | goal | |",
           "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in payload["ratios"]:
        goal = "" if r["need"] is None else f"≤ {r['need']:g}"
        out.append(f"| {r['storage']} | `{r['ours']}()` / {LABELS[r['raw']]} | {r['ours_us']:,.1f} / {r['raw_us']:,.1f} | "
                   f"{r['ratio']:.2f} ({r['min']:.2f}–{r['max']:.2f}) | {r['library_cpu_us']:,.1f} | {goal} | "
                   f"{'' if r['need'] is None else verdict(r['met'])} |")
    out += ["", "| storage | call | µs per call (median, p90 of rounds) | user / system CPU µs | SQL statements "
            "/ RPCs per call |", "| --- | --- | --- | --- | --- |"]
    for s in payload["series"]:
        counts = " / ".join("n/a" if v is None else f"{v:g}" for v in (s["statements_per_call"], s["rpcs_per_call"]))
        out.append(f"| {s['storage']} | {s['label']} | {s['wall_us']:,.1f} ({s['median_us']:,.1f}, {s['p90_us']:,.1f}) | "
                   f"{s['user_us']:,.1f} / {s['system_us']:,.1f} | {counts} |")
    agreed = payload["agreement"]["ratios"]
    if agreed:
        out += ["", f"Every ratio {'was' if all(a['agree'] for a in agreed) else 'was NOT'} within "
                f"{payload['agreement']['limit']:.0%} of the run before it (largest gap "
                f"{max(a['apart'] for a in agreed):.0%})."]
    return "\n".join(out)


QUICK = {"calls": 300, "emulator_calls": 100, "rounds": 5, "warmup": 100}
FULL = {"calls": 2000, "emulator_calls": 400, "rounds": 7, "warmup": 500}
#: What two runs must share for their ratios to be compared.
COMPARABLE = ("calls", "emulator_calls", "rounds", "warmup", "shards", "series")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = script_parser(__doc__)
    parser.add_argument("--quick", action="store_true", help=f"the small run: {QUICK} (default {FULL})")
    parser.add_argument("--series", help=f"storages, comma-separated, from {','.join(STORAGES)} (default: all; "
                                         "the emulator starts only for its series)")
    parser.add_argument("--calls", type=int, help="calls per series and round on SQLite and memory")
    parser.add_argument("--emulator-calls", type=int, help="calls per series and round on the emulator")
    parser.add_argument("--rounds", type=int, help="alternating rounds, at least 5")
    parser.add_argument("--warmup", type=int, help="calls of each series before the rounds, not reported")
    parser.add_argument("--shards", type=int, default=20, help="shards of every counter, rows of the raw tables")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    parser.add_argument("--publish", action="store_true", help="also write docs/benchmarks/lone_call.{json,txt}")
    parser.add_argument("--compare", type=Path, help="a previous lone_call.json to compare the ratios with")
    parser.add_argument("--no-compare", action="store_true", help="compare with no previous run")
    parser.add_argument("--markdown", type=Path, metavar="JSON", help="print docs tables from a recorded run and exit")
    args = parser.parse_args(argv)
    for name, value in (QUICK if args.quick else FULL).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.calls < 1 or args.emulator_calls < 1 or args.rounds < 5 or args.warmup < 0 or args.shards < 1:
        parser.error("need calls >= 1, emulator calls >= 1, rounds >= 5, warmup >= 0, shards >= 1")
    if args.compare is not None and args.no_compare:
        parser.error("give --compare or --no-compare, not both")
    args.series = parse_choices(args.series or ",".join(STORAGES), STORAGES, "series")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.markdown is not None:
        print(markdown(json.loads(args.markdown.read_text())))
        return 0
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Measure, report, write the record; 1 when anything was not stored exactly."""
    began = time.monotonic()
    previous, compared = load_previous(args, args.out / "lone_call.json", "lone-call", COMPARABLE)
    rounds, statements, exact, wrong = measure(args)
    series = summarize(rounds, statements)
    found = ratios(rounds, series)
    agreed = agreement(found, None if previous is None else previous.get("ratios", []), ("storage", "ours", "raw"))
    payload = {
        "benchmark": "lone-call",
        "command": command_line(),
        "settings": {k: (relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "environment": {**environment(), "tmpdir": tempfile.gettempdir()},
        "wall_seconds": 0.0,
        "ratios": found,
        "series": series,
        "exact": exact,
        "wrong_totals": wrong,
        "agreement": {"with": compared, "limit": AGREEMENT, "ratios": agreed},
        "rounds": rounds,
    }
    payload["wall_seconds"] = round(time.monotonic() - began, 1)
    lines = report(payload, compared) + ["", f"command: {payload['command']}", f"took {payload['wall_seconds']:.0f} s"]
    print("\n".join(lines))
    for folder in [args.out] + ([PUBLISHED] if args.publish else []):
        print(f"json: {relative(write_json(folder / 'lone_call.json', payload))}")
        (folder / "lone_call.txt").write_text("\n".join(lines) + "\n")
        print(f"text: {relative(folder / 'lone_call.txt')}")
    return 0 if all(e["exact"] for e in exact) and not wrong else 1


if __name__ == "__main__":
    sys.exit(main())
