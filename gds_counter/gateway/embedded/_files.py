"""One SQLite file as the embedded engine sees it: the connection class
that remembers who opened it, how a connection to it is opened and
prepared (its identity, to notice it was deleted or replaced, is ``_file_ids``),
and how SQLite's failures become gds_counter errors that name the file
and, where it can be told, why; and how one is closed (never one a
forked child inherited, whose closing could release the parent's locks)."""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from pathlib import Path

from gds_counter._process import forks
from gds_counter.errors import Contention, GatewayError, GDSError
from gds_counter.gateway.embedded._file_ids import FileId, file_id
from gds_counter.gateway.embedded._storage import create_schema, is_busy, schema_ready

__all__ = [
    "Connection", "close_connection", "file_gone", "open_connection", "translate",
    "why_unopenable",
]

log = logging.getLogger("gds_counter.gateway.embedded")

class Connection(sqlite3.Connection):
    """A SQLite connection that knows which process opened it, how long it
    waits for another process's lock (seconds) and its ``-wal`` file."""

    pid: forks.Owner
    busy_timeout: float
    wal: FileId | None
    #: Where SQLite keeps that log: beside the file the path resolves to
    #: (through symbolic links), not beside the path itself.
    wal_path: str | None
    #: Why this connection was taken from the transaction that held it
    #: (closed at a fork, or given to another transaction); None while usable.
    dropped: str | None


def open_connection(
    path: str | None, *, read_only: bool, create: bool, known: FileId | None, busy_timeout: float,
) -> tuple[Connection, FileId | None]:
    """A new connection to ``path`` (None: a database in memory), in WAL
    mode with full sync, its tables made, and the file's id; a GDSError
    naming the path when it cannot be opened, or when the file is no longer
    the one ``known`` (deleted or replaced since the first connection)."""
    where = path or "memory"
    if path is None:
        target, uri = ":memory:", False
    else:
        mode = "ro" if read_only else ("rwc" if create else "rw")
        target, uri = f"{Path(path).as_uri()}?mode={mode}", True
    try:
        conn = sqlite3.connect(
            target, timeout=busy_timeout, isolation_level=None, check_same_thread=False, uri=uri, factory=Connection,
        )
    except sqlite3.Error as exc:
        raise _open_error(exc, path, known) from exc
    assert isinstance(conn, Connection)
    conn.pid, conn.wal, conn.wal_path, conn.dropped, conn.busy_timeout = forks.here(), None, None, None, busy_timeout
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        wal = False
        if path is not None:
            wal = conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            if not wal and not read_only:
                wal = _switch_to_wal(conn, busy_timeout)
            conn.execute("PRAGMA synchronous = FULL")  # a commit that returned survives a power cut
        if not schema_ready(conn):
            if read_only:
                raise GatewayError(f"{where} has no gds_counter tables, and it is opened read-only")
            create_schema(conn)
        if path is None:
            return conn, None
        found = file_id(path)
        if known is not None and found != known:
            raise GatewayError(file_gone(path, found, "no connection was opened to it"))
        if wal:
            conn.wal_path = os.path.realpath(path) + "-wal"  # (SQLite's: a symlink's target's log)
            conn.wal = file_id(conn.wal_path)  # open now: the reads above started it
        return conn, found
    except BaseException as exc:
        conn.close()  # our own, just opened in this process
        if isinstance(exc, sqlite3.Error):
            raise _open_error(exc, path, known) from exc
        raise


def _switch_to_wal(conn: sqlite3.Connection, busy_timeout: float) -> bool:
    """``PRAGMA journal_mode = WAL``, waiting like any locked write. SQLite
    answers a journal mode change with "database is locked" at once, without
    its busy handler, while another connection holds the file (another
    process creating it too): several processes opening a new file together
    failed with ``Contention``. Whether WAL is on, once it could be set or
    another connection set it."""
    deadline = time.monotonic() + busy_timeout
    delay = 0.005
    while True:
        try:
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            return bool(mode == "wal")
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _open_error(exc: sqlite3.Error, path: str | None, known: FileId | None) -> GDSError:
    if is_busy(exc):
        return Contention(f"database {path or 'memory'!r} stayed locked by other writers while opening it: {exc}")
    if path is None:
        return GatewayError(f"cannot open an in-memory SQLite database: {exc}")
    if "not a database" in str(exc) or "malformed" in str(exc):
        return GatewayError(f"{path} is not a usable SQLite database ({exc}); is it the right file?")
    why = why_unopenable(path, known)
    return GatewayError(f"cannot open the SQLite database {path}{': ' + why if why else ''} ({exc})")


def file_gone(path: str | None, found: FileId | None, what: str) -> str:
    """Why the file at ``path`` is not the one the gateway opened."""
    if found is None:
        return f"{path} was deleted while the gateway had it open; {what}"
    return f"{path} was replaced by another file while the gateway had it open; {what}"


def translate(exc: sqlite3.Error, where: str) -> GDSError:
    """A SQLite error raised by a call, as the gds_counter error to raise."""
    if is_busy(exc):
        return Contention(f"database {where!r} stayed locked by other writers: {exc}")
    return GatewayError(f"SQLite failed on {where}: {exc}")


def why_unopenable(path: str, known: FileId | None) -> str:
    """What the file system says about a path SQLite could not open."""
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        return "it is a directory"
    if os.path.lexists(parent) and not os.path.isdir(parent):
        return f"{parent} is not a directory"
    if not os.path.lexists(parent):
        return f"the directory {parent} does not exist"
    if not os.access(parent, os.X_OK):
        return f"permission denied to enter {parent}"
    if known is not None and not os.path.lexists(path):
        return "it was deleted while the gateway had it open"
    if os.path.lexists(path) and not os.access(path, os.R_OK):
        return "permission denied"
    missing = [p for p in (path + "-wal", path + "-shm") if not os.path.lexists(p)]
    if os.path.lexists(path) and missing and not os.access(parent, os.W_OK | os.X_OK):
        return f"SQLite must create {' and '.join(missing)} to read it, and {parent} is not writable"
    if not os.path.lexists(path) and not os.access(parent, os.W_OK | os.X_OK):
        return f"permission denied to create it in {parent}"
    return ""


def close_connection(conn: Connection) -> None:
    """Close a connection this process opened; keep (never close) one it
    inherited, since closing it could release the parent's locks."""
    if not forks.owned_here(conn.pid):
        forks.abandon(conn)
        return
    try:
        conn.close()
    except sqlite3.Error as exc:  # closing cannot lose a commit that returned
        log.warning("closing a SQLite connection failed: %s", exc)

