"""The embedded engine's history (``gateway.embedded._history``): the
versions commits replace, kept where asked, so that a read-only transaction
reads at a past ``read_time``. What a read at each time sees is compared
with the Firestore emulator in tests/conformance/test_read_time.py; these
are the engine's own promises: files made before the history existed keep
working and keep it from when it is asked, every writer of a file that
keeps it keeps its deletes too, and old versions are pruned."""

from __future__ import annotations

import datetime as dt
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from moments import after_commit

from gds_counter.errors import BadValueError, ReadTimeTooOld
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.embedded._history import HISTORY_S, prune
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Upsert
from gds_counter.gateway.values import RawEntity

K = Key.of("H", "a")




def read_at(gw: EmbeddedGateway, read_time: dt.datetime) -> Any:
    token = gw.begin_transaction(read_only=True, read_time=read_time)
    try:
        [found] = gw.lookup([K], transaction=token)
    finally:
        gw.rollback(token)
    return None if found is None else found.properties["n"]


def put(gw: EmbeddedGateway, n: int) -> None:
    gw.commit([Upsert(RawEntity(K, {"n": n}))])


def test_without_history_a_past_read_is_refused_as_too_old():
    """A gateway not asked to keep history has none to read: the read is
    refused (nothing older than now is kept), and says how to keep it."""
    with EmbeddedGateway(None) as gw:
        put(gw, 1)
        with pytest.raises(ReadTimeTooOld, match=r"keeps no history.*history=True"):
            read_at(gw, after_commit())


def test_a_file_made_before_history_keeps_it_from_when_it_is_asked(tmp_path: Path):
    """A file written without history (as every file was before it existed)
    opens with it: its history starts then. A time before that is too old
    (its earlier versions were never kept), one after reads as it was."""
    path = tmp_path / "old.sqlite3"
    with EmbeddedGateway(path) as old:
        put(old, 1)
    before = after_commit()
    with EmbeddedGateway(path, history=True) as gw:
        opened = after_commit()
        put(gw, 2)
        written = after_commit()
        with pytest.raises(ReadTimeTooOld, match="history starts at"):
            read_at(gw, before)
        assert (read_at(gw, opened), read_at(gw, written)) == (1, 2)


def test_every_writer_of_a_file_that_keeps_history_keeps_it(tmp_path: Path):
    """Once a file keeps history, a gateway that did not ask for it still
    keeps what its commits replace: an update (the file's trigger) and a
    delete (its commit sees the history table)."""
    path = tmp_path / "shared.sqlite3"
    with EmbeddedGateway(path, history=True) as reader, EmbeddedGateway(path) as writer:
        put(writer, 1)
        first = after_commit()
        put(writer, 2)
        second = after_commit()
        writer.commit([Delete(K)])
        gone = after_commit()
        assert [read_at(reader, t) for t in (first, second, gone)] == [1, 2, None]


def test_versions_replaced_over_the_window_ago_are_pruned(tmp_path: Path):
    """A replaced version is kept ``HISTORY_S`` after it was replaced, then
    pruned (every ``PRUNE_EVERY`` commits): the history does not grow
    without bound under a counter's writes."""
    path = tmp_path / "pruned.sqlite3"
    with EmbeddedGateway(path, history=True) as gw:
        for n in range(4):
            put(gw, n)
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        assert conn.execute("SELECT count(*) FROM history").fetchone()[0] == 3
        prune(conn, time.time())
        assert conn.execute("SELECT count(*) FROM history").fetchone()[0] == 3  # none is that old yet
        prune(conn, time.time() + HISTORY_S + 1)
        assert conn.execute("SELECT count(*) FROM history").fetchone()[0] == 0
    finally:
        conn.close()


def test_a_read_only_gateway_cannot_be_asked_to_keep_history(tmp_path: Path):
    """Keeping history writes; a read-only gateway is told so at open."""
    path = tmp_path / "ro.sqlite3"
    EmbeddedGateway(path).close()
    with pytest.raises(BadValueError, match="read-only"):
        EmbeddedGateway(path, read_only=True, history=True)


def test_past_the_most_versions_kept_the_oldest_go_and_reads_before_them_are_too_old(tmp_path: Path):
    """A hot counter writes a version per ``add``: the history keeps at most
    ``MAX_VERSIONS`` (here 2), and a read at a time whose version was pruned
    is ``ReadTimeTooOld``, not an answer without it; later reads still see
    their versions."""
    path = tmp_path / "capped.sqlite3"
    with EmbeddedGateway(path, history=True) as gw:
        times = []
        for n in range(5):
            put(gw, n)
            times.append(after_commit())
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            prune(conn, time.time(), most=2)
            assert conn.execute("SELECT count(*) FROM history").fetchone()[0] == 2
        finally:
            conn.close()
        for pruned in times[:2]:
            with pytest.raises(ReadTimeTooOld):
                read_at(gw, pruned)
        assert [read_at(gw, at) for at in times[2:]] == [2, 3, 4]


def test_a_past_reads_copy_is_closed_when_its_transaction_ends(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A read at a past time reads a copy of the database; the copy's
    memory must go when the transaction ends, not whenever the cyclic
    collector runs (a served file's size per read: 36 MB a read on a 32 MB
    file, 3 GB after batches of concurrent reads, before this)."""
    from gds_counter.gateway.embedded import _engine

    copies: list[sqlite3.Connection] = []

    def spied(conn: sqlite3.Connection, read_time: dt.datetime) -> sqlite3.Connection:
        copies.append(_engine_past(conn, read_time))
        return copies[-1]

    _engine_past = _engine.past
    monkeypatch.setattr(_engine, "past", spied)
    with EmbeddedGateway(tmp_path / "copies.sqlite3", history=True) as gw:
        put(gw, 1)
        then = after_commit()
        put(gw, 2)
        assert [read_at(gw, then) for _ in range(3)] == [1, 1, 1]
    assert len(copies) == 3
    for copy in copies:
        with pytest.raises(sqlite3.ProgrammingError):
            copy.execute("SELECT 1")
