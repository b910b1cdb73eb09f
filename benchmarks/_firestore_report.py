"""The record of ``firestore_counters.py`` as text: the report it prints
(and ``--publish`` commits as docs/benchmarks/firestore_counters.txt) and
docs/performance.md's tables (``--markdown``), both from the payload
alone, so a recorded run prints the same tables as it did when it ran."""

from __future__ import annotations

from typing import Any

from _common import fmt, table, verdict

GOAL_COLUMNS = [("goal", "goal", 0), ("what", "what", 0), ("layout", "procs x threads", 0), ("ratio", "ratio", 2),
                ("need", "need", 1), ("verdict", "", 0), ("range", "rounds min-max", 0)]
SERIES_COLUMNS = [
    ("series", "series", 0), ("layout", "procs x threads", 0), ("per_s", "calls/s", 1), ("range", "min-max", 0),
    ("rpcs_per_call", "RPC/call", 2), ("reads_per_call", "reads/call", 2), ("writes_per_call", "writes/call", 2),
    ("failed", "errors", 0), ("lost", "lost", 0), ("stale_totals", "stale", 0), ("p50_ms", "p50 ms", 1),
    ("p99_ms", "p99 ms", 1),
]
ROLLUP_COLUMNS = [("read", "read", 0), ("rpcs", "RPCs", 0), ("reads", "doc reads", 0), ("writes", "doc writes", 0),
                  ("seconds", "seconds", 2), ("total", "total", 0)]
ROLLUP_LABELS = {
    "exact": "get_count(), exact: the first read",
    "first_max_age": "get_count(max_age), no rollup yet: exact + rollup write",
    "fresh_rollup": "get_count(max_age), fresh rollup",
    "page_get_count": "the page's get_count()",
}
AGREEMENT_COLUMNS = [("goal", "goal", 0), ("layout", "procs x threads", 0), ("previous", "previous", 2),
                     ("this", "this run", 2), ("apart", "apart", 0), ("verdict", "", 0)]


def _n(count: int, what: str) -> str:
    return f"{count:,} {what}{'' if count == 1 else 's'}"


def report(payload: dict[str, Any]) -> list[str]:
    s = payload["settings"]
    lines = [f"Firestore's distributed counters (issue 39, goal 8): the Firestore emulator in native mode, "
             f"{s['shards']} shards, {s['writers']} writers; {s['repeats']} alternating rounds x {fmt(s['duration'])} s "
             f"per series and layout (after {fmt(s['warmup'])} s of warm-up each); ratio = rate over all rounds / "
             "rate over all rounds; min-max = the ratios of single rounds", ""]
    shown = [{**g, "verdict": verdict(g["met"]),
              "range": "n/a" if g["min"] is None else f"{g['min']:.2f}-{g['max']:.2f}"} for g in payload["goals"]]
    lines.append(table(shown, GOAL_COLUMNS))
    rollup = payload["rollup"]
    if rollup is not None:
        fresh, exact = rollup["reads"]["fresh_rollup"], rollup["reads"]["exact"]
        lines += ["", f"Goal 3, a read with max_age={fmt(rollup['max_age'], 0)} of a counter with {rollup['shards']:,} "
                  f"shards costs 1 RPC: {verdict(rollup['met'])}: the fresh-rollup read took {_n(fresh['rpcs'], 'RPC')} "
                  f"and {_n(fresh['reads'], 'document read')}; the first exact read {_n(exact['rpcs'], 'RPC')} and "
                  f"{_n(exact['reads'], 'document read')}"
                  + (f"; WRONG totals: {', '.join(rollup['wrong_totals'])}" if rollup["wrong_totals"] else
                     f" (every read returned {rollup['expected']:,})")]
        lines.append(table([{**r, "read": ROLLUP_LABELS[name]} for name, r in rollup["reads"].items()], ROLLUP_COLUMNS))
    exact = payload["exact"]
    lines += ["", f"Exact (goal 4): {'yes' if exact['met'] else 'NO'}: {exact['notes']}"]
    lines += [f"  {p}" for p in exact["problems"][:10]]
    page = [x for x in payload["series"] if not x["ours"]]
    lines.append("The page's algorithm lost " + ", ".join(
        f"{x['lost']:,} of {x['acked']:,} ({x['series']} {x['layout']})" for x in page) + " acknowledged increments"
        + ("" if any(x["lost"] for x in page) else ": nothing (its update is atomic)"))
    met = [g for g in [*payload["goals"], rollup, exact] if g is not None]
    missed = sorted({str(g["goal"]) for g in met if g["met"] is False})
    lines += ["", f"Goals met: {len({g['goal'] for g in met}) - len(missed)} of {len({g['goal'] for g in met})}"
              + (f"; missed: {', '.join(missed)}" if missed else "")]
    lines += ["", f"Reproducibility: {payload['agreement']['with']}"]
    agreed = payload["agreement"]["ratios"]
    if agreed:
        lines.append(table([{**a, "apart": f"{a['apart']:.0%}", "verdict": "agree" if a["agree"] else "DISAGREE"}
                            for a in agreed], AGREEMENT_COLUMNS))
    lines += ["", "Series (rates and per-call figures over all rounds, min-max of single rounds, latencies the "
              "median of the rounds'; lost = acknowledged - stored; RPCs: gateway.stats, and google-cloud-firestore's "
              "calls counted alike):"]
    lines.append(table([{**x, "range": f"{x['min_per_s']:,.0f}-{x['max_per_s']:,.0f}"} for x in payload["series"]],
                       SERIES_COLUMNS))
    return lines


