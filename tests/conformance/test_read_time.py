"""Reads at a past ``read_time``: a read-only transaction begun with
``read_time=`` sees the database as it was at that time, on every gateway
that has the feature, as Datastore's ``TransactionOptions.ReadOnly.read_time``
does. The Firestore emulator in Datastore mode is the oracle (reached
through the Datastore gateway, and through the Firestore gateway in native
mode); ``serve`` is the Datastore gateway on ``gds-counter serve``, whose
``ReadOptions.read_time`` reads run the same transactions
(tests/server/test_serve_read_time.py compares them with the emulator
through the raw client). The legacy Datastore emulator ignores read_time
(it reads the newest data), so it is left out.

Times are real (each taken after a commit returned, on the test's clock,
which is the servers' clock): a read at a time sees every commit that
returned before it, and none that began after it.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moments import after_commit, now

from gds_counter.errors import BadValueError, ReadTimeTooOld
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Upsert
from gds_counter.gateway.query import Aggregation, AggregationQuery, Order, PropertyFilter, Query
from gds_counter.gateway.values import RawEntity

#: The gateways that read at a past time.
PAST_READERS = ("memory", "sqlite", "firestore", "serve", "firestore-native")


def with_history(gateway: Any) -> Any:
    """The gateway, keeping the history past reads need: the embedded engine
    keeps it when asked (``keep_history``), as serve asks; servers always do."""
    keep = getattr(gateway, "keep_history", None)
    if keep is not None:
        keep()
    return gateway


@pytest.fixture
def gw(request, make_gateway):
    return with_history(make_gateway(request.param))






def seen_at(gw: Any, read_time: dt.datetime, keys: list[Key], kind: str, namespace: str) -> tuple[Any, ...]:
    """What a read-only transaction at ``read_time`` sees: each key's
    properties (None: missing), the kind's entities by key, its count."""
    token = gw.begin_transaction(read_only=True, read_time=read_time)
    try:
        found = gw.lookup(keys, transaction=token)
        queried = gw.run_query(Query(kind=kind, namespace=namespace), transaction=token).entities
        counted = gw.run_aggregation(
            AggregationQuery(Query(kind=kind, namespace=namespace), (Aggregation("COUNT", alias="n"),)),
            transaction=token,
        )
    finally:
        gw.rollback(token)
    return (
        [None if e is None else dict(e.properties) for e in found],
        sorted((e.key.id_or_name, sorted(e.properties.items())) for e in queried),
        counted["n"],
    )


@pytest.mark.parametrize("gw", PAST_READERS, indirect=True)
def test_a_read_only_transaction_reads_the_data_as_it_was(gw):
    """Before the entity was written, between its two writes, after its
    delete: each read at that time sees that version (lookup, query and
    aggregation alike), while the newest data has none of them."""
    k = Key.of("Past", "a", namespace=gw.namespace)
    times = [after_commit()]
    gw.commit([Upsert(RawEntity(k, {"n": 1}))])
    times.append(after_commit())
    gw.commit([Upsert(RawEntity(k, {"n": 2}))])
    times.append(after_commit())
    gw.commit([Delete(k)])
    times.append(after_commit())
    seen = [seen_at(gw, t, [k], "Past", gw.namespace) for t in times]
    assert seen == [
        ([None], [], 0),
        ([{"n": 1}], [("a", [("n", 1)])], 1),
        ([{"n": 2}], [("a", [("n", 2)])], 1),
        ([None], [], 0),
    ]
    assert gw.lookup([k]) == [None]


