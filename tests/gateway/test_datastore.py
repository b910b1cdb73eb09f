"""DatastoreGateway against both official emulators, plus its retry/error policy.

Shared behaviour runs on both emulators through the ``gw`` fixture. Where the
emulators differ (transforms, concurrency, query operators), each test states
what that emulator does, as observed with gcloud SDK 528.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
import uuid
from typing import Any, Callable

import pytest
from google.api_core import exceptions as gexc

from gds_counter.errors import (
    BadKeyError,
    BadValueError,
    CommitUnknown,
    Contention,
    GatewayError,
    TransactionLost,
    Unavailable,
)
from gds_counter.gateway.base import PROBE_KIND, Gateway, run_query_all
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.datastore import DatastoreGateway
from gds_counter.gateway.datastore._retry import should_retry, translate_error
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Increment, Upsert
from gds_counter.gateway.query import CompositeFilter, Cursor, GqlSource, Order, PropertyFilter, Query
from gds_counter.gateway.values import Geopoint, RawEntity

UTC = dt.timezone.utc
SHARD_KIND = "IK_CounterShardEntity"


@pytest.fixture(params=[
    pytest.param("datastore", marks=pytest.mark.emulator),
    pytest.param("firestore", marks=pytest.mark.emulator),
])
def gw(request: pytest.FixtureRequest) -> DatastoreGateway:
    gateway = request.getfixturevalue(f"{request.param}_gateway")
    gateway.kind = request.param  # type: ignore[attr-defined]  # for per-emulator expectations
    return gateway


def key(gw: DatastoreGateway, *flat: Any) -> Key:
    return Key.of(*flat, namespace=gw.namespace)


def put(gw: DatastoreGateway, *entities: RawEntity) -> None:
    gw.commit([Upsert(e) for e in entities])


def run_in_thread(fn: Callable[[], Any], timeout: float) -> tuple[str, Any, float]:
    """Run ``fn`` with a time limit so a blocked emulator cannot hang the test."""
    outcome: list[Any] = []
    started = time.monotonic()

    def target() -> None:
        try:
            outcome.append(("ok", fn()))
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            outcome.append(("error", exc))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return "blocked", None, time.monotonic() - started
    return outcome[0][0], outcome[0][1], time.monotonic() - started


# --- values -------------------------------------------------------------------


def test_is_a_gateway(gw: DatastoreGateway) -> None:
    assert isinstance(gw, Gateway)


def test_round_trip_of_every_value_type(gw: DatastoreGateway) -> None:
    parent = key(gw, "Parent", "p1")
    k = parent.child("Thing", "every-type")
    other_ns = Key.of("Elsewhere", 42, namespace="other-ns")
    properties = {
        "none": None,
        "true": True,
        "false": False,
        "int": -(2**63),
        "big": 2**63 - 1,
        "float": 1.0 / 3.0,
        "str": "héllo ✓ ünïcode",
        "empty_str": "",
        "bytes": bytes(range(256)),
        "when": dt.datetime(2024, 2, 29, 23, 59, 58, 123456, tzinfo=UTC),
        "before_1970": dt.datetime(1969, 7, 20, 20, 17, 40, 1, tzinfo=UTC),
        "key": parent,
        "key_other_ns": other_ns,
        "geo": Geopoint(51.5074, -0.1278),
        "embedded": RawEntity(None, {"a": 1, "b": "x", "deep": RawEntity(None, {"c": [1, 2]})}, {"b"}),
        "embedded_keyed": RawEntity(key(gw, "Inner", 5), {"a": 2}),
        "ints": [3, 1, 2],
        "mixed": [1, "two", 3.5, None, True, parent],
        "entities": [RawEntity(None, {"n": 1}), RawEntity(None, {"n": 2})],
        "empty_list": [],
        "text": "x" * 5000,
    }
    entity = RawEntity(k, properties, {"text", "ints"})
    gw.commit([Upsert(entity)])
    [got] = gw.lookup([k])
    assert got == entity
    assert got is not None
    assert got.properties["when"].tzinfo == UTC
    assert got.properties["when"].microsecond == 123456
    assert got.properties["before_1970"] == dt.datetime(1969, 7, 20, 20, 17, 40, 1, tzinfo=UTC)
    assert type(got.properties["bytes"]) is bytes


def test_datetime_in_another_timezone_is_stored_as_utc(gw: DatastoreGateway) -> None:
    tz = dt.timezone(dt.timedelta(hours=5, minutes=30))
    local = dt.datetime(2020, 1, 1, 12, 0, 0, 654321, tzinfo=tz)
    k = key(gw, "T", 1)
    put(gw, RawEntity(k, {"at": local}))
    [got] = gw.lookup([k])
    assert got is not None
    assert got.properties["at"] == local
    assert got.properties["at"].tzinfo == UTC
    assert got.properties["at"].hour == 6 and got.properties["at"].minute == 30


def test_index_flags_read_back_raw_as_php_gds_writes_them(gw: DatastoreGateway, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain google-cloud-datastore client sees exactly php-gds's flags:
    target indexed, count excluded, and for lists a flag on every element and
    none on the array value itself."""
    from google.cloud import datastore

    k = key(gw, SHARD_KIND, "post_1_3")
    put(gw, RawEntity(
        k,
        {"target": "post_1", "count": 5, "tags": ["a", "b"], "notes": ["n1", "n2"]},
        {"count", "notes"},
    ))
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", gw.emulator_host or "")
    client = datastore.Client(project=gw.project, namespace=gw.namespace)
    raw_key = client.key(SHARD_KIND, "post_1_3")
    entity = client.get(raw_key)
    assert entity is not None
    assert dict(entity) == {"target": "post_1", "count": 5, "tags": ["a", "b"], "notes": ["n1", "n2"]}
    assert set(entity.exclude_from_indexes) == {"count", "notes"}

    response = client._datastore_api.lookup(request={"project_id": gw.project, "keys": [raw_key.to_protobuf()]})
    props = response.found[0].entity._pb.properties
    assert props["target"].WhichOneof("value_type") == "string_value"
    assert props["target"].exclude_from_indexes is False
    assert props["count"].WhichOneof("value_type") == "integer_value"
    assert props["count"].exclude_from_indexes is True
    assert props["tags"].exclude_from_indexes is False
    assert [v.exclude_from_indexes for v in props["tags"].array_value.values] == [False, False]
    assert props["notes"].exclude_from_indexes is False  # never on the array itself
    assert [v.exclude_from_indexes for v in props["notes"].array_value.values] == [True, True]
    client.close()

    [got] = gw.lookup([k])
    assert got is not None and got.unindexed == frozenset({"count", "notes"})


