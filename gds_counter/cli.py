"""The ``gds-counter`` command: work with PHP-article counters from a shell.

Storage is chosen as everywhere else (``--url``, else ``GDS_URL``, else the
emulator named by ``DATASTORE_EMULATOR_HOST``, else the embedded SQLite file
in the working directory), so ``gds-counter increment "Counter Test" 1``
then ``gds-counter count "Counter Test" 1`` work with no setup.

Exit codes: 0 done; 1 the operation failed at run time (contention, storage
errors), with the message on stderr and no traceback (``-v`` adds it);
2 bad usage or bad input, as argparse does.
"""

from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable, Sequence, TextIO

from gds_counter import __version__, demo
from gds_counter.counter import STRATEGIES, CounterShardDS
from gds_counter.errors import BadValueError, GDSError
from gds_counter.gateway import Gateway, open_gateway

log = logging.getLogger(__name__)

#: Subcommand name -> handler(args, gateway, out) returning an exit code.
#: Later subcommands (``demo``, ``bench``) register here the same way.
Handler = Callable[[argparse.Namespace, Gateway, TextIO], int]
COMMANDS: dict[str, Handler] = {}


def command(name: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        COMMANDS[name] = handler
        return handler

    return register


def _counter(args: argparse.Namespace, gateway: Gateway) -> CounterShardDS:
    return CounterShardDS(
        args.target_type,
        args.target_id,
        gateway=gateway,
        strategy=getattr(args, "strategy", "auto"),
    )


@command("increment")
def _increment(args: argparse.Namespace, gateway: Gateway, out: TextIO) -> int:
    print(_counter(args, gateway).increment(args.n), file=out)
    return 0


@command("count")
def _count(args: argparse.Namespace, gateway: Gateway, out: TextIO) -> int:
    print(_counter(args, gateway).get_count(method=args.method), file=out)
    return 0


@command("shards")
def _shards(args: argparse.Namespace, gateway: Gateway, out: TextIO) -> int:
    rows = _counter(args, gateway).shards()
    width = max(len("count"), *(len(str(count)) for _, count in rows), len(str(sum(c for _, c in rows))))
    print(f"{'shard':>5}  {'count':>{width}}", file=out)
    for shard, count in rows:
        print(f"{shard:>5}  {count:>{width}}", file=out)
    print(f"{'total':>5}  {sum(count for _, count in rows):>{width}}", file=out)
    return 0


@command("increase-shards")
def _increase_shards(args: argparse.Namespace, gateway: Gateway, out: TextIO) -> int:
    print(_counter(args, gateway).increase_shards(args.num_shards), file=out)
    return 0


@command("reset")
def _reset(args: argparse.Namespace, gateway: Gateway, out: TextIO) -> int:
    counter = _counter(args, gateway)
    counter.reset()
    print(f"reset {counter.target!r}", file=out)
    return 0


command("demo")(demo.cli_handler)


def _whole_number(text: str) -> int:
    try:
        value = int(text, 10)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gds-counter",
        description="Sharded counters shared with the PHP article's CounterShardDS.",
    )
    parser.add_argument("--version", action="version", version=f"gds-counter {__version__}")
    parser.add_argument(
        "--url",
        help="storage: sqlite:///file.db, memory:// or datastore://PROJECT "
        "(default: $GDS_URL, else the emulator in $DATASTORE_EMULATOR_HOST, else ./gds_counter.sqlite3)",
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log more (-vv for debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def counter_command(name: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.add_argument("target_type", metavar="TYPE", help='what is counted, e.g. "Counter Test"')
        p.add_argument("target_id", metavar="ID", help="which one, e.g. 1")
        return p

    p = counter_command("increment", "add to a counter and print its new total")
    p.add_argument("-n", type=_whole_number, default=1, metavar="N", help="amount to add (default 1)")
    p.add_argument("--strategy", choices=sorted(STRATEGIES), default="auto", help="how to write (default auto)")
    p = counter_command("count", "print a counter's total")
    p.add_argument("--method", choices=("lookup", "query"), default="lookup",
                   help="lookup: one batch read of every shard (default); query: the article's GQL query")
    counter_command("shards", "print each shard's count")
    p = counter_command("increase-shards", "spread a counter over more shards (never fewer)")
    p.add_argument("num_shards", metavar="N", type=_whole_number, help="new number of shards")
    counter_command("reset", "set every shard of a counter to zero")
    demo.add_parser(sub)
    return parser


def _configure_logging(verbosity: int) -> None:
    level = logging.WARNING if verbosity <= 0 else logging.INFO if verbosity == 1 else logging.DEBUG
    logging.basicConfig(level=level, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error (2)
        return exc.code if isinstance(exc.code, int) else 2
    _configure_logging(args.verbose)
    gateway: Gateway | None = None
    try:
        gateway = open_gateway(args.url)
        return COMMANDS[args.command](args, gateway, out)
    except BadValueError as exc:
        print(f"gds-counter {args.command}: error: {exc}", file=err)
        return 2
    except GDSError as exc:
        log.debug("failed", exc_info=True)
        print(f"gds-counter {args.command}: error: {type(exc).__name__}: {exc}", file=err)
        return 1
    except Exception as exc:  # noqa: BLE001 - a CLI reports, it does not dump tracebacks
        log.info("unexpected failure", exc_info=True)
        where = "" if gateway is not None else f" (opening storage {args.url or 'from the environment'})"
        hint = "" if args.verbose else " (run with -v for details)"
        print(f"gds-counter {args.command}: error{where}: {type(exc).__name__}: {exc}{hint}", file=err)
        return 1
    finally:
        if gateway is not None:
            gateway.close()

if __name__ == "__main__":
    sys.exit(main())
