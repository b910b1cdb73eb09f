"""FirestoreGateway on the official Firestore emulator in native mode.

Each test gets a gateway on an emulator whose documents were all deleted
(``firestore_native_gateway``). What the tests pin down is the mapping of
docs/firestore.md ("The gateway"): keys are documents, writes are
Firestore writes (masks, preconditions, increments), a kind query is a
collection group over the whole database, an ancestor query the
subcollections at any depth under the ancestor's document, and Firestore's
statuses are the project's errors (the errors table of docs/counter.md).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sizes import sized

from gds_counter.errors import (
    AlreadyExists,
    BadKeyError,
    BadValueError,
    CommitUnknown,
    Contention,
    GatewayError,
    NotFound,
    Unavailable,
)
from gds_counter.gateway import open_gateway
from gds_counter.gateway.base import run_query_all
from gds_counter.gateway.firestore import FirestoreGateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Increment, Insert, Update, Upsert
from gds_counter.gateway.query import Aggregation, AggregationQuery, CompositeFilter, Order, PropertyFilter, Query
from gds_counter.gateway.values import Geopoint, RawEntity

UTC = dt.timezone.utc
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def gw(firestore_native_gateway: FirestoreGateway) -> FirestoreGateway:
    return firestore_native_gateway


def put(gw: FirestoreGateway, *entities: RawEntity) -> None:
    gw.commit([Upsert(e) for e in entities])


def names(entities: Any) -> list[Any]:
    return [e.key.flat_path for e in entities]


# --- lookups and writes ----------------------------------------------------------


def test_lookup_answers_in_the_order_of_the_keys_with_none_for_missing(gw):
    """BatchGetDocuments answers in any order; the gateway's answer is in
    the keys' order, a missing document as None, one read per key."""
    a, b, c = Key.of("K", "a"), Key.of("K", "b"), Key.of("P", "p", "K", 7)
    put(gw, RawEntity(a, {"v": 1}), RawEntity(c, {"v": 3}))
    gw.stats.reset()
    found = gw.lookup([c, b, a, c])
    assert [e and e.properties for e in found] == [{"v": 3}, None, {"v": 1}, {"v": 3}]
    assert found[0].key == c  # a numeric id comes back as one (stored as __id7__)
    assert gw.stats["rpc.lookup"] == 1


def test_an_upsert_replaces_the_document_and_a_mask_keeps_the_other_fields(gw):
    """Upsert without a mask writes the whole document (fields not given are
    gone); with a mask only the masked paths change (set-with-merge), a masked
    path the entity lacks is removed, and an empty mask keeps everything."""
    k = Key.of("K", "doc")
    put(gw, RawEntity(k, {"a": 1, "b": 2, "c": 3}))
    put(gw, RawEntity(k, {"a": 10}))
    assert gw.lookup([k])[0].properties == {"a": 10}
    put(gw, RawEntity(k, {"a": 1, "b": 2, "c": 3}))
    gw.commit([Upsert(RawEntity(k, {"a": 100, "x": 5}), property_mask=("a", "c"))])
    assert gw.lookup([k])[0].properties == {"a": 100, "b": 2}
    gw.commit([Upsert(RawEntity(k, {"b": 99}), property_mask=())])
    assert gw.lookup([k])[0].properties == {"a": 100, "b": 2}


def test_a_mask_reaches_into_an_embedded_entity_and_odd_names(gw):
    """Paths are the neutral ``e.x`` (a member of a map) and a backticked
    member taken whole, written as Firestore field paths."""
    k = Key.of("K", "nested")
    put(gw, RawEntity(k, {"e": RawEntity(None, {"x": 1, "y": 2}), "a.b": 1, "z": 0}))
    gw.commit([Upsert(RawEntity(k, {"e": RawEntity(None, {"x": 7}), "a.b": 2}), property_mask=("e.x", "`a.b`"))])
    got = gw.lookup([k])[0].properties
    assert got["e"].properties == {"x": 7, "y": 2}
    assert got["a.b"] == 2 and got["z"] == 0


