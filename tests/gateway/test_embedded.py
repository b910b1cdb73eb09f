"""The embedded SQLite gateway, read as its specification.

Each test states one Datastore behaviour the engine must copy, so that code
tried on it behaves the same on Cloud Datastore.
"""

from __future__ import annotations

import datetime as dt
import multiprocessing
import os
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from gds_counter.errors import BadKeyError, BadValueError, Contention, GatewayError
from gds_counter.gateway import open_gateway
from gds_counter.gateway.base import Gateway, run_query_all
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.embedded._connections import POOL_SIZE
from gds_counter.gateway.embedded._engine import BATCH_SIZE
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Increment, MutationResult, Upsert
from gds_counter.gateway.query import CompositeFilter, Order, PropertyFilter, Query
from gds_counter.gateway.values import Geopoint, RawEntity

UTC = dt.timezone.utc


@pytest.fixture(params=["memory", "file"])
def gw(request, tmp_path):
    gateway = EmbeddedGateway(None if request.param == "memory" else str(tmp_path / "db.sqlite3"))
    yield gateway
    gateway.close()


@pytest.fixture
def db_path(tmp_path) -> str:
    return str(tmp_path / "shared.sqlite3")


def put(gw, *entities: RawEntity) -> list[Key]:
    return [r.key for r in gw.commit([Upsert(e) for e in entities]).mutation_results]


def names(entities) -> list:
    return [e.key.id_or_name for e in entities]


def query(gw, **kwargs) -> list[RawEntity]:
    return list(run_query_all(gw, Query(**kwargs)))


# --- values ---------------------------------------------------------------


def test_every_value_type_round_trips_exactly(gw):
    berlin = dt.timezone(dt.timedelta(hours=2))
    original = RawEntity(
        Key.of("Thing", "all"),
        {
            "none": None,
            "yes": True,
            "int": -(2**63),
            "big": 2**63 - 1,
            "float": 0.1,
            "inf": float("inf"),
            "text": "héllo \x00 wörld",
            "blob": b"\x00\xff\x01",
            "when": dt.datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC),
            "elsewhere": dt.datetime(2024, 3, 1, 1, 0, 0, 7, tzinfo=berlin),
            "key": Key.of("Parent", "p", "Child", 42, namespace="other"),
            "point": Geopoint(52.52, 13.405),
            "inner": RawEntity(Key.of("In", 1), {"deep": [1, "two"], "hidden": "x"}, {"hidden"}),
            "anonymous": RawEntity(None, {"a": 1}),
            "list": [1, "a", None, b"b", 2.5],
            "quiet_list": ["x", "y"],
            "empty": [],
        },
        {"quiet_list", "inner", "anonymous"},
    )
    put(gw, original)
    (back,) = gw.lookup([original.key])
    assert back == original
    assert back.properties["elsewhere"] == dt.datetime(2024, 2, 29, 23, 0, 0, 7, tzinfo=UTC)
    assert back.properties["elsewhere"].tzinfo == UTC
    assert type(back.properties["float"]) is float and type(back.properties["int"]) is int
    assert back.unindexed == {"quiet_list", "inner", "anonymous"}


def test_lookup_keeps_input_order_and_gives_none_for_missing(gw):
    put(gw, RawEntity(Key.of("A", 1), {"n": 1}), RawEntity(Key.of("A", 2), {"n": 2}))
    got = gw.lookup([Key.of("A", 2), Key.of("A", 3), Key.of("A", 1)])
    assert [e and e.properties["n"] for e in got] == [2, None, 1]


def test_bad_input_is_rejected_before_anything_is_written(gw):
    with pytest.raises(BadKeyError):
        gw.lookup([Key.of("A")])
    with pytest.raises(BadKeyError):
        gw.commit([Delete(Key.of("A"))])
    with pytest.raises(BadValueError, match="1500"):
        gw.commit([Upsert(RawEntity(Key.of("A", 1), {"ok": 1})), Upsert(RawEntity(Key.of("A", 2), {"s": "x" * 1501}))])
    assert gw.lookup([Key.of("A", 1)]) == [None]
    put(gw, RawEntity(Key.of("A", 3), {"s": "x" * 1501}, {"s"}))  # unindexed long strings are fine


# --- ordering ----------------------------------------------------------------


def test_mixed_types_sort_in_datastore_order(gw):
    values = {
        "null": None,
        "neg": -3,
        "early": dt.datetime(1970, 1, 1, 0, 0, 0, 4, tzinfo=UTC),  # 4 microseconds: between -3 and 5
        "five": 5,
        "late": dt.datetime(2020, 1, 1, tzinfo=UTC),
        "false": False,
        "true": True,
        "str_a": "a",
        "bytes_b": b"b",
        "str_c": "c",
        "bytes_z": b"z",
        "float_neg": -100.0,
        "float": 1.5,
        "geo_low": Geopoint(-10, 50),
        "geo_high": Geopoint(10, -50),
        "key_id": Key.of("K", 7),
        "key_name": Key.of("K", "a"),
        "key_child": Key.of("K", "a", "C", 1),
    }
    put(gw, *(RawEntity(Key.of("Mixed", name), {"v": value}) for name, value in values.items()))
    expected = [
        "null", "neg", "early", "five", "late", "false", "true", "str_a", "bytes_b", "str_c", "bytes_z",
        "float_neg", "float", "geo_low", "geo_high", "key_id", "key_name", "key_child",
    ]  # fmt: skip
    assert names(query(gw, kind="Mixed", order=[Order("v")])) == expected
    assert names(query(gw, kind="Mixed", order=[Order("v", descending=True)])) == expected[::-1]
    # an inequality spans types, as a range over one index does in Datastore,
    # and without ORDER BY comes back in the inequality property's order (the
    # Firestore emulator's; tests/conformance/test_differential.py)
    assert names(query(gw, kind="Mixed", filter=PropertyFilter("v", "<", "b"))) == expected[: expected.index("str_a") + 1]


