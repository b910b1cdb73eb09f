"""The embedded engine's shortcuts on the counter's hot path keep its meaning.

Reads remember decoded entities by their stored text, a write rewrites a
row's index entries only when they change, and one process's writers queue
on a lock instead of SQLite's busy handler. Each test here states what a
caller must still see.
"""

from __future__ import annotations

import datetime as dt
import enum
import sqlite3
import threading
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gds_counter.errors import BadValueError, Contention
from gds_counter.gateway.base import run_query_all
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.embedded._encoding import (
    key_bytes,
    sortable,
)
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Upsert
from gds_counter.gateway.query import CompositeFilter, PropertyFilter, Query
from gds_counter.gateway.values import MAX_ENTITY_BYTES, RawEntity, entity_size


@pytest.fixture(params=["memory", "file"])
def gw(request, tmp_path):
    gateway = EmbeddedGateway(None if request.param == "memory" else str(tmp_path / "db.sqlite3"))
    yield gateway
    gateway.close()


def shard(name: str, count: int, target: str = "T_1") -> RawEntity:
    return RawEntity(Key.of("Shard", name), {"target": target, "count": count}, frozenset({"count"}))


def by_target(gw, target: str) -> list[RawEntity]:
    return list(run_query_all(gw, Query("Shard", filter=PropertyFilter("target", "=", target))))


def increment(gw, name: str, amount: int = 1, target: str = "T_1") -> tuple:
    entity = RawEntity(Key.of("Shard", name), {"target": target}, frozenset({"count"}))
    [result] = gw.commit([Upsert(entity, property_mask=("target",), transforms=(Increment("count", amount),))]).mutation_results
    return result.transform_results


def test_a_caller_changing_a_read_entity_changes_no_later_read(gw):
    gw.commit([Upsert(shard("T_1_1", 5))])
    for read in (lambda: by_target(gw, "T_1")[0], lambda: gw.lookup([Key.of("Shard", "T_1_1")])[0]):
        first = read()
        first.properties["count"] = 999
        first.properties["extra"] = "x"
        again = read()
        assert again.properties == {"target": "T_1", "count": 5}
        assert again is not first and again.properties is not first.properties


def test_mutable_values_are_never_shared_between_reads(gw):
    key = Key.of("Doc", "d")
    inner = RawEntity(None, {"a": 1})
    gw.commit([Upsert(RawEntity(key, {"tags": ["x", "y"], "inner": inner}))])
    first = gw.lookup([key])[0]
    first.properties["tags"].append("z")
    first.properties["inner"].properties["a"] = 2
    [again] = list(run_query_all(gw, Query("Doc")))
    assert again.properties["tags"] == ["x", "y"]
    assert again.properties["inner"].properties == {"a": 1}


def test_equal_texts_of_other_keys_or_types_stay_apart(gw):
    """Remembering decodes by text must not merge values that only compare
    equal (1, 1.0 and True; naive text vs the same digits)."""
    gw.commit([Upsert(RawEntity(Key.of("V", n), {"v": v})) for n, v in (("i", 1), ("f", 1.0), ("b", True), ("s", "1"))])
    for _ in range(2):
        found = {e.key.name: e.properties["v"] for e in run_query_all(gw, Query("V"))}
        assert {n: (type(v), v) for n, v in found.items()} == {
            "i": (int, 1), "f": (float, 1.0), "b": (bool, True), "s": (str, "1"),
        }


class Level(enum.IntEnum):
    HIGH = 3


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=20),
    st.floats(allow_nan=False),
    st.binary(max_size=8),
    st.just(Level.HIGH),  # an int subclass: stored as an int, read back as one
    st.datetimes(timezones=st.just(dt.timezone.utc)),
    st.builds(Key.of, st.just("Ref"), st.text(min_size=1, max_size=8).filter(lambda n: not n.startswith("__"))),
    st.lists(st.integers(min_value=0, max_value=9), max_size=3),
)


def test_an_increment_keeps_the_shard_in_its_target_query_and_indexes_its_result(gw):
    """The shard's count was written excluded from the indexes; an increment's
    result is indexed all the same, as the Firestore emulator indexes it
    (tests/server/test_serve_engine_differences.py compares the two)."""
    gw.commit([Upsert(shard("T_1_1", 0))])
    assert [increment(gw, "T_1_1") for _ in range(3)] == [(1,), (2,), (3,)]
    assert [e.properties["count"] for e in by_target(gw, "T_1")] == [3]
    assert [e.key.name for e in run_query_all(gw, Query("Shard", filter=PropertyFilter("count", "=", 3)))] == ["T_1_1"]
    assert list(run_query_all(gw, Query("Shard", filter=PropertyFilter("count", "=", 2)))) == []