def test_insert_of_an_existing_document_is_already_exists_naming_it_and_writes_nothing(gw):
    """Insert is a write with the precondition exists=false: ALREADY_EXISTS,
    raised as AlreadyExists (as the Datastore gateway and the embedded engine
    raise it), naming the document; a Firestore commit is atomic, so the
    commit's other write is not stored either."""
    k, other = Key.of("K", "there"), Key.of("K", "other")
    put(gw, RawEntity(k, {"v": 1}))
    with pytest.raises(AlreadyExists, match="K/there"):
        gw.commit([Upsert(RawEntity(other, {"v": 2})), Insert(RawEntity(k, {"v": 3}))])
    assert gw.lookup([k, other]) == [RawEntity(k, {"v": 1}), None]
    gw.commit([Insert(RawEntity(Key.of("K", "new"), {"v": 4}))])
    assert gw.lookup([Key.of("K", "new")])[0].properties == {"v": 4}


def test_update_of_a_missing_document_is_not_found_naming_it(gw):
    """Update is a write with the precondition exists=true: NOT_FOUND is
    NotFound; an Update of an existing document writes it."""
    k = Key.of("K", "absent")
    with pytest.raises(NotFound, match="K/absent"):
        gw.commit([Update(RawEntity(k, {"v": 1}))])
    assert gw.lookup([k]) == [None]
    put(gw, RawEntity(k, {"v": 1, "w": 2}))
    gw.commit([Update(RawEntity(k, {"v": 5}), property_mask=("v",))])
    assert gw.lookup([k])[0].properties == {"v": 5, "w": 2}


def test_delete_removes_the_document(gw):
    k = Key.of("K", "gone")
    put(gw, RawEntity(k, {"v": 1}))
    gw.commit([Delete(k)])
    assert gw.lookup([k]) == [None]


def test_increments_return_their_results_out_of_a_transaction(gw):
    """Increments are update_transforms; their results come back as the
    Datastore gateway returns them: one value per transform, in order. A
    missing field starts from the amount; a double makes a double; 64-bit
    integers saturate."""
    k = Key.of("counters", "likes", "shards", "0")
    first = gw.commit([Upsert(RawEntity(k, {}), property_mask=(), transforms=[Increment("count", 1)])])
    assert first.mutation_results[0].transform_results == (1,)
    second = gw.commit([
        Upsert(RawEntity(k, {}), property_mask=(), transforms=[Increment("count", 2), Increment("f", 0.5)])
    ])
    assert second.mutation_results[0].transform_results == (3, 0.5)
    top = gw.commit([Upsert(RawEntity(k, {}), property_mask=(), transforms=[Increment("count", 2**63 - 1)])])
    assert top.mutation_results[0].transform_results == (2**63 - 1,)
    assert gw.lookup([k])[0].properties == {"count": 2**63 - 1, "f": 0.5}


def test_increments_in_a_transaction_and_a_masked_write_beside_them(gw):
    """In a transaction too; a mask beside the increment writes its fields
    and keeps the others."""
    k = Key.of("K", "txn-inc")
    put(gw, RawEntity(k, {"count": 10, "keep": "yes"}))
    txn = gw.begin_transaction()
    assert gw.lookup([k], transaction=txn)[0].properties["count"] == 10
    result = gw.commit(
        [Upsert(RawEntity(k, {"seen": True}), property_mask=("seen",), transforms=[Increment("count", 5)])],
        transaction=txn,
    )
    assert result.mutation_results[0].transform_results == (15,)
    assert gw.lookup([k])[0].properties == {"count": 15, "keep": "yes", "seen": True}


# --- transactions ----------------------------------------------------------------