def test_keys_order_by_path_ids_before_names(gw):
    keys = [Key.of("B", 1), Key.of("A", "z"), Key.of("A", 10), Key.of("A", 9), Key.of("A", "b"), Key.of("A", "b", "C", 1)]
    put(gw, *(RawEntity(k) for k in keys))
    assert [e.key for e in query(gw, kind=None)] == [
        Key.of("A", 9), Key.of("A", 10), Key.of("A", "b"), Key.of("A", "b", "C", 1), Key.of("A", "z"), Key.of("B", 1)
    ]  # fmt: skip
    assert names(query(gw, kind="A", order=[Order("__key__", descending=True)])) == ["z", "b", 10, 9]


def test_ties_break_by_key_and_entities_without_the_property_are_left_out(gw):
    put(
        gw,
        RawEntity(Key.of("T", "b"), {"n": 1}),
        RawEntity(Key.of("T", "a"), {"n": 1}),
        RawEntity(Key.of("T", "c"), {"n": 0}),
        RawEntity(Key.of("T", "none"), {"n": None}),
        RawEntity(Key.of("T", "missing"), {}),
        RawEntity(Key.of("T", "hidden"), {"n": 5}, {"n"}),
    )
    assert names(query(gw, kind="T", order=[Order("n")])) == ["none", "c", "a", "b"]
    # ties break by key in the direction of the last sort order (the Firestore emulator's)
    assert names(query(gw, kind="T", order=[Order("n", descending=True)])) == ["b", "a", "c", "none"]


# --- filters -------------------------------------------------------------------


@pytest.fixture
def numbers(gw):
    put(gw, *(RawEntity(Key.of("N", i), {"n": i, "parity": "even" if i % 2 == 0 else "odd"}) for i in range(1, 7)))
    return gw


@pytest.mark.parametrize(
    "op, value, expected",
    [
        ("=", 3, [3]),
        ("<", 3, [1, 2]),
        ("<=", 3, [1, 2, 3]),
        (">", 4, [5, 6]),
        (">=", 4, [4, 5, 6]),
        ("!=", 3, [1, 2, 4, 5, 6]),
        ("IN", (2, 5, 99), [2, 5]),
        ("NOT_IN", (2, 5), [1, 3, 4, 6]),
    ],
)
def test_each_operator(numbers, op, value, expected):
    assert names(query(numbers, kind="N", filter=PropertyFilter("n", op, value))) == expected


def test_and_or_nested(numbers):
    even_or_one = CompositeFilter("OR", [PropertyFilter("parity", "=", "even"), PropertyFilter("n", "=", 1)])
    assert names(query(numbers, kind="N", filter=even_or_one)) == [1, 2, 4, 6]
    big_and_even_or_one = CompositeFilter("AND", [even_or_one, PropertyFilter("n", ">", 3)])
    assert names(query(numbers, kind="N", filter=big_and_even_or_one)) == [4, 6]
    no_index_branch = CompositeFilter("OR", [PropertyFilter("n", "!=", 1), PropertyFilter("parity", "=", "odd")])
    assert names(query(numbers, kind="N", filter=no_index_branch)) == [1, 2, 3, 4, 5, 6]


def test_key_filters(numbers):
    assert names(query(numbers, kind="N", filter=PropertyFilter("__key__", ">", Key.of("N", 4)))) == [5, 6]
    assert names(query(numbers, kind="N", filter=PropertyFilter("__key__", "IN", (Key.of("N", 2), Key.of("N", 9))))) == [2]
    assert names(query(numbers, kind="N", filter=PropertyFilter("__key__", "!=", Key.of("N", 2)))) == [1, 3, 4, 5, 6]


def test_multi_valued_properties_match_if_any_element_matches(gw):
    put(
        gw,
        RawEntity(Key.of("L", "159"), {"tags": [1, 5, 9]}),
        RawEntity(Key.of("L", "5"), {"tags": [5]}),
        RawEntity(Key.of("L", "19"), {"tags": [1, 9]}),
    )

    def where(f):
        return names(query(gw, kind="L", filter=f))

    assert where(PropertyFilter("tags", "=", 9)) == ["159", "19"]
    assert where(CompositeFilter("AND", [PropertyFilter("tags", "=", 1), PropertyFilter("tags", "=", 9)])) == ["159", "19"]
    # != and NOT_IN: some element differs (both emulators agree)
    assert where(PropertyFilter("tags", "!=", 5)) == ["159", "19"]
    assert where(PropertyFilter("tags", "NOT_IN", (1, 9))) == ["159", "5"]
    # inequalities on one property must hold for one element: [1, 9] has none in (1, 9)
    assert where(CompositeFilter("AND", [PropertyFilter("tags", ">", 1), PropertyFilter("tags", "<", 9)])) == ["159", "5"]
    # sorted by the smallest element ascending, the largest descending; each entity
    # once (docs/gql.md: deliberate differences); ties by key in the sort's direction
    assert names(query(gw, kind="L", order=[Order("tags")])) == ["159", "19", "5"]
    assert names(query(gw, kind="L", order=[Order("tags", descending=True)])) == ["19", "159", "5"]


