"""``gds-counter demo``: the workshop in one command, with no cloud account.

Four steps, each measured on the spot:

1. one counter entity under a write-rate limit (a MODEL of Datastore's
   per-entity limit, from the embedded gateway's ``entity_writes_per_second``);
2. the same load spread over 20 shards;
3. the server-side increment (one commit, no read);
4. what reading costs: a batch lookup, the PHP article's query, the cache.

Library code here never prints: the narrative goes through the ``write``
function the caller passes (the CLI passes ``print``), and diagnostics go to
``logging``. The load comes from ``gds_counter._load`` (the one load runner,
which the benchmarks and the reliability tests use too), an emulator from
``gds_counter.emulators``; the optional-matplotlib helper (``new_figure``) is
shared with ``benchmarks/``. The demo is product code: it never imports test
tooling (``gds_counter.testing``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import logging
import math
import os
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import attrs

from gds_counter._load import LoadResult, run_load
from gds_counter.counter import CountCache, CounterShardDS, get_counts
from gds_counter.counter.runtime import Runtime
from gds_counter.emulators import Emulator, EmulatorKind, start_emulator
from gds_counter.errors import BadValueError, GDSError
from gds_counter.gateway.base import Gateway

log = logging.getLogger(__name__)

Write = Callable[[str], None]

#: The default rate of the write-limit model, in writes per second per entity.
#: Datastore's documented sustained figure is about one per second; 5 keeps
#: the demo short while keeping the effect plain.
MODEL_WRITES_PER_SECOND = 5.0
DEMO_SHARDS = 20


# --- the plot helper (shared with benchmarks/) ---------------------------------------


def new_figure(width: float = 8.0, height: float = 4.5) -> tuple[Any, Callable[[Path], None]] | str:
    """A matplotlib Figure and a function that saves it as PNG, or a message
    saying why there is none (matplotlib is the optional ``bench`` extra).

    Uses the object API with the Agg canvas, so no global pyplot state or
    display backend is touched.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return 'matplotlib is not installed, so no plot was drawn (pip install "gds-counter[bench]")'
    figure = Figure(figsize=(width, height), layout="constrained")

    def save(path: Path) -> None:
        # No mkdir: a mistyped folder must fail, not appear (callers check
        # the folder first, e.g. ``check_plot_path``).
        FigureCanvasAgg(figure).print_png(str(path))

    return figure, save


# --- the demo ---------------------------------------------------------------------------


def _positive(what: str, *, whole: bool = False) -> Callable[[Any, Any, Any], None]:
    def check(_instance: Any, _attribute: Any, value: Any) -> None:
        kind = int if whole else (int, float)
        if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value <= 0:
            raise BadValueError(f"the demo's {what} must be a positive {'whole ' if whole else ''}number, "
                                f"got {value!r}")

    return check


@attrs.frozen
class Settings:
    """Writer threads, seconds per load step, the model's writes per second
    per entity, and the shards of step 2; each must be positive."""

    writers: int = attrs.field(default=8, validator=_positive("writers", whole=True))
    seconds: float = attrs.field(default=4.0, validator=_positive("seconds"))
    rate: float = attrs.field(default=MODEL_WRITES_PER_SECOND, validator=_positive("rate"))
    shards: int = attrs.field(default=DEMO_SHARDS, validator=_positive("shards", whole=True))

    @classmethod
    def quick(cls) -> "Settings":
        return cls(writers=8, seconds=1.5)


@attrs.define
class Step:
    """One measured load step of the demo."""

    title: str
    shards: int
    strategy: str
    load: LoadResult
    final_count: int
    rpcs: int
    reads: int
    writes: int
    #: Conflicting attempts the counter retried (each on another shard, when there is one).
    retries: int = 0

    @property
    def counted_ok(self) -> bool:
        return self.final_count == self.load.ok

    def per_increment(self, value: int) -> float:
        return value / self.load.ok if self.load.ok else float("nan")


