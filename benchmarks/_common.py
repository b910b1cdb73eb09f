"""Helpers shared by the benchmarks: storage to run on, the baselines
(the PHP article's algorithm on our Store and on Google's raw client, raw
puts, raw sqlite3 upserts), Google's client with its RPCs counted, the
environment record, tables, JSON and progress bars.

The load runner is the product's (``gds_counter._load``, which the workshop
and the reliability tests use too), the emulators come from
``gds_counter.emulators``, and the optional-matplotlib figure helper
(``new_figure``) lives in ``gds_counter._demo``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import itertools
import json
import os
import platform
import random
import shlex
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence, cast

import attrs

from gds_counter.counter import CounterShardEntity
from gds_counter.emulators import EmulatorKind, start_emulator
from gds_counter.gateway.base import Gateway
from gds_counter.gateway.embedded._connections import BUSY_TIMEOUT_S
from gds_counter.gateway.stats import Stats
from gds_counter.gds.store import Store

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
REPO = HERE.parent

BACKENDS = ("sqlite", "datastore", "firestore")
EMULATED = ("datastore", "firestore")

_PACKAGES = (
    "gds-counter", "google-cloud-datastore", "google-cloud-firestore", "google-cloud-ndb", "google-api-core", "grpcio",
    "protobuf", "tqdm", "matplotlib",
)


# --- storage -------------------------------------------------------------------------


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """``values`` set in the environment while in use, then as they were."""
    old = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in old.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@attrs.frozen
class BackendSpec:
    """Where one run counts, as plain data so a child process can reopen it.

    ``sqlite``: ``location`` is a file path. Emulators: ``location`` is the
    emulator's host:port; ``namespace`` keeps each run's data apart.
    """

    kind: str
    location: str
    project: str = ""
    namespace: str = ""

    def open_gateway(self) -> Gateway:
        if self.kind == "sqlite":
            from gds_counter.gateway.embedded import EmbeddedGateway

            return EmbeddedGateway(self.location, namespace=self.namespace)
        from gds_counter.gateway.datastore import DatastoreGateway

        return DatastoreGateway(project=self.project, namespace=self.namespace, emulator_host=self.location)

    @contextlib.contextmanager
    def client_environment(self) -> Iterator[None]:
        """``DATASTORE_EMULATOR_HOST`` for Google's own clients (ndb, raw
        google-cloud-datastore), set only while they are in use."""
        if self.kind not in EMULATED:
            raise ValueError(f"Google's clients need an emulator, not {self.kind!r}")
        with environ(DATASTORE_EMULATOR_HOST=self.location, DATASTORE_PROJECT_ID=self.project):
            yield


class Backend:
    """A started storage backend; ``fresh()`` gives each run its own data."""

    def __init__(self, kind: str, folder: str, emulator: Any | None = None) -> None:
        self.kind = kind
        self.folder = folder
        self.emulator = emulator

    def fresh(self, label: str) -> BackendSpec:
        tag = f"{label}-{uuid.uuid4().hex[:8]}"
        if self.emulator is None:
            return BackendSpec("sqlite", os.path.join(self.folder, f"{tag}.sqlite3"))
        return BackendSpec(self.kind, self.emulator.host, self.emulator.project, tag)


@contextlib.contextmanager
def open_backends(kinds: Sequence[str]) -> Iterator[dict[str, Backend]]:
    """Start what each backend needs (emulators through gds_counter.emulators)
    and stop it all at the end."""
    with contextlib.ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="gds-bench-"))
        backends: dict[str, Backend] = {}
        for kind in kinds:
            if kind == "sqlite":
                backends[kind] = Backend(kind, folder)
            elif kind in EMULATED:
                backends[kind] = Backend(kind, folder, stack.enter_context(start_emulator(cast(EmulatorKind, kind))))
            else:
                raise SystemExit(f"unknown backend {kind!r}; choose from {', '.join(BACKENDS)}")
        yield backends


# --- the PHP article's CounterShardDS, ported literally ------------------------------------
#
# CounterShardDS.php (the article's seed text), line by line:
#
#   getCount():  $this->data->query('SELECT * FROM ' . kind . ' WHERE target = @target',
#                                    ['target' => $this->target]);
#                sum of $shard->count over $this->data->fetchAll()
#   increment(): $shardNum = rand(1, self::NUM_SHARDS);
#                $curCount = $this->getCount();
#                $shard = $this->data->fetchByName($this->target . '_' . $shardNum);
#                if ($shard == null) $shard = new CounterShardEntity([... 'count' => 0]);
#                $shard->count++;
#                $this->data->upsert($shard);          // no transaction
#                return $curCount + 1;
#
# Two writers that read the same shard before either writes both store
# old + 1: one increment is lost. That loss is what the benchmarks report.

PHP_KIND = CounterShardEntity.kind()

_shard_classes: dict[str, type[CounterShardEntity]] = {}


def shard_entity_class(prefix: str) -> type[CounterShardEntity]:
    """``CounterShardEntity`` with ``KIND_PFX = prefix`` (PHP's constant for
    this), one class per prefix: ``CounterShardDS(..., store=Store(cls, gw))``
    then counts in kind ``prefix + "IK_CounterShardEntity"``."""
    if prefix not in _shard_classes:
        _shard_classes[prefix] = type(f"{prefix}CounterShardEntity", (CounterShardEntity,), {"KIND_PFX": prefix})
    return _shard_classes[prefix]


class PhpArticleCounter:
    """The PHP article's ``CounterShardDS`` on our php-gds port (``Store``):
    the same calls as the PHP code makes on php-gds's Store. One instance per
    thread: a Store remembers its last query, as php-gds's does."""

    def __init__(self, target_type: str, target_id: Any, num_shards: int, gateway: Gateway) -> None:
        self.target = f"{target_type}_{target_id}"
        self.num_shards = num_shards
        self.store = Store(CounterShardEntity, gateway)

    def get_count(self) -> int:
        self.store.query(f"SELECT * FROM {PHP_KIND} WHERE target = @target", {"target": self.target})
        shards = self.store.fetch_all()
        return sum(int(shard.count) for shard in shards)

    def increment(self) -> int:
        shard_num = random.randint(1, self.num_shards)
        cur_count = self.get_count()
        shard = self.store.fetch_by_name(f"{self.target}_{shard_num}")
        if shard is None:
            shard = CounterShardEntity({"target": self.target, "shardNum": shard_num, "count": 0})
        shard.count = int(shard.count) + 1
        self.store.upsert(shard)
        return cur_count + 1