def test_unindexed_properties_are_invisible_to_filters_and_orders(gw):
    put(gw, RawEntity(Key.of("U", 1), {"target": "t", "count": 3}, {"count"}), RawEntity(Key.of("U", 2), {"target": "t", "count": 3}))
    assert names(query(gw, kind="U", filter=PropertyFilter("count", "=", 3))) == [2]
    assert names(query(gw, kind="U", order=[Order("count")])) == [2]
    assert names(query(gw, kind="U", filter=PropertyFilter("target", "=", "t"))) == [1, 2]


def test_indexed_embedded_entities_are_filtered_by_dotted_names(gw):
    put(
        gw,
        RawEntity(Key.of("E", 1), {"addr": RawEntity(None, {"city": "Oslo", "zip": "0150"}, {"zip"})}),
        RawEntity(Key.of("E", 2), {"addr": [RawEntity(None, {"city": "Bergen"}), RawEntity(None, {"city": "Oslo"})]}),
        RawEntity(Key.of("E", 3), {"addr": RawEntity(None, {"city": "Oslo"})}, {"addr"}),
    )
    # E3's entity value is excluded, its city is not: indexed, as on the Firestore emulator
    assert names(query(gw, kind="E", filter=PropertyFilter("addr.city", "=", "Oslo"))) == [1, 2, 3]
    assert names(query(gw, kind="E", filter=PropertyFilter("addr.zip", "=", "0150"))) == []
    assert names(query(gw, kind="E", order=[Order("addr.city")])) == [2, 1, 3]


def test_namespaces_are_isolated(gw):
    put(gw, RawEntity(Key.of("A", 1, namespace="x"), {"n": 1}), RawEntity(Key.of("A", 1), {"n": 2}))
    assert [e.properties["n"] for e in query(gw, kind="A", namespace="x")] == [1]
    assert [e.properties["n"] for e in query(gw, kind="A")] == [2]
    assert [e.properties["n"] for e in query(gw, kind=None, namespace="x")] == [1]
    assert query(gw, kind="A", namespace="y") == []
    assert query(gw, kind="A", namespace="x", filter=PropertyFilter("n", "=", 2)) == []


def test_ancestor_queries(gw):
    parent = Key.of("P", "p")
    put(
        gw,
        RawEntity(parent, {"n": 0}),
        RawEntity(parent.child("C", 1), {"n": 1}),
        RawEntity(parent.child("C", 2).child("G", "g"), {"n": 2}),
        RawEntity(Key.of("P", "q", "C", 3), {"n": 3}),
        RawEntity(Key.of("P", "p", namespace="other").child("C", 4), {"n": 4}),
    )
    is_under = PropertyFilter("__key__", "HAS_ANCESTOR", parent)
    assert [e.properties["n"] for e in query(gw, kind=None, filter=is_under)] == [0, 1, 2]
    assert [e.properties["n"] for e in query(gw, kind="C", filter=is_under)] == [1]
    both = CompositeFilter("AND", [is_under, PropertyFilter("n", ">=", 1)])
    assert [e.properties["n"] for e in query(gw, kind="C", filter=both)] == [1]
    with pytest.raises(BadValueError, match="kind is required for filter: n"):  # as the Firestore emulator
        query(gw, kind=None, filter=both)


# --- projections, distinct, keys-only -----------------------------------------


def test_projection_distinct_and_keys_only(gw):
    put(
        gw,
        RawEntity(Key.of("P", "a"), {"tags": [3, 1], "colour": "red", "big": "x"}),
        RawEntity(Key.of("P", "b"), {"tags": [1], "colour": "blue"}),
        RawEntity(Key.of("P", "c"), {"colour": "red"}),
    )
    rows = query(gw, kind="P", projection=("tags",))
    assert [(e.key.name, e.properties) for e in rows] == [("a", {"tags": 1}), ("b", {"tags": 1}), ("a", {"tags": 3})]
    assert [e.properties for e in query(gw, kind="P", projection=("tags",), distinct_on=("tags",))] == [{"tags": 1}, {"tags": 3}]
    assert [(e.key.name, e.properties) for e in query(gw, kind="P", projection=("colour",), distinct_on=("colour",))] == [
        ("b", {"colour": "blue"}),
        ("a", {"colour": "red"}),
    ]
    keys = query(gw, kind="P", keys_only=True)
    assert [(e.key.name, e.properties) for e in keys] == [("a", {}), ("b", {}), ("c", {})]
    with pytest.raises(BadValueError, match="equality"):
        gw.run_query(Query("P", projection=("colour",), filter=PropertyFilter("colour", "=", "red")))


