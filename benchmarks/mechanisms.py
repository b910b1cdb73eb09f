"""What each speed mechanism buys: the same load with it on and off, side by side.

    python benchmarks/mechanisms.py [--quick] [--backend sqlite,firestore]
        [--mechanisms combined-writes,shared-reads,affinity,count-cache,group-commit,redis-cache]
        [--redis URL]
        [--threads 16] [--shards 20] [--duration 4] [--repeats 3] [--out DIR]

The product keeps a mechanism for speed only where it earns its place
(``docs/architecture.md``, "Mechanisms"): this measures each one against the
product with that one mechanism switched off, everything else unchanged.
Switching off is done here, in this process only, by giving the gateway a
runtime without it (``counter.runtime.Runtime``) or by replacing the
gateway's part with the plain path it short-cuts:

  combined-writes  each caller commits its own amount
                   (``Runtime(combine_writes=False)``)
  shared-reads     each caller runs its own read of a total
                   (``Runtime(share_reads=False)``)
  affinity         each attempt takes a uniformly random shard, as the
                   articles do (``Runtime(shards=RandomShards())``)
  group-commit     each embedded commit is its own SQLite transaction and
                   fsync (SQLite backend only)
  count-cache      readers use ``cache=True`` against no cache; the load is
                   one writer adding every 10 ms and the other threads
                   reading (``get_count``); its rate and costs are per read
                   (the writer's own RPCs are in both sides alike)
  redis-cache      the same load with ``cache="redis://..."`` (the cache every
                   process shares) against no cache: ``--redis URL``, or a
                   redis-server this script starts on a free port and stops
                   (not in the default list: it needs redis-server)

Every other mechanism load is ``--threads`` threads of one process calling
``CounterShardDS(name, 1, shards).increment()`` for ``--duration`` seconds.
Rounds alternate the order (on, off, then off, on) so drift hits both
sides alike; a rate is pooled over the rounds. Each row also gives RPCs and
entity reads and writes per operation (``gateway.stats``: what Datastore
bills) and checks the one promise that matters more than speed: the stored
total equals the increments acknowledged (a row with ``exact`` = no is a
defect, whatever its speed).

Results: ``benchmarks/results/mechanisms.json`` and a table on stdout
(``--publish`` also writes ``docs/benchmarks/mechanisms.json``).
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (  # noqa: E402
    REPO,
    RESULTS,
    BackendSpec,
    command_line,
    environment,
    open_backends,
    parse_choices,
    table,
    write_json,
)

from gds_counter.counter import CounterShardDS  # noqa: E402
from gds_counter.counter.runtime import Runtime  # noqa: E402
from gds_counter.counter.shard_choice import RandomShards  # noqa: E402
from gds_counter.errors import GDSError  # noqa: E402

MECHANISMS = ("combined-writes", "shared-reads", "affinity", "count-cache", "group-commit", "redis-cache")
#: Run when --mechanisms is not given (redis-cache needs a redis-server).
DEFAULT_MECHANISMS = MECHANISMS[:-1]
#: The Redis URL of the redis-cache load (set by main).
REDIS_URL: str | None = None
SQLITE_ONLY = ("group-commit",)
#: The count-cache load's one writer adds once per this many seconds: a
#: read-mostly counter (a page of like buttons), which is what a cache is
#: for. Under constant writes by this process every read overlaps a write,
#: and such a read is never cached (it could be untrue), so the cache then
#: buys nothing; the "count-cache" row is measured where it can.
WRITER_PAUSE_S = 0.01


# --- switching one mechanism off, in this process only ------------------------------------


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    saved = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


def _solo_group_commit() -> contextlib.AbstractContextManager[None]:
    """The embedded engine's group commit with a batch of one: each commit
    takes the process's write lock and writes alone."""
    from gds_counter.gateway.embedded import _engine

    original = _engine.EmbeddedGateway._apply

    def apply_alone(self: Any, mutations: Any, txn: Any) -> Any:
        if txn is None and self.path is not None:
            with self._db() as conn, self._pool.write_lock:
                return self._write(conn, mutations, None)
        return original(self, mutations, txn)

    return _patched(_engine.EmbeddedGateway, "_apply", apply_alone)


