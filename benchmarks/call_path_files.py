"""How many of the library's files one ``add()`` and one ``get_count()`` cross.

    python benchmarks/call_path_files.py [--url sqlite:///path.db | memory://] [--list] [--json PATH]

A reader (or mypy) follows a value from ``increment()`` to the wire through
every file it passes. This records, with ``sys.setprofile``, each
``gds_counter`` source file that runs Python code during one warm ``add()``
and one warm ``get_count()`` of the PHP article's counter (its config
learned, its shards written), on one thread with nothing else running, so
no other caller's code is counted; then the same two calls of the asyncio
face (``gds_counter.aio``), awaited one at a time, as the event loop's
thread runs them (the embedded engine's own calls run in the async
gateway's worker threads, which are not recorded). ``--list`` prints the
files in the order first entered.

It uses only the public API, so the same file measures an older commit too
(``git worktree add`` it elsewhere and run this script there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any, Awaitable, Callable

import gds_counter
from gds_counter import CounterShardDS, aio, open_gateway

PACKAGE = Path(gds_counter.__file__).resolve().parent


class _Recorder:
    """A profile function that notes each of the package's files as code
    of it is first entered."""

    def __init__(self) -> None:
        self.seen: dict[str, None] = {}

    def __call__(self, frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            path = frame.f_code.co_filename
            if path.startswith(str(PACKAGE)) and path not in self.seen:
                self.seen[path] = None

    def files(self) -> list[str]:
        return [str(Path(path).relative_to(PACKAGE.parent)) for path in self.seen]


def files_crossed(call: Callable[[], Any]) -> list[str]:
    """The package's files that ran code during ``call()``, first entered first."""
    recorder = _Recorder()
    sys.setprofile(recorder)
    try:
        call()
    finally:
        sys.setprofile(None)
    return recorder.files()


async def files_awaited(call: Callable[[], Awaitable[Any]]) -> list[str]:
    """The package's files that ran code in this (the event loop's) thread
    while ``await call()`` ran, first entered first; nothing else is
    scheduled on the loop meanwhile."""
    recorder = _Recorder()
    sys.setprofile(recorder)
    try:
        await call()
    finally:
        sys.setprofile(None)
    return recorder.files()


def measure(url: str) -> dict[str, list[str]]:
    """The files one warm ``add()`` and one warm ``get_count()`` cross, on
    each face: ``add`` and ``get_count`` (blocking), ``aio add`` and ``aio
    get_count`` (awaited, on an async gateway over the same storage)."""
    gateway = open_gateway(url)
    try:
        counter = CounterShardDS("Counter Test", 1, gateway=gateway)
        for _ in range(3 * counter.num_shards):  # warm: config learned, every shard written
            counter.add()
        counter.get_count()
        crossed = {"add": files_crossed(counter.add), "get_count": files_crossed(counter.get_count)}
        crossed.update(asyncio.run(_measure_aio(gateway)))
        return crossed
    finally:
        gateway.close()


async def _measure_aio(blocking: Any) -> dict[str, list[str]]:
    gateway = aio.ThreadedGateway(blocking)  # not its owner: closing it leaves ``blocking`` open
    try:
        counter = aio.CounterShardDS("Counter Test", 1, gateway=gateway)
        for _ in range(3 * counter.num_shards):
            await counter.add()
        await counter.get_count()
        return {"aio add": await files_awaited(counter.add), "aio get_count": await files_awaited(counter.get_count)}
    finally:
        await gateway.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="storage to measure on (default: a fresh SQLite file)")
    parser.add_argument("--list", action="store_true", help="print the files crossed, in order")
    parser.add_argument("--json", type=Path, help="write the result here too")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        url = args.url or "sqlite:///" + os.path.join(folder, "path.db")
        crossed = measure(url)
    storage = "SQLite file" if url.startswith("sqlite") else url
    print(f"| call | files crossed ({storage}) |\n| --- | --- |")
    for name, files in crossed.items():
        print(f"| {name}() | {len(files)} |")
    if args.list:
        for name, files in crossed.items():
            print(f"\n{name}():")
            for path in files:
                print(f"  {path}")
    if args.json:
        result = {
            "command": "python benchmarks/call_path_files.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            "python": platform.python_version(),
            "storage": storage,
            "files": crossed,
            "counts": {name: len(files) for name, files in crossed.items()},
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