@attrs.define
class DemoResult:
    settings: Settings = attrs.field(factory=Settings)
    #: Where it counted, as the first line of the narrative says.
    storage: str = ""
    #: The write-rate model's writes per second per entity; None on an emulator.
    model_rate: float | None = None
    steps: list[Step] = attrs.field(factory=list)
    reads: list[tuple[str, int, int]] = attrs.field(factory=list)  # (what, rpcs, entity reads)
    plot: Path | None = None
    plot_message: str | None = None

    @property
    def all_counted(self) -> bool:
        return all(step.counted_ok for step in self.steps)


class _Storage:
    """Where the demo counts: a temporary SQLite file with the write-rate
    model, or an official emulator (real contention, no model)."""

    def __init__(self, emulator: Emulator | None, rate: float, folder: str) -> None:
        self.emulator = emulator
        self.rate = rate
        self.folder = folder

    @property
    def label(self) -> str:
        if self.emulator is None:
            return f"embedded SQLite with the write-rate MODEL ({self.rate:g} writes/s per entity)"
        return f"the official {self.emulator.kind} emulator at {self.emulator.host}"

    def open(self, count: int = 1) -> list[Gateway]:
        """``count`` gateways on one fresh place (a new file, or a new
        namespace on the emulator): one per app instance that counts there,
        each choosing shards as a process of its own would (a ``Runtime``
        of its own, with its own dice and an instance number: 1, 2, ... as
        processes started together have consecutive ids)."""
        name = uuid.uuid4().hex[:8]
        gateways: list[Gateway]
        if self.emulator is not None:
            emulator = self.emulator
            gateways = [emulator.gateway(namespace=f"demo-{name}") for _ in range(count)]
        else:
            from gds_counter.gateway.embedded import EmbeddedGateway

            path = os.path.join(self.folder, f"demo-{name}.sqlite3")
            gateways = [EmbeddedGateway(path, entity_writes_per_second=self.rate) for _ in range(count)]
        for number, gateway in enumerate(gateways, 1):
            Runtime(instance=number).install(gateway)
        return gateways


@contextlib.contextmanager
def _storage(emulator: str | None, rate: float) -> Iterator[_Storage]:
    with tempfile.TemporaryDirectory(prefix="gds-counter-demo-") as folder:
        if emulator is None:
            yield _Storage(None, rate, folder)
            return
        # (not "firestore-native": the workshop's counters are Datastore's)
        kind: EmulatorKind = "datastore" if emulator == "datastore" else "firestore"
        if emulator != kind:
            raise BadValueError(f"emulator must be 'datastore' or 'firestore', got {emulator!r}")
        with start_emulator(kind) as emu:
            yield _Storage(emu, rate, folder)


def _load_step(storage: _Storage, settings: Settings, title: str, shards: int, strategy: str) -> Step:
    """Each writer thread stands for an app instance of its own (as each
    PHP request is), with a gateway of its own on the same storage: writers
    sharing one gateway would have their overlapping writes combined
    (``counter._combined``), which hides the contention the workshop
    is about. Each gateway also chooses shards as a separate process would
    (``_Storage.open``): instances sharing this process's shard order would
    all begin on one shard and meet there, hiding what sharding does."""
    gateways = storage.open(settings.writers)
    try:
        counters = iter([
            CounterShardDS("Workshop", shards, num_shards=shards, gateway=gateway, strategy=strategy)
            for gateway in gateways
        ])
        load = run_load(lambda: next(counters).add, writers=settings.writers, duration=settings.seconds)
        stats: collections.Counter[str] = collections.Counter()
        for gateway in gateways:
            stats.update(gateway.stats.snapshot())
        final = CounterShardDS("Workshop", shards, num_shards=shards, gateway=gateways[0]).get_count()
    finally:
        for gateway in gateways:
            gateway.close()
    return Step(title, shards, strategy, load, final, stats["rpcs"], stats["entity_reads"], stats["entity_writes"],
                stats["counter.retries"])


