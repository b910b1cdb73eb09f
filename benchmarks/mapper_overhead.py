"""What the mapper costs on top of Google's own client, measured side by side.

    python benchmarks/mapper_overhead.py [--entities 1000] [--batch 100] [--rounds 3]
        [--backend datastore|firestore]

On one emulator (started here through gds_counter.emulators), the same work is
done through ``Store`` (Entity -> schema check -> RawEntity -> protobuf) and
through google-cloud-datastore's ``Client`` (its Entity -> protobuf):

* upsert N small entities one per commit, then in batches;
* fetch them by name one per lookup, then in batches.

Rounds alternate between the two clients so that drift in the emulator's
speed hits both alike; the median round counts. Each side writes to its own
namespace. RPCs are counted from the gateway's stats on our side and are the
same number of requests on Google's side (one per call). The goal of the
issue: the mapper adds under 10% over the raw client.
Results: benchmarks/results/mapper_overhead.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import command_line, environment, open_backends, progress, table, write_json  # noqa: E402

from gds_counter import Schema, Store  # noqa: E402

KIND = "Book"


def schema() -> Schema:
    return Schema(KIND).add_string("title").add_string("isbn").add_integer("pages", index=False)


def fields(i: int) -> dict[str, Any]:
    return {"title": f"Book {i}", "isbn": f"978-{i:010d}", "pages": 300 + i}


def chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def ours(store: Store, names: list[str], batch: int) -> dict[str, Callable[[], None]]:
    def entity(name: str, i: int) -> Any:
        book = store.create_entity(fields(i))
        book.set_key_name(name)
        return book

    def upsert_single() -> None:
        for i, name in enumerate(names):
            store.upsert(entity(name, i))

    def upsert_batch() -> None:
        for part in chunks(list(enumerate(names)), batch):
            store.upsert([entity(name, i) for i, name in part])

    def fetch_single() -> None:
        for name in names:
            assert store.fetch_by_name(name) is not None

    def fetch_batch() -> None:
        for part in chunks(names, batch):
            assert None not in store.fetch_by_names(part)

    return {"upsert single": upsert_single, "upsert batch": upsert_batch,
            "fetch single": fetch_single, "fetch batch": fetch_batch}


def google(client: Any, names: list[str], batch: int) -> dict[str, Callable[[], None]]:
    from google.cloud import datastore

    def entity(name: str, i: int) -> Any:
        book = datastore.Entity(client.key(KIND, name), exclude_from_indexes=("pages",))
        book.update(fields(i))
        return book

    def upsert_single() -> None:
        for i, name in enumerate(names):
            client.put(entity(name, i))

    def upsert_batch() -> None:
        for part in chunks(list(enumerate(names)), batch):
            client.put_multi([entity(name, i) for i, name in part])

    def fetch_single() -> None:
        for name in names:
            assert client.get(client.key(KIND, name)) is not None

    def fetch_batch() -> None:
        for part in chunks(names, batch):
            got = client.get_multi([client.key(KIND, name) for name in part])
            assert len(got) == len(part)

    return {"upsert single": upsert_single, "upsert batch": upsert_batch,
            "fetch single": fetch_single, "fetch batch": fetch_batch}


def timed(work: Callable[[], None]) -> float:
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entities", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", choices=("datastore", "firestore"), default="datastore")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args(argv)
    names = [f"book-{i:05d}" for i in range(args.entities)]

    with open_backends([args.backend]) as backends:
        from google.cloud import datastore

        spec = backends[args.backend].fresh("mapper-ours")
        gateway = spec.open_gateway()
        store = Store(schema(), gateway)
        raw_spec = backends[args.backend].fresh("mapper-google")
        with raw_spec.client_environment():
            client = datastore.Client(project=raw_spec.project, namespace=raw_spec.namespace)
        sides = {"gds_counter Store": ours(store, names, args.batch), "google-cloud-datastore": google(client, names, args.batch)}
        times: dict[tuple[str, str], list[float]] = {}
        rpcs: dict[str, int] = {}
        steps = list(sides["gds_counter Store"])
        turns = [(step, side) for _ in range(args.rounds) for step in steps for side in sides]
        for step, side in progress(turns, len(turns), "mapper overhead"):
            before = gateway.stats["rpcs"]
            times.setdefault((step, side), []).append(timed(sides[side][step]))
            if side == "gds_counter Store":
                rpcs[step] = gateway.stats["rpcs"] - before
        gateway.close()

    rows = []
    for step in steps:
        mine = statistics.median(times[(step, "gds_counter Store")])
        theirs = statistics.median(times[(step, "google-cloud-datastore")])
        rows.append({
            "step": step,
            "entities": args.entities,
            "rpcs": rpcs[step],
            "ours_s": mine,
            "google_s": theirs,
            "ours_per_s": args.entities / mine,
            "google_per_s": args.entities / theirs,
            "ratio": mine / theirs,
            "overhead_pct": (mine / theirs - 1) * 100,
        })
    print()
    print(table(rows, [("step", "step", 0), ("entities", "entities", 0), ("rpcs", "RPCs (ours)", 0),
                       ("ours_per_s", "Store ent/s", 0), ("google_per_s", "Client ent/s", 0),
                       ("ratio", "time ours/google", 2), ("overhead_pct", "overhead %", 1)]))
    worst = max(row["overhead_pct"] for row in rows)
    print(f"\nworst overhead: {worst:+.1f}% (goal: under +10%) on the {args.backend} emulator, median of {args.rounds} rounds")
    payload = {"benchmark": "mapper_overhead", "command": command_line(),
               "settings": vars(args) | {"out": "benchmarks/results"}, "environment": environment(),
               "rows": rows, "worst_overhead_pct": worst, "goal_met": worst < 10.0}
    print(f"json: {write_json(args.out / 'mapper_overhead.json', payload)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
