"""Helpers shared by the benchmarks: storage to run on, the baselines
(the PHP article's algorithm, the Google article's ndb counter, raw client
commits), the environment record, tables, JSON and progress bars.

The load runner is the product's (``gds_counter.load``, which the workshop
and the reliability tests use too), the emulators come from
``gds_counter.emulators``, and the optional-matplotlib figure helper
(``new_figure``) lives in ``gds_counter.demo``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import itertools
import json
import os
import platform
import random
import shlex
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
from gds_counter.gateway.base import Gateway, run_query_all
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.query import Query
from gds_counter.gateway.values import RawEntity
from gds_counter.gds.store import Store

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
REPO = HERE.parent

BACKENDS = ("sqlite", "datastore", "firestore")
EMULATED = ("datastore", "firestore")

_PACKAGES = (
    "gds-counter", "google-cloud-datastore", "google-cloud-ndb", "google-api-core", "grpcio",
    "protobuf", "tqdm", "matplotlib",
)


# --- storage -------------------------------------------------------------------------


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
        saved = {name: os.environ.get(name) for name in ("DATASTORE_EMULATOR_HOST", "DATASTORE_PROJECT_ID")}
        os.environ["DATASTORE_EMULATOR_HOST"] = self.location
        os.environ["DATASTORE_PROJECT_ID"] = self.project
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


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


# --- baseline (a): the PHP article's CounterShardDS, ported literally ------------------


class PhpArticleCounter:
    """The PHP article's ``CounterShardDS`` line by line, on our Store.

    ``increment()``: pick a shard 1..NUM_SHARDS at random, ``fetchByName``
    it, add one (or create it with 1), ``upsert`` it with NO transaction,
    then ``getCount()`` by the GQL query on ``target``. Two writers that read
    the same shard before either writes both store old+1: one increment is
    lost. That loss is what the benchmark measures.

    One instance per thread: a Store remembers its last query.
    """

    def __init__(self, target_type: str, target_id: Any, num_shards: int, gateway: Gateway) -> None:
        self.target = f"{target_type}_{target_id}"
        self.num_shards = num_shards
        self.store = Store(CounterShardEntity, gateway)

    def increment(self) -> int:
        shard_num = random.randint(1, self.num_shards)
        shard = self.store.fetch_by_name(f"{self.target}_{shard_num}")
        if shard is None:
            shard = self.store.create_entity({"target": self.target, "count": 0})
            shard.set_key_name(f"{self.target}_{shard_num}")
        shard.count = int(shard.count) + 1
        self.store.upsert(shard)
        return self.get_count()

    def get_count(self) -> int:
        shards = self.store.fetch_all(
            f"SELECT * FROM {CounterShardEntity.kind()} WHERE target = @target", {"target": self.target}
        )
        return sum(int(shard.count) for shard in shards)


# --- baseline (b): the Google article's general counter, with google-cloud-ndb ----------

_ndb_models: dict[str, Any] = {}
_ndb_lock = threading.Lock()


def ndb_models() -> dict[str, Any]:
    """The article's two models, defined once per process (ndb keeps a
    global kind registry) and only when ndb is used."""
    with _ndb_lock:
        if not _ndb_models:
            from google.cloud import ndb

            class GeneralCounterShardConfig(ndb.Model):
                num_shards = ndb.IntegerProperty(default=20)

            class GeneralCounterShard(ndb.Model):
                count = ndb.IntegerProperty(default=0)

            _ndb_models.update(config=GeneralCounterShardConfig, shard=GeneralCounterShard, ndb=ndb)
        return _ndb_models


class NdbGeneralCounter:
    """The Google article's Python sharded counter on google-cloud-ndb, as a
    Python user would write it today: ``get_or_insert`` the config, then a
    ``@ndb.transactional`` read-modify-write of one random shard; the total
    is a ``get_multi`` of every shard key. The article's memcache calls are
    left out (there is no memcache here); nothing else is changed."""

    def __init__(self, spec: BackendSpec) -> None:
        from google.auth.credentials import AnonymousCredentials

        models = ndb_models()
        self.ndb = models["ndb"]
        self.config_model = models["config"]
        self.shard_model = models["shard"]
        with spec.client_environment():
            self.client = self.ndb.Client(project=spec.project, credentials=AnonymousCredentials(),
                                          namespace=spec.namespace)

    def _context(self) -> Any:
        # A context per call, as a web app has one per request; caches off
        # (the article cached only totals, in memcache).
        return self.client.context(cache_policy=False, global_cache_policy=False)

    def _shard_key(self, name: str, index: int) -> Any:
        return self.ndb.Key(self.shard_model, f"shard-{name}-{index}")

    def set_num_shards(self, name: str, num_shards: int) -> None:
        with self._context():
            self.config_model(id=name, num_shards=num_shards).put()

    def increment(self, name: str) -> None:
        with self._context():
            config = self.config_model.get_or_insert(name)
            self._add_one(name, config.num_shards)

    def _add_one(self, name: str, num_shards: int) -> None:
        @self.ndb.transactional()
        def add() -> None:
            key = self._shard_key(name, random.randint(0, num_shards - 1))
            shard = key.get() or self.shard_model(key=key)
            shard.count += 1
            shard.put()

        add()

    def get_count(self, name: str) -> int:
        with self._context():
            config = self.config_model.get_or_insert(name)
            keys = [self._shard_key(name, index) for index in range(config.num_shards)]
            return sum(shard.count for shard in self.ndb.get_multi(keys) if shard is not None)


# --- baseline (c): the raw ceiling -------------------------------------------------------

RAW_KIND = "RawCeiling"


def raw_writer(spec: BackendSpec, gateway: Gateway, *, google_client: bool) -> Callable[[], Callable[[], None]]:
    """Writers that each commit one new entity per call, with no read and no
    transaction: as many plain commits as the server takes, which no counter
    can beat. ``google_client``: through google-cloud-datastore's own
    ``Client.put`` (emulators only); else one ``gateway.commit`` per call
    (on the emulators that is the same library's GAPIC layer with raw
    protobufs, the lightest client there is)."""
    if google_client:
        from google.cloud import datastore

        with spec.client_environment():  # the client refuses credentials under an emulator
            client = datastore.Client(project=spec.project, namespace=spec.namespace)

        def make() -> Callable[[], None]:
            prefix, serial = uuid.uuid4().hex[:8], itertools.count()

            def put() -> None:
                entity = datastore.Entity(client.key(RAW_KIND, f"{prefix}-{next(serial)}"),
                                          exclude_from_indexes=("count",))
                entity["count"] = 1
                client.put(entity)

            return put

        return make

    def make_local() -> Callable[[], None]:
        prefix, serial = uuid.uuid4().hex[:8], itertools.count()

        def put() -> None:
            key = Key.of(RAW_KIND, f"{prefix}-{next(serial)}", namespace=spec.namespace)
            gateway.commit([Upsert(RawEntity(key, {"count": 1}, {"count"}))])

        return put

    return make_local


def raw_count(gateway: Gateway, namespace: str) -> int:
    """How many raw-ceiling entities landed (keys-only query)."""
    return sum(1 for _ in run_query_all(gateway, Query(kind=RAW_KIND, namespace=namespace, keys_only=True)))


# --- records -------------------------------------------------------------------------------


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