def test_a_changed_indexed_value_moves_the_entity_between_query_answers(gw):
    gw.commit([Upsert(shard("s", 1, target="old"))])
    increment(gw, "s", target="new")
    assert by_target(gw, "old") == []
    assert [(e.key.name, e.properties["count"]) for e in by_target(gw, "new")] == [("s", 2)]
    gw.commit([Upsert(RawEntity(Key.of("Shard", "s"), {"target": "new", "count": 7}))])  # count now indexed
    assert [e.key.name for e in run_query_all(gw, Query("Shard", filter=PropertyFilter("count", "=", 7)))] == ["s"]
    gw.commit([Upsert(shard("s", 8, target="new"))])  # and unindexed again
    assert list(run_query_all(gw, Query("Shard", filter=PropertyFilter("count", ">=", 0)))) == []


def test_a_rewrite_replaces_index_rows_of_an_older_encoding(tmp_path):
    """Files written before -0.0 had its own encoding hold it indexed as 0.0.
    The index rows kept on a rewrite are then compared with the stored ones,
    not with the old entity's, so the old row is replaced even when the
    values are the same."""
    path = str(tmp_path / "db.sqlite3")
    gw = EmbeddedGateway(path)
    try:
        key = Key.of("Shard", "s")
        gw.commit([Upsert(RawEntity(key, {"v": -0.0, "target": "T"}))])
        with sqlite3.connect(path) as raw:  # as an older release indexed it
            raw.execute("UPDATE props SET value = ? WHERE key_bytes = ? AND name = 'v'", (sortable(0.0), key_bytes(key)))
        gw.commit([Upsert(RawEntity(key, {"v": -0.0, "target": "T"}))])
        with sqlite3.connect(path) as raw:
            rows = raw.execute("SELECT name, value FROM props WHERE key_bytes = ? ORDER BY name", (key_bytes(key),)).fetchall()
        assert rows == [("target", sortable("T")), ("v", sortable(-0.0))]
    finally:
        gw.close()