# --- cursors, offsets, limits, batches ------------------------------------------


def test_batches_must_be_followed_and_offset_is_applied_in_full(gw):
    total = BATCH_SIZE * 2 + 17
    gw.commit([Upsert(RawEntity(Key.of("B", i + 1), {"i": i})) for i in range(total)])
    first = gw.run_query(Query("B"))
    assert len(first.entities) == BATCH_SIZE and first.more_results and first.end_cursor
    assert [e.properties["i"] for e in run_query_all(gw, Query("B"))] == list(range(total))
    assert [e.properties["i"] for e in run_query_all(gw, Query("B", order=[Order("i", descending=True)]))] == list(range(total))[::-1]
    skipped = gw.run_query(Query("B", offset=BATCH_SIZE + 5, limit=3))
    assert [e.properties["i"] for e in skipped.entities] == [BATCH_SIZE + 5, BATCH_SIZE + 6, BATCH_SIZE + 7]
    assert not skipped.more_results
    rest = gw.run_query(Query("B", start_cursor=skipped.end_cursor, limit=2))
    assert [e.properties["i"] for e in rest.entities] == [BATCH_SIZE + 8, BATCH_SIZE + 9]
    limited = list(run_query_all(gw, Query("B", limit=BATCH_SIZE + 1)))
    assert len(limited) == BATCH_SIZE + 1


def test_cursors_resume_on_a_new_gateway_on_the_same_file(db_path):
    first = EmbeddedGateway(db_path)
    put(first, *(RawEntity(Key.of("C", f"k{i:02}"), {"n": i % 4}) for i in range(20)))
    q = Query("C", order=[Order("n", descending=True)], limit=5)
    page1 = first.run_query(q)
    first.close()
    second = EmbeddedGateway(db_path)
    page2 = second.run_query(q.replace(start_cursor=page1.end_cursor))
    everything = names(query(second, kind="C", order=[Order("n", descending=True)]))
    assert names(page1.entities) + names(page2.entities) == everything[:10]
    # an end cursor stops a query where another one ended
    upto = names(query(second, kind="C", order=[Order("n", descending=True)], end_cursor=page1.end_cursor))
    assert upto == names(page1.entities)
    with pytest.raises(BadValueError):
        second.run_query(Query("C", start_cursor=b"not a cursor"))
    second.close()


# --- transactions ------------------------------------------------------------------


def test_first_commit_wins_and_the_second_writes_nothing(gw):
    key = Key.of("Acct", "x")
    put(gw, RawEntity(key, {"n": 0}))
    t1, t2 = gw.begin_transaction(), gw.begin_transaction()
    (e1,) = gw.lookup([key], transaction=t1)
    (e2,) = gw.lookup([key], transaction=t2)
    gw.commit([Upsert(RawEntity(key, {"n": e1.properties["n"] + 1}))], transaction=t1)
    with pytest.raises(Contention) as caught:
        gw.commit([Upsert(RawEntity(key, {"n": e2.properties["n"] + 10})), Upsert(RawEntity(Key.of("Other", 1)))], transaction=t2)
    assert caught.value.attempts == 1
    assert gw.lookup([key, Key.of("Other", 1)]) == [RawEntity(key, {"n": 1}), None]
    with pytest.raises(BadValueError, match="already committed or rolled back"):
        gw.commit([], transaction=t2)  # used up by the failed commit


def test_reading_a_missing_entity_conflicts_with_its_creation(gw):
    key = Key.of("Acct", "new")
    txn = gw.begin_transaction()
    assert gw.run_query(Query("Acct"), transaction=txn).entities == ()
    assert gw.lookup([key], transaction=txn) == [None]
    put(gw, RawEntity(key, {"n": 5}))
    with pytest.raises(Contention):
        gw.commit([Upsert(RawEntity(key, {"n": 1}))], transaction=txn)


def test_transactions_on_different_entities_do_not_abort_each_other(gw):
    """Validation is by what a transaction read, not by whether anything at
    all was committed since its snapshot (which would abort every counter
    shard transaction under load)."""
    a_key, b_key = Key.of("Shard", 1), Key.of("Shard", 2)
    put(gw, RawEntity(a_key, {"n": 0}), RawEntity(b_key, {"n": 0}))
    query = Query("Shard", filter=PropertyFilter("__key__", "=", a_key))
    a, b = gw.begin_transaction(), gw.begin_transaction()
    gw.lookup([a_key], transaction=a)
    assert len(gw.run_query(query, transaction=a).entities) == 1
    gw.lookup([b_key], transaction=b)
    gw.commit([Upsert(RawEntity(b_key, {"n": 1}))], transaction=b)
    gw.commit([Upsert(RawEntity(a_key, {"n": 1}))], transaction=a)
    assert [e.properties["n"] for e in gw.lookup([a_key, b_key])] == [1, 1]


