"""The like app as it is deployed, under load: the Dockerfile's own uvicorn
command (4 worker processes) on the Firestore emulator (or a SQLite file),
thousands of concurrent likes, exact totals, latency percentiles.

    python benchmarks/like_app_load.py [--likes 2000] [--connections 50]
        [--workers 4] [--backend firestore|sqlite] [--cache redis://...] [--json PATH]

How: the command is read from the Dockerfile's CMD (so what is measured is
what is deployed), with ``--host 127.0.0.1`` and a free port; the storage
is given as ``GDS_URL`` (a namespace of its own on the emulator), the cache
as ``GDS_CACHE_URL``. Once ``GET /api/likes`` answers, every like is sent
at once (``POST /api/likes/ITEM``, the items in turn) over at most
``--connections`` connections, each timed from send to answer. Then the
stored totals are read the way PHP reads them (the article's query) and
compared with the likes the app said it counted (200, or 202: counted,
total unread); a 503 says whether it was counted. The server is stopped
with SIGTERM, as a platform stops it.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REPO, command_line, environment, script_parser, write_json  # noqa: E402

ITEMS = ("tea", "coffee", "cocoa")
#: The deployed image's recipe, which lives with the example.
DOCKERFILE = REPO / "examples" / "like_app" / "Dockerfile"


def deployed_command(port: int, workers: int) -> list[str]:
    """The Dockerfile's uvicorn command, on a local port."""
    text = DOCKERFILE.read_text()
    match = re.search(r'exec (uvicorn [^"]+)"', text)
    if match is None:
        raise SystemExit("the Dockerfile's CMD has no 'exec uvicorn ...'")
    command = match.group(1).replace("${PORT}", str(port)).replace("${WORKERS}", str(workers)).split()
    command[command.index("--host") + 1] = "127.0.0.1"
    return [sys.executable, "-m", *command]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def _fire(base: str, likes: int, connections: int) -> list[tuple[str, int, float, Any]]:
    import httpx

    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    # the pool wait is not bounded: every like is queued at once, on purpose
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=httpx.Timeout(120, pool=None)) as client:
        async def one(i: int) -> tuple[str, int, float, Any]:
            item = ITEMS[i % len(ITEMS)]
            began = time.perf_counter()
            try:
                response = await client.post(f"/api/likes/{item}")
            except httpx.TransportError as exc:  # no answer: recorded as status 0 (not counted), with why
                return item, 0, time.perf_counter() - began, f"{type(exc).__name__}: {exc}"
            return item, response.status_code, time.perf_counter() - began, response.json()

        return list(await asyncio.gather(*(one(i) for i in range(likes))))


def run(url: str, env: dict[str, str], likes: int, connections: int, workers: int, cache: str | None) -> dict[str, Any]:
    """Serve the app as deployed on ``url``, send ``likes`` at once, check."""
    from gds_counter.counter import CounterShardDS
    from gds_counter.gateway import open_gateway

    port = _free_port()
    server_env = {**os.environ, **env, "GDS_URL": url, "PYTHONPATH": str(REPO)}
    if cache:
        server_env["GDS_CACHE_URL"] = cache
    # The server's log goes to a file, so that a run with unanswered requests says what the server saw.
    log_file = tempfile.TemporaryFile(mode="w+")
    server = subprocess.Popen(deployed_command(port, workers), cwd=REPO, env=server_env,
                              stdout=subprocess.DEVNULL, stderr=log_file, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(base + "/api/likes", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                log_file.seek(0)
                raise SystemExit(f"the app did not start: {log_file.read()[-5000:]}")
            time.sleep(0.2)
        began = time.perf_counter()
        answers = asyncio.run(_fire(base, likes, connections))
        took = time.perf_counter() - began
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
    counted = {item: 0 for item in ITEMS}
    statuses: dict[int, int] = {}
    for item, status, _, _ in answers:
        statuses[status] = statuses.get(status, 0) + 1
        if status in (200, 202):
            counted[item] += 1
    os.environ.update(env)
    gateway = open_gateway(url)
    try:
        stored = {item: CounterShardDS("like", item, gateway=gateway).get_count(method="query") for item in ITEMS}
    finally:
        gateway.close()
    log_file.seek(0)
    server_log = log_file.read()
    log_file.close()
    unanswered = [body for _, status, _, body in answers if status == 0]
    latencies = sorted(seconds for _, _, seconds, _ in answers)
    quantiles = statistics.quantiles(latencies, n=100)
    return {
        "likes": likes, "connections": connections, "workers": workers, "cache": bool(cache),
        "statuses": {str(k): v for k, v in sorted(statuses.items())}, "counted": counted, "stored": stored,
        "exact": stored == counted, "seconds": round(took, 2), "likes_per_second": round(likes / took, 1),
        "p50_ms": round(quantiles[49] * 1000, 1), "p99_ms": round(quantiles[98] * 1000, 1),
        "max_ms": round(latencies[-1] * 1000, 1), "server_exit": server.returncode,
        **({"unanswered": unanswered[:5], "server_log_tail": server_log[-5000:]} if unanswered else {}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = script_parser(__doc__)
    parser.add_argument("--likes", type=int, default=2000)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--backend", choices=("firestore", "sqlite"), default="firestore")
    parser.add_argument("--cache", help="a redis:// URL for the cache every worker shares")
    parser.add_argument("--json", type=Path, help="write the record here")
    args = parser.parse_args(argv)
    if args.backend == "firestore":
        from gds_counter.emulators import launch_emulator

        emulator = launch_emulator("firestore")
        try:
            url = f"datastore://{emulator.env['DATASTORE_PROJECT_ID']}?namespace=likes-{uuid.uuid4().hex[:8]}"
            result = run(url, dict(emulator.env), args.likes, args.connections, args.workers, args.cache)
        finally:
            emulator.stop()
    else:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            result = run(f"sqlite:///{folder}/likes.sqlite3", {}, args.likes, args.connections, args.workers, args.cache)
    print(f"{result['likes']} likes at once over {result['connections']} connections, {result['workers']} workers, "
          f"{args.backend}: {result['likes_per_second']:,.0f} likes/s, p50 {result['p50_ms']} ms, "
          f"p99 {result['p99_ms']} ms, max {result['max_ms']} ms; answers {result['statuses']}; "
          f"stored {result['stored']} {'= counted' if result['exact'] else '!= counted ' + str(result['counted'])}")
    if args.json is not None:
        payload = {"command": command_line(None if argv is None else [sys.argv[0], *argv]),
                   "environment": environment(), "settings": vars(args) | {"json": None}, "result": result}
        print(f"record: {write_json(args.json, payload)}", file=sys.stderr)
    return 0 if result["exact"] else 1


if __name__ == "__main__":
    sys.exit(main())