def _report_step(write: Write, step: Step) -> None:
    load = step.load
    failures = ", ".join(f"{n} {name}" for name, n in load.errors.most_common()) or "none"
    write(f"   increments counted: {load.ok} in {load.elapsed:.1f} s = {load.rate:.1f}/s")
    write(f"   increments refused (raised to the caller, never counted): {load.failed} ({failures})")
    write(f"   conflicting attempts retried with backoff: {step.retries}")
    write(
        f"   per counted increment: {step.per_increment(step.rpcs):.2f} RPCs, "
        f"{step.per_increment(step.reads):.2f} entity reads, {step.per_increment(step.writes):.2f} entity writes"
    )
    verdict = "equal, nothing lost" if step.counted_ok else "MISMATCH"
    write(f"   final count {step.final_count} vs increments counted {load.ok}: {verdict}")


def _read_costs(storage: _Storage, shards: int) -> list[tuple[str, int, int]]:
    """(what, RPCs, entity reads) for each way of reading a total."""
    [gateway] = storage.open()
    rows: list[tuple[str, int, int]] = []
    try:
        counter = CounterShardDS("Workshop", "reads", num_shards=shards, gateway=gateway,
                                 strategy="transactional", cache=CountCache(ttl=60))
        for _ in range(shards):  # roughly one write per shard; pace them for the model
            _retrying(counter.add)
        plain = CounterShardDS("Workshop", "reads", num_shards=shards, gateway=gateway)  # no cache
        many = [CounterShardDS("Workshop", f"page-{i}", gateway=gateway) for i in range(30)]

        def measure(what: str, read: Callable[[], Any]) -> None:
            gateway.stats.reset()
            read()
            snap = gateway.stats.snapshot()
            rows.append((what, snap["rpcs"], snap["entity_reads"]))

        measure("lookup: one batch get of every shard key + the config key", lambda: _uncached(counter))
        measure("query: the PHP article's GQL (SELECT * ... WHERE target = @target)",
                lambda: plain.get_count(method="query"))
        counter.get_count()  # fill the cache
        measure("cached: get_count() again within the cache's 60 s", counter.get_count)
        measure("get_counts() of 30 counters (a page of like buttons)", lambda: get_counts(many, use_cache=False))
    finally:
        gateway.close()
    return rows


def _uncached(counter: CounterShardDS) -> int:
    return get_counts([counter], use_cache=False)[0]


def _retrying(op: Callable[[], Any], tries: int = 50) -> None:
    """Setup writes under the write-rate model: wait and retry until counted."""
    for _ in range(tries):
        try:
            op()
            return
        except GDSError:
            time.sleep(0.05)
    op()


def check_plot_path(plot: str | os.PathLike[str]) -> Path:
    """The plot's path, refused (``BadValueError``, naming the absolute path)
    when it names a directory or a folder that does not exist: the demo
    creates no directories, so a typo cannot leave new ones behind."""
    path = Path(os.path.abspath(plot))
    if path.is_dir():
        raise BadValueError(f"plot path {os.fspath(plot)!r} is the directory {path}; name a .png file")
    if not path.parent.is_dir():
        raise BadValueError(
            f"plot path {os.fspath(plot)!r}: the directory {path.parent} does not exist (the demo creates none)"
        )
    return path


