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
errors, stdout that takes no more), with the message on stderr and no
traceback (``-v`` adds it); when a change was stored and only printing its
result failed, that one line says it WAS stored (a script must not retry
it); 2 bad usage or bad input (a malformed URL, a reserved name, an amount
or shard count out of range, a refused confirmation), reported before the
storage is opened, so nothing is written or created; 130 on Ctrl-C, one
line and no traceback; 141 (128 + SIGPIPE, what a shell reports for a
command killed by a closed pipe) when the reader of stdout went away, as in
``gds-counter list | head -1``, with no message unless a change was stored.

Split by idea: ``_context`` (what every subcommand is given, the registry,
exit codes, output), ``_arguments`` (the parser and the checks on input),
and one module per family of subcommands: ``_counter_commands`` (one
counter), ``_storage_commands`` (every counter in the storage: ``list``,
``rollup``), ``_tool_commands`` (``size``, ``demo``, ``serve``). This
module runs one command: parse, dispatch, report errors and exit codes.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Sequence, TextIO

from gds_counter._process import deadlines

# The command families register their subcommands as they are imported.
from gds_counter.cli import _counter_commands, _storage_commands, _tool_commands  # noqa: F401
from gds_counter.cli._arguments import build_parser, check_input
from gds_counter.cli._context import (
    COMMANDS,
    EXIT_BROKEN_PIPE,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    Context,
    OutputError,
    storage_label,
    write_out,
)
from gds_counter.errors import BadValueError, CommitUnknown, GDSError, Unavailable

__all__ = ["EXIT_BROKEN_PIPE", "EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "build_parser", "main"]

log = logging.getLogger(__name__)


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


def _run(ctx: Context) -> int:
    args = ctx.args
    where = f"{getattr(args, 'prog', PROG)} {args.command}"
    # The embedded engine's waits (a lock another process holds, a
    # connection) end by the command's deadline too; the server has none.
    bounded = deadlines.limit(ctx.deadline) if args.command != "serve" else None
    try:
        check_input(args)
        return COMMANDS[args.command](ctx)
    except (BrokenPipeError, OutputError):
        raise  # stdout failed: main says so, with what was stored
    except BadValueError as exc:
        print(f"{where}: error: {exc}", file=ctx.err)
        return EXIT_USAGE
    except GDSError as exc:
        log.debug("failed", exc_info=True)
        hint = ""
        if isinstance(exc, (Unavailable, CommitUnknown)):
            hint = f" (storage: {storage_label(ctx.opened, args.url)}; --timeout sets how long to try)"
        print(f"{where}: error: {type(exc).__name__}: {exc}{hint}", file=ctx.err)
        return EXIT_FAILURE
    except Exception as exc:  # noqa: BLE001 - a CLI reports, it does not dump tracebacks
        log.info("unexpected failure", exc_info=True)
        opening = "" if ctx.opened is not None else f" (opening storage {storage_label(None, args.url)})"
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
    ctx = Context(args, out, err, stdin or sys.stdin)
    where = f"{prog} {args.command}"
    try:
        code = _run(ctx)
        write_out(out)  # a closed pipe or a full disk shows here, not at interpreter exit
        return code
    except BrokenPipeError:
        # The reader went away (``| head``): stop quietly, unless a change
        # was stored, which nothing else would tell (``increment | true``).
        if ctx.stored:
            err.write(f"{where}: {ctx.stored}, but stdout was closed before its result was written\n")
        _stop_writing(out)
        return EXIT_BROKEN_PIPE
    except OutputError as exc:
        # A change stored and only its printing failed is not a failed
        # change: a script that retried it would count it twice.
        stored = f"{ctx.stored}, but " if ctx.stored else ""
        err.write(f"{where}: error: {stored}writing the result to stdout failed: {exc}\n")
        _stop_writing(out)
        return EXIT_FAILURE
    except KeyboardInterrupt as exc:
        # Ctrl-C: no traceback, but what the library noted on the way out
        # (whether the write under way was stored) is the user's answer.
        notes = "".join(f"; {note}" for note in getattr(exc, "__notes__", ()))
        if ctx.stored:
            notes += f"; {ctx.stored}"
        err.write(f"{prog}: interrupted{notes}\n")
        return EXIT_INTERRUPTED
    finally:
        logs.close()


def _stop_writing(out: TextIO) -> None:
    """Point stdout at devnull after it failed, so that the interpreter's
    final flush of what is still buffered does not fail again (a second
    message, and exit status 120)."""
    if out is sys.stdout:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
