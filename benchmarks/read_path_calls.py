"""How much Python work one ``get_count()`` does: function calls per read.

    python benchmarks/read_path_calls.py [--shards 20] [--reads 200] [--json PATH]

A read needs one integer from each shard. This counts every Python and
built-in function call (``cProfile``'s total, the same count on every
machine for the same code) that one ``get_count()`` makes on a warm counter
whose shards are all written, on the embedded engine in memory, so the
figure is the library's own work with no network in it.

It uses only the public API, so the same file measures an older commit too
(check it out elsewhere and run this script from there) to compare the read
path before and after a change.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import platform
import pstats
import sys
from pathlib import Path

from gds_counter import CounterShardDS, open_gateway


def calls_per_read(shards: int, reads: int) -> float:
    gateway = open_gateway("memory://")
    try:
        counter = CounterShardDS("Counter Test", 1, num_shards=shards, gateway=gateway, strategy="transactional")
        while any(count == 0 for _, count in counter.shards()):
            counter.add()
        counter.get_count()  # warm: the counter has learned its config
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(reads):
            counter.get_count()
        profiler.disable()
        return pstats.Stats(profiler).total_calls / reads  # type: ignore[attr-defined]
    finally:
        gateway.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--json", type=Path, help="write the result here too")
    args = parser.parse_args(argv)
    calls = calls_per_read(args.shards, args.reads)
    print(f"| shards | reads | Python calls per get_count() |\n| --- | --- | --- |\n| {args.shards} | {args.reads} | {calls:.0f} |")
    if args.json:
        result = {
            "command": "python benchmarks/read_path_calls.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "python": platform.python_version(),
            "shards": args.shards,
            "reads": args.reads,
            "calls_per_get_count": round(calls, 1),
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
