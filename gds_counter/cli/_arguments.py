"""The ``gds-counter`` command line: every subcommand's arguments, help and
checks on input (argument types; ``check_input``, which refuses a target,
an amount or a shard count the library would refuse, with the library's own
checks, before any storage is opened or created). Apart from the commands,
so that what a user may type is read in one place and what each command
does in another.
"""

from __future__ import annotations

import argparse
import math
from typing import NoReturn

from gds_counter import __version__
from gds_counter import _demo as demo
from gds_counter._checks import check_amount
from gds_counter.cli._context import DEFAULT_TIMEOUT, PROG
from gds_counter.cli._counter_commands import CONFIRM_SHARDS_OVER
from gds_counter.counter import (
    DEFAULT_WRITES_PER_SHARD,
    FIRESTORE_PAGE,
    PHP_ARTICLE,
    STRATEGIES,
    check_counter_path,
    check_num_shards,
    make_target,
)
from gds_counter.errors import BadValueError


def check_input(args: argparse.Namespace) -> None:
    """Refuse what the library would refuse, before any storage is opened
    or created (an SQLite URL names a file that opening creates): a target
    no storage would take (empty, reserved ``__x__``, too long), an amount
    beyond Datastore's integers (the counter's check: ``-n`` is passed as
    it is, or negated, and the range is symmetric), a shard count below 1
    or over ``MAX_SHARDS``."""
    if hasattr(args, "target_type"):
        if args.target_id is None:  # a document path: Firestore's distributed counter
            if "/" not in args.target_type:
                raise BadValueError(
                    f"{args.target_type!r} needs an ID after it (TYPE ID, the PHP article's counter), or is a "
                    "document path such as counters/likes (a Firestore distributed counter)"
                )
            check_counter_path(args.target_type, FIRESTORE_PAGE.default_shards)
        else:
            target = make_target(args.target_type, args.target_id)
            PHP_ARTICLE.config_key(target)
            PHP_ARTICLE.shard_key(target, PHP_ARTICLE.default_shards)
    if args.command in ("increment", "decrement"):
        check_amount(args.n)
    if args.command == "increase-shards":
        check_num_shards(args.num_shards)


#: Commands renamed, (old name, new name): who types an old one is told the
#: new one (no alias: one name per idea).
RENAMED = (("plan", "size"),)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, but an old command name gets its new name in one
    line instead of "invalid choice"."""

    def error(self, message: str) -> NoReturn:
        for old, new in RENAMED:
            if message.startswith(f"argument COMMAND: invalid choice: {old!r}"):
                self.exit(2, f"{self.prog}: error: there is no command {old!r}: it is now {new!r} "
                          f"(see {self.prog} {new} --help)\n")
        super().error(message)


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
    "an absolute path), memory:// (gone when the command exits), datastore://PROJECT?namespace=NS or "
    "firestore://PROJECT?database=DB (Firestore in native mode; $FIRESTORE_EMULATOR_HOST for its emulator) "
    "(default: $GDS_URL, else the emulator in $DATASTORE_EMULATOR_HOST, else ./gds_counter.sqlite3)"
)


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(
        prog=prog,
        description="Sharded counters shared with the PHP article's CounterShardDS.",
        epilog="Exit status: 0 done, 1 failed at run time (the message says whether a change was stored), "
        "2 bad usage or input (nothing written), 130 interrupted (Ctrl-C), 141 stdout closed early.",
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
            p.add_argument("target_type", metavar="TYPE|PATH",
                           help='what is counted, e.g. "Counter Test"; or alone, the document path of a '
                                'Firestore distributed counter, e.g. counters/likes')
            p.add_argument("target_id", metavar="ID", nargs="?", help="which one, e.g. 1 (none after a PATH)")
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
    p = add("size", "print the shards a write rate needs, and what an exact read costs against a rollup read",
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
