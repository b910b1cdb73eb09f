"""``gds-counter serve`` against the official emulators, in one run: start-up,
resident memory, and google-cloud-datastore's raw client at 16 threads.

    python benchmarks/serve.py [--targets serve,firestore,datastore] [--threads 16]
        [--duration 4] [--php-seconds 5] [--json docs/benchmarks/serve.json]

Each target is started as a subprocess of its own, measured, and stopped,
one after the other, with the same client code (on this machine, so the
client's Python shares the cores with the server: compare the targets with
each other, in one run, not with another machine):

* ``serve``: ``gds-counter serve --port P --url sqlite:///TMP/serve.sqlite3``
  (a fresh file; the console script next to this Python);
* ``firestore``: the official Firestore emulator in Datastore mode (gcloud,
  Java), the oracle; ``datastore``: the legacy Datastore emulator.

Measured for each:

* start-up: seconds from starting the process to the first ``GET /`` that
  answers ``Ok``, and to the first answered gRPC ``Lookup`` (polled every
  10 ms);
* resident memory: the RSS of the whole process tree (the process and its
  children, from ``/proc``: for the emulators, gcloud's Python launcher and
  its Java child), 1 s after start-up (idle), at its peak while the rates
  below run (sampled every 0.1 s; under load), and 1 s after them; and the
  tree's CPU seconds per second while the rates ran ("server cores busy":
  the machine's cores are shared with the client's threads);
* rates, ``--threads`` threads each with its own ``datastore.Client``
  (``DATASTORE_EMULATOR_HOST`` set), ``--duration`` seconds each: puts/s
  (``client.put`` of one small entity, a key per thread and call), lookups/s
  (``client.get`` of one of the stored entities), queries/s (an equality
  filter on an indexed property, at most 20 of the stored entities back);
* the PHP article's increments/s: ``php tests/server/php/increment_loop.php
  HOST:PORT PROJECT NAMESPACE SECONDS`` with ``PHP_GDS_SRC`` (php-gds's
  ``src`` folder), which prints ``{"increments": N, "seconds": S}``; without
  ``PHP_GDS_SRC``, ``php`` or the script, the row is ``null`` with the reason.

The issue's goals for ``serve`` (issue 27): start-up under 1 s (to the first
gRPC answer), memory under 150 MB (idle and under load), and each rate at
least the Firestore emulator's; each is printed and recorded as met, not
met, or not measured (``null``). The record (``--json``) holds the command,
the environment, every target's figures and the goals.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

from _common import REPO, command_line, environ, environment, fmt, parse_choices, script_parser, table, write_json

from gds_counter.emulators import emulator_command

TARGETS = ("serve", "firestore", "datastore")
RATES = ("puts", "lookups", "queries")
PROJECT = "serve-bench"
PHP_SCRIPT = REPO / "tests" / "server" / "php" / "increment_loop.php"
DEFAULT_JSON = REPO / "docs" / "benchmarks" / "serve.json"
GOAL_STARTUP_S = 1.0
GOAL_MEMORY_MB = 150.0
STORED = 200  # entities written before the lookups and queries
KIND = "Bench"


# --- processes -------------------------------------------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(port: int, folder: str) -> list[str]:
    script = Path(sys.executable).with_name("gds-counter")
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "gds_counter"]
    return [*launcher, "serve", "--port", str(port), "--url", f"sqlite:///{folder}/serve.sqlite3"]


def tree(root: int) -> list[int]:
    """``root`` and all its descendants (from ``/proc/PID/stat``)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rpartition(")")[2].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, ()))
    return out


def tree_rss_mb(root: int) -> float:
    """The resident memory of ``root`` and all its descendants, in MB (10^6
    bytes), from ``/proc/PID/status``."""
    total = 0
    for pid in tree(root):
        with contextlib.suppress(OSError, ValueError):
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
    return total / 1e6


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user and system) used so far by ``root``'s tree."""
    ticks = 0
    for pid in tree(root):
        with contextlib.suppress(OSError, IndexError, ValueError):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rpartition(")")[2].split()
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