def _plot(result: DemoResult, path: Path) -> None:
    made = new_figure(10, 4.8)
    if isinstance(made, str):
        result.plot_message = made
        return
    figure, save = made
    left, right = figure.subplots(1, 2)
    steps = result.steps
    labels = [f"{s.shards} shard{'s' if s.shards > 1 else ''}\n{s.strategy}" for s in steps]
    bars = left.bar(labels, [s.load.rate for s in steps], color=["#c0392b", "#2980b9", "#27ae60"][: len(steps)])
    left.bar_label(bars, fmt="%.1f/s", padding=2)
    if result.model_rate is not None:
        left.axhline(result.model_rate, color="#333333", linestyle="--", linewidth=1,
                     label=f"modelled limit of one entity: {result.model_rate:g} writes/s")
        left.legend(loc="upper left", fontsize="small")
    left.set_ylabel("increments counted per second")
    left.set_title("Writing: increments counted per second")
    left.margins(y=0.15)
    bars = right.bar(labels, [s.per_increment(s.rpcs) for s in steps], color="#7f8c8d")
    right.bar_label(bars, fmt="%.2f", padding=2)
    right.set_ylabel("RPCs per counted increment")
    right.set_title("Cost: RPCs per counted increment")
    right.margins(y=0.15)
    settings = result.settings
    figure.suptitle(
        f"gds-counter demo: one counter under {settings.writers} writer threads, {settings.seconds:g} s per step\n"
        f"on {result.storage}"
    )
    save(path)
    result.plot = path


def run_demo(
    write: Write,
    *,
    quick: bool = False,
    emulator: str | None = None,
    plot: str | os.PathLike[str] | None = "gds_counter_demo.png",
    settings: Settings | None = None,
) -> DemoResult:
    """Run the workshop's four steps, narrating through ``write``.

    ``emulator`` None counts in a temporary SQLite file with the write-rate
    model; "datastore" or "firestore" starts that official emulator instead.
    ``plot`` None skips the picture; a plot path whose folder does not exist
    is refused (``BadValueError``) before anything runs. Returns the
    measurements; raises nothing for contention (refused increments are part
    of the lesson).
    """
    plot_path = check_plot_path(plot) if plot is not None else None
    settings = settings or (Settings.quick() if quick else Settings())
    result = DemoResult(settings=settings)
    with _storage(emulator, settings.rate) as storage:
        result.storage = storage.label
        result.model_rate = settings.rate if storage.emulator is None else None
        write(f"gds-counter demo on {storage.label}")
        write(f"{settings.writers} writer threads, {settings.seconds:g} s per step. Each stands for an app instance "
              "of its own: it has")
        write("a gateway of its own (writers sharing one would have their overlapping writes combined), and")
        write("it chooses shards as a separate process does (from a starting shard and with dice of its own).")
        write("")
        if emulator is None:
            write(
                f"NOTE: the limit below is a MODEL. The embedded gateway refuses a write to an entity "
                f"written less than 1/{settings.rate:g} s ago, as a stand-in for Datastore's limit of "
                "about one sustained write per second per entity. Real numbers come from the emulators "
                "(--emulator firestore) and from benchmarks/contention.py."
            )
            write("")

        write("1. One entity. Every writer updates the same counter entity, in a transaction;")
        write("   a collision is retried with backoff, and with one shard every retry hits that entity again.")
        one = _load_step(storage, settings, "one entity", 1, "transactional")
        result.steps.append(one)
        _report_step(write, one)
        write("")

        write(f"2. The same load on {settings.shards} shards; the total is the sum of the shards. Each instance "
              "starts")
        write("   at a place of its own on the ring of shards (the instances' starts are spread around it) and,")
        write("   while alone, writes the shards from there in turn. Once it meets another instance (a conflict,")
        write("   or another's count in its shard), it keeps to its first free shards, and leaves the shard")
        write("   where they met (after a conflict always, after a count half the time); a retry takes another.")
        write("   (The articles pick a random shard for every increment instead.)")
        sharded = _load_step(storage, settings, "sharded", settings.shards, "transactional")
        result.steps.append(sharded)
        _report_step(write, sharded)
        if one.load.rate > 0:
            write(f"   {sharded.load.rate / one.load.rate:.1f}x the increments per second of step 1.")
        write("")

        write("3. The server-side increment: one commit with an increment transform, no read and")
        write("   no transaction.")
        [gateway] = storage.open()
        applies = gateway.capabilities.applies_transforms
        gateway.close()
        if applies:
            server = _load_step(storage, settings, "server-side increment", settings.shards, "increment")
            result.steps.append(server)
            _report_step(write, server)
            if server.load.failed:
                write(f"   {server.load.failed} were refused even without a read: each is still a write to a shard.")
            else:
                write("   None was refused in this run.")
            write(f"   {server.per_increment(server.rpcs):.2f} RPCs per counted increment, against "
                  f"{sharded.per_increment(sharded.rpcs):.2f} with transactions in step 2.")
        else:
            write("   skipped: this emulator (the legacy Datastore one) silently ignores increment")
            write("   transforms, so the counter uses transactions there (strategy 'auto').")
        write("")

        write("4. What reading a total costs (Datastore bills RPCs and entity reads):")
        result.reads = _read_costs(storage, settings.shards)
        width = max(len(what) for what, _, _ in result.reads)
        write(f"   {'read':<{width}}  RPCs  entity reads")
        for what, rpcs, reads in result.reads:
            write(f"   {what:<{width}}  {rpcs:>4}  {reads:>12}")
        write("")

    write("Final counts (each must equal the increments counted):")
    for step in result.steps:
        mark = "ok" if step.counted_ok else "LOST OR DOUBLED"
        write(f"   {step.title:<22} final count {step.final_count:>6} = counted {step.load.ok:>6}  {mark}")
    if plot_path is not None:
        _plot(result, plot_path)
        if result.plot is not None:
            write(f"Plot saved to {result.plot}")
        else:
            write(f"No plot: {result.plot_message}")
    return result