class PhpArticleClient:
    """The same algorithm written with google-cloud-datastore's own
    ``Client`` (the raw client: no mapper, no gateway of ours), as a Python
    developer would port the PHP file: the target query, a lookup by key
    name, and a blind non-transactional ``put`` of the shard as php-gds
    writes it (``target`` indexed, ``count`` excluded from indexes). A
    Client is thread-safe; one instance per thread is still cheap."""

    def __init__(self, client: Any, target_type: str, target_id: Any, num_shards: int, kind: str = PHP_KIND) -> None:
        from google.cloud import datastore

        self.datastore = datastore
        self.client = client
        self.target = f"{target_type}_{target_id}"
        self.num_shards = num_shards
        self.kind = kind

    def get_count(self) -> int:
        query = self.client.query(kind=self.kind)
        query.add_filter(filter=self.datastore.query.PropertyFilter("target", "=", self.target))
        return sum(int(shard["count"]) for shard in query.fetch())

    def increment(self) -> int:
        shard_num = random.randint(1, self.num_shards)
        cur_count = self.get_count()
        key = self.client.key(self.kind, f"{self.target}_{shard_num}")
        shard = self.client.get(key)
        if shard is None:
            shard = self.datastore.Entity(key, exclude_from_indexes=("count",))
            shard.update({"target": self.target, "count": 0})
        shard["count"] += 1
        self.client.put(shard)
        return cur_count + 1


# --- Google's client, with its RPCs counted -------------------------------------------------