def test_a_memory_snapshot_is_copied_only_when_a_commit_would_change_what_it_reads(tmp_path):
    gw = EmbeddedGateway(None)
    key = Key.of("C", 1)
    put(gw, RawEntity(key, {"n": 0}))
    for n in range(1, 20):  # one transaction at a time: nothing to copy
        txn = gw.begin_transaction()
        (e,) = gw.lookup([key], transaction=txn)
        gw.commit([Upsert(RawEntity(key, {"n": e.properties["n"] + 1}))], transaction=txn)
    assert gw.stats["snapshot_copies"] == 0
    ro1, ro2 = gw.begin_transaction(read_only=True), gw.begin_transaction(read_only=True)
    gw.lookup([key], transaction=ro1)
    gw.lookup([key], transaction=ro2)
    put(gw, RawEntity(key, {"n": 100}))
    put(gw, RawEntity(key, {"n": 200}))
    assert gw.stats["snapshot_copies"] == 1  # one copy, shared by both
    assert [gw.lookup([key], transaction=t)[0].properties["n"] for t in (ro1, ro2)] == [19, 19]
    gw.close()


def test_an_open_transaction_holds_one_connection_until_it_ends(tmp_path):
    gw = EmbeddedGateway(str(tmp_path / "db.sqlite3"))
    key = Key.of("C", 1)
    put(gw, RawEntity(key, {"n": 0}))
    pool = gw._pool
    txns = [gw.begin_transaction() for _ in range(3)]
    assert not pool._held  # begin holds nothing: the first read pins the snapshot
    for txn in txns:
        gw.lookup([key], transaction=txn)
        gw.lookup([key], transaction=txn)
    assert len(pool._held) == 3
    gw.commit([Upsert(RawEntity(key, {"n": 1}))], transaction=txns[0])
    gw.rollback(txns[1])
    with pytest.raises(BadValueError):  # refused by BaseGateway, before the hook: the token is used up
        gw.commit([Upsert(RawEntity(key, {"n": 2}))] * 2 + [Upsert(RawEntity(Key.of("C", 2)))] * 500, transaction=txns[2])
    assert len(pool._held) == 1  # the third one's, until the next transaction takes a connection
    gw.lookup([key], transaction=gw.begin_transaction())
    assert len(pool._held) == 1  # the third one's came back: nothing referenced its transaction any more
    assert not pool._lent
    gw.close()


def test_transactions_beyond_the_bound_end_the_oldest_snapshot(tmp_path, monkeypatch):
    from gds_counter.gateway.embedded import _connections

    monkeypatch.setattr(_connections, "HOLD_WAIT_S", 0.05)
    gw = EmbeddedGateway(str(tmp_path / "db.sqlite3"))
    key = Key.of("C", 1)
    put(gw, RawEntity(key, {"n": 0}))
    cap = POOL_SIZE - _connections.RESERVED_FOR_CALLS
    txns = [gw.begin_transaction() for _ in range(cap + 1)]
    for txn in txns:
        gw.lookup([key], transaction=txn)
    assert len(gw._pool._held) == cap and gw._pool._count <= POOL_SIZE
    assert gw.lookup([key]) == [RawEntity(key, {"n": 0})]  # plain calls still find a connection
    with pytest.raises(Contention, match="oldest"):
        gw.lookup([key], transaction=txns[0])
    for txn in txns[1:]:
        gw.rollback(txn)
    assert not gw._pool._held
    gw.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_ends_open_snapshots_without_waiting_for_them(tmp_path):
    gw = EmbeddedGateway(str(tmp_path / "db.sqlite3"))
    key = Key.of("C", 1)
    put(gw, RawEntity(key, {"n": 0}))
    txn = gw.begin_transaction()
    gw.lookup([key], transaction=txn)
    started = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: its own connections, and the file is usable
        code = 0
        try:
            put(gw, RawEntity(Key.of("C", 2), {"n": 2}))
        except BaseException:
            code = 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert time.monotonic() - started < 10
    with pytest.raises(Contention, match="forked"):
        gw.commit([Upsert(RawEntity(key, {"n": 1}))], transaction=txn)
    assert gw.lookup([key, Key.of("C", 2)]) == [RawEntity(key, {"n": 0}), RawEntity(Key.of("C", 2), {"n": 2})]
    gw.close()


def test_transaction_tokens_are_used_up_and_read_only_rejects_writes(gw):
    txn = gw.begin_transaction()
    gw.rollback(txn)
    with pytest.raises(BadValueError, match="already committed or rolled back"):
        gw.commit([], transaction=txn)
    ro = gw.begin_transaction(read_only=True)
    with pytest.raises(BadValueError):
        gw.commit([Upsert(RawEntity(Key.of("A", 1)))], transaction=ro)
    big = gw.begin_transaction()
    with pytest.raises(BadValueError, match="500"):
        gw.commit([Upsert(RawEntity(Key.of("A", i + 1))) for i in range(501)], transaction=big)
    gw.commit([Upsert(RawEntity(Key.of("A", i + 1))) for i in range(501)])  # outside a transaction: atomic anyway
    assert len(query(gw, kind="A", keys_only=True)) == 501


def test_mutations_apply_in_order_and_the_last_one_on_a_key_wins(gw):
    """In a transaction, as both emulators do; without one, a key named
    twice is refused before anything is written (as Datastore refuses it)."""
    key = Key.of("M", 1)
    mutations = [Upsert(RawEntity(key, {"v": 1})), Delete(key), Upsert(RawEntity(key, {"v": 3})), Delete(Key.of("M", 404))]
    with pytest.raises(BadValueError, match="named twice"):
        gw.commit(mutations)
    assert gw.lookup([key]) == [None]
    gw.commit(mutations, transaction=gw.begin_transaction())
    assert gw.lookup([key]) == [RawEntity(key, {"v": 3})]
    assert names(query(gw, kind="M", filter=PropertyFilter("v", "=", 1))) == []