def test_bad_values_fail_before_anything_is_sent(gw: DatastoreGateway) -> None:
    k = key(gw, "T", "bad")
    with pytest.raises(BadValueError, match="naive datetime"):
        gw.commit([Upsert(RawEntity(key(gw, "T", "ok"), {"x": 1})),
                   Upsert(RawEntity(k, {"at": dt.datetime(2020, 1, 1)}))])
    with pytest.raises(BadValueError, match="1500"):
        gw.commit([Upsert(RawEntity(k, {"s": "x" * 1501}))])
    with pytest.raises(BadKeyError):
        gw.commit([Delete(key(gw, "T"))])
    assert gw.stats["rpcs"] == 0
    assert gw.lookup([key(gw, "T", "ok")]) == [None]


# --- lookups, commits, batches ------------------------------------------------


def test_lookup_keeps_order_and_gives_none_for_missing(gw: DatastoreGateway) -> None:
    put(gw, RawEntity(key(gw, "K", 1), {"v": 1}), RawEntity(key(gw, "K", 3), {"v": 3}))
    got = gw.lookup([key(gw, "K", 3), key(gw, "K", 2), key(gw, "K", 1), key(gw, "K", 3)])
    assert [e.properties["v"] if e else None for e in got] == [3, None, 1, 3]


def test_incomplete_keys_get_ids_and_allocate_ids(gw: DatastoreGateway) -> None:
    result = gw.commit([Upsert(RawEntity(key(gw, "Auto"), {"v": 1})), Upsert(RawEntity(key(gw, "Auto"), {"v": 2}))])
    keys = [r.key for r in result.mutation_results]
    assert all(k is not None and k.id is not None and k.namespace == gw.namespace for k in keys)
    assert keys[0] != keys[1]
    assert [e.properties["v"] for e in gw.lookup(keys) if e] == [1, 2]
    allocated = gw.allocate_ids([key(gw, "Auto"), key(gw, "P", "x", "Auto")])
    assert not any(k.is_partial for k in allocated)
    assert allocated[1].parent == key(gw, "P", "x")
    with pytest.raises(BadKeyError):
        gw.allocate_ids([key(gw, "Auto", 5)])


def test_large_batches_are_split_into_legal_rpcs(gw: DatastoreGateway) -> None:
    keys = [key(gw, "Many", i) for i in range(1, 1201)]
    result = gw.commit([Upsert(RawEntity(k, {"i": k.id})) for k in keys])
    assert len(result.mutation_results) == 1200
    assert gw.stats["rpc.commit"] == 3  # 500 + 500 + 200
    assert gw.stats["entity_writes"] == 1200

    missing = key(gw, "Many", 99999)
    got = gw.lookup([missing] + keys[::-1])
    assert got[0] is None
    assert [e.properties["i"] for e in got[1:] if e] == list(range(1200, 0, -1))
    assert gw.stats["rpc.lookup"] >= 2  # at least 1000 + 201 keys, plus any deferred ones

    txn = gw.begin_transaction()
    with pytest.raises(BadValueError, match="at most 500"):
        gw.commit([Delete(k) for k in keys[:501]], transaction=txn)
    gw.rollback(txn)

    gw.stats.reset()
    tail = gw.run_query(Query("Many", gw.namespace, keys_only=True, offset=1150))
    assert ids(tail.entities) == list(range(1151, 1201))
    # the legacy emulator skips at most a few hundred per batch; the gateway follows them
    assert gw.stats["rpc.run_query"] >= 1

    gw.stats.reset()
    gw.commit([Delete(k) for k in keys])
    assert gw.stats["rpc.commit"] == 3 and gw.stats["entity_deletes"] == 1200
    assert gw.lookup(keys[:3]) == [None, None, None]


# --- queries ------------------------------------------------------------------


@pytest.fixture
def books(gw: DatastoreGateway) -> DatastoreGateway:
    put(gw, *[
        RawEntity(key(gw, "Book", i), {"year": 2000 + i % 3, "title": f"t{i:02d}", "tags": ["odd" if i % 2 else "even", "all"]})
        for i in range(1, 26)
    ])
    gw.stats.reset()
    return gw


