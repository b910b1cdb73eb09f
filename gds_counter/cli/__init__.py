"""The ``gds-counter`` command: work with PHP-article counters from a shell.

Storage is chosen as everywhere else (``--url``, else ``GDS_URL``, else the
emulator named by ``DATASTORE_EMULATOR_HOST``, else the embedded SQLite file
``./gds_counter.sqlite3``), so ``gds-counter increment "Counter Test" 1``
then ``gds-counter count "Counter Test" 1`` work with no setup.
``sqlite:///x.db`` is ``x.db`` in the working directory; four slashes,
``sqlite:////tmp/x.db``, give an absolute path. ``-v`` logs which storage
was chosen.

Output: data on stdout (``--json`` for scripts), everything else on stderr.
Exit codes: 0 done; 1 the operation failed at run time (contention, storage
errors), with the message on stderr and no traceback (``-v`` adds it);
2 bad usage or bad input (a malformed URL, a reserved name, a refused
confirmation), reported before anything is written; 141 (128 + SIGPIPE,
what a shell reports for a command killed by a closed pipe) when the reader
of stdout went away, as in ``gds-counter list | head -1``, with no message.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
import sys
import time
from typing import Any, Callable, Sequence, TextIO

import attrs

from gds_counter import __version__
from gds_counter import _demo as demo
from gds_counter._process import deadlines
from gds_counter.counter import (
    DEFAULT_WRITES_PER_SHARD,
    PHP_ARTICLE,
    STRATEGIES,
    CounterShardDS,
    Layout,
    ShardedCounter,
    check_num_shards,
    counter_names_plan,
    make_target,
    plan_shards,
    rollup_all_plan,
)
from gds_counter.errors import BadValueError, CommitUnknown, GDSError, Unavailable
from gds_counter.gateway import Gateway, open_gateway, plan
from gds_counter.gateway.base import MAX_KEYS_PER_LOOKUP, run_query_all
from gds_counter.gateway.query import Query
from gds_counter.gds.transaction import DEFAULT_RETRY

log = logging.getLogger(__name__)

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
#: 128 + SIGPIPE: the status a shell shows for a command killed by a closed pipe.
EXIT_BROKEN_PIPE = 141
#: ``increase-shards`` past this many shards asks first (``--yes`` skips it).
CONFIRM_SHARDS_OVER = 100
#: Seconds a command may take when ``--timeout`` is not given.
DEFAULT_TIMEOUT = 30.0


class Context:
    """What a subcommand gets: its arguments, the streams, the command's
    deadline, and the storage (opened on first use, so commands that need
    none open none).

    ``--timeout`` bounds the whole command, not each call: one deadline,
    set when the command starts, is handed to the gateway (each Datastore
    call, the capability probe and every retry get only the time left) and
    to the counter's retries, so a server that is down or never answers
    makes the command fail by then, however many calls it makes."""

    def __init__(self, args: argparse.Namespace, out: TextIO, err: TextIO, stdin: TextIO) -> None:
        self.args, self.out, self.err, self.stdin = args, out, err, stdin
        self._gateway: Gateway | None = None
        self.seconds = float(args.timeout or DEFAULT_TIMEOUT)
        self.deadline = time.monotonic() + self.seconds

    @property
    def opened(self) -> Gateway | None:
        return self._gateway

    def left(self) -> float:
        """Seconds until the command's deadline (0 once it has passed)."""
        return max(0.0, self.deadline - time.monotonic())

    def gateway(self) -> Gateway:
        if self._gateway is None:
            self._gateway = open_gateway(self.args.url, timeout=self.seconds)
            # The Datastore gateways take the command's deadline; the embedded
            # engine has no network to wait for and has no such setting.
            set_deadline = getattr(self._gateway, "set_deadline", None)
            if callable(set_deadline):
                set_deadline(self.deadline)
            url = self.args.url or os.environ.get("GDS_URL")
            if url and url.lower().startswith("memory:"):
                log.warning("%s keeps data in this process only: it is gone when gds-counter exits", url)
        return self._gateway

    def counter(self) -> CounterShardDS:
        gateway = self.gateway()
        # The counter retries a storage that is unavailable; no new attempt
        # starts past the command's deadline (a tiny floor: a policy needs a
        # positive deadline, and the gateway refuses calls past it anyway).
        retry = attrs.evolve(DEFAULT_RETRY, deadline=max(self.left(), 0.001))
        return CounterShardDS(self.args.target_type, self.args.target_id, gateway=gateway,
                              strategy=getattr(self.args, "strategy", "auto"), retry=retry)

    def emit(self, data: Any, text: str) -> None:
        """``data`` as one JSON document with ``--json``, else ``text``."""
        print(json.dumps(data) if getattr(self.args, "json", False) else text, file=self.out)

    def confirm(self, question: str, *, refused: str) -> bool:
        """``--yes``, or ask on a terminal; elsewhere refuse (BadValueError, exit 2)."""
        if self.args.yes:
            return True
        if not self.stdin.isatty():
            raise BadValueError(f"{refused}; pass --yes to confirm (stdin is not a terminal, so nobody can be asked)")
        print(f"{question} [y/N] ", end="", file=self.err, flush=True)
        if self.stdin.readline().strip().lower() in ("y", "yes"):
            return True
        print("not confirmed: nothing was changed", file=self.err)
        return False


