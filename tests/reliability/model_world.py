"""The real parts ``test_counter_model.py`` drives, one set per gateway.

A ``World`` is the storage (memory, a SQLite file, ``gds-counter serve``
over a SQLite file, or the Firestore emulator) with what the model's rules
need around it: a real redis-server, a second process on the same storage
(``model_child.py``), the ``gds-counter rollup`` command, a way to restart
the server under its clients, PHP's writer, and Ctrl-C at a random moment.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence

from gds_counter.counter import PHP_ARTICLE, ShardedCounter
from gds_counter.counter._inventory import counter_names_plan, rollup_all_plan
from gds_counter.errors import (
    BadValueError,
    CommitUnknown,
    Contention,
    CorruptDataError,
    CountSaturated,
    GatewayError,
    TotalUnavailable,
    TransformsIgnored,
    Unavailable,
)
from gds_counter.gateway import open_gateway, plan
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity

CHILD = Path(__file__).with_name("model_child.py")
PHP_KIND = "IK_CounterShardEntity"
SERVE_PROJECT = "gds-counter-serve"


class Defect(AssertionError):
    """A documented promise broken: the message says which, with the values."""


def outcome_of(error: BaseException | None, what: str) -> str:
    """What the errors table ("was the increment stored") says an add's
    outcome is: "stored", "not" or "unknown". An error that refuses valid
    input (``BadValueError``, ``CorruptDataError``) is a defect here: every
    amount and name the model uses is valid and the data is the layout's."""
    if error is None or isinstance(error, (TotalUnavailable, CountSaturated)):
        return "stored"
    if isinstance(error, (Contention, Unavailable, TransformsIgnored)):
        return "not"
    if isinstance(error, (BadValueError, CorruptDataError)):
        raise Defect(f"{what} raised {type(error).__name__} on valid input: {error}") from error
    if isinstance(error, (CommitUnknown, GatewayError, KeyboardInterrupt)):
        return "unknown"
    raise Defect(f"{what} raised {type(error).__name__}, which the errors table does not list: {error}") from error


def reset_outcome(error: BaseException | None, num_shards: int) -> str:
    """A reset's outcome for the model: "stored", "not" (an error the docs
    say applied nothing: ``Contention``/``Unavailable`` on at most 25
    shards, which one transaction zeroes) or "partial" (anything else that
    may have applied part of it, a partial-reset error included)."""
    if error is None:
        return "stored"
    if isinstance(error, (BadValueError, CorruptDataError)):
        raise Defect(f"reset raised {type(error).__name__} on valid input: {error}") from error
    if "partial" in type(error).__name__.lower():
        return "partial"
    if isinstance(error, (Contention, Unavailable)) and num_shards <= 25:
        return "not"
    return "partial"


def call(function: Callable[[], Any]) -> tuple[Any, BaseException | None]:
    """``function()``'s result, or the GDSError it raised."""
    from gds_counter.errors import GDSError

    try:
        return function(), None
    except GDSError as exc:
        return None, exc


class Interrupter:
    """Ctrl-C at a random moment: SIGALRM raises KeyboardInterrupt in the
    main thread ``delay`` seconds into a call (as
    ``tests/reliability/interrupted_counter.py`` does), armed only around it."""

    def __init__(self) -> None:
        self.armed = False
        self.previous = signal.signal(signal.SIGALRM, self._on_alarm)

    def _on_alarm(self, signum: int, frame: object) -> None:
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def run(self, function: Callable[[], Any], delay: float) -> tuple[Any, BaseException | None]:
        try:
            try:
                self.armed = True
                signal.setitimer(signal.ITIMER_REAL, delay)
                return call(function)
            finally:
                self.armed = False
                signal.setitimer(signal.ITIMER_REAL, 0)
        except KeyboardInterrupt as exc:
            return None, exc

    def close(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.previous)