# --- masks, transforms, ids ------------------------------------------------------------


def test_property_mask_and_increment_keep_other_properties(gw):
    key = Key.of("IK_CounterShardEntity", "page_1_1")
    put(gw, RawEntity(key, {"target": "page_1", "count": 5, "note": "keep"}, {"count"}))
    result = gw.commit(
        [Upsert(RawEntity(key, {"target": "page_1"}, {"count"}), property_mask=("target",), transforms=[Increment("count", 3), Increment("count", 1)])]
    )
    assert result.mutation_results == (MutationResult(key, (8, 9)),)
    (stored,) = gw.lookup([key])
    # the increment's result is indexed, though written excluded: as on the Firestore emulator
    assert stored == RawEntity(key, {"target": "page_1", "count": 9, "note": "keep"})
    assert names(query(gw, kind=key.kind, filter=PropertyFilter("count", "=", 9))) == ["page_1_1"]
    fresh = Key.of("IK_CounterShardEntity", "page_1_2")
    gw.commit([Upsert(RawEntity(fresh, {"target": "page_1", "ignored": 1}), property_mask=("target",), transforms=[Increment("count", 2)])])
    assert gw.lookup([fresh]) == [RawEntity(fresh, {"target": "page_1", "count": 2})]


def test_an_increment_replaces_a_value_that_is_not_a_number_as_datastore_does(gw):
    """(tests/conformance/test_increments.py compares every case with the
    Firestore emulator.)"""
    key = Key.of("S", "text")
    put(gw, RawEntity(key, {"count": "3"}), RawEntity(Key.of("S", "ok"), {"count": 1}))
    result = gw.commit(
        [
            Upsert(RawEntity(Key.of("S", "ok")), property_mask=(), transforms=[Increment("count", 1)]),
            Upsert(RawEntity(key), property_mask=(), transforms=[Increment("count", 1)]),
        ]
    )
    assert [r.transform_results for r in result.mutation_results] == [(2,), (1,)]
    assert [e.properties["count"] for e in gw.lookup([Key.of("S", "ok"), key])] == [2, 1]


def test_ids_are_allocated_uniquely_across_gateways_on_one_file(db_path):
    a, b = EmbeddedGateway(db_path), EmbeddedGateway(db_path)
    ids = [k.id for k in a.allocate_ids([Key.of("X")] * 50)]
    ids += [k.id for k in b.allocate_ids([Key.of("X")] * 50)]
    ids += [r.key.id for r in a.commit([Upsert(RawEntity(Key.of("X"), {"n": i})) for i in range(50)]).mutation_results]
    ids += [r.key.id for r in b.commit([Upsert(RawEntity(Key.of("P", 1, "X"), {"n": i})) for i in range(50)]).mutation_results]
    assert len(set(ids)) == 200 and all(0 < i < 2**63 for i in ids)
    assert len(query(a, kind="X")) == 100
    with pytest.raises(BadKeyError):
        a.allocate_ids([Key.of("X", 1)])
    a.close()
    b.close()


# --- cost accounting ---------------------------------------------------------------------


def test_stats_count_rpcs_reads_and_writes_exactly(gw):
    gw.commit([Upsert(RawEntity(Key.of("A", 1))), Upsert(RawEntity(Key.of("A", 2))), Delete(Key.of("A", 3))])
    gw.lookup([Key.of("A", 1), Key.of("A", 2), Key.of("A", 3)])
    snap = gw.stats.snapshot()
    assert {k: snap[k] for k in ("rpcs", "rpc.commit", "rpc.lookup", "entity_reads", "entity_writes", "entity_deletes")} == {
        "rpcs": 2,
        "rpc.commit": 1,
        "rpc.lookup": 1,
        "entity_reads": 3,
        "entity_writes": 2,
        "entity_deletes": 1,
    }
    gw.run_query(Query("A", keys_only=True))
    assert gw.stats["rpc.run_query"] == 1 and gw.stats["entity_reads"] == 5
    gw.commit([])
    assert gw.stats["rpc.commit"] == 1  # an empty commit outside a transaction is no RPC


def test_write_rate_model_raises_contention_on_a_hot_entity(tmp_path):
    gw = EmbeddedGateway(str(tmp_path / "rate.db"), entity_writes_per_second=2.0)
    key = Key.of("Hot", 1)
    put(gw, RawEntity(key, {"n": 1}))
    with pytest.raises(Contention):
        put(gw, RawEntity(key, {"n": 2}))
    put(gw, RawEntity(Key.of("Hot", 2), {"n": 1}))  # another entity is not limited
    time.sleep(0.55)
    put(gw, RawEntity(key, {"n": 3}))
    assert gw.lookup([key])[0].properties["n"] == 3
    gw.close()


# --- concurrency, durability, indexes --------------------------------------------------------

COUNTER = Key.of("Counter", "c")