def test_two_transactions_that_conflict_end_in_contention_and_write_nothing_twice(gw):
    """Both read the document, then both write it. The emulator's locks
    make at least one commit fail with ABORTED, which is Contention (nothing
    of that transaction written); the document holds one of the writes or
    none, never both counted."""
    k = Key.of("K", "contended")
    put(gw, RawEntity(k, {"n": 0}))
    tokens = [gw.begin_transaction() for _ in range(2)]
    for token in tokens:
        gw.lookup([k], transaction=token)
    outcomes: dict[int, Any] = {}

    def write(i: int) -> None:
        try:
            gw.commit([Upsert(RawEntity(k, {}), property_mask=(), transforms=[Increment("n", 1)])], transaction=tokens[i])
            outcomes[i] = "ok"
        except Exception as exc:  # recorded for the assertion below
            outcomes[i] = exc

    threads = [threading.Thread(target=write, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    failed = [o for o in outcomes.values() if o != "ok"]
    assert failed and all(isinstance(o, Contention) for o in failed), outcomes
    assert "K/contended" in str(failed[0])
    assert gw.lookup([k])[0].properties["n"] == len(outcomes) - len(failed)


def test_a_read_only_transaction_reads_and_cannot_write(gw):
    k = Key.of("K", "ro")
    put(gw, RawEntity(k, {"v": 1}))
    txn = gw.begin_transaction(read_only=True)
    assert gw.lookup([k], transaction=txn)[0].properties == {"v": 1}
    assert names(gw.run_query(Query(kind="K"), transaction=txn).entities) == [("K", "ro")]
    with pytest.raises(BadValueError, match="read-only"):
        gw.commit([Upsert(RawEntity(k, {"v": 2}))], transaction=txn)
    ro = gw.begin_transaction(read_only=True)
    gw.commit([], transaction=ro)


def test_a_rolled_back_transaction_writes_nothing(gw):
    k = Key.of("K", "rb")
    txn = gw.begin_transaction()
    gw.lookup([k], transaction=txn)
    gw.rollback(txn)
    assert gw.lookup([k]) == [None]
    with pytest.raises(BadValueError, match="unknown, or was already"):
        gw.commit([Upsert(RawEntity(k, {"v": 1}))], transaction=txn)


# --- queries ---------------------------------------------------------------------


@pytest.fixture
def tree(gw: FirestoreGateway) -> FirestoreGateway:
    """Documents of kind S at three depths, under two parents."""
    put(
        gw,
        RawEntity(Key.of("S", "top"), {"n": 1, "tag": "a"}),
        RawEntity(Key.of("C", "c1"), {"n": 0}),
        RawEntity(Key.of("C", "c1", "S", "s1"), {"n": 2, "tag": "b"}),
        RawEntity(Key.of("C", "c1", "X", "x", "S", "deep"), {"n": 3, "tag": "a"}),
        RawEntity(Key.of("C", "c2", "S", "s2"), {"n": 4, "tag": "b"}),
    )
    return gw


def test_a_kind_query_sees_the_kind_at_any_depth_in_the_whole_database(tree):
    """No ancestor: a collection group over the whole database, as
    Datastore's kind query sees entities at any depth."""
    found = run_query_all(tree, Query(kind="S", order=[Order("n")]))
    assert [e.properties["n"] for e in found] == [1, 2, 3, 4]


def test_an_ancestor_query_sees_the_kind_at_any_depth_under_the_ancestor_and_the_ancestor_itself(tree):
    """HAS ANCESTOR: the kind's documents at any depth under the ancestor's
    document, as a range of document names (the emulator refuses a
    collection group under a parent document). Like Datastore's, it
    returns the ancestor itself when its kind matches, and nothing of a
    sibling whose id starts with the ancestor's (c1 is not c10)."""
    put(tree, RawEntity(Key.of("C", "c10", "S", "s10"), {"n": 10}))
    ancestor = PropertyFilter("__key__", "HAS_ANCESTOR", Key.of("C", "c1"))
    found = run_query_all(tree, Query(kind="S", filter=ancestor, order=[Order("n")]))
    assert names(found) == [("C", "c1", "S", "s1"), ("C", "c1", "X", "x", "S", "deep")]
    assert names(run_query_all(tree, Query(kind="C", filter=ancestor))) == [("C", "c1")]
    also = CompositeFilter("AND", (ancestor, PropertyFilter("tag", "=", "a")))
    assert names(run_query_all(tree, Query(kind="S", filter=also))) == [("C", "c1", "X", "x", "S", "deep")]
    ranged = CompositeFilter("AND", (PropertyFilter("n", ">", 2), ancestor))
    assert names(run_query_all(tree, Query(kind="S", filter=ranged))) == [("C", "c1", "X", "x", "S", "deep")]


def test_filters_orders_limit_and_keys_only(tree):
    gw = tree
    assert [e.properties["n"] for e in run_query_all(gw, Query(kind="S", filter=PropertyFilter("n", ">=", 2),
                                                              order=[Order("n", descending=True)]))] == [4, 3, 2]
    either = CompositeFilter("OR", (PropertyFilter("n", "=", 1), PropertyFilter("n", "IN", (3, 4))))
    assert sorted(e.properties["n"] for e in run_query_all(gw, Query(kind="S", filter=either))) == [1, 3, 4]
    assert [e.properties["n"] for e in gw.run_query(Query(kind="S", order=[Order("n")], limit=2)).entities] == [1, 2]
    keys = gw.run_query(Query(kind="S", filter=PropertyFilter("tag", "=", "b"), order=[Order("n")], keys_only=True))
    assert [(e.key.flat_path, e.properties) for e in keys.entities] == [
        (("C", "c1", "S", "s1"), {}), (("C", "c2", "S", "s2"), {}),
    ]
    projected = gw.run_query(Query(kind="S", projection=("tag",), order=[Order("n")], limit=1)).entities
    assert projected[0].properties == {"tag": "a"}
    put(gw, RawEntity(Key.of("S", "null"), {"n": None}))
    assert names(run_query_all(gw, Query(kind="S", filter=PropertyFilter("n", "=", None)))) == [("S", "null")]
    assert len(list(run_query_all(gw, Query(kind="S", filter=PropertyFilter("n", "!=", None))))) == 4


def test_key_filters_and_orders_are_on_the_document_name(tree):
    gw = tree
    target = Key.of("C", "c2", "S", "s2")
    assert names(run_query_all(gw, Query(kind="S", filter=PropertyFilter("__key__", "=", target)))) == [target.flat_path]
    ascending = run_query_all(gw, Query(kind="S", order=[Order("__key__")]))
    assert names(ascending) == [("C", "c1", "S", "s1"), ("C", "c1", "X", "x", "S", "deep"), ("C", "c2", "S", "s2"), ("S", "top")]
    # The emulator answers FAILED_PRECONDITION "Firestore does not support
    # descending key scans": an error naming the query, not a wrong answer.
    with pytest.raises(GatewayError, match="descending key scans.*kind 'S'"):
        gw.run_query(Query(kind="S", order=[Order("__key__", descending=True)]))


def test_cursors_page_through_a_query_and_bound_it(tree):
    """Our opaque cursors: the end cursor of one page starts the next; an
    end cursor stops a query after that result, as on Datastore."""
    gw = tree
    query = Query(kind="S", order=[Order("tag"), Order("n", descending=True)], limit=2)
    first = gw.run_query(query)
    second = gw.run_query(query.replace(start_cursor=first.end_cursor))
    rest = gw.run_query(query.replace(start_cursor=second.end_cursor))
    order = [(e.properties["tag"], e.properties["n"]) for batch in (first, second, rest) for e in batch.entities]
    assert order == [("a", 3), ("a", 1), ("b", 4), ("b", 2)]
    bounded = gw.run_query(Query(kind="S", order=[Order("tag"), Order("n", descending=True)], end_cursor=first.end_cursor))
    assert [e.properties["n"] for e in bounded.entities] == [3, 1]
    keys = Query(kind="S", keys_only=True, order=[Order("n")], limit=3)
    page = gw.run_query(keys)
    after = gw.run_query(keys.replace(start_cursor=page.end_cursor))
    assert len(page.entities) == 3 and names(after.entities) == [("C", "c2", "S", "s2")]
    with pytest.raises(BadValueError, match="cursor"):
        gw.run_query(query.replace(start_cursor=b"not ours"))


def test_native_aggregations_count_sum_and_avg(tree):
    """RunAggregationQuery, Firestore's own: one RPC."""
    tree.stats.reset()
    result = tree.run_aggregation(AggregationQuery(
        Query(kind="S", filter=PropertyFilter("tag", "=", "b")),
        [Aggregation.count("c"), Aggregation.sum("n", "s"), Aggregation.avg("n", "a")],
    ))
    assert dict(result) == {"c": 2, "s": 6, "a": 3.0}
    assert tree.stats["rpcs"] == 1
    under = PropertyFilter("__key__", "HAS_ANCESTOR", Key.of("C", "c1"))
    summed = tree.run_aggregation(AggregationQuery(Query(kind="S", filter=under), [Aggregation.sum("n")]))
    assert dict(summed) == {"property_1": 5}
    upto = tree.run_aggregation(AggregationQuery(Query(kind="S"), [Aggregation.count_up_to(3, "u")]))
    assert dict(upto) == {"u": 3}


def test_queries_firestore_cannot_answer_are_refused_before_anything_is_sent(gw):
    gw.stats.reset()
    with pytest.raises(BadValueError, match="kindless"):
        gw.run_query(Query())
    with pytest.raises(BadValueError, match="DISTINCT ON"):
        gw.run_query(Query(kind="S", projection=("tag",), distinct_on=("tag",)))
    inside_or = CompositeFilter("OR", (PropertyFilter("__key__", "HAS_ANCESTOR", Key.of("C", "c1")), PropertyFilter("n", "=", 1)))
    with pytest.raises(BadValueError, match="HAS ANCESTOR inside an OR"):
        gw.run_query(Query(kind="S", filter=inside_or))
    with pytest.raises(BadKeyError, match="namespace"):
        gw.run_query(Query(kind="S", namespace="ns"))
    assert gw.stats["rpcs"] == 0


# --- keys and values -------------------------------------------------------------


def test_namespaces_and_incomplete_keys_are_refused_before_anything_is_sent(gw):
    gw.stats.reset()
    in_ns = Key.of("K", "a", namespace="ns")
    with pytest.raises(BadKeyError, match="no namespaces"):
        gw.lookup([in_ns])
    with pytest.raises(BadKeyError, match="no namespaces"):
        gw.commit([Upsert(RawEntity(in_ns, {}))])
    with pytest.raises(BadKeyError, match="no namespaces"):
        gw.commit([Upsert(RawEntity(Key.of("K", "a"), {"ref": in_ns}))])
    with pytest.raises(BadKeyError):
        gw.lookup([Key.of("K")])
    with pytest.raises(BadValueError, match="list may not contain a list"):
        gw.commit([Upsert(RawEntity(Key.of("K", "a"), {"l": [RawEntity(None, {"x": 1}), [1]]}))])
    assert gw.stats["rpcs"] == 0


def test_incomplete_keys_get_random_63_bit_ids_made_here(gw):
    """Native mode allocates no ids: allocate_ids makes scattered random ones
    without an RPC, and an upserted incomplete key is numbered the same way."""
    gw.stats.reset()
    allocated = gw.allocate_ids([Key.of("K"), Key.of("P", "p", "K")])
    assert gw.stats["rpcs"] == 0
    assert all(0 < k.id < 2**63 for k in allocated) and allocated[1].parent == Key.of("P", "p")
    written = gw.commit([Upsert(RawEntity(Key.of("K"), {"v": 1}))]).mutation_results[0].key
    assert written.id is not None and gw.lookup([written])[0].properties == {"v": 1}


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=30),
    st.binary(max_size=30),
    st.datetimes(timezones=st.just(UTC)),
    st.builds(Geopoint, st.floats(-90, 90), st.floats(-180, 180)),
    st.builds(lambda a, b: Key.of("R", a, "S", b), st.text("abc", min_size=1, max_size=5), st.integers(1, 2**63 - 1)),
)
_values = st.recursive(
    _scalars,
    lambda inner: st.one_of(
        st.lists(st.one_of(_scalars, st.builds(lambda d: RawEntity(None, d), st.dictionaries(st.sampled_from("xyz"), inner, max_size=3))), max_size=4),
        st.builds(lambda d: RawEntity(None, d), st.dictionaries(st.sampled_from("xyz"), inner, max_size=3)),
    ),
    max_leaves=8,
)