#: Subcommand name -> handler(context) returning an exit code.
Handler = Callable[[Context], int]
COMMANDS: dict[str, Handler] = {}


def command(name: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        COMMANDS[name] = handler
        return handler

    return register


def _check_names(args: argparse.Namespace) -> None:
    """Refuse a target no storage would take (empty, reserved ``__x__``,
    too long) before any storage is opened or created."""
    if hasattr(args, "target_type"):
        target = make_target(args.target_type, args.target_id)
        PHP_ARTICLE.config_key(target)
        PHP_ARTICLE.shard_key(target, PHP_ARTICLE.default_shards)


def _changed(ctx: Context, amount: int) -> int:
    counter = ctx.counter()
    total = counter.increment(amount)
    ctx.emit({"target": counter.target, "amount": amount, "count": total}, str(total))
    return EXIT_OK


@command("increment")
def _increment(ctx: Context) -> int:
    return _changed(ctx, ctx.args.n)


@command("decrement")
def _decrement(ctx: Context) -> int:
    return _changed(ctx, -ctx.args.n)


@command("count")
def _count(ctx: Context) -> int:
    counter = ctx.counter()
    method = ctx.args.method or "auto"
    if ctx.args.max_age is None:
        total = counter.get_count(method=method)
        ctx.emit({"target": counter.target, "count": total}, str(total))
        return EXIT_OK
    found = counter.get_count_as_of(method, max_age=ctx.args.max_age)
    ctx.emit({"target": counter.target, "count": found.total, "as_of": found.as_of.isoformat(),
              "from_rollup": found.from_rollup}, str(found.total))
    return EXIT_OK


def _counters(ctx: Context) -> tuple[list[str], Callable[[str], ShardedCounter]]:
    """Every PHP-layout counter in the storage, found by key only
    (``counter._inventory``), and how to build one by name."""
    gateway = ctx.gateway()
    names = plan.run(counter_names_plan(PHP_ARTICLE, gateway.namespace), gateway)
    retry = attrs.evolve(DEFAULT_RETRY, deadline=max(ctx.left(), 0.001))
    return names, lambda name: ShardedCounter(name, layout=PHP_ARTICLE, gateway=gateway, retry=retry)


def _as_of(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@command("rollup")
def _rollup(ctx: Context) -> int:
    """Refresh the rollup of every counter older than ``--max-age`` (0: all),
    25 counters per transaction. Safe to run from cron, several at once."""
    names, make = _counters(ctx)
    rolled = plan.run(rollup_all_plan(names, make, ctx.args.max_age, forced=True), ctx.gateway())
    fresh = sum(found.from_rollup for _, found in rolled.totals)
    writes = rolled.writes
    data = {"counters": len(names), "fresh": fresh, "read": len(names) - fresh, "written": writes.written,
            "failed": writes.failed}
    ctx.emit(data, f"{len(names)} counters: {fresh} rollups fresh, {len(names) - fresh} read from their shards, "
                   f"{writes.written} rollups written" + (f", {writes.failed} failed" if writes.failed else ""))
    for failure in writes.not_written:
        print(f"{getattr(ctx.args, 'prog', PROG)} rollup: error: rollup not written: {failure}", file=ctx.err)
    return EXIT_FAILURE if writes.failed else EXIT_OK  # so cron learns that some were not written


@command("plan")
def _plan(ctx: Context) -> int:
    found = plan_shards(ctx.args.rate, ctx.args.per_shard)
    data = attrs.asdict(found)
    rows = [
        ("increments per second", f"{found.rate:g}"),
        ("writes per second per shard", f"{found.per_shard:g}"),
        ("shards needed", f"{found.shards:,}"),
        ("exact read: entity reads", f"{found.exact_reads:,}"),
        ("exact read: RPCs (batch lookup)", f"{found.exact_rpcs:,}"),
        ("rollup read: entity reads", f"{found.rollup_reads:,}"),
        ("rollup read: RPCs", f"{found.rollup_rpcs:,}"),
    ]
    width = max(len(label) for label, _ in rows)
    ctx.emit(data, "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows))
    return EXIT_OK


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], *, text_last: bool = False) -> str:
    """Right-aligned columns; with ``text_last`` the last column is free text
    (a target may hold spaces), left as it is."""
    lines = [list(map(str, row)) for row in [header, *rows]]
    columns = len(header) - 1 if text_last else len(header)
    widths = [max(len(line[i]) for line in lines) for i in range(columns)]
    return "\n".join(
        "  ".join([*(cell.rjust(width) for cell, width in zip(line, widths)), *line[columns:]]) for line in lines
    )


@command("shards")
def _shards(ctx: Context) -> int:
    counter = ctx.counter()
    rows = counter.shards()
    total = sum(count for _, count in rows)
    data = {"target": counter.target, "count": total,
            "shards": [{"shard": shard, "count": count} for shard, count in rows]}
    ctx.emit(data, _table(("shard", "count"), [*rows, ("total", total)]))
    return EXIT_OK


@command("list")
def _list(ctx: Context) -> int:
    """Every PHP-layout counter in the storage: its shard entities grouped by
    ``target``, and its config entity. Reads every shard entity and every
    config entity once (Datastore bills each read).

    Two shard numbers per counter, because both matter: ``shards``, how many
    shards it is configured for (what its config entity records, else the
    layout's default of 20, as every reader assumes), which is what
    ``increase-shards`` changes and how many shards readers look up; and
    ``written``, how many shard entities exist (a shard is written on its
    first increment, so fewer on a counter that is rarely incremented).

    With ``--max-age``: each counter's total at most that old, from its
    rollup (1 entity read) or else read from its shards and rolled up, and
    when it was true; counters are found by key only (``counter._inventory``)."""
    if ctx.args.max_age is not None:
        names, make = _counters(ctx)
        rolled = plan.run(rollup_all_plan(names, make, ctx.args.max_age), ctx.gateway())
        data = [{"target": name, "count": f.total, "as_of": f.as_of.isoformat(), "from_rollup": f.from_rollup}
                for name, f in rolled.totals]
        aged: list[tuple[object, ...]] = [(f.total, _as_of(f.as_of), name) for name, f in rolled.totals]
        ctx.emit(data, _table(("count", "as of (UTC)", "target"), aged, text_last=True))
        return EXIT_OK
    gateway = ctx.gateway()
    layout = PHP_ARTICLE
    counters = _listed_counters(gateway, layout)
    rows = [(c.count, c.shards if c.shards is not None else "?", c.written, target)
            for target, c in sorted(counters.items())]
    data = [{"target": target, "count": c.count, "shards": c.shards, "written": c.written}
            for target, c in sorted(counters.items())]
    ctx.emit(data, _table(("count", "shards", "written", "target"), rows, text_last=True))
    return EXIT_OK


@attrs.define
class _Listed:
    """One counter as ``list`` shows it."""

    count: int = 0
    #: Shards configured (None: its config entity cannot be read; logged).
    shards: int | None = PHP_ARTICLE.default_shards
    written: int = 0
    highest: int = 0


def _listed_counters(gateway: Gateway, layout: Layout) -> dict[str, _Listed]:
    """Each counter's total, configured shards and written shards, from one
    pass over the shard kind and one over the config kind."""
    found: dict[str, _Listed] = {}
    for raw in run_query_all(gateway, Query(layout.config_kind, namespace=gateway.namespace)):
        target = raw.key.name if raw.key is not None else None
        if not target:
            log.warning("skipped %s: a counter's config entity is keyed by the counter's name", raw.key)
            continue
        entry = found.setdefault(target, _Listed())
        try:
            entry.shards = max(layout.config_of(raw) or 0, layout.default_shards)
        except GDSError as exc:
            log.warning("%s: its configured shard count is shown as ?: %s", target, exc)
            entry.shards = None
    target_property = layout.target_property or "target"
    for raw in run_query_all(gateway, Query(layout.shard_kind, namespace=gateway.namespace)):
        target = raw.properties.get(target_property)
        if not isinstance(target, str):
            log.warning("skipped %s: it has no string %r property", raw.key, target_property)
            continue
        entry = found.setdefault(target, _Listed())
        entry.written += 1
        entry.count += layout.count_of(raw)
        if raw.key is not None:
            entry.highest = max(entry.highest, layout.shard_number(target, raw.key) or 0)
    for target, entry in found.items():
        if entry.shards is not None and entry.highest > entry.shards:
            log.warning(
                "%s has shard %d, beyond the %d shards it is configured for (a writer with a larger NUM_SHARDS?): "
                "its total counts it, but get_count(method='lookup') does not look it up until increase-shards "
                "records %d or more", target, entry.highest, entry.shards, entry.highest)
    return found


@command("increase-shards")
def _increase_shards(ctx: Context) -> int:
    counter = ctx.counter()
    wanted = check_num_shards(ctx.args.num_shards)  # over MAX_SHARDS: exit 2 before asking anything
    if wanted > CONFIRM_SHARDS_OVER:
        reads = wanted + 1
        rpcs = math.ceil(reads / MAX_KEYS_PER_LOOKUP)
        cost = (f"every get_count() of {counter.target!r} will then read {reads} entities ({wanted} shards and "
                f"the config entity) in {rpcs} lookup RPC{'s' if rpcs > 1 else ''}, and shards never decrease")
        if not ctx.confirm(f"Spread {counter.target!r} over {wanted} shards? {cost}.",
                           refused=f"refusing increase-shards to {wanted} (over {CONFIRM_SHARDS_OVER}): {cost}"):
            return EXIT_FAILURE
    shards = counter.increase_shards(wanted)
    ctx.emit({"target": counter.target, "shards": shards}, str(shards))
    return EXIT_OK


@command("reset")
def _reset(ctx: Context) -> int:
    counter = ctx.counter()
    if not ctx.confirm(f"Set every shard of {counter.target!r} to 0?",
                       refused=f"refusing to reset {counter.target!r}: it sets every shard to 0 and cannot be undone"):
        return EXIT_FAILURE
    counter.reset()
    ctx.emit({"target": counter.target, "count": 0}, f"reset {counter.target!r}")
    return EXIT_OK


@command("demo")
def _demo(ctx: Context) -> int:
    if ctx.args.url:
        log.warning("demo ignores --url %s: it counts in a temporary database of its own", ctx.args.url)
    return demo.cli_handler(ctx.args, ctx.out)


@command("serve")
def _serve(ctx: Context) -> int:
    from gds_counter.gateway import DEFAULT_URL
    from gds_counter.server import Server, serve_until_signalled

    url = ctx.args.serve_url or ctx.args.url or os.environ.get("GDS_URL") or DEFAULT_URL
    if not url.lower().startswith(("sqlite:", "memory:")):
        raise BadValueError(f"serve puts the embedded engine behind the Datastore API: --url must be sqlite:/// or "
                            f"memory://, got {url!r}")
    gateway = open_gateway(url)
    try:
        def ready(server: Server) -> None:
            print(f"gds-counter serve: Datastore API (gRPC and REST) on {server.emulator_host} over "
                  f"{_storage_label(gateway, url)}; export DATASTORE_EMULATOR_HOST={server.emulator_host}",
                  file=ctx.err, flush=True)

        serve_until_signalled(Server(gateway, ctx.args.host, ctx.args.port), ready)
    finally:
        gateway.close()
    return EXIT_OK


# --- arguments ------------------------------------------------------------------------


def _whole_number(text: str) -> int:
    try:
        return int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _seconds_from_zero(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isnan(value) or value < 0:  # inf: any age
        raise argparse.ArgumentTypeError(f"expected a number of seconds from 0 up, got {text!r}")
    return value


def _port(text: str) -> int:
    port = _whole_number(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 0 to 65535, got {text!r}")
    return port


def _url(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the URL is empty (leave --url out for the default storage)")
    return text


URL_HELP = (
    "storage: sqlite:///x.db (x.db in the working directory), sqlite:////abs/x.db (four slashes: "
    "an absolute path), memory:// (gone when the command exits) or datastore://PROJECT?namespace=NS "
    "(default: $GDS_URL, else the emulator in $DATASTORE_EMULATOR_HOST, else ./gds_counter.sqlite3)"
)


#: The command's name in help and errors (``python -m gds_counter`` passes its own).
PROG = "gds-counter"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Sharded counters shared with the PHP article's CounterShardDS.",
        epilog="Exit status: 0 done, 1 failed at run time, 2 bad usage or input, 141 stdout closed early.",
    )
    parser.add_argument("--version", action="version", version=f"gds-counter {__version__}")
    parser.add_argument("--url", type=_url, help=URL_HELP)
    seconds = demo.positive_option(float, "a positive number of seconds")
    parser.add_argument("--timeout", type=seconds, metavar="SECONDS",
                        help="give up after this long: it bounds the whole command, every Datastore call and retry "
                        f"included (default {DEFAULT_TIMEOUT:g}; the embedded SQLite engine makes no network calls)")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more: -v the storage chosen and steps, -vv debug (also after the command)")
    # -v after the subcommand too; counted separately, then added up.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-v", "--verbose", dest="verbose_after", action="count", default=0, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help: str, *, target: bool = True, json_output: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, parents=[common])
        if target:
            p.add_argument("target_type", metavar="TYPE", help='what is counted, e.g. "Counter Test"')
            p.add_argument("target_id", metavar="ID", help="which one, e.g. 1")
        if json_output:
            p.add_argument("--json", action="store_true", help="print one JSON document instead of text")
        return p

    for name, verb in (("increment", "add to"), ("decrement", "subtract from")):
        p = add(name, f"{verb} a counter and print its new total")
        p.add_argument("-n", type=_whole_number, default=1, metavar="N", help="amount (default 1)")
        p.add_argument("--strategy", choices=sorted(STRATEGIES), default="auto", help="how to write (default auto)")
    max_age_help = ("a total at most this many seconds old, from the counter's rollup when it is fresh enough "
                    "(one entity read), else read from the shards and rolled up")
    p = add("count", "print a counter's total")
    p.add_argument("--method", choices=("lookup", "query"),
                   help="lookup: one batch read of the shard keys and the config entity; query: the article's "
                   "GQL query on target (default: the library's get_count() default)")
    p.add_argument("--max-age", type=_seconds_from_zero, metavar="SECONDS", help=max_age_help)
    add("shards", "print each shard's count")
    p = add("list", "print every counter in the storage: its total, the shards it is configured for and the shard "
            "entities written (reads every shard)", target=False)
    p.add_argument("--max-age", type=_seconds_from_zero, metavar="SECONDS",
                   help=max_age_help + "; shows each total and when it was true instead of the shard columns")
    p = add("rollup", "refresh the rollup of every counter in the storage (safe to run from cron, even twice at once)",
            target=False)
    p.add_argument("--max-age", type=_seconds_from_zero, metavar="SECONDS", default=0.0,
                   help="leave rollups at most this old as they are (default 0: refresh every one)")
    p = add("plan", "print the shards a write rate needs, and what an exact read costs against a rollup read",
            target=False)
    p.add_argument("--rate", type=demo.positive_option(float, "a positive number of increments per second"),
                   required=True, metavar="N", help="increments per second the counter must take")
    p.add_argument("--per-shard", type=demo.positive_option(float, "a positive number of writes per second"),
                   default=DEFAULT_WRITES_PER_SHARD, metavar="R",
                   help=f"writes per second one shard takes (default {DEFAULT_WRITES_PER_SHARD:g}, Datastore's guidance "
                   "for one entity)")
    p = add("increase-shards", "spread a counter over more shards (never fewer)")
    p.add_argument("num_shards", metavar="N", type=_whole_number, help="new number of shards")
    p.add_argument("--yes", action="store_true",
                   help=f"do not ask before going over {CONFIRM_SHARDS_OVER} shards (needed when not on a terminal)")
    p = add("reset", "set every shard of a counter to zero")
    p.add_argument("--yes", action="store_true", help="do not ask first (needed when not on a terminal)")
    demo.add_parser(sub, parents=[common])
    p = add("serve", "serve the Datastore v1 API (gRPC and REST JSON, one port) on the embedded engine, for any "
            "Datastore client; stops cleanly on SIGTERM or Ctrl-C", target=False, json_output=False)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=8081,
                   help="port to listen on (default 8081, the Datastore emulator's; 0 picks a free one)")
    p.add_argument("--url", dest="serve_url", type=_url, metavar="URL",
                   help="sqlite:///x.db or memory:// (default: --url before the command, else $GDS_URL, else the "
                   "persistent SQLite file ./gds_counter.sqlite3)")
    return parser


class _Logging:
    """Send gds_counter's log records to the command's stderr while it runs."""

    def __init__(self, verbosity: int, err: TextIO) -> None:
        level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
        fmt = "%(levelname)s %(name)s: %(message)s" if verbosity > 1 else "%(levelname)s: %(message)s"
        self.handler = logging.StreamHandler(err)
        self.handler.setFormatter(logging.Formatter(fmt))
        self.logger = logging.getLogger("gds_counter")
        self.saved = self.logger.level
        self.logger.setLevel(level)
        self.logger.addHandler(self.handler)

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.setLevel(self.saved)


def _storage_label(gateway: Gateway | None, url: str | None) -> str:
    if gateway is None:
        return url or os.environ.get("GDS_URL") or "from the environment"
    if getattr(gateway, "emulator_host", None):
        return f"the Datastore emulator at {getattr(gateway, 'emulator_host')}"
    if hasattr(gateway, "project"):
        return f"Cloud Datastore project {getattr(gateway, 'project')!r}"
    path = getattr(gateway, "path", None)
    return f"the SQLite file {path}" if path else "an in-memory database"


def _run(ctx: Context) -> int:
    args = ctx.args
    where = f"{getattr(args, 'prog', PROG)} {args.command}"
    # The embedded engine's waits (a lock another process holds, a
    # connection) end by the command's deadline too; the server has none.
    bounded = deadlines.limit(ctx.deadline) if args.command != "serve" else None
    try:
        _check_names(args)
        return COMMANDS[args.command](ctx)
    except BrokenPipeError:
        raise
    except BadValueError as exc:
        print(f"{where}: error: {exc}", file=ctx.err)
        return EXIT_USAGE
    except GDSError as exc:
        log.debug("failed", exc_info=True)
        hint = ""
        if isinstance(exc, (Unavailable, CommitUnknown)):
            hint = f" (storage: {_storage_label(ctx.opened, args.url)}; --timeout sets how long to try)"
        print(f"{where}: error: {type(exc).__name__}: {exc}{hint}", file=ctx.err)
        return EXIT_FAILURE
    except Exception as exc:  # noqa: BLE001 - a CLI reports, it does not dump tracebacks
        log.info("unexpected failure", exc_info=True)
        opening = "" if ctx.opened is not None else f" (opening storage {_storage_label(None, args.url)})"
        hint = "" if args.verbose else " (run with -v for details)"
        print(f"{where}: error{opening}: {type(exc).__name__}: {exc}{hint}", file=ctx.err)
        return EXIT_FAILURE
    finally:
        if bounded is not None:
            deadlines.restore(bounded)
        if ctx.opened is not None:
            ctx.opened.close()


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None,
         stdin: TextIO | None = None, prog: str = PROG) -> int:
    """Run one command; ``prog`` is the name help and errors give it."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser(prog)
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    args.prog = prog
    args.verbose += getattr(args, "verbose_after", 0)
    logs = _Logging(args.verbose, err)
    try:
        code = _run(Context(args, out, err, stdin or sys.stdin))
        out.flush()  # a closed pipe shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly. Point stdout at
        # devnull so the interpreter's final flush does not fail again.
        if out is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
    finally:
        logs.close()


if __name__ == "__main__":
    sys.exit(main())