def increment_with_retries(gateway: EmbeddedGateway, times: int) -> int:
    """Read-modify-write in a transaction, retried on Contention: what a
    counter without transforms does. Returns how many attempts conflicted."""
    conflicts = 0
    for _ in range(times):
        while True:
            txn = gateway.begin_transaction()
            (entity,) = gateway.lookup([COUNTER], transaction=txn)
            current = entity.properties["n"] if entity else 0
            try:
                gateway.commit([Upsert(RawEntity(COUNTER, {"n": current + 1}))], transaction=txn)
                break
            except Contention:
                conflicts += 1
    return conflicts


def _process_worker(path: str, times: int) -> None:
    gateway = EmbeddedGateway(path)
    increment_with_retries(gateway, times)
    gateway.close()


def test_four_processes_lose_no_increment(db_path):
    EmbeddedGateway(db_path).close()
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_process_worker, args=(db_path, 200)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0, 0, 0]
    gateway = EmbeddedGateway(db_path)
    assert gateway.lookup([COUNTER])[0].properties["n"] == 800
    gateway.close()


@pytest.mark.parametrize("url", ["memory://", "file"])
def test_eight_threads_lose_no_increment(url, db_path):
    gateway = open_gateway(url if url == "memory://" else f"sqlite:///{db_path}")
    assert isinstance(gateway, Gateway)
    conflicts: list[int] = []
    threads = [threading.Thread(target=lambda: conflicts.append(increment_with_retries(gateway, 50))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert gateway.lookup([COUNTER])[0].properties["n"] == 400
    assert gateway.stats["aborts"] == sum(conflicts)
    gateway.close()


def test_memory_gateway_is_shared_between_threads():
    gateway = open_gateway("memory://?namespace=ws")
    assert gateway.namespace == "ws"
    threading.Thread(target=lambda: put(gateway, RawEntity(Key.of("T", 1), {"from": "thread"}))).start()
    deadline = time.monotonic() + 5
    while gateway.lookup([Key.of("T", 1)]) == [None] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert gateway.lookup([Key.of("T", 1)])[0].properties == {"from": "thread"}
    other = open_gateway("memory://")
    assert other.lookup([Key.of("T", 1)]) == [None]  # each memory gateway is its own database
    gateway.close()
    other.close()
    with pytest.raises(GatewayError):
        gateway.lookup([Key.of("T", 1)])


def test_a_filter_reads_the_index_not_the_whole_kind(db_path):
    gateway = EmbeddedGateway(db_path)
    total, batch = 100_000, 500
    for start in range(0, total, batch):
        gateway.commit(
            [
                Upsert(RawEntity(Key.of("IK_CounterShardEntity", f"t{i // 20}_{i % 20 + 1}"), {"target": f"t{i // 20}", "count": i}, {"count"}))
                for i in range(start, start + batch)
            ]
        )
    q = Query("IK_CounterShardEntity", filter=PropertyFilter("target", "=", "t777"))
    explained = gateway.explain_query(q)
    assert "SEARCH props USING PRIMARY KEY (ns=? AND kind=? AND name=? AND value=?)" in explained
    assert "SCAN e" not in explained and "SCAN entities" not in explained and "SCAN props" not in explained
    gateway.stats.reset()
    found = list(run_query_all(gateway, q))
    assert len(found) == 20 and {e.properties["target"] for e in found} == {"t777"}
    assert gateway.stats["rows_examined"] == 20
    gateway.close()


# --- the file and its connections -------------------------------------------------------------


def test_the_path_is_made_absolute_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    gateway = EmbeddedGateway("rel.sqlite3")
    assert gateway.path == os.path.join(os.getcwd(), "rel.sqlite3")
    gateway.close()
    memory = EmbeddedGateway(":memory:")  # SQLite's name for memory: one database, not a file
    assert memory.path is None and not (tmp_path / ":memory:").exists()
    memory.close()


def test_paths_with_uri_characters_name_the_file_they_say(tmp_path):
    for name in ("a b.db", "q?mode=ro.db", "h#x.db", "pct%20.db", "ünï.db"):
        gateway = EmbeddedGateway(tmp_path / name)
        put(gateway, RawEntity(Key.of("T", 1), {"n": 1}))
        gateway.close()
        assert (tmp_path / name).is_file()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == sorted(
        ("a b.db", "q?mode=ro.db", "h#x.db", "pct%20.db", "ünï.db")
    )


def test_threads_share_a_bounded_pool_of_connections(db_path):
    gateway = EmbeddedGateway(db_path)
    put(gateway, RawEntity(Key.of("T", 1), {"n": 1}))
    barrier = threading.Barrier(POOL_SIZE + 8)
    seen: list[int] = []

    def read() -> None:
        barrier.wait()
        seen.append(len(gateway.lookup([Key.of("T", 1)])))

    threads = [threading.Thread(target=read) for _ in range(POOL_SIZE + 8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == [1] * (POOL_SIZE + 8)
    assert 1 <= gateway._pool._count <= POOL_SIZE  # more threads than connections: they took turns
    gateway.close()
    assert gateway._pool._count == 0


def test_close_waits_for_calls_in_progress_and_then_refuses(db_path):
    gateway = EmbeddedGateway(db_path)
    with gateway._db() as conn:  # a call in progress on this connection
        gateway.close()
        assert conn.execute("SELECT count(*) FROM entities").fetchone() == (0,)
    with pytest.raises(GatewayError, match="closed"):
        gateway.lookup([Key.of("T", 1)])
    assert gateway._pool._count == 0


def test_a_schema_left_half_made_is_completed_and_a_complete_one_is_not_written(db_path):
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")  # what a crash could leave
    conn.commit()
    conn.close()
    gateway = EmbeddedGateway(db_path)
    assert put(gateway, RawEntity(Key.of("T", None), {"n": 1}))[0].id is not None
    gateway.close()
    before = Path(db_path).read_bytes()
    reader = EmbeddedGateway(db_path, read_only=True)
    assert len(list(run_query_all(reader, Query("T")))) == 1
    with pytest.raises(GatewayError, match="readonly"):
        put(reader, RawEntity(Key.of("T", 2), {"n": 2}))
    reader.close()
    assert Path(db_path).read_bytes() == before  # (a read-only connection leaves its empty -wal behind)


def test_a_read_only_open_of_a_file_without_the_tables_names_it(tmp_path):
    path = tmp_path / "other.sqlite3"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE unrelated (x)")
    conn.commit()
    conn.close()
    with pytest.raises(GatewayError, match=f"{path} has no gds_counter tables"):
        EmbeddedGateway(path, read_only=True)


def test_a_cursor_issued_before_cursors_named_their_query_is_still_read(gw):
    """Cursors of the first format (GDSC1: the position alone, as a user may
    have kept one in a URL) still continue their query."""
    from gds_counter.gateway.embedded._cursors import decode_cursor
    from gds_counter.gateway.embedded._encoding import key_bytes

    put(gw, *(RawEntity(Key.of("C", f"c{i}"), {"n": i}) for i in range(4)))
    first = gw.run_query(Query("C", limit=2))
    assert first.end_cursor is not None and first.end_cursor.startswith(b"GDSC3")
    position = key_bytes(Key.of("C", "c1"))  # a key-ordered query's row: its key
    old = b"GDSC1" + len(position).to_bytes(4, "big") + position
    assert decode_cursor(old, 1, b"any owner") == (position,)
    assert names(gw.run_query(Query("C", start_cursor=old)).entities) == ["c2", "c3"]


def test_a_cursor_is_a_point_another_query_of_the_kind_continues_from(gw):
    """As the Firestore emulator answers (measured: docs/gql.md): the page
    of ORDER BY n ending at n = 1, read by ORDER BY n DESC, starts at n = 1;
    as its end cursor, it stops before n = 1."""
    put(gw, *(RawEntity(Key.of("C", f"c{i}"), {"n": i}) for i in range(5)))
    cursor = gw.run_query(Query("C", order=(Order("n"),), limit=2)).end_cursor
    descending = Query("C", order=(Order("n", True),))
    assert names(gw.run_query(descending.replace(start_cursor=cursor)).entities) == ["c1", "c0"]
    assert names(gw.run_query(descending.replace(end_cursor=cursor)).entities) == ["c4", "c3", "c2"]
    assert names(gw.run_query(Query("C", order=(Order("n"),), projection=("n",), start_cursor=cursor)).entities) == [
        "c2", "c3", "c4",
    ]


def test_a_cursor_is_refused_where_datastore_refuses_it(gw):
    put(gw, *(RawEntity(Key.of(kind, f"c{i}"), {"n": i, "x": -i}) for kind in ("C", "D") for i in range(4)))
    by_n_then_x = gw.run_query(Query("C", order=(Order("n"), Order("x")), limit=2)).end_cursor
    with pytest.raises(BadValueError, match="does not match"):  # more values than the query sorts by
        gw.run_query(Query("C", order=(Order("n"),), start_cursor=by_n_then_x))
    with pytest.raises(BadValueError, match="kind 'C', not the query's 'D'"):
        gw.run_query(Query("D", order=(Order("n"),), start_cursor=by_n_then_x))
    key_first = Query("C", order=(Order("__key__"), Order("n")), limit=2)
    with pytest.raises(BadValueError, match="sorted by __key__ before another property"):
        gw.run_query(key_first.replace(start_cursor=gw.run_query(key_first).end_cursor))
    damaged = by_n_then_x[:-3]
    with pytest.raises(BadValueError):
        gw.run_query(Query("C", order=(Order("n"), Order("x")), start_cursor=damaged))


def test_a_query_sorted_by_key_before_a_property_still_reads_past_one_batch(gw):
    """Its cursors are refused as Datastore refuses them, but the engine's
    own batches of it go on (the emulator returns such a query whole):
    the cursor work broke ``fetch_all`` and ``count`` past 300 rows."""
    put(gw, *(RawEntity(Key.of("C", f"c{i:04d}"), {"n": i % 7}) for i in range(BATCH_SIZE * 2 + 5)))
    query = Query("C", order=(Order("__key__"), Order("n")), projection=("n",))
    assert len(list(run_query_all(gw, query))) == BATCH_SIZE * 2 + 5
    first = gw.run_query(query.replace(limit=2))
    with pytest.raises(BadValueError, match="sorted by __key__ before another property"):
        gw.run_query(query.replace(start_cursor=first.end_cursor))