def ids(entities: Any) -> list[int | str | None]:
    return [e.key.id_or_name for e in entities]


def test_cursors_page_through_a_query(books: DatastoreGateway) -> None:
    gw = books
    query = Query("Book", gw.namespace, order=(Order("__key__"),), limit=10)
    seen: list[Any] = []
    cursor = None
    pages = 0
    while True:
        page = gw.run_query(query.replace(start_cursor=cursor))
        seen += ids(page.entities)
        pages += 1
        cursor = page.end_cursor
        if len(page.entities) < 10:
            break
    assert seen == list(range(1, 26))
    assert pages == 3
    assert page.more_results is False  # the last page exhausted the query
    assert gw.stats["entity_reads"] == 25

    assert ids(run_query_all(gw, Query("Book", gw.namespace))) == list(range(1, 26))
    assert ids(run_query_all(gw, Query("Book", gw.namespace, limit=7))) == list(range(1, 8))

    end = gw.run_query(Query("Book", gw.namespace, limit=5)).end_cursor
    bounded = gw.run_query(Query("Book", gw.namespace, end_cursor=end))
    assert ids(bounded.entities) == [1, 2, 3, 4, 5]


def test_offset_is_applied_fully(books: DatastoreGateway) -> None:
    gw = books
    result = gw.run_query(Query("Book", gw.namespace, offset=22))
    assert ids(result.entities) == [23, 24, 25]
    assert ids(gw.run_query(Query("Book", gw.namespace, offset=30)).entities) == []
    keys_only = gw.run_query(Query("Book", gw.namespace, keys_only=True, offset=2, limit=3))
    assert ids(keys_only.entities) == [3, 4, 5]
    assert all(e.properties == {} for e in keys_only.entities)


def test_filters_order_projection(books: DatastoreGateway) -> None:
    gw = books
    ns = gw.namespace
    q = Query("Book", ns, PropertyFilter("year", "=", 2001), order=(Order("title", descending=True),))
    assert ids(gw.run_query(q).entities) == [25, 22, 19, 16, 13, 10, 7, 4, 1]
    both = CompositeFilter("AND", (PropertyFilter("year", ">=", 2001), PropertyFilter("tags", "=", "even")))
    assert sorted(ids(run_query_all(gw, Query("Book", ns, both)))) == [2, 4, 8, 10, 14, 16, 20, 22]
    proj = gw.run_query(Query("Book", ns, projection=("year",), distinct_on=("year",), order=(Order("year"),)))
    assert [e.properties for e in proj.entities] == [{"year": 2000}, {"year": 2001}, {"year": 2002}]
    assert gw.run_query(Query("Book", ns, PropertyFilter("__key__", "=", key(gw, "Book", 7)))).entities[0].key == key(gw, "Book", 7)


def test_projections_return_index_values(gw: DatastoreGateway) -> None:
    """As Datastore does: projected datetimes are integer microseconds and
    projected blobs are strings (both emulators; the Store's schema converts)."""
    when = dt.datetime(2021, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)
    put(gw, RawEntity(key(gw, "Proj", 1), {"when": when, "n": 5, "b": b"xy"}))
    got = gw.run_query(Query("Proj", gw.namespace, projection=("when", "n", "b"))).entities[0]
    assert got.properties == {"when": 1620284889123456, "n": 5, "b": "xy"}
    assert got.key == key(gw, "Proj", 1)


def test_empty_non_transactional_commit_sends_nothing(gw: DatastoreGateway) -> None:
    assert gw.commit([]).mutation_results == ()
    assert gw.stats["rpcs"] == 0


def test_newer_operators(books: DatastoreGateway) -> None:
    """!=, IN, NOT_IN and OR: the Firestore emulator runs them; the legacy
    Datastore emulator rejects every one of them (it predates them)."""
    gw = books
    ns = gw.namespace
    queries = {
        "!=": Query("Book", ns, PropertyFilter("year", "!=", 2000)),
        "IN": Query("Book", ns, PropertyFilter("year", "IN", (2000, 2002))),
        "NOT_IN": Query("Book", ns, PropertyFilter("year", "NOT_IN", (2000, 2002))),
        "OR": Query("Book", ns, CompositeFilter("OR", (PropertyFilter("year", "=", 2000), PropertyFilter("title", "=", "t01")))),
    }
    expected = {
        "!=": [i for i in range(1, 26) if i % 3 != 0],
        "IN": [i for i in range(1, 26) if i % 3 != 1],
        "NOT_IN": [i for i in range(1, 26) if i % 3 == 1],
        "OR": [1] + [i for i in range(1, 26) if i % 3 == 0],
    }
    for op, query in queries.items():
        if gw.kind == "firestore":  # type: ignore[attr-defined]
            assert sorted(ids(run_query_all(gw, query))) == sorted(expected[op]), op
        else:
            with pytest.raises((GatewayError, BadValueError)):
                gw.run_query(query)