def switched_off(mechanism: str, gateway: Any) -> contextlib.AbstractContextManager[None]:
    """``mechanism`` off for the counters built on ``gateway`` from now on:
    through the gateway's runtime where it is a runtime's part, else (the
    group commit) by replacing the engine's method for the run's duration."""
    if mechanism == "combined-writes":
        Runtime(combine_writes=False).install(gateway)
    elif mechanism == "affinity":
        Runtime(shards=RandomShards()).install(gateway)
    elif mechanism == "shared-reads":
        Runtime(share_reads=False).install(gateway)
    elif mechanism == "group-commit":
        return _solo_group_commit()
    return contextlib.nullcontext()  # count-cache: off is the counter built without one


# --- one measured run --------------------------------------------------------------------


def run_once(spec: BackendSpec, mechanism: str, on: bool, threads: int, shards: int, seconds: float) -> dict[str, Any]:
    """``threads`` threads on one fresh counter for ``seconds``; the rate,
    the costs per operation and the exactness check."""
    gateway = spec.open_gateway()
    name = f"mechanisms-{mechanism}-{'on' if on else 'off'}-{random.getrandbits(32):08x}"
    reads_cached = mechanism in ("count-cache", "redis-cache")
    cache: Any = REDIS_URL if mechanism == "redis-cache" else True
    acknowledged = [0] * threads
    operations = [0] * threads
    errors = [0] * threads
    stop = threading.Event()
    start = threading.Barrier(threads + 1)

    def worker(i: int) -> None:
        reader = reads_cached and i > 0
        counter = CounterShardDS(name, 1, shards, gateway=gateway, cache=cache if on and reader else None)
        start.wait()
        while not stop.is_set():
            try:
                if reader:
                    counter.get_count()
                else:
                    counter.add(1) if reads_cached else counter.increment()
                    acknowledged[i] += 1
                    if reads_cached:
                        time.sleep(WRITER_PAUSE_S)
                if reader or not reads_cached:  # count-cache: the reads are what is measured
                    operations[i] += 1
            except GDSError:
                errors[i] += 1

    context = switched_off(mechanism, gateway) if not on else contextlib.nullcontext()
    with context:
        workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
        for thread in workers:
            thread.start()
        before = gateway.stats.snapshot()
        start.wait()
        began = time.perf_counter()
        time.sleep(seconds)
        stop.set()
        for thread in workers:
            thread.join(120)
        elapsed = time.perf_counter() - began
    after = gateway.stats.snapshot()
    used = {k: after.get(k, 0) - before.get(k, 0) for k in ("rpcs", "entity_reads", "entity_writes")}
    stored = CounterShardDS(name, 1, shards, gateway=gateway).get_count()
    gateway.close()
    ops = sum(operations)
    return {
        "ops": ops,
        "seconds": elapsed,
        "errors": sum(errors),
        "acknowledged": sum(acknowledged),
        "stored": stored,
        **used,
    }


def measure(spec_of: Callable[[str], BackendSpec], backend: str, mechanism: str, args: argparse.Namespace) -> dict[str, Any]:
    sides: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for round_number in range(args.repeats):
        order = (True, False) if round_number % 2 == 0 else (False, True)
        for on in order:
            sides[on].append(run_once(spec_of(f"{mechanism}-{on}"), mechanism, on, args.threads, args.shards, args.duration))
    row: dict[str, Any] = {"backend": backend, "mechanism": mechanism}
    for on, runs in sides.items():
        side = "on" if on else "off"
        ops = sum(r["ops"] for r in runs)
        row[f"{side}_rate"] = ops / sum(r["seconds"] for r in runs)
        for cost in ("rpcs", "entity_reads", "entity_writes"):
            row[f"{side}_{cost}"] = sum(r[cost] for r in runs) / max(ops, 1)
        row[f"{side}_errors"] = sum(r["errors"] for r in runs)
        row[f"{side}_exact"] = all(r["stored"] == r["acknowledged"] for r in runs)
    row["gain"] = row["on_rate"] / row["off_rate"] if row["off_rate"] else None
    row["exact"] = "yes" if row["on_exact"] and row["off_exact"] else "NO"
    return row