class Child:
    """A long-lived second process counting on the same storage."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(CHILD), json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )

    def ask(self, command: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise Defect(f"the second process died (status {self.process.wait(10)}) on {command}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


class World:
    """One gateway's storage and everything around it; see the module docstring."""

    def __init__(self, name: str, tmp_path: Path, redis_server: Any, request: Any) -> None:
        self.name = name
        self.redis = redis_server  # tests/conftest.py's RedisServer
        self.redis_url: str = redis_server.url
        self.server: Any = None
        self._server_storage: Any = None
        self._child: Child | None = None
        self.env: dict[str, str] = {}
        if name == "memory":
            self.url: str | None = None
            self.gateway: Any = open_gateway("memory://")
            self.spec: dict[str, Any] | None = None
        elif name == "sqlite":
            self.url = f"sqlite:///{tmp_path / 'model.sqlite3'}"
            self.gateway = open_gateway(self.url)
            self.spec = {"url": self.url}
        elif name == "serve":
            self._served = f"sqlite:///{tmp_path / 'served.sqlite3'}"
            self._start_server(0)
            self._datastore(SERVE_PROJECT, self.server.emulator_host)
        elif name == "firestore":
            emulator = request.getfixturevalue("firestore_emulator")
            self._datastore(emulator.project, emulator.host)
        else:
            raise ValueError(f"unknown gateway {name!r}")

    def _datastore(self, project: str, host: str) -> None:
        from gds_counter.gateway.datastore import DatastoreGateway

        namespace = f"t-{uuid.uuid4().hex}"
        self.gateway = DatastoreGateway(project, namespace=namespace, emulator_host=host)
        self.url = f"datastore://{project}?namespace={namespace}"
        self.env = {"DATASTORE_EMULATOR_HOST": host}
        self.spec = {"project": project, "namespace": namespace, "host": host}

    # --- gds-counter serve ---------------------------------------------------------

    def _start_server(self, port: int) -> None:
        from gds_counter.server import Server

        self._server_storage = open_gateway(self._served)
        self.server = Server(self._server_storage, "127.0.0.1", port).start()

    def restart_server(self, grace: float) -> None:
        """Stop ``gds-counter serve`` (requests under way get ``grace``
        seconds), close its storage, and start a new one on the same file
        and port: what a redeploy does. Its transactions in progress are
        lost with it."""
        port = self.server.port
        self.server.stop(grace)
        self._server_storage.close()
        self._start_server(port)

    # --- Redis -----------------------------------------------------------------------------

    def snapshot_redis(self) -> None:
        import redis

        redis.Redis(port=self.redis.port, socket_timeout=5).save()

    def restart_redis(self, restore: bool) -> bool:
        """Kill redis-server and start it again on the same port: empty, or
        (``restore``) from the last snapshot, if one was saved. True if it
        started from a snapshot."""
        self.redis.stop()
        snapshot = Path(self.redis.directory) / "dump.rdb"
        kept = snapshot.with_suffix(".kept")
        if snapshot.exists():
            snapshot.replace(kept)  # redis-server loads dump.rdb when it starts
        if restore and kept.exists():
            kept.replace(snapshot)
        self.redis.start()
        return restore and snapshot.exists()

    # --- a second process, the command -------------------------------------------

    @property
    def child(self) -> Child:
        if self._child is None:
            assert self.spec is not None
            self._child = Child(self.spec)
        return self._child

    def rollup(self, real_command: bool) -> set[str]:
        """Refresh every counter's rollup: ``gds-counter rollup`` itself, or
        (and always on memory://, which no other process can reach) the
        library function the command runs. Returns the names of the
        counters it did not write for the one documented reason (their
        rollups already list twice ``MAX_CLAIMS`` claims made within a
        claim's lifetime: the command names them and exits 1); any other
        failure, or a failure not named, is a defect."""
        if real_command and self.url is not None:
            run = subprocess.run(
                [sys.executable, "-m", "gds_counter", "--url", self.url, "rollup", "--json"],
                capture_output=True, text=True, timeout=120,
                env={**os.environ, **self.env, "PYTHONPATH": os.pathsep.join(sys.path)},
            )
            named = [line for line in run.stderr.splitlines() if "rollup not written" in line]
            result: dict[str, Any] = json.loads(run.stdout) if run.stdout.strip() else {}
            if run.returncode != (1 if named else 0) or len(named) != result.get("failed", -1):
                raise Defect(f"gds-counter rollup exited {run.returncode}: {run.stdout} {run.stderr[-2000:]}")
            return _held_back(named)
        gateway = self.gateway
        names = plan.run(counter_names_plan(PHP_ARTICLE, gateway.namespace), gateway)
        rolled = plan.run(rollup_all_plan(  # forced, as the command's is: not paced like a reader's
            names, lambda name: ShardedCounter(name, layout=PHP_ARTICLE, gateway=gateway), 0.0, forced=True), gateway)
        if rolled.writes.failed != len(rolled.writes.not_written):
            raise Defect(f"the rollup failed to write {rolled.writes.failed} rollups, naming {rolled.writes.not_written}")
        return _held_back(rolled.writes.not_written)

    # --- PHP's writer ------------------------------------------------------------------

    def php_increment(self, target: str, shard: int) -> None:
        """The article's PHP ``increment()`` on shard ``shard`` (PHP picks
        it at random from 1..NUM_SHARDS; here NUM_SHARDS is 40): fetch it
        by name, add 1 or create it with 1, upsert with no transaction,
        ``count`` unindexed (as ``tests/counter/test_php_interop.py``)."""
        key = Key.of(PHP_KIND, f"{target}_{shard}", namespace=self.gateway.namespace)
        [found] = self.gateway.lookup([key])
        count = int(found.properties["count"]) + 1 if found is not None else 1
        self.gateway.commit([Upsert(RawEntity(key, {"target": target, "count": count}, frozenset({"count"})))])

    def close(self) -> None:
        if self._child is not None:
            self._child.close()
        self.gateway.close()
        if self.server is not None:
            self.server.stop(1.0)
        if self._server_storage is not None:
            self._server_storage.close()


def in_thread(function: Callable[[], Any]) -> tuple[threading.Thread, list[tuple[Any, BaseException | None]]]:
    """Start ``function`` in a thread; the list gets its ``call`` outcome."""
    out: list[tuple[Any, BaseException | None]] = []
    thread = threading.Thread(target=lambda: out.append(call(function)), daemon=True)
    thread.start()
    return thread, out


#: Why a forced rollup may leave a counter (``counter.rollup._held_back``).
_HELD_BACK = re.compile(r"'([^']+)': its rollup lists \d+ claims made within ")


def _held_back(lines: Sequence[str]) -> set[str]:
    """The counters ``lines`` (the rollup's ``not_written``, or the
    command's error lines) name as held back by their claims; a line that
    gives another reason is a defect."""
    names = set()
    for line in lines:
        found = _HELD_BACK.search(line)
        if found is None:
            raise Defect(f"a rollup was not written: {line}")
        names.add(found.group(1))
    return names