class _CountingApi:
    """google-cloud-datastore's GAPIC layer, counting each RPC in a
    ``Stats`` the way our gateway counts its own (``rpcs``, ``entity_reads``
    per key looked up or entity a query returned, ``entity_writes`` per
    mutation), so the raw client's figures sit beside ours."""

    def __init__(self, api: Any, stats: Stats) -> None:
        self._api = api
        self._stats = stats

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)
        if name not in ("lookup", "run_query", "run_aggregation_query", "commit", "begin_transaction",
                        "rollback", "allocate_ids", "reserve_ids"):
            return method

        def call(*args: Any, request: Any = None, **kwargs: Any) -> Any:
            response = method(*args, request=request, **kwargs)
            reads = writes = 0
            if name == "lookup":
                reads = len(_field(request, "keys"))
            elif name == "run_query":
                reads = len(response.batch.entity_results)
            elif name == "commit":
                writes = len(_field(request, "mutations"))
            self._stats.record(name, reads=reads, writes=writes)
            return response

        return call


def _field(request: Any, name: str) -> Any:
    return request[name] if isinstance(request, dict) else getattr(request, name)


def google_client(spec: BackendSpec, stats: Stats | None = None) -> Any:
    """google-cloud-datastore's ``Client`` on an emulator, in the spec's
    namespace; with ``stats``, every RPC it sends is counted there."""
    from google.cloud import datastore

    with spec.client_environment():  # the client refuses credentials under an emulator
        client = datastore.Client(project=spec.project, namespace=spec.namespace)
    if stats is not None:
        client._datastore_api_internal = _CountingApi(client._datastore_api, stats)
    return client


class _CountingFirestoreApi:
    """google-cloud-firestore's GAPIC layer, counting each RPC in a
    ``Stats`` the way ``FirestoreGateway`` counts its own (``rpcs``;
    ``entity_reads`` per document asked for by ``BatchGetDocuments`` or
    listed by a page of ``ListDocuments``; ``entity_writes`` per write of a
    commit): what Firestore bills. Each page of ``list_documents`` is its
    own RPC, counted as the page is read."""

    _COUNTED = ("batch_get_documents", "commit", "list_documents", "run_query", "run_aggregation_query",
                "begin_transaction", "rollback", "batch_write")

    def __init__(self, api: Any, stats: Stats) -> None:
        self._api = api
        self._stats = stats

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._api, name)
        if name not in self._COUNTED:
            return method

        def call(*args: Any, request: Any = None, **kwargs: Any) -> Any:
            response = method(*args, request=request, **kwargs)
            if name == "list_documents":
                return self._pages(response)
            reads = len(_field(request, "documents")) if name == "batch_get_documents" else 0
            writes = len(_field(request, "writes")) if name in ("commit", "batch_write") else 0
            self._stats.record(name, reads=reads, writes=writes)
            return response

        return call

    def _pages(self, pager: Any) -> Iterator[Any]:
        for page in pager.pages:  # the first page came with the call; each next one is an RPC
            self._stats.record("list_documents", reads=len(page.documents))
            yield from page.documents


def firestore_client(host: str, project: str, database: str = "(default)", stats: Stats | None = None) -> Any:
    """google-cloud-firestore's ``Client`` on the native-mode emulator at
    ``host``, found as an app finds it (``FIRESTORE_EMULATOR_HOST``, set only
    while the client is made); with ``stats``, every RPC it sends is
    counted there."""
    from google.cloud import firestore

    with environ(FIRESTORE_EMULATOR_HOST=host):
        client = firestore.Client(project=project, database=database)
        api = client._firestore_api  # the channel is made now, while the variable is set
    if stats is not None:
        client._firestore_api_internal = _CountingFirestoreApi(api, stats)
    return client


# --- the ceilings ---------------------------------------------------------------------------

RAW_KIND = "RawPut"