@settings(max_examples=sized("GDS_FIRESTORE_VALUE_EXAMPLES", 25, 100), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_values)
def test_values_round_trip(gw, value):
    """Every neutral value comes back as it was written (timestamps at
    microseconds, as they are given); no index flags come back."""
    k = Key.of("V", "v")
    put(gw, RawEntity(k, {"p": value}, unindexed={"p"}))
    back = gw.lookup([k])[0]
    assert back.properties == {"p": value} and back.unindexed == frozenset()


# --- errors and URLs -------------------------------------------------------------


def test_an_unreachable_server_is_unavailable_for_a_commit_never_sent(gw):
    """A connection never made (nothing listens on the port) proves the
    increment was not sent: Unavailable, not CommitUnknown."""
    down = FirestoreGateway("gds-counter-test", emulator_host="127.0.0.1:9", timeout=1.0)
    try:
        with pytest.raises(Unavailable, match="K/x"):
            down.commit([Upsert(RawEntity(Key.of("K", "x"), {}), property_mask=(), transforms=[Increment("n", 1)])])
    finally:
        down.close()


def test_a_commit_past_its_deadline_is_commit_unknown_and_may_yet_be_applied(gw, firestore_native_emulator):
    """The emulator's evidence for the errors table: a transaction holds a
    lock on the shard, an increment waits behind it and its 0.5 s deadline
    passes (DEADLINE_EXCEEDED). The request had left, so the answer is
    CommitUnknown, naming the document, not an error a retry would answer
    by counting again: once the lock is gone the emulator applies it."""
    k = Key.of("counters", "c", "shards", "0")
    put(gw, RawEntity(k, {"count": 0}))
    holder = gw.begin_transaction()
    gw.lookup([k], transaction=holder)
    impatient = firestore_native_emulator.firestore_gateway(timeout=0.5)
    try:
        with pytest.raises(CommitUnknown, match="counters/c/shards/0"):
            impatient.commit([Upsert(RawEntity(k, {}), property_mask=(), transforms=[Increment("count", 1)])])
    finally:
        impatient.close()
    gw.rollback(holder)
    assert gw.lookup([k])[0].properties["count"] in (0, 1)  # unknown: either is the truth