def test_a_failed_write_lets_the_next_writer_of_the_process_in(tmp_path):
    gw = EmbeddedGateway(str(tmp_path / "db.sqlite3"))
    try:
        pad = MAX_ENTITY_BYTES - entity_size(RawEntity(Key.of("Shard", "s"), {"target": "T_1", "p1": b"", "p2": b""}))
        halves = {"p1": b"x" * (pad // 2), "p2": b"x" * (pad - pad // 2)}  # (each under the value limit)
        gw.commit([Upsert(RawEntity(Key.of("Shard", "s"), {"target": "T_1", **halves}, frozenset(halves)))])
        with pytest.raises(BadValueError, match="entity limit"):  # stored and new values together, at the write
            increment(gw, "s")
        done: list[tuple] = []
        writer = threading.Thread(target=lambda: done.append(increment(gw, "t")))
        writer.start()
        writer.join(timeout=60)
        assert done == [(1,)]
        assert "count" not in gw.lookup([Key.of("Shard", "s")])[0].properties
    finally:
        gw.close()


def test_a_writer_waits_for_another_processs_write_lock_then_commits(tmp_path, monkeypatch):
    """Another process (a plain sqlite3 connection here) holds the file's
    write lock: a commit waits for it, without SQLite's busy handler, and
    lands once it is free; a wait longer than the busy timeout is
    Contention, naming the file, with nothing written. The connection keeps
    its busy timeout for reads either way."""
    from gds_counter.errors import Contention
    from gds_counter.gateway.embedded import _connections

    monkeypatch.setattr(_connections, "BUSY_TIMEOUT_S", 1.0)  # connections opened from here on wait 1 s
    path = str(tmp_path / "db.sqlite3")
    gw = EmbeddedGateway(path)
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        gw.commit([Upsert(shard("s", 1))])
        other.execute("BEGIN IMMEDIATE")
        released = threading.Timer(0.1, lambda: other.execute("COMMIT"))
        released.start()
        gw.commit([Upsert(shard("s", 2))])  # waits until the other writer commits
        released.join()
        assert gw.lookup([Key.of("Shard", "s")])[0].properties["count"] == 2

        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(Contention, match="locked") as raised:
            gw.commit([Upsert(shard("s", 3))])
        assert "db.sqlite3" in str(raised.value)
        other.execute("ROLLBACK")
        assert gw.lookup([Key.of("Shard", "s")])[0].properties["count"] == 2
        with gw._db() as conn:
            assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 1000
    finally:
        other.close()
        gw.close()


def test_equality_queries_answered_by_the_index_alone_match_as_datastore_does(gw):
    """Where the index SQL is exact (equalities), the Python check is skipped:
    a list matches by any element, values of other types never match, and
    ``__key__`` equality finds one entity."""
    gw.commit([Upsert(RawEntity(Key.of("E", name), props)) for name, props in (
        ("list", {"v": [1, "a"]}), ("int", {"v": 1}), ("float", {"v": 1.0}), ("bool", {"v": True}),
        ("str", {"v": "1"}), ("none", {"v": None}), ("hidden", {"v": 1, "w": 2}),
    )] + [Upsert(RawEntity(Key.of("E", "unindexed"), {"v": 1}, frozenset({"v"})))])

    def names(**kwargs) -> list:
        return sorted(e.key.name for e in run_query_all(gw, Query("E", **kwargs)))

    assert names(filter=PropertyFilter("v", "=", 1)) == ["hidden", "int", "list"]
    assert names(filter=PropertyFilter("v", "=", "a")) == ["list"]
    assert names(filter=PropertyFilter("v", "=", True)) == ["bool"]
    assert names(filter=PropertyFilter("v", "=", 1.0)) == ["float"]
    assert names(filter=PropertyFilter("v", "=", None)) == ["none"]
    assert names(filter=PropertyFilter("__key__", "=", Key.of("E", "str"))) == ["str"]
    both = CompositeFilter("AND", (PropertyFilter("v", "=", 1), PropertyFilter("w", "=", 2)))
    assert names(filter=both) == ["hidden"]


def _stored_text(gw, key: Key) -> str:
    with gw._db() as conn:  # white box: the row as SQLite holds it
        return conn.execute("SELECT data FROM entities WHERE key_bytes = ?", (key_bytes(key),)).fetchone()[0]


def test_a_row_this_process_wrote_is_not_decoded_again(gw, monkeypatch):
    """A lone ``add()`` writes a new text into its shard every time, and the
    next write and the next read of that shard used to decode it back
    (JSON, then a validated key: a fifth of the engine's time for the
    write). The writer knows what the text says, so neither the next
    increment nor a query nor a lookup decodes it."""
    from gds_counter.gateway.embedded import _encoding

    target = f"T_{uuid.uuid4().hex}"  # texts no earlier test wrote (decodings are remembered by text)
    gw.commit([Upsert(shard("T_1_1", 0, target))])
    increment(gw, "T_1_1", target=target)
    decoded: list[str] = []
    real_loads = _encoding.json.loads

    def counting_loads(text, *args, **kwargs):
        decoded.append(text)
        return real_loads(text, *args, **kwargs)

    monkeypatch.setattr(_encoding.json, "loads", counting_loads)
    assert increment(gw, "T_1_1", target=target) == (2,)
    assert [e.properties["count"] for e in by_target(gw, target)] == [2]
    assert gw.lookup([Key.of("Shard", "T_1_1")])[0].properties == {"target": target, "count": 2}
    assert decoded == []


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from(["a", "b", "target"]), _values, max_size=3), st.booleans())
def test_what_a_write_remembers_is_what_its_stored_text_decodes_to(properties, masked):
    """What a write remembers of the text it stored is exactly what decoding
    that text gives (type for type: a datetime comes back in UTC, an int
    subclass as an int, a key without its project); a value that would not
    come back equal is not remembered but decoded when read."""
    from gds_counter.gateway.embedded import _encoding

    gw = EmbeddedGateway(None)
    try:
        key = Key.of("E", "e")
        entity = RawEntity(key, properties, frozenset({"b"}) & set(properties))
        gw.commit([Upsert(RawEntity(key, {"c": 1}))])
        mutation = Upsert(entity, property_mask=tuple(properties), transforms=(Increment("c", 2),)) if masked else Upsert(entity)
        gw.commit([mutation])
        text = _stored_text(gw, key)
        fresh = _encoding._entity_from_json(_encoding.json.loads(text))
        for read in (gw.lookup([key])[0], *run_query_all(gw, Query("E"))):
            assert read == fresh
            assert {n: type(v) for n, v in read.properties.items()} == {n: type(v) for n, v in fresh.properties.items()}
    finally:
        gw.close()


