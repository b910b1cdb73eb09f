"""Every entity result ``gds-counter serve`` answers carries its own cursor,
the cursor right after it, as the Firestore emulator's (and Datastore's)
do. Clients rely on it: google-cloud-ndb pages a query it filters itself
(a repeated structured property) by the cursor of the last result it kept,
wherever that result is in the batch; with a cursor on the batch's last
result only, its ``fetch_page`` gave the first page again."""

from __future__ import annotations

import uuid
from typing import Any

import pytest


def _client(host: str, project: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    from google.cloud import datastore

    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", host)
    return datastore.Client(project=project, namespace=namespace)


def _run_query(client: Any, *, start_cursor: bytes = b"", limit: int | None = None, offset: int = 0) -> Any:
    """The raw ``RunQueryResponse`` (protobuf) of kind ``P`` by ``n`` then key."""
    from google.cloud.datastore_v1.types import entity as entity_pb
    from google.cloud.datastore_v1.types import query as query_pb

    query = query_pb.Query(
        kind=[query_pb.KindExpression(name="P")],
        order=[query_pb.PropertyOrder(property=query_pb.PropertyReference(name="n"))],
        offset=offset,
        start_cursor=start_cursor,
    )
    if limit is not None:
        query.limit = limit
    partition = entity_pb.PartitionId(project_id=client.project, namespace_id=client.namespace)
    request = {"project_id": client.project, "partition_id": partition, "query": query}
    return client._datastore_api.run_query(request=request)._pb


def _names(results: Any) -> list[str]:
    return [r.entity.key.path[-1].name for r in results]


def _what_cursors_do(client: Any) -> dict[str, Any]:
    """Seven entities, one batch of five after an offset of one: which
    results carry a cursor, and what resuming from each one gives."""
    from google.cloud import datastore

    entities = []
    for i in range(7):
        entity = datastore.Entity(client.key("P", f"e{i}"))
        entity.update({"n": i % 3, "i": i})
        entities.append(entity)
    client.put_multi(entities)
    everything = _names(_run_query(client).batch.entity_results)
    batch = _run_query(client, limit=5, offset=1).batch
    results = list(batch.entity_results)
    return {
        "all": everything,
        "batch": _names(results),
        "with_cursor": [bool(r.cursor) for r in results],
        "last_is_end": bool(results) and results[-1].cursor == batch.end_cursor,
        "resumed": [_names(_run_query(client, start_cursor=r.cursor).batch.entity_results) for r in results if r.cursor],
    }


def test_every_result_carries_the_cursor_after_it_as_on_the_firestore_emulator(
    firestore_emulator: Any, serve_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Differential: the same entities and query on the emulator and on the
    server; every result has a cursor, the last one's is the batch's end
    cursor, and resuming from result k's cursor gives exactly the results
    after k."""
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    emulator = _what_cursors_do(_client(firestore_emulator.host, firestore_emulator.project, namespace, monkeypatch))
    served = _what_cursors_do(_client(serve_server.emulator_host, "serve-test", namespace, monkeypatch))
    assert emulator["with_cursor"] == [True] * 5  # what the emulator does, measured here each run
    assert served == emulator
    for k, after in enumerate(served["resumed"]):
        assert after == served["all"][served["all"].index(served["batch"][k]) + 1 :]


ndb = pytest.importorskip("google.cloud.ndb", reason="google-cloud-ndb is in the dev extra")


class Line(ndb.Model):
    sku = ndb.StringProperty()
    qty = ndb.IntegerProperty()


class Order(ndb.Model):
    """An order of lines: ``lines == Line(sku=..., qty=...)`` is a filter
    ndb runs in part itself (the same line must match both)."""

    number = ndb.IntegerProperty()
    lines = ndb.StructuredProperty(Line, repeated=True)


def test_ndb_fetch_page_of_a_query_it_filters_itself_goes_on_page_after_page(
    serve_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ndb sends ``lines.sku = 'a' AND lines.qty = 2`` (every order has a
    line of each) and keeps the orders where one line has both, ending each
    page at the cursor of the last one it kept: a result in the middle of
    the server's batch."""
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", serve_server.emulator_host)
    client = ndb.Client(project="ndb-app", namespace=f"t-{uuid.uuid4().hex[:12]}")
    with client.context():
        ndb.put_multi([
            Order(id=f"o{n:02d}", number=n, lines=[Line(sku="a", qty=n % 2 + 1), Line(sku="b", qty=2)])
            for n in range(12)
        ])
        wanted = {f"o{n:02d}" for n in range(12) if n % 2 == 1}  # the "a" line has qty 2
        query = Order.query(Order.lines == Line(sku="a", qty=2))
        pages: list[list[str]] = []
        cursor = None
        for _ in range(10):  # six matches, two a page: three pages, then an empty or final one
            found, cursor, more = query.fetch_page(2, start_cursor=cursor)
            pages.append([order.key.id() for order in found])
            if not more or not found:
                break
    assert pages[0] and pages[1] and pages[1] != pages[0], pages
    seen = [name for page in pages for name in page]
    assert sorted(seen) == sorted(wanted), pages  # every match, each once


def test_a_results_cursor_continues_no_other_namespace_and_no_tampering(
    serve_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cursor in the middle of a batch is checked as an end cursor is:
    given to a query of another namespace, or altered, it is refused
    (INVALID_ARGUMENT), never read as a position among another's data."""
    from google.api_core import exceptions as gexc

    mine = _client(serve_server.emulator_host, "serve-test", f"t-{uuid.uuid4().hex[:12]}", monkeypatch)
    theirs = _client(serve_server.emulator_host, "serve-test", f"t-{uuid.uuid4().hex[:12]}", monkeypatch)
    _what_cursors_do(mine)
    _what_cursors_do(theirs)
    middle = _run_query(mine, limit=5).batch.entity_results[1].cursor
    with pytest.raises(gexc.InvalidArgument, match="namespace"):
        _run_query(theirs, start_cursor=middle)
    with pytest.raises(gexc.InvalidArgument):
        _run_query(mine, start_cursor=middle[:-3])
