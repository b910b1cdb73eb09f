"""The embedded engine's recent past: the versions commits replaced, so that
a read-only transaction can read the database as it was at a past
``read_time`` (``gateway._read_time``).

* ``history(key_bytes, ns, kind, version, written_at, replaced_at, data)``:
  one row per entity version a commit overwrote or deleted, in the same
  SQLite transaction as that commit. A version was current from its
  ``written_at`` (inclusive, as a read at a commit's time sees it) until
  its ``replaced_at``. An update's row is the trigger's (``BEFORE UPDATE OF
  data``: every writer of the file keeps it); a delete's is written by the
  commit (``keep_deleted``), which knows its time. Created entities need no
  row: nothing was there before.
* ``meta('history_since')``: microseconds since the epoch from which the
  history is whole: 0 for a file that was empty when the table was made,
  else the time it was added to an existing file (its entities' earlier
  versions were never kept).

A row is kept ``HISTORY_S`` (one hour, what Datastore keeps without
point-in-time recovery; the Firestore emulator answers for 7 days) after it
was replaced, then pruned, every ``PRUNE_EVERY`` commits; and at most
``MAX_VERSIONS`` rows are kept, the oldest pruned first, so that an hour of
a hot counter's writes (a version per ``add``) cannot grow a served
``memory://`` store past its memory (about 250 bytes a row: 60 MB at most).
Pruning by count moves ``history_since`` to the time the newest pruned
version was replaced: a read older than that, or than the hour, is
``ReadTimeTooOld``, never an answer missing a version.

The state at a time T is then the current rows written at or before T, and
the history rows current at T. A past read is the slow path: ``past``
copies the database into memory (SQLite's backup) and rewinds the copy to
T (the later rows out, those history rows in, their index rows made again),
and the transaction's reads run on that copy with the engine's own lookup
and query code.
"""

from __future__ import annotations

import datetime as _dt
import sqlite3
import time

from gds_counter.errors import ReadTimeTooOld
from gds_counter.gateway._read_time import TOO_OLD, epoch_seconds
from gds_counter.gateway.embedded._encoding import index_entries, load_entity
from gds_counter.gateway.embedded._storage import _write_index

__all__ = ["HISTORY_S", "MAX_VERSIONS", "PRUNE_EVERY", "ensure_history", "history_kept", "keep_deleted", "past", "prune"]

#: How long a replaced version is kept, in seconds.
HISTORY_S = 3600.0
#: Every how many commits the versions older than ``HISTORY_S`` are pruned.
PRUNE_EVERY = 256
#: The most replaced versions kept; past it the oldest are pruned.
MAX_VERSIONS = 250_000

_SCHEMA = """
CREATE TABLE IF NOT EXISTS history (
    key_bytes BLOB NOT NULL,
    ns TEXT NOT NULL,
    kind TEXT NOT NULL,
    version INTEGER NOT NULL,
    written_at REAL NOT NULL,
    replaced_at REAL NOT NULL,
    data TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS history_of_updates BEFORE UPDATE OF data ON entities BEGIN
    INSERT INTO history VALUES (old.key_bytes, old.ns, old.kind, old.version, old.written_at, new.written_at, old.data);
END;
"""


def ensure_history(conn: sqlite3.Connection) -> None:
    """Give a writable database its history table and trigger, once; a file
    that already held entities keeps its history from then on. Every later
    writer of the file keeps it too (the trigger is in the file, and
    ``history_kept`` tells the commits to keep their deletes)."""
    if conn.execute("SELECT count(*) FROM sqlite_master WHERE name IN ('history', 'history_of_updates')").fetchone()[0] == 2:
        return
    since = int(time.time() * 1_000_000)
    try:
        conn.executescript(
            "BEGIN IMMEDIATE;\n" + _SCHEMA
            + f"INSERT OR IGNORE INTO meta VALUES ('history_since', CASE WHEN EXISTS (SELECT 1 FROM entities) THEN {since} ELSE 0 END);\n"
            + "COMMIT;\n"
        )
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


