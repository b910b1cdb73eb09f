"""What every ``gds-counter`` subcommand shares: the ``Context`` it is
given (its arguments, the streams, the command's one deadline, the storage
opened on first use, what it has stored), the registry of subcommands, the
exit codes, and how output is shaped (``emit``, ``table``). Apart from the commands themselves,
so that each family of commands is a module of its own, and from the
argument parser, which describes the commands but does not run them.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from typing import Any, Callable, Sequence, TextIO

import attrs

from gds_counter.counter import FIRESTORE_PAGE, CounterShardDS, ShardedCounter, make_target
from gds_counter.errors import BadValueError
from gds_counter.gateway import Gateway, open_gateway
from gds_counter.gds.transaction import DEFAULT_RETRY

log = logging.getLogger("gds_counter.cli")

EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2
#: 128 + SIGPIPE: the status a shell shows for a command killed by a closed pipe.
EXIT_BROKEN_PIPE = 141
#: 128 + SIGINT: the status a shell shows for a command ended by Ctrl-C.
EXIT_INTERRUPTED = 130
#: Seconds a command may take when ``--timeout`` is not given.
DEFAULT_TIMEOUT = 30.0
#: The command's name in help and errors (``python -m gds_counter`` passes its own).
PROG = "gds-counter"


class OutputError(Exception):
    """Writing the result to stdout failed (a full disk, a device that takes
    nothing), not because its reader went away: that is ``BrokenPipeError``,
    answered with 141. Carries the ``OSError``; ``cli.main`` reports it,
    with what was stored, if anything."""

    def __init__(self, cause: OSError) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.cause = cause


def write_out(stream: TextIO, text: str | None = None) -> None:
    """Write ``text`` (and a newline) to stdout, or only flush it; an
    ``OSError`` other than a closed pipe becomes ``OutputError``."""
    try:
        if text is not None:
            print(text, file=stream)
        else:
            stream.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputError(exc) from exc


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
        #: What the command has stored, once it has (``was_stored``): said
        #: on stderr if its result then cannot be printed.
        self.stored: str | None = None
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

    def target(self) -> str:
        """The counter's target (PHP's ``type_id``, or a distributed counter's
        document path), known before any storage is opened."""
        if self.args.target_id is None:
            return str(self.args.target_type)
        return make_target(self.args.target_type, self.args.target_id)

    def was_stored(self, what: str) -> None:
        """Note that ``what`` (a sentence: the change, the counter, the total)
        is stored, before its result is printed: a script must not be told
        that a stored change failed."""
        self.stored = what

    def counter(self) -> ShardedCounter:
        gateway = self.gateway()
        # The counter retries a storage that is unavailable; no new attempt
        # starts past the command's deadline (a tiny floor: a policy needs a
        # positive deadline, and the gateway refuses calls past it anyway).
        retry = attrs.evolve(DEFAULT_RETRY, deadline=max(self.left(), 0.001))
        strategy = getattr(self.args, "strategy", "auto")
        if self.args.target_id is None:  # a document path; its shard count is whatever it records
            return ShardedCounter(self.target(), layout=FIRESTORE_PAGE, gateway=gateway, strategy=strategy, retry=retry)
        return CounterShardDS(self.args.target_type, self.args.target_id, gateway=gateway, strategy=strategy, retry=retry)

    def emit(self, data: Any, text: str) -> None:
        """``data`` as one JSON document with ``--json``, else ``text``."""
        write_out(self.out, json.dumps(data) if getattr(self.args, "json", False) else text)

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


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, text_last: bool = False) -> str:
    """Right-aligned columns; with ``text_last`` the last column is free text
    (a target may hold spaces), left as it is."""
    lines = [list(map(str, row)) for row in [header, *rows]]
    columns = len(header) - 1 if text_last else len(header)
    widths = [max(len(line[i]) for line in lines) for i in range(columns)]
    return "\n".join(
        "  ".join([*(cell.rjust(width) for cell, width in zip(line, widths)), *line[columns:]]) for line in lines
    )


def storage_label(gateway: Gateway | None, url: str | None) -> str:
    if gateway is None:
        return url or os.environ.get("GDS_URL") or "from the environment"
    system = "Firestore" if type(gateway).__module__.startswith("gds_counter.gateway.firestore") else "Datastore"
    if getattr(gateway, "emulator_host", None):
        return f"the {system} emulator at {getattr(gateway, 'emulator_host')}"
    if hasattr(gateway, "project"):
        return f"Cloud {system} project {getattr(gateway, 'project')!r}"
    path = getattr(gateway, "path", None)
    return f"the SQLite file {path}" if path else "an in-memory database"