def test_native_gql_with_named_and_positional_bindings(books: DatastoreGateway) -> None:
    gw = books
    ns = gw.namespace
    named = Query("Book", ns, gql=GqlSource(
        "SELECT * FROM Book WHERE year = @year AND tags = @tag ORDER BY __key__ DESC LIMIT @limit",
        named=(("year", 2002), ("tag", "odd"), ("limit", 2)),
    ))
    assert ids(gw.run_query(named).entities) == [23, 17]
    positional = Query("Book", ns, gql=GqlSource(
        "SELECT __key__ FROM Book WHERE title > @1 AND title <= @2", positional=("t20", "t22"),
    ))
    assert ids(gw.run_query(positional).entities) == [21, 22]
    literal = Query("Book", ns, gql=GqlSource("SELECT * FROM Book WHERE __key__ = KEY(Book, 3)"))
    assert ids(gw.run_query(literal).entities) == [3]
    with_offset = Query("Book", ns, gql=GqlSource("SELECT * FROM Book OFFSET @1", positional=(23,)))
    assert ids(gw.run_query(with_offset).entities) == [24, 25]
    ancestor = Query(None, ns, gql=GqlSource(
        "SELECT * WHERE __key__ HAS ANCESTOR @a", named=(("a", key(gw, "Book", 9)),)))
    assert ids(gw.run_query(ancestor).entities) == [9]
    first = gw.run_query(Query("Book", ns, limit=4))
    from_cursor = Query("Book", ns, gql=GqlSource(
        "SELECT * FROM Book LIMIT 2 OFFSET @start", named=(("start", Cursor(first.end_cursor or b"")),)))
    assert ids(gw.run_query(from_cursor).entities) == [5, 6]
    blob = Query("Book", ns, gql=GqlSource("SELECT * FROM Book WHERE title = @1", positional=(b"t01",)))
    # bytes go as a blob value (not a cursor); both emulators index blobs and
    # strings alike, so the blob b"t01" matches the string "t01" (observed)
    assert ids(gw.run_query(blob).entities) == [1]
    with pytest.raises(BadValueError):
        gw.run_query(Query("Book", ns, gql=GqlSource("SELEC * FROM Book")))


def test_namespaces_are_isolated(gw: DatastoreGateway) -> None:
    other = DatastoreGateway(gw.project, gw.namespace + "-other", emulator_host=gw.emulator_host)
    try:
        put(gw, RawEntity(key(gw, "Iso", "same"), {"who": "first"}))
        put(other, RawEntity(Key.of("Iso", "same", namespace=other.namespace), {"who": "second"}))
        [mine] = gw.lookup([key(gw, "Iso", "same")])
        assert mine is not None and mine.properties == {"who": "first"}
        found = gw.run_query(Query("Iso", gw.namespace)).entities
        assert [e.properties["who"] for e in found] == ["first"]
        assert [e.properties["who"] for e in other.run_query(Query("Iso", other.namespace)).entities] == ["second"]
    finally:
        other.close()


def test_ancestor_queries(gw: DatastoreGateway) -> None:
    a = key(gw, "Author", "a")
    b = key(gw, "Author", "b")
    put(
        gw,
        RawEntity(a, {"n": 0}),
        RawEntity(a.child("Book", 1), {"n": 1}),
        RawEntity(a.child("Book", 1).child("Page", 1), {"n": 2}),
        RawEntity(b.child("Book", 2), {"n": 3}),
    )
    whole = Query(None, gw.namespace, PropertyFilter("__key__", "HAS_ANCESTOR", a))
    assert sorted(e.properties["n"] for e in gw.run_query(whole).entities) == [0, 1, 2]
    books_of_a = Query("Book", gw.namespace, PropertyFilter("__key__", "HAS_ANCESTOR", a))
    assert [e.key for e in gw.run_query(books_of_a).entities] == [a.child("Book", 1)]
    txn = gw.begin_transaction()
    in_txn = gw.run_query(Query("Book", gw.namespace, PropertyFilter("__key__", "HAS_ANCESTOR", b)), transaction=txn)
    assert [e.properties["n"] for e in in_txn.entities] == [3]
    gw.rollback(txn)


# --- transactions -------------------------------------------------------------


def test_transaction_commit_and_rollback(gw: DatastoreGateway) -> None:
    k = key(gw, "Acct", "x")
    put(gw, RawEntity(k, {"v": 1}))
    txn = gw.begin_transaction()
    [e] = gw.lookup([k], transaction=txn)
    assert e is not None
    gw.commit([Upsert(RawEntity(k, {"v": e.properties["v"] + 1}))], transaction=txn)
    txn = gw.begin_transaction()
    gw.lookup([k], transaction=txn)
    gw.rollback(txn)
    gw.rollback(txn)  # a second rollback of a finished transaction is harmless: no RPC
    [e] = gw.lookup([k])
    assert e is not None and e.properties == {"v": 2}
    assert gw.stats["rpc.begin_transaction"] == 2 and gw.stats["rpc.rollback"] == 1


def test_read_only_transactions_reject_mutations(gw: DatastoreGateway) -> None:
    k = key(gw, "Acct", "ro")
    put(gw, RawEntity(k, {"v": 1}))
    txn = gw.begin_transaction(read_only=True)
    assert gw.lookup([k], transaction=txn)[0] is not None
    before = gw.stats["rpcs"]
    with pytest.raises(BadValueError, match="read-only"):
        gw.commit([Upsert(RawEntity(k, {"v": 2}))], transaction=txn)
    assert gw.stats["rpcs"] == before
    assert gw.lookup([k])[0].properties == {"v": 1}  # type: ignore[union-attr]