def raw_put(client: Any, writer: int, entities: int, kind: str = RAW_KIND) -> Callable[[], None]:
    """One writer's op for the raw ceiling: ``Client.put`` of one entity of
    ``entities`` per commit, shaped like a PHP shard (``target`` indexed,
    ``count`` not), no read, no transaction. Writer ``i`` always writes
    entity ``i mod entities``, so writers of one process never share an
    entity: as many plain commits as the server takes, which no counter can
    beat."""
    from google.cloud import datastore

    key = client.key(kind, f"Raw_1_{writer % entities + 1}")
    serial = itertools.count(1)

    def put() -> None:
        entity = datastore.Entity(key, exclude_from_indexes=("count",))
        entity.update({"target": "Raw_1", "count": next(serial)})
        client.put(entity)

    return put


#: The raw SQLite ceiling's table: one row per shard.
SQLITE_TABLE = "shard"


def sqlite_connect(path: str) -> sqlite3.Connection:
    """A plain sqlite3 connection with the embedded engine's file settings:
    WAL, ``synchronous = FULL`` (a commit that returned survives a power
    cut), the same busy timeout, autocommit."""
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    conn.execute(f"CREATE TABLE IF NOT EXISTS {SQLITE_TABLE} (name TEXT PRIMARY KEY, count INTEGER NOT NULL)")
    return conn


def sqlite_upsert(conn: sqlite3.Connection, shards: int) -> Callable[[], None]:
    """One writer's op for the embedded ceiling: on its own connection, one
    autocommitted ``INSERT ... ON CONFLICT DO UPDATE SET count = count + 1``
    of a random shard row: the least SQLite work that counts an increment."""
    sql = (f"INSERT INTO {SQLITE_TABLE} (name, count) VALUES (?, 1) "
           "ON CONFLICT (name) DO UPDATE SET count = count + 1")
    names = [f"Raw_1_{n}" for n in range(1, shards + 1)]

    def upsert() -> None:
        conn.execute(sql, (random.choice(names),))

    return upsert


def sqlite_total(path: str) -> int:
    conn = sqlite_connect(path)
    try:
        return int(conn.execute(f"SELECT coalesce(sum(count), 0) FROM {SQLITE_TABLE}").fetchone()[0])
    finally:
        conn.close()


# --- what a run checks and pools ----------------------------------------------------------


class ReturnedTotals:
    """Checks every total a call returns (``increment()``, or a baseline's
    increment and read) against the increments this process had
    acknowledged before the call: a strongly consistent read can never be
    below that. ``wrap`` makes the op; ``stale``, ``checked`` and
    ``first_stale`` say what it found."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.acked = 0
        self.stale = 0
        self.checked = 0
        self.first_stale: str | None = None

    def wrap(self, increment: Callable[[], int]) -> Callable[[], None]:
        def op() -> None:
            before = self.acked
            total = increment()
            with self.lock:
                self.checked += 1
                if total < before + 1:
                    self.stale += 1
                    if self.first_stale is None:
                        self.first_stale = f"returned {total} after {before} acknowledged increments"
                self.acked += 1

        return op


def pooled(rows: list[dict[str, Any]], series: str, layout: str) -> float | None:
    """A series' rate over all its rounds: the calls that returned within
    the measured windows over the windows' time (a long run cut into
    alternating pieces)."""
    mine = [r for r in rows if r["series"] == series and r["layout"] == layout]
    window = sum(r["window_s"] for r in mine)
    return sum(r["in_window"] for r in mine) / window if window else None


# --- records -------------------------------------------------------------------------------


@attrs.frozen
class Layout:
    """Writers as processes x threads ("1x16", "4x4")."""

    processes: int
    threads: int

    @property
    def name(self) -> str:
        return f"{self.processes}x{self.threads}"


def git_commit() -> str | None:
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def environment() -> dict[str, Any]:
    versions: dict[str, str | None] = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "packages": versions,
        "git_commit": git_commit(),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def command_line(argv: Sequence[str] | None = None) -> str:
    args = list(sys.argv if argv is None else argv)
    script = Path(args[0])
    with contextlib.suppress(ValueError):
        args[0] = str(script.resolve().relative_to(REPO))
    return " ".join(shlex.quote(a) for a in ["python", *args])


def write_json(path: Path, payload: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n")
    return path


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str, int]]) -> str:
    """Rows as an aligned text table; ``columns`` are (key, heading, digits)."""
    cells = [[heading for _, heading, _ in columns]]
    cells += [[fmt(row.get(key), digits) for key, _, digits in columns] for row in rows]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    lines = ["  ".join(cell.rjust(width) if i else cell.ljust(width) for i, (cell, width) in enumerate(zip(line, widths)))
             for line in cells]
    lines.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(lines)


def progress(items: Iterable[Any], total: int, desc: str) -> Any:
    """A tqdm bar when tqdm is installed (the ``bench`` extra), else the items."""
    try:
        from tqdm import tqdm
    except ImportError:
        print(f"{desc}: {total} runs (install tqdm for a progress bar)", file=sys.stderr)
        return items
    return tqdm(items, total=total, desc=desc, unit="run", file=sys.stderr, dynamic_ncols=True)


def script_parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's argument parser: its docstring's first paragraph as
    the description, the whole docstring after the options."""
    return argparse.ArgumentParser(description=(doc or "").split("\n\n")[0], epilog=doc,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)