class Sampler:
    """The tree's peak RSS while a ``with`` block runs (every 0.1 s)."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak = pid, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.peak = max(self.peak, tree_rss_mb(self.pid))

    def __enter__(self) -> "Sampler":
        self.peak = tree_rss_mb(self.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss_mb(self.pid))


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the process group we started (the emulators' Java child
    too), then SIGKILL if it lingers."""
    import signal

    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(wait)
            return


def answers_ok(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}/", timeout=1) as response:  # noqa: S310 - loopback only
            return bool(response.read().strip() == b"Ok")
    except (OSError, ValueError):
        return False


def client(host: str, namespace: str) -> Any:
    from google.cloud import datastore

    with environ(DATASTORE_EMULATOR_HOST=host, DATASTORE_PROJECT_ID=PROJECT):
        return datastore.Client(project=PROJECT, namespace=namespace)


@contextlib.contextmanager
def started(target: str, folder: str, timeout: float = 120.0) -> Iterator[dict[str, Any]]:
    """Start ``target``; yield its host, pid and start-up times; stop it."""
    port = free_port()
    host = f"127.0.0.1:{port}"
    command = serve_command(port, folder) if target == "serve" else emulator_command(target, host, PROJECT, folder)  # type: ignore[arg-type]
    env = dict(os.environ, CLOUDSDK_CORE_DISABLE_PROMPTS="1", CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="1")
    env.pop("DATASTORE_EMULATOR_HOST", None)
    probe = client(host, "startup")  # made before the clock: a client's own set-up is not the server's
    missing = probe.key(KIND, "nothing-here")
    log = open(os.path.join(folder, f"{target}.log"), "wb")
    began = time.monotonic()
    process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    try:
        while not answers_ok(host):
            if process.poll() is not None or time.monotonic() - began > timeout:
                raise SystemExit(f"{target} did not answer GET / ({' '.join(command)}); see {log.name}")
            time.sleep(0.01)
        http_s = time.monotonic() - began
        while True:
            try:
                probe.get(missing, timeout=5)
                break
            except Exception:  # noqa: BLE001 - not answering yet
                if time.monotonic() - began > timeout:
                    raise
                time.sleep(0.01)
        grpc_s = time.monotonic() - began
        yield {"host": host, "pid": process.pid, "command": command, "startup_http_s": http_s, "startup_grpc_s": grpc_s}
    finally:
        stop_group(process)
        log.close()


# --- rates ---------------------------------------------------------------------------------------


def rate(op_for_thread: Callable[[int], Callable[[], None]], threads: int, duration: float) -> dict[str, Any]:
    """Calls per second of ``threads`` threads, each calling its op for
    ``duration`` seconds (ops are made before the clock starts)."""
    ops = [op_for_thread(i) for i in range(threads)]
    counts, failures = [0] * threads, [0] * threads
    barrier = threading.Barrier(threads + 1)
    deadline = [0.0]

    def work(i: int) -> None:
        barrier.wait()
        while time.monotonic() < deadline[0]:
            try:
                ops[i]()
                counts[i] += 1
            except Exception:  # noqa: BLE001 - counted, and the run's record says how many
                failures[i] += 1

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    deadline[0] = time.monotonic() + duration
    began = time.monotonic()
    barrier.wait()
    for worker in workers:
        worker.join()
    seconds = time.monotonic() - began
    return {"per_second": sum(counts) / seconds, "calls": sum(counts), "failed": sum(failures), "seconds": seconds}