def test_conflicting_transactions(gw: DatastoreGateway) -> None:
    """Two transactions read the same entity, then both commit. Exactly one
    wins and the other raises Contention having written nothing.

    * Datastore emulator (optimistic): both commits return at once; the first
      commit wins, the second gets ABORTED "too much contention".
    * Firestore emulator (pessimistic): each read takes a shared lock, so the
      first commit waits for the other transaction's lock, and after about 2 s
      gets ABORTED "Transaction lock timeout"; then the second commit wins.
    """
    k = key(gw, "Acct", "contended")
    put(gw, RawEntity(k, {"v": 0}))
    t1, t2 = gw.begin_transaction(), gw.begin_transaction()
    assert run_in_thread(lambda: gw.lookup([k], transaction=t1), 10)[0] == "ok"
    assert run_in_thread(lambda: gw.lookup([k], transaction=t2), 10)[0] == "ok"
    first = run_in_thread(lambda: gw.commit([Upsert(RawEntity(k, {"v": 1}))], transaction=t1), 20)
    second = run_in_thread(lambda: gw.commit([Upsert(RawEntity(k, {"v": 2}))], transaction=t2), 20)
    assert "blocked" not in (first[0], second[0])
    [stored] = gw.lookup([k])
    assert stored is not None
    if gw.kind == "datastore":  # type: ignore[attr-defined]
        assert first[0] == "ok"
        assert second[0] == "error" and isinstance(second[1], Contention), second
        assert second[1].attempts == 1
        assert stored.properties == {"v": 1}
    else:
        assert first[0] == "error" and isinstance(first[1], Contention), first
        assert first[2] >= 1.0  # it waited for the lock before giving up
        assert second[0] == "ok"
        assert stored.properties == {"v": 2}


# --- transforms ---------------------------------------------------------------


def _shard(gw: DatastoreGateway) -> tuple[Key, RawEntity]:
    k = key(gw, SHARD_KIND, "post_1_1")
    return k, RawEntity(k, {"target": "post_1", "count": 5}, {"count"})


def test_firestore_emulator_applies_increments(firestore_gateway: DatastoreGateway) -> None:
    gw = firestore_gateway
    assert gw.capabilities.applies_transforms is True
    k, shard = _shard(gw)
    put(gw, shard)
    masked = Upsert(RawEntity(k, {"target": "post_1"}), property_mask=("target",), transforms=(Increment("count", 2),))
    result = gw.commit([masked])
    assert result.mutation_results[0].transform_results == (7,)
    only_transform = Upsert(RawEntity(k, {}), property_mask=(), transforms=(Increment("count", 3),))
    assert gw.commit([only_transform]).mutation_results[0].transform_results == (10,)
    [stored] = gw.lookup([k])
    assert stored is not None
    assert stored.properties == {"target": "post_1", "count": 10}  # the mask kept target
    # Observed: the incremented value is written WITHOUT exclude_from_indexes,
    # so php-gds's "count is unindexed" does not survive a transform.
    assert stored.unindexed == frozenset()
    created = key(gw, SHARD_KIND, "post_1_2")
    fresh = gw.commit([Upsert(RawEntity(created, {"target": "post_1"}), transforms=(Increment("count", 4),))])
    assert fresh.mutation_results[0].transform_results == (4,)  # a missing property counts as 0


def test_datastore_emulator_silently_ignores_increments_and_masks(datastore_gateway: DatastoreGateway) -> None:
    """The legacy emulator accepts transforms and property masks and ignores
    both: no transform results, no increment, and the upsert REPLACES the
    whole entity (so `count` disappears rather than staying unchanged)."""
    gw = datastore_gateway
    assert gw.capabilities.applies_transforms is False
    k, shard = _shard(gw)
    put(gw, shard)
    result = gw.commit([Upsert(RawEntity(k, {"target": "post_1"}), property_mask=("target",), transforms=(Increment("count", 2),))])
    assert result.mutation_results[0].transform_results is None
    assert gw.stats["transforms_ignored"] == 1
    [stored] = gw.lookup([k])
    assert stored is not None and stored.properties == {"target": "post_1"}


def test_capabilities_are_probed_once_on_a_throwaway_entity(datastore_emulator: Any, firestore_emulator: Any) -> None:
    expected = {
        # legacy emulator: ignores transforms and masks, refuses != / IN / OR
        # (and answers aggregations with UNIMPLEMENTED)
        "datastore": Capabilities(applies_transforms=False, indexes_transformed=False, not_equal_in_or=False),
        # Firestore emulator: applies them, indexes what a transform wrote, runs aggregations
        "firestore": Capabilities(applies_transforms=True, indexes_transformed=True, not_equal_in_or=True, aggregation=True),
    }
    for emulator in (datastore_emulator, firestore_emulator):
        gw = DatastoreGateway(emulator.project, f"probe-{uuid.uuid4().hex}", emulator_host=emulator.host)
        try:
            assert gw.capabilities == expected[emulator.kind]
            probes = gw.stats["probe_rpcs"]
            assert probes > 0 and gw.stats["rpcs"] == 0  # the caller's costs are untouched
            assert gw.capabilities is gw.capabilities  # learned once, kept
            assert gw.stats["probe_rpcs"] == probes
            leftovers = gw.run_query(Query(PROBE_KIND, namespace=gw.namespace, keys_only=True))
            assert leftovers.entities == ()  # the probe entity is deleted again
        finally:
            gw.close()