def _measure_all(backends: list[str], mechanisms: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with open_backends(backends) as opened:
        for backend in backends:
            for mechanism in mechanisms:
                if mechanism in SQLITE_ONLY and backend != "sqlite":
                    continue
                row = measure(opened[backend].fresh, backend, mechanism, args)
                rows.append(row)
                print(f"{backend} {mechanism}: on {row['on_rate']:,.0f}/s, off {row['off_rate']:,.0f}/s, "
                      f"gain {row['gain']:.2f}, exact {row['exact']}", file=sys.stderr)
    return rows


@contextlib.contextmanager
def _redis_server() -> Iterator[str]:
    """A throwaway redis-server on a free local port (no persistence)."""
    import shutil
    import socket
    import subprocess
    import tempfile

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("redis-cache needs redis-server (or --redis URL)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with tempfile.TemporaryDirectory() as folder:
        server = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", folder],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            import redis

            for _ in range(200):
                try:
                    redis.Redis(port=port, socket_timeout=0.5).ping()
                    break
                except redis.RedisError:
                    time.sleep(0.05)
            yield f"redis://127.0.0.1:{port}/0"
        finally:
            server.kill()
            server.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 rounds x 2 s (about a minute on SQLite)")
    parser.add_argument("--backend", default="sqlite", help="comma-separated: sqlite, firestore (default sqlite)")
    parser.add_argument("--mechanisms", default=",".join(DEFAULT_MECHANISMS),
                        help=f"comma-separated, from {', '.join(MECHANISMS)} (default: all but redis-cache)")
    parser.add_argument("--redis", help="the redis-cache load's Redis URL (default: start a redis-server here)")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--shards", type=int, default=20)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per side and round")
    parser.add_argument("--repeats", type=int, default=3, help="alternating rounds")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--publish", action="store_true",
                        help="also write docs/benchmarks/mechanisms.json (the run docs/architecture.md quotes)")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.repeats = 2.0, 2
    backends = parse_choices(args.backend, ("sqlite", "firestore"), "backend")
    mechanisms = parse_choices(args.mechanisms, MECHANISMS, "mechanism")
    global REDIS_URL
    with contextlib.ExitStack() as stack:
        if "redis-cache" in mechanisms:
            REDIS_URL = args.redis or stack.enter_context(_redis_server())
        rows = _measure_all(backends, mechanisms, args)
    columns = [
        ("backend", "backend", 0), ("mechanism", "mechanism", 0),
        ("on_rate", "on ops/s", 0), ("off_rate", "off ops/s", 0), ("gain", "on/off", 2),
        ("on_rpcs", "RPCs/op on", 2), ("off_rpcs", "RPCs/op off", 2),
        ("on_entity_reads", "reads/op on", 2), ("off_entity_reads", "reads/op off", 2),
        ("on_entity_writes", "writes/op on", 2), ("off_entity_writes", "writes/op off", 2),
        ("exact", "exact", 0),
    ]
    print(table(rows, columns))
    payload = {
        "command": command_line(argv), "environment": environment(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "publish")}, "rows": rows,
    }
    path = write_json(args.out / "mechanisms.json", payload)
    print(f"results: {path}", file=sys.stderr)
    if args.publish:
        print(f"published: {write_json(REPO / 'docs' / 'benchmarks' / 'mechanisms.json', payload)}", file=sys.stderr)
    return 0 if all(row["exact"] == "yes" for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
