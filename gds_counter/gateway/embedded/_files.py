"""One SQLite file as the embedded engine sees it: the connection class
that remembers who opened it, how a file is identified (to notice it was
deleted or replaced), and how SQLite's failures become gds_counter errors
that name the file and, where it can be told, why."""

from __future__ import annotations

import os
import sqlite3

from gds_counter.errors import Contention, GatewayError, GDSError
from gds_counter.gateway.embedded._storage import is_busy

__all__ = ["Connection", "FileId", "file_id", "translate", "why_unopenable"]

FileId = tuple[int, int]


class Connection(sqlite3.Connection):
    """A SQLite connection that knows which process opened it, how long it
    waits for another process's lock (seconds) and its ``-wal`` file."""

    pid: int
    busy_timeout: float
    wal: FileId | None
    #: Why this connection was taken from the transaction that held it
    #: (closed at a fork, or given to another transaction); None while usable.
    dropped: str | None


def file_id(path: str) -> FileId | None:
    """(device, inode) of ``path``, or None when nothing is there."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


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