def test_unreachable_server_raises_unavailable_within_the_timeout() -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gw = DatastoreGateway("p", emulator_host=f"127.0.0.1:{port}", timeout=2.0)
    started = time.monotonic()
    with pytest.raises(Unavailable):
        gw.lookup([Key.of("K", 1)])
    assert time.monotonic() - started < 10
    assert gw.stats["retry.lookup"] >= 1
    # nothing reached a server, so even an increment could be resent: Unavailable, not CommitUnknown
    with pytest.raises(Unavailable):
        gw.commit([Upsert(RawEntity(Key.of("K", 1), {}), transforms=(Increment("n", 1),))])
    gw.close()


# --- the retry / error policy, unit-tested ------------------------------------

UNAVAILABLE_AMBIGUOUS = gexc.ServiceUnavailable("Socket closed")
UNAVAILABLE_NOT_SENT = gexc.ServiceUnavailable(
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Failed to connect to remote host: Connection refused"
)


@pytest.mark.parametrize("call", ["lookup", "run_query", "allocate_ids", "begin_transaction", "rollback"])
@pytest.mark.parametrize("exc,retried", [
    (UNAVAILABLE_AMBIGUOUS, True),
    (gexc.ResourceExhausted("quota"), True),
    (gexc.InternalServerError("oops"), True),
    (gexc.DeadlineExceeded("slow"), True),
    (gexc.Aborted("too much contention on these datastore entities"), False),
    (gexc.InvalidArgument("bad"), False),
    (gexc.Unknown("?"), False),
    (gexc.PermissionDenied("no"), False),
])
def test_idempotent_calls_retry_transient_errors(call: str, exc: Exception, retried: bool) -> None:
    assert should_retry(exc, call=call) is retried


@pytest.mark.parametrize("exc,idempotent,retried", [
    (UNAVAILABLE_NOT_SENT, False, True),
    (UNAVAILABLE_AMBIGUOUS, False, False),
    (UNAVAILABLE_AMBIGUOUS, True, True),
    (gexc.ResourceExhausted("quota"), False, True),
    (gexc.DeadlineExceeded("slow"), True, False),
    (gexc.DeadlineExceeded("slow"), False, False),
    (gexc.InternalServerError("oops"), False, False),
    (gexc.Unknown("?"), False, False),
    (gexc.Cancelled("gone"), False, False),
    (gexc.Aborted("conflict"), True, False),
])
def test_commit_is_never_retried_when_its_outcome_is_unknown(exc: Exception, idempotent: bool, retried: bool) -> None:
    assert should_retry(exc, call="commit", idempotent_commit=idempotent) is retried


@pytest.mark.parametrize("exc,call,expected", [
    (gexc.Aborted("anything"), "commit", Contention),
    (gexc.Aborted("Transaction lock timeout."), "lookup", Contention),
    (gexc.FailedPrecondition("too much contention on these datastore entities"), "commit", Contention),
    (gexc.DeadlineExceeded("slow"), "commit", CommitUnknown),
    (gexc.Unknown("?"), "commit", CommitUnknown),
    (gexc.InternalServerError("oops"), "commit", CommitUnknown),
    (gexc.Cancelled("gone"), "commit", CommitUnknown),
    (UNAVAILABLE_AMBIGUOUS, "commit", CommitUnknown),
    (UNAVAILABLE_NOT_SENT, "commit", Unavailable),
    (UNAVAILABLE_AMBIGUOUS, "lookup", Unavailable),
    (gexc.DeadlineExceeded("slow"), "lookup", Unavailable),  # a read that timed out: nothing applied, retry it
    (gexc.InvalidArgument("bad key"), "commit", BadValueError),
    (gexc.PermissionDenied("no"), "run_query", GatewayError),
])
def test_errors_map_to_gds_errors(exc: Exception, call: str, expected: type) -> None:
    mapped = translate_error(exc, call=call)
    assert type(mapped) is expected
    if isinstance(mapped, Contention):
        assert mapped.attempts == 1


#: What each server says of a transaction it no longer knows (tests/conformance/test_lost_transactions.py
#: checks the emulators' and serve's answers; Cloud Datastore's is from its users' reports).
LOST_TRANSACTION_MESSAGES = [
    "The referenced transaction has expired or is no longer valid.",  # Cloud Datastore
    "Transaction is invalid or closed.",  # the Firestore emulator: a lookup or commit
    "Transaction is invalid or expired.",  # the Firestore emulator: a rollback
    "transaction has expired or is invalid",  # the legacy Datastore emulator
    "Invalid transaction.",  # both emulators: a token they never gave out
]


@pytest.mark.parametrize("message", LOST_TRANSACTION_MESSAGES)
@pytest.mark.parametrize("call", ["lookup", "run_query", "commit"])
def test_a_transaction_the_server_lost_is_transaction_lost_not_a_bad_value(message: str, call: str) -> None:
    """INVALID_ARGUMENT naming the transaction: the server forgot it (it
    expired, or the server restarted), so nothing of it was applied and the
    whole transaction may be redone: a ``Contention``, never ``BadValueError``
    (the gateway sends only tokens it began and has not ended)."""
    mapped = translate_error(gexc.InvalidArgument(message), call=call)
    assert type(mapped) is TransactionLost
    assert isinstance(mapped, Contention) and mapped.attempts == 1
    assert "nothing of it was applied" in str(mapped) and message in str(mapped)
    assert should_retry(gexc.InvalidArgument(message), call=call, idempotent_commit=True) is False  # same token: same answer


