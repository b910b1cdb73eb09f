"""What reading a counter costs: RPCs and entity reads, as Datastore bills.

    python benchmarks/reads.py [--quick] [--backend sqlite|datastore|firestore]
        [--shards 1,5,20,100,500] [--counters 1000]

1. One counter with 1 to 500 shards (every shard written once): the batch
   lookup of the shard keys and the config key ("get_count (lookup)"), the
   same through the cache, and the PHP article's GQL query
   ``SELECT * FROM IK_CounterShardEntity WHERE target = @target``.
   The lookup reads 21 entities at 1 and at 5 shards, not 2 and 6: a reader
   always looks up at least the layout's default 20 shard keys, because a
   writer built with the default (or PHP's NUM_SHARDS = 20) may have written
   any of them without recording anything, plus the counter's config
   entity. From 20 shards on it reads shards + 1. The query reads only the
   shards that exist, in one RPC per result batch (2 at 500 shards).
2. ``--counters`` counters of 20 shards (a page of like buttons): one
   batched ``get_counts()``, the same through the cache, one ``get_count()``
   per counter, and one article query per counter.

Costs come from ``gateway.stats``; times are the median of several reads.
Results: benchmarks/results/reads.json and reads.png.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    BACKENDS,
    RESULTS,
    Backend,
    PhpArticleCounter,
    command_line,
    environment,
    open_backends,
    parse_choices,
    parse_ints,
    progress,
    table,
    write_json,
)

from gds_counter._demo import new_figure  # noqa: E402
from gds_counter.counter import CountCache, CounterShardDS, get_counts  # noqa: E402
from gds_counter.gateway.base import Gateway  # noqa: E402
from gds_counter.gateway.mutations import Upsert  # noqa: E402

TYPE = "Reads"


def populate(gateway: Gateway, counters: list[CounterShardDS]) -> None:
    """Write every shard of every counter once (count 1), in commits of 500
    (Datastore's limit of mutations per commit)."""
    upserts: list[Upsert] = []
    for counter in counters:
        if counter.num_shards > counter.layout.default_shards:
            counter.increase_shards(counter.num_shards)
        upserts += [Upsert(counter.layout.shard_entity(counter.name, n, 1, counter.namespace))
                    for n in counter.layout.shard_numbers(counter.num_shards)]
    for start in range(0, len(upserts), 500):
        gateway.commit(upserts[start : start + 500])


def measure(gateway: Gateway, what: str, read: Callable[[], Any], expected: int | list[int],
            repeats: int) -> dict[str, Any]:
    """Cost of one ``read()`` (from the stats of the last repeat) and the
    median wall time; checks the value read."""
    times = []
    snapshot: dict[str, int] = {}
    for _ in range(repeats):
        gateway.stats.reset()
        began = time.perf_counter()
        value = read()
        times.append(time.perf_counter() - began)
        snapshot = gateway.stats.snapshot()
        if value != expected:
            raise AssertionError(f"{what} read {value!r}, expected {expected!r}")
    return {"method": what, "rpcs": snapshot["rpcs"], "entity_reads": snapshot["entity_reads"],
            "ms": statistics.median(times) * 1000.0}


def by_shards(backend: Backend, shards: int, repeats: int) -> list[dict[str, Any]]:
    spec = backend.fresh(f"shards{shards}")
    gateway = spec.open_gateway()
    try:
        counter = CounterShardDS(TYPE, shards, num_shards=shards, gateway=gateway)
        cached = CounterShardDS(TYPE, shards, num_shards=shards, gateway=gateway, cache=CountCache(ttl=600))
        populate(gateway, [counter])
        article = PhpArticleCounter(TYPE, shards, shards, gateway)
        cached.get_count()  # fill the cache
        rows = [
            measure(gateway, "get_count (lookup)", lambda: get_counts([counter], use_cache=False)[0], shards, repeats),
            measure(gateway, "get_count (cached)", cached.get_count, shards, repeats),
            measure(gateway, "article GQL query", article.get_count, shards, repeats),
        ]
    finally:
        gateway.close()
    for row in rows:
        row.update(backend=backend.kind, part="one counter", shards=shards, counters=1)
    return rows


def by_counters(backend: Backend, how_many: int, repeats: int) -> list[dict[str, Any]]:
    spec = backend.fresh(f"counters{how_many}")
    gateway = spec.open_gateway()
    try:
        counters = [CounterShardDS(TYPE, i, gateway=gateway) for i in range(how_many)]
        cache = CountCache(ttl=600)
        cached = [CounterShardDS(TYPE, i, gateway=gateway, cache=cache) for i in range(how_many)]
        articles = [PhpArticleCounter(TYPE, i, 20, gateway) for i in range(how_many)]
        populate(gateway, counters)
        get_counts(cached)  # fill the cache
        want = [20] * how_many
        rows = [
            measure(gateway, "get_counts (one batch)", lambda: get_counts(counters, use_cache=False), want, repeats),
            measure(gateway, "get_counts (cached)", lambda: get_counts(cached), want, repeats),
            measure(gateway, "get_count per counter", lambda: [get_counts([c], use_cache=False)[0] for c in counters],
                    want, 1),
            measure(gateway, "article GQL query per counter", lambda: [a.get_count() for a in articles], want, 1),
        ]
    finally:
        gateway.close()
    for row in rows:
        row.update(backend=backend.kind, part=f"{how_many} counters", shards=20, counters=how_many)
    return rows


def rpc_ranges(rows: list[dict[str, Any]]) -> str:
    """``method n`` or ``method lo-hi``: the RPCs each method took, from the
    measured rows (so a title never claims a figure the table contradicts)."""
    parts = []
    for method in dict.fromkeys(r["method"] for r in rows):
        rpcs = sorted(r["rpcs"] for r in rows if r["method"] == method)
        name = method[method.index("(") + 1 : -1] if method.endswith(")") else method
        parts.append(f"{name} {rpcs[0]}" if rpcs[0] == rpcs[-1] else f"{name} {rpcs[0]}-{rpcs[-1]}")
    return ", ".join(parts)


def plot(rows: list[dict[str, Any]], path: Path, how_many: int) -> str:
    made = new_figure(12, 4.5)
    if isinstance(made, str):
        return made
    figure, save = made
    left, right = figure.subplots(1, 2)
    single = [r for r in rows if r["part"] == "one counter"]
    for method in dict.fromkeys(r["method"] for r in single):
        points = sorted((r["shards"], r["entity_reads"]) for r in single if r["method"] == method)
        left.plot([p[0] for p in points], [max(p[1], 0.5) for p in points], marker="o", label=method)
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("shards")
    left.set_ylabel("entity reads per read (0 drawn at 0.5)")
    left.set_title(f"One counter: entity reads per read\n(RPCs per read: {rpc_ranges(single)})", fontsize="medium")
    left.grid(alpha=0.3)
    left.legend(fontsize="small")
    floor = sorted((r["shards"], r["entity_reads"]) for r in single if r["method"] == "get_count (lookup)")
    if floor and floor[0][0] < 20:
        left.annotate(f"{floor[0][1]}: the default 20 shard keys + the config key", floor[0],
                      xytext=(0, 8), textcoords="offset points", fontsize="small")
    many = [r for r in rows if r["part"] != "one counter"]
    right.bar([r["method"].replace(" (", "\n(").replace(" per", "\nper") for r in many],
              [max(r["rpcs"], 0.5) for r in many], color="#2980b9")
    right.set_yscale("log")
    right.set_ylim(top=max(max((r["rpcs"] for r in many), default=1), 1) * 5)  # room for the labels
    right.set_ylabel("RPCs (0 drawn at 0.5)")
    right.set_title(f"{how_many} counters of 20 shards: RPCs")
    for i, r in enumerate(many):
        right.annotate(f"{r['rpcs']} RPCs\n{r['entity_reads']:,} reads", (i, max(r["rpcs"], 0.5)),
                       ha="center", va="bottom", fontsize="small")
    save(path)
    return f"plot: {path}"


NOTE = ("\nget_count (lookup) never reads fewer than 21 entities: the layout's default 20 shard keys (a writer "
        "may have written\nany of them without recording it) plus the config entity, so at 1 and 5 shards it "
        "still reads 21.\nThe article's query reads only the shards that exist, in one RPC per result batch.")

COLUMNS = [("backend", "backend", 0), ("part", "part", 0), ("shards", "shards", 0), ("method", "method", 0),
           ("rpcs", "RPCs", 0), ("entity_reads", "entity reads", 0), ("ms", "ms (median)", 2)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer repeats and 200 counters")
    parser.add_argument("--backend", default="sqlite", help=f"one of {','.join(BACKENDS)} (default sqlite)")
    parser.add_argument("--shards", default="1,5,20,100,500", help="shard counts (default 1,5,20,100,500)")
    parser.add_argument("--counters", type=int, help="counters read in one batch (default 1000; --quick 200)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="results folder (default benchmarks/results)")
    args = parser.parse_args(argv)
    [kind] = parse_choices(args.backend, BACKENDS, "backend")[:1]
    shard_counts = parse_ints(args.shards)
    how_many = args.counters or (200 if args.quick else 1000)
    repeats = 3 if args.quick else 9
    began = time.monotonic()
    rows: list[dict[str, Any]] = []
    with open_backends([kind]) as backends:
        backend = backends[kind]
        steps: list[Callable[[], list[dict[str, Any]]]] = [
            (lambda s=s: by_shards(backend, s, repeats)) for s in shard_counts
        ]
        steps.append(lambda: by_counters(backend, how_many, repeats))
        for step in progress(steps, len(steps), "reads"):
            rows += step()
    print()
    print(table(rows, COLUMNS))
    print(NOTE)
    args.out.mkdir(parents=True, exist_ok=True)
    print(plot(rows, args.out / "reads.png", how_many))
    payload = {"benchmark": "reads", "command": command_line(), "environment": environment(),
               "settings": {"backend": kind, "shards": shard_counts, "counters": how_many, "repeats": repeats},
               "wall_seconds": round(time.monotonic() - began, 1), "rows": rows}
    print(f"json: {write_json(args.out / 'reads.json', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