@pytest.mark.parametrize("gw", PAST_READERS, indirect=True)
def test_a_query_at_a_past_time_filters_and_orders_that_version(gw):
    """A filter and an order at a past time use the values of then: the
    engine rebuilds the index rows of the versions it brings back."""
    a, b = (Key.of("Ranked", name, namespace=gw.namespace) for name in "ab")
    gw.commit([Upsert(RawEntity(a, {"rank": 1})), Upsert(RawEntity(b, {"rank": 2}))])
    then = after_commit()
    gw.commit([Upsert(RawEntity(a, {"rank": 3})), Upsert(RawEntity(b, {"rank": 0}))])
    query = Query(kind="Ranked", namespace=gw.namespace, filter=PropertyFilter("rank", ">=", 1), order=(Order("rank", descending=True),))
    token = gw.begin_transaction(read_only=True, read_time=then)
    try:
        past = [(e.key.name, e.properties["rank"]) for e in gw.run_query(query, transaction=token).entities]
    finally:
        gw.rollback(token)
    assert past == [("b", 2), ("a", 1)]
    assert [(e.key.name, e.properties["rank"]) for e in gw.run_query(query).entities] == [("a", 3)]


@pytest.mark.parametrize("gw", PAST_READERS, indirect=True)
def test_a_time_in_the_future_is_refused(gw):
    """Datastore refuses a read_time after now (INVALID_ARGUMENT, "cannot
    be in the future"), before anything is read."""
    with pytest.raises(BadValueError, match="cannot be in the future"):
        gw.begin_transaction(read_only=True, read_time=now() + dt.timedelta(minutes=5))


@pytest.mark.parametrize("gw", PAST_READERS, indirect=True)
def test_a_time_older_than_the_kept_versions_is_too_old(gw):
    """Eight days ago is older than any storage keeps versions (the
    emulator 7 days, the engine one hour): ``ReadTimeTooOld``, Datastore's
    FAILED_PRECONDITION "The requested 'read_time' is too old."."""
    with pytest.raises(ReadTimeTooOld, match="'read_time' is too old"):
        token = gw.begin_transaction(read_only=True, read_time=now() - dt.timedelta(days=8))
        gw.lookup([Key.of("Past", "a", namespace=gw.namespace)], transaction=token)


@pytest.mark.parametrize("gw", PAST_READERS, indirect=True)
def test_read_time_needs_a_read_only_transaction(gw):
    """Datastore has read_time only on read-only transactions; a read-write
    one with a read_time, or a naive datetime, is refused before anything
    is sent."""
    with pytest.raises(BadValueError, match="read-only"):
        gw.begin_transaction(read_time=now() - dt.timedelta(seconds=1))
    with pytest.raises(BadValueError, match="aware datetime"):
        gw.begin_transaction(read_only=True, read_time=dt.datetime.now())  # noqa: DTZ005 (the naive one refused)


# --- generated write sequences, the engine against the emulator -----------------

_KEYS = ("a", "b", "c")
_WRITES = st.lists(
    st.tuples(st.sampled_from(_KEYS), st.one_of(st.none(), st.integers(-3, 3))),  # None: delete
    min_size=1,
    max_size=5,
)


@pytest.fixture
def pair(make_gateway):
    return with_history(make_gateway("memory")), make_gateway("firestore")


def _play(gw: Any, writes: list[tuple[str, int | None]]) -> list[tuple[Any, ...]]:
    """Commit ``writes`` one by one in a fresh namespace, then read at the
    time before each commit and after the last."""
    namespace = f"h-{uuid.uuid4().hex[:12]}"
    keys = [Key.of("H", name, namespace=namespace) for name in _KEYS]
    times = [after_commit()]
    for name, value in writes:
        k = Key.of("H", name, namespace=namespace)
        gw.commit([Delete(k) if value is None else Upsert(RawEntity(k, {"v": value}))])
        times.append(after_commit())
    return [seen_at(gw, t, keys, "H", namespace) for t in times]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writes=_WRITES)
def test_generated_writes_read_back_at_each_commit_as_on_the_emulator(pair, writes):
    """Any sequence of puts and deletes on three keys, read at the time
    between each two commits: the engine sees what the emulator sees."""
    engine, emulator = pair
    assert _play(engine, writes) == _play(emulator, writes)