@pytest.mark.parametrize("call", ["commit", "begin_transaction"])
@pytest.mark.parametrize("message", [
    "Key path is incomplete: [Person: null]",
    "The value of property \"transaction\" is longer than 1500 bytes.",
    "a NON_TRANSACTIONAL commit names no transaction",
])
def test_other_invalid_arguments_stay_bad_values(message: str, call: str) -> None:
    assert type(translate_error(gexc.InvalidArgument(message), call=call)) is BadValueError


def test_only_a_call_that_names_a_transaction_can_be_told_it_is_lost() -> None:
    """BeginTransaction names none: its INVALID_ARGUMENT is a bad request."""
    assert type(translate_error(gexc.InvalidArgument("Invalid transaction options."), call="begin_transaction")) is BadValueError


def test_a_lost_transaction_after_an_unknown_commit_attempt_is_commit_unknown() -> None:
    """A resent commit told "transaction invalid" may be one whose first
    attempt committed it: unknown, not lost."""
    for message in LOST_TRANSACTION_MESSAGES:
        mapped = translate_error(gexc.InvalidArgument(message), call="commit", earlier_attempts=[UNAVAILABLE_AMBIGUOUS])
        assert type(mapped) is CommitUnknown


def test_a_commit_retried_after_an_unknown_attempt_stays_unknown() -> None:
    # first attempt may have landed; the retry then fails: still unknown, not "bad value"
    mapped = translate_error(gexc.InvalidArgument("transaction expired"), call="commit", earlier_attempts=[UNAVAILABLE_AMBIGUOUS])
    assert isinstance(mapped, CommitUnknown)
    assert isinstance(translate_error(UNAVAILABLE_NOT_SENT, call="commit", earlier_attempts=[UNAVAILABLE_NOT_SENT]), Unavailable)


class FakeRpc:
    """Stands in for a GAPIC method: raises the given errors, then answers."""

    def __init__(self, *errors: Exception, answer: Any = None) -> None:
        self.errors = list(errors)
        self.answer = answer
        self.calls = 0

    def __call__(self, *, request: Any, retry: Any, timeout: float) -> Any:
        assert retry is None and 0 < timeout <= 5
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return self.answer


@pytest.fixture
def offline_gw() -> Any:
    gw = DatastoreGateway("p", emulator_host="127.0.0.1:9", timeout=5.0)
    yield gw
    gw.close()


def test_call_retries_idempotent_reads_with_backoff(offline_gw: DatastoreGateway) -> None:
    rpc = FakeRpc(UNAVAILABLE_AMBIGUOUS, gexc.DeadlineExceeded("slow"), answer="done")
    assert offline_gw._call("lookup", rpc, object()) == "done"
    assert rpc.calls == 3 and offline_gw.stats["retry.lookup"] == 2


def test_call_does_not_resend_an_increment_of_unknown_outcome(offline_gw: DatastoreGateway) -> None:
    for error in (gexc.DeadlineExceeded("slow"), UNAVAILABLE_AMBIGUOUS, gexc.InternalServerError("x")):
        rpc = FakeRpc(error, answer="done")
        with pytest.raises(CommitUnknown):
            offline_gw._call("commit", rpc, object(), idempotent_commit=False)
        assert rpc.calls == 1


def test_call_retries_commits_that_are_safe_to_resend(offline_gw: DatastoreGateway) -> None:
    rpc = FakeRpc(UNAVAILABLE_AMBIGUOUS, gexc.ResourceExhausted("quota"), answer="done")
    assert offline_gw._call("commit", rpc, object(), idempotent_commit=True) == "done"
    rpc = FakeRpc(UNAVAILABLE_NOT_SENT, answer="done")
    assert offline_gw._call("commit", rpc, object(), idempotent_commit=False) == "done"
    rpc = FakeRpc(gexc.Aborted("too much contention"), answer="done")
    with pytest.raises(Contention):
        offline_gw._call("commit", rpc, object(), idempotent_commit=True)
    assert rpc.calls == 1


def test_an_error_names_the_project_and_the_keys_or_kind_of_its_request(offline_gw: DatastoreGateway) -> None:
    """"Deadline Exceeded after 1.50s" alone names nothing a user can look
    up: the error says which project, and which keys the commit or lookup
    was about (the first three, and how many more), or the kind queried."""
    offline_gw._client().commit = FakeRpc(gexc.DeadlineExceeded("slow"))  # type: ignore[method-assign]
    keys = [Key.of("Shard", f"s{i}", namespace="ns") for i in range(5)]
    with pytest.raises(CommitUnknown, match=r"\[project 'p', keys 'ns':Shard:'s0', 'ns':Shard:'s1', "
                       r"'ns':Shard:'s2' and 2 more\]$"):
        offline_gw.commit([Upsert(RawEntity(key, {"count": 1})) for key in keys])
    offline_gw._client().lookup = FakeRpc(*[gexc.DeadlineExceeded("slow")] * 50)  # type: ignore[method-assign]
    offline_gw.timeout = 0.3
    with pytest.raises(Unavailable, match=r"\[project 'p', keys Counter:7/Shard:'a'\]$"):
        offline_gw.lookup([Key.of("Counter", 7, "Shard", "a")])
    offline_gw._client().run_query = FakeRpc(*[gexc.DeadlineExceeded("slow")] * 50)  # type: ignore[method-assign]
    with pytest.raises(Unavailable, match=r"\[project 'p', kind 'Shard'\]$"):
        list(offline_gw.run_query(Query(kind="Shard")))


# --- one deadline for many calls (set_deadline) -----------------------------------------