def history_kept(conn: sqlite3.Connection) -> bool:
    """Whether the database keeps history (a gateway turned it on, in this
    process or another one): its deletes must then keep their versions."""
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'history'").fetchone() is not None


def keep_deleted(conn: sqlite3.Connection, kb: bytes, now: float) -> None:
    """Before the commit at ``now`` deletes entity ``kb``: keep its version."""
    conn.execute(
        "INSERT INTO history SELECT key_bytes, ns, kind, version, written_at, ?, data FROM entities WHERE key_bytes = ?",
        (now, kb),
    )


def prune(conn: sqlite3.Connection, now: float, most: int = MAX_VERSIONS) -> None:
    """Drop the versions replaced over ``HISTORY_S`` before ``now``, then the
    oldest past the ``most`` kept (moving ``history_since`` past them). Rows
    are in the order of their commits, so the search stops at the first one
    kept."""
    first_kept = conn.execute(
        "SELECT rowid FROM history WHERE replaced_at >= ? ORDER BY rowid LIMIT 1", (now - HISTORY_S,)
    ).fetchone()
    if first_kept is None:
        conn.execute("DELETE FROM history")
        return
    conn.execute("DELETE FROM history WHERE rowid < ?", first_kept)
    over = conn.execute("SELECT rowid, replaced_at FROM history ORDER BY rowid DESC LIMIT 1 OFFSET ?", (most,)).fetchone()
    if over is not None:
        last_dropped, replaced_at = over
        conn.execute("DELETE FROM history WHERE rowid <= ?", (last_dropped,))
        conn.execute("UPDATE meta SET value = max(value, ?) WHERE name = 'history_since'",
                     (int(replaced_at * 1_000_000) + 1,))


def past(conn: sqlite3.Connection, read_time: _dt.datetime) -> sqlite3.Connection:
    """A new in-memory database holding what ``conn``'s held at
    ``read_time``; ``ReadTimeTooOld`` when its history does not reach back
    that far."""
    at = epoch_seconds(read_time)
    copy = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
    conn.backup(copy)
    oldest = time.time() - HISTORY_S  # after the copy: no later prune is in it
    row = copy.execute("SELECT value FROM meta WHERE name = 'history_since'").fetchone()
    if row is None or at < max(oldest, row[0] / 1_000_000):
        copy.close()
        reach = (
            "this database keeps no history (EmbeddedGateway(history=True) keeps it; gds-counter serve does)" if row is None
            else f"gds-counter keeps replaced versions for {HISTORY_S:g} s (as Datastore without point-in-time recovery)"
            + (f", and this file's history starts at {_iso(row[0] / 1_000_000)}" if row[0] else "")
        )
        raise ReadTimeTooOld(f"{TOO_OLD} read_time={read_time.isoformat()}: {reach}")
    copy.execute("DROP TRIGGER IF EXISTS history_of_updates")
    copy.execute("BEGIN")
    later = copy.execute("SELECT key_bytes FROM entities WHERE written_at > ?", (at,)).fetchall()
    copy.executemany("DELETE FROM entities WHERE key_bytes = ?", later)
    copy.executemany("DELETE FROM props WHERE key_bytes = ?", later)
    then = copy.execute(
        "SELECT key_bytes, ns, kind, version, written_at, data FROM history WHERE written_at <= ? AND replaced_at > ?",
        (at, at),
    ).fetchall()
    for kb, ns, kind, version, written_at, data in then:
        copy.execute("INSERT INTO entities VALUES (?, ?, ?, ?, ?, ?)", (kb, ns, kind, version, written_at, data))
        entity = load_entity(data)
        assert entity.key is not None  # a stored entity always has its key
        _write_index(copy, entity.key, kb, {(name, enc) for name, enc, _ in index_entries(entity)}, fresh=True)
    copy.execute("COMMIT")
    return copy


def _iso(seconds: float) -> str:
    return _dt.datetime.fromtimestamp(seconds, _dt.timezone.utc).isoformat()