def parse_ints(text: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SystemExit(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SystemExit(f"expected positive whole numbers, got {text!r}")
    return values


def parse_choices(text: str, allowed: Sequence[str], what: str) -> list[str]:
    values = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [v for v in values if v not in allowed]
    if unknown or not values:
        raise SystemExit(f"unknown {what} {', '.join(unknown) or text!r}; choose from {', '.join(allowed)}")
    return values


# --- comparing with the previous run -------------------------------------------------------

#: Two consecutive runs must agree this closely on every goal ratio.
AGREEMENT = 0.20


def relative(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def verdict(met: bool | None) -> str:
    return "not run" if met is None else "met" if met else "MISSED"


def load_previous(args: argparse.Namespace, path: Path, benchmark: str,
                  settings: Sequence[str]) -> tuple[dict[str, Any] | None, str]:
    """The run to compare with, and a line saying which (or why none):
    ``args.compare`` when given, else ``path`` (the results folder's last
    run) when it is a run of ``benchmark`` made with the same ``settings``
    (names of ``args``). ``--no-compare`` compares with nothing."""
    if args.no_compare:
        return None, "not compared with another run (--no-compare)"
    path = args.compare or path
    if not path.exists():
        return None, f"no previous run to compare with ({relative(path)} does not exist)"
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return None, f"could not read {relative(path)}: {exc}"
    if previous.get("benchmark") != benchmark:
        return None, f"{relative(path)} is not a goals run of this benchmark; not compared"
    mine = {k: getattr(args, k, None) for k in settings}
    theirs = {k: previous.get("settings", {}).get(k) for k in settings}
    if mine != theirs and args.compare is None:
        return None, f"the previous run ({relative(path)}) used other settings ({theirs}); not compared"
    when = previous.get("environment", {}).get("when")
    return previous, f"compared with {relative(path)} ({when}, {previous.get('command')})"


def agreement(ratios: Sequence[dict[str, Any]], previous: Sequence[dict[str, Any]] | None,
              keys: Sequence[str], limit: float = AGREEMENT) -> list[dict[str, Any]]:
    """How far each ratio (``"ratio"``, told apart by ``keys``) moved from the
    same ratio in ``previous``: ``apart`` = larger / smaller - 1, and whether
    that is within ``limit``. Ratios either run lacks are left out."""
    if previous is None:
        return []
    before = {tuple(r.get(k) for k in keys): r.get("ratio") for r in previous}
    out = []
    for r in ratios:
        old = before.get(tuple(r.get(k) for k in keys))
        if r["ratio"] is None or not old:
            continue
        apart = max(r["ratio"], old) / min(r["ratio"], old) - 1
        out.append({**{k: r[k] for k in keys}, "previous": old, "this": r["ratio"],
                    "apart": round(apart, 3), "agree": apart <= limit})
    return out