def test_a_deadline_gives_each_call_only_the_time_left(offline_gw: DatastoreGateway) -> None:
    """One operation makes several calls; with ``set_deadline`` each gets
    what is left of the operation's time, not its own whole ``timeout``
    (which is how ``gds-counter --timeout`` bounds a whole command)."""
    offline_gw.set_deadline(time.monotonic() + 1.0)
    rpc = FakeRpc(answer="done")
    seen: list[float] = []

    def timed(*, request: Any, retry: Any, timeout: float) -> Any:
        seen.append(timeout)
        return rpc(request=request, retry=retry, timeout=timeout)

    assert offline_gw._call("lookup", timed, object()) == "done"
    assert 0 < seen[0] <= 1.0  # not the gateway's 5 s


def test_past_the_deadline_a_call_is_not_sent_and_says_nothing_was_written(offline_gw: DatastoreGateway) -> None:
    """Even a commit of an increment: it never left, so ``Unavailable``
    (not ``CommitUnknown``) is the truth, and the error names the gateway."""
    offline_gw.set_deadline(time.monotonic() - 0.5)
    rpc = FakeRpc(answer="done")
    with pytest.raises(Unavailable, match=r"commit: not sent to DatastoreGateway\('p'.*nothing of it was written"):
        offline_gw._call("commit", rpc, object(), idempotent_commit=False)
    assert rpc.calls == 0
    offline_gw.set_deadline(None)  # lifted: calls are sent again
    assert offline_gw._call("commit", rpc, object(), idempotent_commit=False) == "done"


def test_a_server_that_never_answers_is_given_up_on_at_the_deadline() -> None:
    """A listening socket that never accepts: gRPC's handshake never ends,
    as with a blackholed address. The retries of a read stop at the deadline
    set for the operation, well before the gateway's own 20 s timeout."""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        gw = DatastoreGateway("p", emulator_host=f"127.0.0.1:{listener.getsockname()[1]}", timeout=20.0)
        try:
            gw.set_deadline(time.monotonic() + 1.5)
            kind, outcome, took = run_in_thread(lambda: gw.lookup([Key.of("K", 1)]), timeout=60)
            assert kind == "error" and isinstance(outcome, Unavailable), outcome
            assert took < 1.5 + 2.0, took  # the deadline plus a margin for a loaded machine
        finally:
            gw.close()


def test_a_timeout_changed_after_construction_bounds_the_retries() -> None:
    """``timeout`` is a public attribute: lowering it bounds the next call,
    retries included. (The retry policy was made for the first timeout and
    kept it: a call retried for 20 s where 1 s was asked.)"""
    import socket

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        gw = DatastoreGateway("p", emulator_host=f"127.0.0.1:{listener.getsockname()[1]}", timeout=20.0)
        try:
            gw.timeout = 1.0
            kind, outcome, took = run_in_thread(lambda: gw.lookup([Key.of("K", 1)]), timeout=60)
            assert kind == "error" and isinstance(outcome, Unavailable), outcome
            assert took < 1.0 + 2.0, took  # the timeout plus a margin for a loaded machine
        finally:
            gw.close()


def test_the_async_gateway_keeps_the_same_deadline() -> None:
    """``AsyncDatastoreGateway`` shares the rule: past the deadline nothing
    is sent and the call raises ``Unavailable``; before it, the time left
    bounds the call (a refused connection is retried only until then)."""
    import asyncio
    import socket

    from google.cloud.datastore_v1.types import datastore as ds

    from gds_counter.gateway.datastore._async_gateway import AsyncDatastoreGateway

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def scenario() -> tuple[BaseException, float, BaseException]:
        gw = AsyncDatastoreGateway("p", emulator_host=f"127.0.0.1:{port}", timeout=20.0)
        try:
            gw.set_deadline(time.monotonic() + 1.0)
            began = time.monotonic()
            try:
                await gw._send("lookup", ds.LookupRequest(project_id="p"))
            except Unavailable as exc:
                first: BaseException = exc
            took = time.monotonic() - began
            gw.set_deadline(time.monotonic() - 1.0)
            try:
                await gw._send("commit", ds.CommitRequest(project_id="p"))
            except Unavailable as exc:
                second: BaseException = exc
            return first, took, second
        finally:
            await gw.close()

    first, took, second = asyncio.run(asyncio.wait_for(scenario(), 60))
    assert took < 1.0 + 2.0, took
    assert "lookup" in str(first)
    assert "not sent" in str(second) and "nothing of it was written" in str(second)


def test_missing_credentials_are_a_gds_error_naming_the_project(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Every error a user sees is a GDSError: google-auth's own error used to
    escape from the constructor (and from the async gateway's first call)."""
    import asyncio

    from google.cloud.datastore_v1.types import datastore as ds

    from gds_counter.gateway.datastore._async_gateway import AsyncDatastoreGateway

    monkeypatch.delenv("DATASTORE_EMULATOR_HOST", raising=False)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(tmp_path / "missing.json"))
    with pytest.raises(GatewayError, match=r"project 'my-project': no credentials.*Nothing was sent"):
        DatastoreGateway("my-project")

    async def first_call() -> None:
        gw = AsyncDatastoreGateway("my-project")
        await gw._send("lookup", ds.LookupRequest(project_id="my-project"))

    with pytest.raises(GatewayError, match="project 'my-project': no credentials"):
        asyncio.run(asyncio.wait_for(first_call(), 60))