def measure_rates(host: str, threads: int, duration: float) -> dict[str, dict[str, Any]]:
    from google.cloud import datastore

    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    clients = [client(host, namespace) for _ in range(threads)]
    seed = clients[0]
    for start in range(0, STORED, 100):
        batch = []
        for i in range(start, min(STORED, start + 100)):
            entity = datastore.Entity(seed.key(KIND, f"e{i}"))
            entity.update({"group": i % 10, "n": i, "text": "x" * 40})
            batch.append(entity)
        seed.put_multi(batch)

    def putter(t: int) -> Callable[[], None]:
        c, serial = clients[t], iter(range(10**9))

        def put() -> None:
            entity = datastore.Entity(c.key("Put", f"t{t}-{next(serial)}"))
            entity.update({"group": t, "n": t, "text": "x" * 40})
            c.put(entity)

        return put

    def looker(t: int) -> Callable[[], None]:
        c, serial = clients[t], iter(range(10**9))

        def lookup() -> None:
            if c.get(c.key(KIND, f"e{(t * 7919 + next(serial)) % STORED}")) is None:
                raise RuntimeError("a stored entity was not found")

        return lookup

    def querier(t: int) -> Callable[[], None]:
        c, serial = clients[t], iter(range(10**9))

        def query() -> None:
            q = c.query(kind=KIND)
            q.add_filter(filter=datastore.query.PropertyFilter("group", "=", (t + next(serial)) % 10))
            if len(list(q.fetch(limit=20))) != 20:
                raise RuntimeError("a query found fewer than its 20 entities")

        return query

    return {name: rate(op, threads, duration) for name, op in (("puts", putter), ("lookups", looker), ("queries", querier))}


def php_increments(host: str, seconds: float) -> dict[str, Any]:
    """The PHP article's loop (another branch's script), or why not."""
    src = os.environ.get("PHP_GDS_SRC")
    php = shutil.which("php")
    reason = ("PHP_GDS_SRC not set" if not src else "php not on PATH" if not php
              else f"{PHP_SCRIPT.relative_to(REPO)} not found" if not PHP_SCRIPT.exists() else None)
    if reason is not None:
        return {"per_second": None, "reason": reason}
    namespace = f"php-{uuid.uuid4().hex[:8]}"
    done = subprocess.run([str(php), str(PHP_SCRIPT), host, PROJECT, namespace, str(seconds)], capture_output=True,
                          text=True, timeout=seconds + 120, env=dict(os.environ, PHP_GDS_SRC=str(src)))
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
        return {"per_second": result["increments"] / result["seconds"], **result}
    except (IndexError, KeyError, ValueError, ZeroDivisionError):
        return {"per_second": None, "reason": f"the PHP script failed ({done.returncode}): {done.stderr.strip()[-300:]}"}


def measure(target: str, threads: int, duration: float, php_seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"gds-bench-{target}-") as folder, started(target, folder) as run:
        time.sleep(1.0)
        idle = tree_rss_mb(run["pid"])
        with Sampler(run["pid"]) as sampler:
            cpu, wall = tree_cpu_s(run["pid"]), time.monotonic()
            rates = measure_rates(run["host"], threads, duration)
            # the server's cores busy while the rates ran (its CPU seconds per second)
            busy = (tree_cpu_s(run["pid"]) - cpu) / (time.monotonic() - wall)
            rates["php_increments"] = php_increments(run["host"], php_seconds)
        time.sleep(1.0)
        after = tree_rss_mb(run["pid"])
        command = " ".join([Path(run["command"][0]).name, *run["command"][1:]]).replace(folder, "TMP")
    return {"target": target, "command": command, "startup_http_s": run["startup_http_s"],
            "server_cores_busy_under_load": busy,
            "startup_grpc_s": run["startup_grpc_s"], "rss_idle_mb": idle, "rss_load_peak_mb": sampler.peak,
            "rss_after_load_mb": after, "rates": rates}


def medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One target's rounds as one result: each number the median of its
    rounds (a rate's ``each`` keeps every round's), so one noisy round on a
    shared machine moves no goal; a rate not measured keeps its reason."""
    out = dict(runs[0])
    for name, value in runs[0].items():
        if isinstance(value, (int, float)):
            out[name] = statistics.median(run[name] for run in runs)
    out["rates"] = {}
    for name, first in runs[0]["rates"].items():
        each = [run["rates"][name].get("per_second") for run in runs]
        if any(value is None for value in each):
            out["rates"][name] = first
            continue
        out["rates"][name] = {"per_second": statistics.median(each), "each": each,
                              **{key: sum(run["rates"][name].get(key, 0) for run in runs)
                                 for key in ("calls", "failed", "seconds", "increments") if key in first}}
    return out


# --- goals and output -----------------------------------------------------------------------------


def goals(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    serve, oracle = results.get("serve"), results.get("firestore")
    out: list[dict[str, Any]] = []
    if serve is None:
        return out
    out.append({"goal": f"start-up to the first gRPC answer < {GOAL_STARTUP_S:g} s", "value": serve["startup_grpc_s"],
                "met": serve["startup_grpc_s"] < GOAL_STARTUP_S})
    peak = max(serve["rss_idle_mb"], serve["rss_load_peak_mb"])
    out.append({"goal": f"resident memory (idle and under load) < {GOAL_MEMORY_MB:g} MB", "value": peak,
                "met": peak < GOAL_MEMORY_MB})
    for name in (*RATES, "php_increments"):
        ours = serve["rates"][name]["per_second"]
        theirs = oracle["rates"][name]["per_second"] if oracle is not None else None
        ratio = ours / theirs if ours is not None and theirs else None
        out.append({"goal": f"{name}/s >= the Firestore emulator's", "value": ratio,
                    "met": None if ratio is None else ratio >= 1.0})
    return out


def rows(results: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for target, r in results.items():
        row = {"target": target, "http": r["startup_http_s"], "grpc": r["startup_grpc_s"], "idle": r["rss_idle_mb"],
               "load": r["rss_load_peak_mb"], "after": r["rss_after_load_mb"], "cpu": r["server_cores_busy_under_load"]}
        row.update({name: r["rates"][name]["per_second"] for name in (*RATES, "php_increments")})
        out.append(row)
    return out


COLUMNS = [("target", "target", 0), ("http", "start GET / s", 2), ("grpc", "start gRPC s", 2),
           ("idle", "RSS idle MB", 0), ("load", "RSS load MB", 0), ("after", "RSS after MB", 0),
           ("puts", "puts/s", 0), ("lookups", "lookups/s", 0), ("queries", "queries/s", 0),
           ("php_increments", "PHP incr/s", 1), ("cpu", "server cores busy", 2)]


def main(argv: list[str] | None = None) -> int:
    parser = script_parser(__doc__)
    parser.add_argument("--targets", default="serve,firestore,datastore",
                        help="comma-separated, from serve, firestore, datastore")
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per rate")
    parser.add_argument("--php-seconds", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3,
                        help="rounds, the targets' order reversed each round; the record keeps each round and the medians")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where the record goes")
    args = parser.parse_args(argv)
    targets = parse_choices(args.targets, TARGETS, "target")
    rounds: dict[str, list[dict[str, Any]]] = {target: [] for target in targets}
    for round_ in range(max(1, args.repeats)):
        for target in targets if round_ % 2 == 0 else list(reversed(targets)):
            print(f"measuring {target} (round {round_ + 1}) ...", file=sys.stderr, flush=True)
            rounds[target].append(measure(target, args.threads, args.duration, args.php_seconds))
    results = {target: medians(rounds[target]) for target in targets}
    reached = goals(results)
    print(table(rows(results), COLUMNS))
    php = {t: r["rates"]["php_increments"].get("reason") for t, r in results.items()}
    if any(php.values()):
        print(f"PHP row not measured: {'; '.join(f'{t}: {why}' for t, why in php.items() if why)}")
    print("\nGoals (gds-counter serve):")
    for goal in reached:
        state = "not measured" if goal["met"] is None else "met" if goal["met"] else "NOT met"
        print(f"  {goal['goal']}: {fmt(goal['value'], 2)} -> {state}")
    record = {"command": command_line([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
              "environment": environment(),
              "settings": {"targets": targets, "threads": args.threads, "duration_s": args.duration,
                           "php_seconds": args.php_seconds, "stored_entities": STORED, "repeats": max(1, args.repeats)},
              "results": results, "goals": reached}
    print(f"\nwrote {write_json(args.json, record)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