# --- the ``gds-counter demo`` subcommand (registered by gds_counter.cli) ------------------


def positive_option(convert: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """An argparse type: ``convert`` the text, refusing anything not positive
    and finite with "expected <what>, got '<text>'" (the CLI uses it too)."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    parse.__name__ = what  # argparse names the type in some messages
    return parse


def add_parser(sub: Any, parents: Sequence[Any] = ()) -> None:
    """Add ``demo`` to the CLI's subparsers."""
    p = sub.add_parser(
        "demo",
        parents=list(parents),
        help="the workshop in one command: contention, shards, server-side increments, read costs",
        description="Run the workshop's four steps on a temporary SQLite file (no cloud account), "
        "or on an official emulator, and draw a plot. Ignores --url.",
    )
    p.add_argument("--quick", action="store_true", help="short steps, for CI (under 30 s)")
    p.add_argument("--emulator", choices=("datastore", "firestore"),
                   help="count on this official emulator instead of the embedded model (needs gcloud)")
    p.add_argument("--plot", default="gds_counter_demo.png", metavar="PNG",
                   help="where to save the plot, in an existing folder (default ./gds_counter_demo.png)")
    p.add_argument("--no-plot", dest="plot", action="store_const", const=None, help="draw no plot")
    p.add_argument("--writers", type=positive_option(lambda t: int(t, 10), "a whole number of writers, at least 1"),
                   help="writer threads (default 8)")
    p.add_argument("--seconds", type=positive_option(float, "a positive number of seconds"),
                   help="seconds per load step (default 4; --quick 1.5)")
    p.add_argument("--rate", type=positive_option(float, "a positive number of writes per second"),
                   help=f"the model's writes per second per entity (default {MODEL_WRITES_PER_SECOND:g})")


def cli_handler(args: Any, out: Any) -> int:
    """``gds-counter demo``: exit 0 when every final count matched."""
    base = Settings.quick() if args.quick else Settings()
    given = {name: getattr(args, name) for name in ("writers", "seconds", "rate") if getattr(args, name) is not None}
    settings = attrs.evolve(base, **given)

    def write(line: str) -> None:
        print(line, file=out, flush=True)

    result = run_demo(write, quick=args.quick, emulator=args.emulator, plot=args.plot, settings=settings)
    return 0 if result.all_counted else 1