def test_a_write_in_memory_sends_no_busy_handler_or_commit_counter_statements():
    """A database in memory lives in its one connection, so no other
    connection can hold its lock: a write there neither waits for one nor
    switches SQLite's busy handler off and on around it, and its commit
    number comes from the gateway, which knows the last one, not from
    ``meta`` (three statements of the seven a lone write ran). Versions
    still grow with every commit, so a transaction that read before another
    commit wrote its entity is refused."""
    gw = EmbeddedGateway(None)
    try:
        gw.commit([Upsert(shard("T_1_1", 0))])
        statements: list[str] = []
        with gw._db() as conn:
            conn.set_trace_callback(statements.append)
        increment(gw, "T_1_1")
        with gw._db() as conn:
            conn.set_trace_callback(None)
        assert statements[0] == "BEGIN IMMEDIATE" and statements[-1] == "COMMIT"
        assert not [sql for sql in statements if "PRAGMA" in sql or "meta" in sql]
        assert increment(gw, "T_1_1") == (2,)
        txn = gw.begin_transaction()
        gw.lookup([Key.of("Shard", "T_1_1")], transaction=txn)
        increment(gw, "T_1_1")
        with pytest.raises(Contention):
            gw.commit([Upsert(shard("T_1_1", 0))], transaction=txn)
        assert increment(gw, "T_1_1") == (4,)
    finally:
        gw.close()


def test_a_counters_target_query_reads_its_shards_from_the_index_in_key_order(gw):
    """An equality on one property (the article's target query) finds each
    key once, in key order, in the index's rows for that value: its SQL
    neither removes duplicates nor sorts (no temporary b-tree; they were 2.6
    of the 13 us SQLite spent on a read of 20 shards). The answer is still
    every shard of the target, in key order, and a cursor from the middle
    of it resumes after the row it was taken at."""
    gw.commit([Upsert(shard(f"T_1_{n}", n)) for n in range(1, 21)] + [Upsert(shard(f"T_2_{n}", n, "T_2")) for n in range(1, 6)])
    query = Query("Shard", filter=PropertyFilter("target", "=", "T_1"))
    assert "TEMP B-TREE" not in gw.explain_query(query)
    names = [e.key.name for e in by_target(gw, "T_1")]
    assert sorted(names, key=lambda name: key_bytes(Key.of("Shard", name))) == names
    assert set(names) == {f"T_1_{n}" for n in range(1, 21)}
    first = gw.run_query(query.replace(limit=7))
    rest = list(run_query_all(gw, query.replace(start_cursor=first.end_cursor)))
    assert [e.key.name for e in first.entities] + [e.key.name for e in rest] == names


def test_a_key_ordered_query_pages_in_batches_at_the_batch_size(gw):
    """A key-ordered query with nothing to check in Python (its SQL's rows
    are its answer) is read a batch at a time: up to ``BATCH_SIZE`` rows,
    and ``more_results`` only while a row is left and the limit allows;
    the batch after a cursor continues where the first ended."""
    from gds_counter.gateway.embedded._query_batches import BATCH_SIZE

    count = BATCH_SIZE + 1
    gw.commit([Upsert(shard(f"s{n:04d}", n, "T")) for n in range(count)])
    query = Query("Shard", filter=PropertyFilter("target", "=", "T"))
    for limit, sizes in ((None, [BATCH_SIZE, 1]), (BATCH_SIZE, [BATCH_SIZE]), (count, [BATCH_SIZE, 1]), (5, [5])):
        got, cursor = [], None
        while True:
            result = gw.run_query(query.replace(limit=None if limit is None else limit - sum(got), start_cursor=cursor))
            got.append(len(result.entities))
            if not result.more_results:
                break
            cursor = result.end_cursor
        assert got == sizes, limit
    names = [e.key.name for e in by_target(gw, "T")]
    assert names == [f"s{n:04d}" for n in range(count)]