def markdown(payload: dict[str, Any]) -> str:
    """docs/performance.md's tables, from a recorded run."""
    goals = payload["goals"]
    layouts = list(dict.fromkeys(g["layout"] for g in goals))

    def heading(layout: str) -> str:
        processes, threads = layout.split("x")
        return f"{processes} process{'es' if processes != '1' else ''} × {threads} threads"

    out = [f"| goal | {' | '.join(heading(layout) for layout in layouts)} | need | |",
           "| --- |" + " --- |" * (len(layouts) + 2)]
    for number in dict.fromkeys(g["goal"] for g in goals):
        mine = [g for g in goals if g["goal"] == number]
        cells = ["n/a" if g["ratio"] is None else f"{g['ratio']:.2f} ({g['min']:.2f}–{g['max']:.2f})" for g in mine]
        cells = [c if g["met"] is not False else f"**{c}**" for c, g in zip(cells, mine)]
        met = None if any(g["met"] is None for g in mine) else all(g["met"] for g in mine)
        out.append(f"| {number}. {mine[0]['what']} | {' | '.join(cells)} | ≥ {mine[0]['need']:.1f} | {verdict(met)} |")
    rollup = payload["rollup"]
    if rollup is not None:
        fresh, exact = rollup["reads"]["fresh_rollup"], rollup["reads"]["exact"]
        cell = (f"{_n(fresh['rpcs'], 'RPC')} (the first exact read: {_n(exact['rpcs'], 'RPC')}, "
                f"{_n(exact['reads'], 'document read')})")
        out.append(f"| 3. `get_count(max_age=...)` at {rollup['shards']:,} shards | "
                   + " | ".join([cell] + [""] * (len(layouts) - 1)) + f" | 1 RPC | {verdict(rollup['met'])} |")
    exact = payload["exact"]
    out.append("| 4. nothing lost, no stale total (every series) | "
               + " | ".join([exact["notes"]] + [""] * (len(layouts) - 1)) + f" | 0 | {verdict(exact['met'])} |")
    agreed = payload["agreement"]["ratios"]
    if agreed:
        out += ["", f"Every goal ratio {'was' if all(a['agree'] for a in agreed) else 'was NOT'} within "
                f"{payload['agreement']['limit']:.0%} of the run before it (largest gap "
                f"{max(a['apart'] for a in agreed):.1%}): "
                + ", ".join(f"{a['goal']} ({a['layout']}) {a['previous']:.2f} then {a['this']:.2f}" for a in agreed)
                + "."]
    out += ["", f"| series | {' | '.join(heading(layout) + ', calls/s' for layout in layouts)} | RPCs per call "
            f"({' / '.join(layouts)}) | lost |", "| --- |" + " --- |" * (len(layouts) + 2)]
    for name in dict.fromkeys(x["series"] for x in payload["series"]):
        mine = {x["layout"]: x for x in payload["series"] if x["series"] == name}
        label = next(iter(mine.values()))["label"]
        rates = [f"{mine[layout]['per_s']:,.0f}" if layout in mine else "n/a" for layout in layouts]
        rpcs = " / ".join(f"{mine[layout]['rpcs_per_call']:.2f}" for layout in layouts if layout in mine)
        lost = ", ".join(f"{x['lost']:,} of {x['acked']:,}" for x in mine.values())
        out.append(f"| `{name}`: {label} | {' | '.join(rates)} | {rpcs} | {lost} |")
    if rollup is not None:
        out += ["", "| read of a counter with " + f"{rollup['shards']:,} shards | RPCs | document reads | seconds |",
                "| --- | --- | --- | --- |"]
        for name, r in rollup["reads"].items():
            out.append(f"| {ROLLUP_LABELS[name]} | {r['rpcs']:,} | {r['reads']:,} | {r['seconds']:.2f} |")
    return "\n".join(out)