def test_firestore_urls_open_the_gateway_on_the_emulator(firestore_native_emulator, monkeypatch):
    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", firestore_native_emulator.host)
    gateway = open_gateway(f"firestore://{firestore_native_emulator.project}?database=(default)")
    try:
        assert isinstance(gateway, FirestoreGateway) and gateway.emulator_host == firestore_native_emulator.host
        gateway.commit([Upsert(RawEntity(Key.of("U", "u"), {"v": 1}))])
        assert gateway.lookup([Key.of("U", "u")])[0].properties == {"v": 1}
    finally:
        gateway.close()
    monkeypatch.setenv("GDS_URL", f"firestore://{firestore_native_emulator.project}")
    from_env = open_gateway()
    try:
        assert isinstance(from_env, FirestoreGateway) and from_env.lookup([Key.of("U", "u")])[0] is not None
    finally:
        from_env.close()
    for bad in ("firestore://", "firestore://p?namespace=x", "firestore://p?database=Bad_Db", "firestore://p/path"):
        with pytest.raises(BadValueError):
            open_gateway(bad)


def test_the_command_counts_on_firestore_through_gds_url(gw, firestore_native_emulator):
    """``GDS_URL=firestore://...`` works as the other URLs do: the command,
    a real subprocess, increments the PHP article's counter there (its
    entities as documents) and reads it back, and says where it counted."""
    env = {**os.environ, "GDS_URL": f"firestore://{firestore_native_emulator.project}",
           "FIRESTORE_EMULATOR_HOST": firestore_native_emulator.host, "PYTHONPATH": str(ROOT)}
    env.pop("DATASTORE_EMULATOR_HOST", None)
    command = [sys.executable, "-m", "gds_counter"]
    added = subprocess.run([*command, "-v", "increment", "Counter Test", "1", "-n", "3"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert added.returncode == 0, added.stderr
    assert added.stdout.strip() == "3" and "the Firestore emulator at" in added.stderr
    counted = subprocess.run([*command, "count", "Counter Test", "1", "--json"], env=env, capture_output=True, text=True,
                             timeout=120)
    assert json.loads(counted.stdout) == {"target": "Counter Test_1", "count": 3}


def test_the_asyncio_face_runs_on_the_async_firestore_client(gw, firestore_native_emulator, monkeypatch):
    """``aio.open_gateway("firestore://...")`` is ``AsyncFirestoreGateway``
    (google-cloud-firestore's async client on gRPC asyncio), not the
    blocking gateway in a thread pool, and reaches the emulator named by
    ``FIRESTORE_EMULATOR_HOST`` as the blocking one does, in the database
    the URL names."""
    import asyncio

    from gds_counter import aio

    monkeypatch.setenv("FIRESTORE_EMULATOR_HOST", firestore_native_emulator.host)

    async def main(query: str) -> Any:
        gateway = aio.open_gateway(f"firestore://{firestore_native_emulator.project}{query}")
        try:
            await gateway.commit([Upsert(RawEntity(Key.of("A", "a"), {}), property_mask=(), transforms=[Increment("n", 2)])])
            found = (await gateway.lookup([Key.of("A", "a")]))[0].properties
            return type(gateway).__name__, getattr(gateway, "database", None), found
        finally:
            await gateway.close()

    assert asyncio.run(main("")) == ("AsyncFirestoreGateway", "(default)", {"n": 2})
    assert asyncio.run(main("?database=other-db")) == ("AsyncFirestoreGateway", "other-db", {"n": 2})
    assert gw.lookup([Key.of("A", "a")])[0].properties == {"n": 2}  # one increment in each database
