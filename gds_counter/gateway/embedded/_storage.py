"""The embedded engine's SQLite file: its tables, and the row-level writes
that keep them consistent inside one commit.

Storage layout (one SQLite file, WAL mode so readers never block the writer):

* ``entities(key_bytes PK, ns, kind, version, written_at, data)``: ``data`` is
  tagged JSON (lossless, never pickle); ``version`` is the number of the commit
  that last wrote the row. Commit numbers only grow, so a version never comes
  back after a delete and re-create, which is what optimistic transactions
  compare.
* ``props(ns, kind, name, value, key_bytes)``: one row per indexed value (one
  per list element), ``value`` encoded so that SQLite's byte comparison is
  Datastore's value ordering. Filters and sort orders therefore only ever see
  indexed values, as in Datastore, and a query reads candidate keys from this
  index instead of scanning its kind.
* ``meta``: the commit counter and the id allocator. (In memory the one
  connection's gateway keeps the commit counter itself: ``_memory_seq``.)

Every write function here runs inside a write transaction (``BEGIN
IMMEDIATE``) that the gateway holds, so the checks and writes of one commit
are atomic.

Transactions are serializable, with snapshot reads. A transaction reads one
snapshot, pinned by its first read and named by its ``commit_seq``: a SQLite
read transaction on a connection it holds (WAL), or, in memory, the one
connection until a commit would change what it reads, then a copy of the
database as it was (``EmbeddedGateway._freeze_pinned``). Its commit takes the
write lock (writers are serial) and, if anything was committed since its
snapshot, checks that what it read is what it would read now: every entity
it looked up or a query returned has the version it read, and every query
it ran returns the same rows (so an entity that now matches, a phantom, is
seen). Otherwise it raises ``Contention``: the transaction behaves as if it
ran alone at its commit. Checking rows rather than SQLite's own snapshot
check (``SQLITE_BUSY_SNAPSHOT``, raised when anything at all was committed
since) keeps transactions on different entities, such as counter shards,
from aborting each other.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from types import TracebackType
from typing import Any, Hashable, Iterable, Iterator

import attrs

from gds_counter._process import deadlines, forks
from gds_counter._process.interrupts import surely
from gds_counter.errors import AlreadyExists, Contention, GatewayError, GDSError, NotFound
from gds_counter.gateway import _paths as paths
from gds_counter.gateway.base import TransactionState
from gds_counter.gateway.embedded._encoding import (
    ROUND_TRIP,
    Decodings,
    Index,
    dump_entity,
    dump_plain,
    index_entries,
    key_bytes,
    sortable,
    stable_index,
)
from gds_counter.gateway.embedded._transforms import incremented, request_time, transformed
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Insert, Update, Upsert
from gds_counter.gateway.query import Query
from gds_counter.gateway.values import RawEntity, check_entity_limits

log = logging.getLogger("gds_counter.gateway.embedded")

SCHEMA = """
CREATE TABLE IF NOT EXISTS entities (
    key_bytes BLOB PRIMARY KEY,
    ns TEXT NOT NULL,
    kind TEXT NOT NULL,
    version INTEGER NOT NULL,
    written_at REAL NOT NULL,
    data TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS entities_by_kind ON entities (ns, kind, key_bytes);
CREATE TABLE IF NOT EXISTS props (
    ns TEXT NOT NULL,
    kind TEXT NOT NULL,
    name TEXT NOT NULL,
    value BLOB NOT NULL,
    key_bytes BLOB NOT NULL,
    PRIMARY KEY (ns, kind, name, value, key_bytes)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS props_by_key ON props (key_bytes);
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO meta VALUES ('commit_seq', 0), ('next_id', 1);
"""

#: The tables and indexes ``SCHEMA`` creates, and the ``meta`` rows it inserts.
_SCHEMA_OBJECTS = frozenset({"entities", "entities_by_kind", "props", "props_by_key", "meta"})
_META_ROWS = ("commit_seq", "next_id")


def schema_ready(conn: sqlite3.Connection) -> bool:
    """Whether the file already holds every table, index and ``meta`` row:
    a read only, so a read-only file, or a reader that arrives while a writer
    holds the lock, can open the database without writing anything."""
    marks = ", ".join("?" * len(_SCHEMA_OBJECTS))
    found = conn.execute(f"SELECT count(*) FROM sqlite_master WHERE name IN ({marks})", sorted(_SCHEMA_OBJECTS)).fetchone()[0]
    if found != len(_SCHEMA_OBJECTS):
        return False
    rows = conn.execute("SELECT count(*) FROM meta WHERE name IN (?, ?)", _META_ROWS).fetchone()[0]
    return bool(rows == len(_META_ROWS))


def create_schema(conn: sqlite3.Connection) -> None:
    """Create whatever of ``SCHEMA`` is missing, in one write transaction, so
    a crash never leaves the tables without their ``meta`` rows. Idempotent:
    concurrent openers of one file agree."""
    try:
        conn.executescript("BEGIN IMMEDIATE;\n" + SCHEMA + "COMMIT;\n")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")


@attrs.define(eq=False)
class SharedCopy:
    """A copy of the database that transactions read (in memory, once a
    commit changed it; or rewound to a past ``read_time``), closed when the
    last of them ends: a ``sqlite3.Connection`` sits in a reference cycle
    with its statement cache, so a dropped copy would keep its memory until
    the cyclic collector ran (a served file's size per past read)."""

    conn: sqlite3.Connection
    users: int
    _lock: threading.Lock = attrs.field(factory=threading.Lock)

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            last = self.users == 0
        if last:
            self.conn.close()


@attrs.define
class Transaction(TransactionState):
    """A transaction: its snapshot, and what it read there, checked again at
    commit (see the module docstring)."""

    #: key encoding -> (version read, 0 if absent; the key, for messages)
    reads: dict[bytes, tuple[int, Key]] = attrs.field(factory=dict)
    #: each query a read-write transaction ran, with what it returned
    queries: list[tuple[Query, Hashable]] = attrs.field(factory=list)
    #: the commit number of its snapshot, once its first read pinned it
    seq: int | None = None
    #: a file's connection holding the snapshot (``ConnectionPool.hold``)
    conn: Any = None
    #: in memory, once a commit changed the database: a copy as it was at
    #: ``seq`` (or, at a past ``read_time``, as it was then); ``copy`` holds it
    snapshot: sqlite3.Connection | None = None
    copy: SharedCopy | None = None

    def saw(self, key_enc: bytes, version: int, key: Key) -> None:
        self.reads.setdefault(key_enc, (version, key))  # the first read is what the caller acted on


#: How often a writer tries again for the write lock another process holds.
WRITE_LOCK_POLL_S = 0.0002


class write_transaction:
    """A write transaction: ``BEGIN IMMEDIATE`` takes the file's write
    lock, waiting up to ``timeout`` seconds (the connection's busy timeout),
    or until the caller's deadline if that is sooner, for another process
    to let it go; the block writes and commits; one
    that does not commit is rolled back.

    The wait polls every ``WRITE_LOCK_POLL_S`` instead of going through
    SQLite's busy handler, which sleeps 1, 2, 5, 10 ... up to 100 ms between
    tries: another process's write transaction lasts a millisecond or so,
    so with four processes writing one file much of their time went to
    sleeping past the moment the lock was free (p99 of an increment 119 ms
    at 4 processes x 4 threads). The handler is switched off before the
    wait and back on once the transaction has ended, so that neither
    statement runs while this connection holds the lock the other processes
    wait for. Writers of one process never meet here: they queue on the
    pool's write lock first.

    A class, not a ``contextlib`` generator: an interrupt that lands as a
    generator's ``__enter__`` returns (after ``BEGIN``) leaves the generator
    suspended, holding the connection. The pool then lends that connection
    to another caller, and the generator's cleanup, whenever the garbage
    collector runs it, rolled back the other caller's transaction in the
    middle (its later statements then committed one by one: half a batch
    written). Here ``__enter__`` undoes its own ``BEGIN`` before the
    interrupt leaves it, and nothing runs later.

    ``timeout`` 0 (a database in memory, which lives in its one connection,
    so no other connection can hold its lock): no wait, and no busy
    handler to switch off and on, two statements fewer."""

    __slots__ = ("_conn", "_timeout")

    def __init__(self, conn: sqlite3.Connection, timeout: float) -> None:
        self._conn, self._timeout = conn, timeout

    def __enter__(self) -> None:
        conn = self._conn
        try:
            if not self._timeout:
                conn.execute("BEGIN IMMEDIATE")
                return
            conn.execute("PRAGMA busy_timeout = 0")
            # The caller's deadline may come sooner (``_process.deadlines``): a
            # writer behind a frozen lock holder gives up then, not 30 s later.
            deadline = time.monotonic() + deadlines.remaining(self._timeout)
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as exc:
                    if not is_busy(exc) or time.monotonic() >= deadline:
                        raise
                time.sleep(WRITE_LOCK_POLL_S)
        except BaseException:
            surely(self._end)
            raise

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        pending = surely(self._end)
        if exc is None and pending is not None:
            raise pending

    def _end(self) -> None:
        """Roll back what did not commit; switch the busy handler back on.
        Not on a connection of the parent's, in a child forked inside the
        transaction: the parent goes on with it (it is never used here again)."""
        conn = self._conn
        pid = getattr(conn, "pid", None)  # (a plain sqlite3 connection has none: its own)
        if pid is not None and not forks.owned_here(pid):
            return
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        if not self._timeout:
            return
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._timeout * 1000)}")
        except sqlite3.Error as exc:  # never turn a write that committed into an error
            log.warning("could not switch SQLite's busy handler back on: %r", exc)


def is_busy(exc: BaseException) -> bool:
    """Whether SQLite refused because another connection holds a lock."""
    if not isinstance(exc, sqlite3.OperationalError):
        return False
    text = str(exc)
    return "locked" in text or "busy" in text


def commit_seq(conn: sqlite3.Connection) -> int:
    """The number of the last commit: what a snapshot is named by."""
    return int(conn.execute("SELECT value FROM meta WHERE name = 'commit_seq'").fetchone()[0])


def check_unchanged(conn: sqlite3.Connection, txn: Transaction) -> None:
    """Raise Contention if any entity ``txn`` read was written (or created,
    or deleted) since: its row's version is no longer the one read."""
    for kb, (version, key) in txn.reads.items():
        row = conn.execute("SELECT version FROM entities WHERE key_bytes = ?", (kb,)).fetchone()
        if (row[0] if row else 0) != version:
            raise Contention(f"{key} changed since this transaction read it", attempts=1)


def _scatter(sequence: int) -> int:
    """Spread sequential numbers over a wide range (bit reversal, a bijection),
    so that allocated ids, like Datastore's, do not collide with small ids
    that callers pick by hand."""
    return int(f"{sequence:052b}"[::-1], 2)


#: Ids ``reserve_ids`` kept out of ``allocate``. Made by the first
#: ``reserve`` (not by ``SCHEMA``), so that a file written before it still
#: opens read-only and an allocation on it costs no extra read.
RESERVED_IDS = "CREATE TABLE IF NOT EXISTS reserved_ids (id INTEGER PRIMARY KEY)"


def allocate(conn: sqlite3.Connection, count: int) -> list[int]:
    """``count`` new ids, none of them reserved (``reserve``)."""
    out: list[int] = []
    while len(out) < count:
        wanted = count - len(out)
        end = conn.execute("UPDATE meta SET value = value + ? WHERE name = 'next_id' RETURNING value", (wanted,)).fetchall()[0][0]
        if end >= 2**52:
            raise GatewayError("the id allocator is exhausted")
        fresh = [_scatter(n) for n in range(end - wanted, end)]
        taken = _reserved(conn, fresh)
        out += [new_id for new_id in fresh if new_id not in taken]
    return out


def _reserved(conn: sqlite3.Connection, ids: list[int]) -> set[int]:
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'reserved_ids'").fetchone() is None:
        return set()
    found: set[int] = set()
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        found.update(row[0] for row in conn.execute(f"SELECT id FROM reserved_ids WHERE id IN ({marks})", chunk))
    return found


def reserve(conn: sqlite3.Connection, ids: Iterable[int]) -> None:
    """Keep ``ids`` out of every later ``allocate`` (inside a write transaction)."""
    conn.execute(RESERVED_IDS)
    conn.executemany("INSERT OR IGNORE INTO reserved_ids VALUES (?)", [(i,) for i in ids])


def check_exists(
    conn: sqlite3.Connection, mutation: Upsert, key: Key, stored: dict[bytes, str | None] | None, written: int = 0,
) -> None:
    """Refuse an ``Insert`` of an entity that exists and an ``Update`` of one
    that does not (before anything of the mutation is written). ``written``:
    how many mutations of its commit before it stay written if it is
    refused (a commit without a transaction: ``Stopped``), which the error
    says."""
    if not isinstance(mutation, (Insert, Update)):
        return
    kb = key_bytes(key)
    if stored is not None and kb in stored:
        exists = stored[kb] is not None
    else:
        exists = conn.execute("SELECT 1 FROM entities WHERE key_bytes = ?", (kb,)).fetchone() is not None
    what = "nothing of this commit was written" if not written else (
        f"the {written} mutation(s) before it in this commit were written and the rest were not (a commit without a "
        "transaction stops at the first mutation that fails: use a transaction for all or nothing)"
    )
    if isinstance(mutation, Insert) and exists:
        raise AlreadyExists(f"cannot insert {key}: it exists; {what}")
    if isinstance(mutation, Update) and not exists:
        raise NotFound(f"cannot update {key}: no such entity; {what}")


def stored_texts(conn: sqlite3.Connection, keys: Iterable[bytes]) -> dict[bytes, str | None]:
    """What ``entities.data`` holds for each of ``keys`` (None: nothing),
    read in one statement per 500 keys: a group commit reads the rows it
    writes at once, not one statement each while it holds the file's
    write lock."""
    wanted = list(dict.fromkeys(keys))
    texts: dict[bytes, str | None] = dict.fromkeys(wanted)
    for start in range(0, len(wanted), 500):
        chunk = wanted[start : start + 500]
        marks = ", ".join("?" * len(chunk))
        texts.update(conn.execute(f"SELECT key_bytes, data FROM entities WHERE key_bytes IN ({marks})", chunk).fetchall())
    return texts


class Stopped(Exception):
    """A commit without a transaction stopped at a mutation whose entity
    exists (an insert) or does not (an update): the mutations before it are
    written, as Datastore applies such a commit in order up to the first
    that fails (measured on the Firestore emulator; the v1 reference says a
    non-transactional commit "may not apply as all or none")."""

    def __init__(self, error: GDSError, seq: int) -> None:
        super().__init__(str(error))
        self.error, self.seq = error, seq


def upserted_keys(batch: Iterable[Any]) -> Iterator[bytes]:
    """The encoded keys a group's upserts write (those with a complete key)."""
    for request in batch:
        for mutation in request.mutations:
            if isinstance(mutation, Upsert) and mutation.entity.key is not None and not mutation.entity.key.is_partial:
                yield key_bytes(mutation.entity.key)


#: Longest text ``masked_plain`` writes without counting the limits: of
#: plain values (JSON with ASCII escapes) each property costs at most its
#: text plus 8 bytes of ``entity_size``, a key its text plus 8 per element,
#: and each takes 4 characters or more: under 48 + 5 x 4,096 bytes, and
#: at most 1,024 indexed values (tests/gateway/test_embedded_masked_writes.py).
PLAIN_TEXT_LIMIT = 4096


def _rows_of(index: Index) -> set[tuple[str, bytes]]:
    """The index rows (name, encoding) the index values ``index`` give today."""
    return {(name, enc) for name, values in index.items() for enc, _ in values}


def _index_rows(index: Index) -> set[tuple[str, bytes]] | None:
    """The index rows an entity with the index values ``index`` has stored,
    when every value's encoding never changed (None: read them)."""
    return _rows_of(index) if stable_index(index) else None


#: What ``masked_plain`` answers: the text to store, the transforms'
#: results, the written entity's index, and whether its index rows changed.
Plain = tuple[str, tuple[Any, ...], Index, bool]


def masked_plain(mutation: Upsert, key: Key, text: str, decodings: Decodings) -> Plain | None:
    """``upsert``'s masked write, for the counter's every ``add()``, without
    rebuilding the entity: the same text, results and index, when the
    stored text's decoding is remembered (``Decodings.plain``: a pure
    function of the text SQLite returned, so never stale), every value is
    plain (``ROUND_TRIP``) and every path names a top-level property. The
    stored properties with the named ones set, dropped or incremented; only
    their index entries remade (the rows change only if their encodings
    do); no limits counted (``PLAIN_TEXT_LIMIT``). None when it does not
    apply (a dotted path, a list, a datetime, an indexed float whose row
    may be of an older encoding...): ``upsert`` takes the general path."""
    if key.project is not None or mutation.entity.meanings:
        return None
    decoded = decodings.plain(text)
    if decoded is None:
        return None
    _, stored, stored_unindexed, stored_index, _ = decoded
    assert mutation.property_mask is not None
    given, excluded = mutation.entity.properties, mutation.entity.unindexed
    properties, unindexed, index = dict(stored), set(stored_unindexed), dict(stored_index)
    changed = False
    for name in mutation.property_mask:
        if "." in name or "`" in name:
            return None
        if name in given:
            value = given[name]
            if type(value) not in ROUND_TRIP:
                return None
            changed |= _put(properties, unindexed, index, name, value, name in excluded)
        else:  # in the mask but not the entity: Datastore removes it
            properties.pop(name, None)
            unindexed.discard(name)
            changed |= index.pop(name, None) is not None
    results = []
    for transform in mutation.transforms:
        name = transform.name
        if "." in name or "`" in name or type(transform) is not Increment:
            return None  # (the counter's transform is an increment of a top-level property)
        total = incremented(properties.get(name), transform.amount)
        changed |= _put(properties, unindexed, index, name, total, False)  # a transform's result is indexed
        results.append(total)
    unindexed.intersection_update(properties)
    written_unindexed = frozenset(unindexed)
    text = dump_plain(key, properties, written_unindexed)
    if len(text) > PLAIN_TEXT_LIMIT:
        return None
    index = {name: index[name] for name in properties if name in index}  # (in the entity's order, as index_entries)
    decodings.remember_plain(text, key, properties, written_unindexed, index)
    return text, tuple(results), index, changed


def _put(properties: dict[str, Any], unindexed: set[str], index: Index, name: str, value: Any, unindex: bool) -> bool:
    """Set ``name`` to the plain ``value`` (``paths.put`` of one member),
    remaking its index entry; whether its index rows changed."""
    properties[name] = value
    before = index.pop(name, None)
    if unindex:
        unindexed.add(name)
        return before is not None
    unindexed.discard(name)
    entry = sortable(value)
    index[name] = [(entry, value)]
    return before is None or len(before) != 1 or before[0][0] != entry


def upsert(
    conn: sqlite3.Connection, mutation: Upsert, key: Key, seq: int, now: float, decodings: Decodings,
    stored: dict[bytes, str | None] | None = None,
) -> tuple[Key, tuple[Any, ...]]:
    """Write one entity (after its property mask and transforms) and its index
    rows; return the key and the transform results.

    A row that exists is updated in place, and its index rows are rewritten
    only when they change: a counter shard's increment changes its ``count``
    alone, so its commit writes the row's page and the count's one index row
    (a transform's result is indexed, as on the Firestore emulator), nothing
    of the target's rows or ``entities_by_kind`` (every page a commit
    touches is another write into the WAL). The stored index rows are compared, not the old
    entity's, so rows written under an older encoding are still replaced.

    ``stored``, when given, holds what this transaction knows some keys'
    rows hold (``stored_texts``); this write keeps it up to date."""
    entity = mutation.entity
    kb = key_bytes(key)
    if stored is not None and kb in stored:
        text = stored[kb]
        row = None if text is None else (text,)
    else:
        row = conn.execute("SELECT data FROM entities WHERE key_bytes = ?", (kb,)).fetchone()
    if row is not None and mutation.property_mask is not None:
        plain = masked_plain(mutation, key, row[0], decodings)  # a counter's add(): no entity rebuilt
        if plain is not None:
            text, results, index, changed = plain
            conn.execute("UPDATE entities SET version = ?, written_at = ?, data = ? WHERE key_bytes = ?", (seq, now, text, kb))
            if stored is not None:
                stored[kb] = text
            if changed:
                _write_index(conn, key, kb, _rows_of(index), fresh=False)
            return key, results
    old_index: Index | None = None  # the stored entity's index values, when decoded
    if mutation.property_mask is None:
        properties = dict(entity.properties)
        unindexed = set(entity.unindexed) & set(properties)
        meanings = dict(entity.meanings)
    else:
        old, old_index = decodings.load_indexed(row[0], key) if row else (RawEntity(key), None)
        properties, unindexed, meanings = dict(old.properties), set(old.unindexed), dict(old.meanings)
        for name in mutation.property_mask:  # a path: "e.x" is x inside the entity value e
            members = paths.parse(name)
            value = paths.get(entity.properties, members)
            if value is paths.MISSING:
                paths.drop(properties, unindexed, members, meanings)  # in the mask but not the entity: Datastore removes it
            else:
                paths.put(properties, unindexed, members, value, paths.excluded(entity, members), meanings, paths.meaning_at(entity, members))
    transform_results = []
    when = request_time(now)  # (one clock reading per commit: every REQUEST_TIME of it is the same)
    for transform in mutation.transforms:
        members = paths.parse(transform.name)
        value, result = transformed(transform, paths.get(properties, members), when)
        # Indexed, whatever the written entity says of it: the Firestore
        # emulator indexes a transform's result (docs/gql.md); and it drops
        # the value's meaning.
        paths.put(properties, unindexed, members, value, False, meanings, None)
        transform_results.append(result)
    written = RawEntity(key, properties, frozenset(unindexed & set(properties)))
    if meanings:
        written.meanings = {name: meaning for name, meaning in meanings.items() if name in properties}
    if mutation.property_mask is not None or mutation.transforms:
        check_entity_limits(written)  # stored values and new ones together, never validated as a whole
    indexed = list(index_entries(written))
    entries = {(name, enc) for name, enc, _ in indexed}
    text = dump_entity(written)
    decodings.remember_written(text, written, indexed)  # the next write or read of this row need not decode it
    if row is None:
        conn.execute(
            "INSERT INTO entities (key_bytes, ns, kind, version, written_at, data) VALUES (?, ?, ?, ?, ?, ?)",
            (kb, key.namespace, key.kind, seq, now, text),
        )
        known: set[tuple[str, bytes]] | None = None
    else:
        # Before the first write: a single mutation raises before it writes.
        known = _stored_index(row[0], decodings) if old_index is None else _index_rows(old_index)
        conn.execute("UPDATE entities SET version = ?, written_at = ?, data = ? WHERE key_bytes = ?", (seq, now, text, kb))
    if stored is not None:
        stored[kb] = text
    if row is None or known != entries:  # (known: the rows the stored text implies, None if not known)
        _write_index(conn, key, kb, entries, fresh=row is None)
    return key, tuple(transform_results)


def _write_index(conn: sqlite3.Connection, key: Key, kb: bytes, entries: set[tuple[str, bytes]], *, fresh: bool) -> None:
    """Make ``entries`` the index rows of the entity ``kb``: of a row just
    inserted (``fresh``), or of one whose rows are read and replaced unless
    they are these already."""
    if not fresh:
        if set(conn.execute("SELECT name, value FROM props WHERE key_bytes = ?", (kb,))) == entries:
            return
        conn.execute("DELETE FROM props WHERE key_bytes = ?", (kb,))
    conn.executemany(
        "INSERT OR IGNORE INTO props (ns, kind, name, value, key_bytes) VALUES (?, ?, ?, ?, ?)",
        [(key.namespace, key.kind, name, enc, kb) for name, enc in entries],
    )


def _stored_index(text: str, decodings: Decodings) -> set[tuple[str, bytes]] | None:
    """The index rows an entity stored as ``text`` has, known without reading
    them when every indexed value is of a type whose encoding never changed
    (None: read them)."""
    try:
        index = decodings.load_indexed(text)[1]
    except (GDSError, ValueError, LookupError, TypeError):  # unreadable: its rows are read instead
        return None
    return None if index is None else _index_rows(index)
