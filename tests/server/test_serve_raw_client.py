"""google-cloud-datastore's own client, unchanged, against ``gds-counter
serve``: what it writes through gRPC is what the embedded engine stores, and
the server's errors arrive as the statuses the client's users catch."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from google.api_core import exceptions as gexc

from gds_counter.gateway.keys import Key


def test_put_get_and_delete(client: Any) -> None:
    from google.cloud import datastore

    book = datastore.Entity(client.key("Book", "dune"), exclude_from_indexes=("blurb",))
    when = dt.datetime(2020, 1, 2, 3, 4, 5, 678901, tzinfo=dt.timezone.utc)
    book.update({"title": "Dune", "pages": 412, "price": 9.5, "tags": ["sf", "classic"], "blurb": "long",
                 "published": when, "author": client.key("Author", 7)})
    client.put(book)
    got = client.get(client.key("Book", "dune"))
    assert got is not None and dict(got) == dict(book)
    assert got.key == book.key and got.exclude_from_indexes == {"blurb"}
    client.delete(book.key)
    assert client.get(client.key("Book", "dune")) is None


def test_what_the_client_writes_the_embedded_engine_stores(client: Any, served: Any, namespace: str) -> None:
    from google.cloud import datastore

    _, gateway = served
    entity = datastore.Entity(client.key("Shelf", "s", "Book", 3))
    entity["n"] = 5
    client.put(entity)
    [stored] = gateway.lookup([Key.of("Shelf", "s", "Book", 3, namespace=namespace)])
    assert stored is not None and stored.properties == {"n": 5}


def test_an_incomplete_key_gets_its_id_and_allocate_ids_never_repeats_one(client: Any) -> None:
    from google.cloud import datastore

    entities = [datastore.Entity(client.key("Note")) for _ in range(3)]
    for i, entity in enumerate(entities):
        entity["i"] = i
    client.put_multi(entities)
    ids = [e.key.id for e in entities]
    assert all(isinstance(i, int) and i > 0 for i in ids) and len(set(ids)) == 3
    allocated = [k.id for k in client.allocate_ids(client.key("Note"), 5)]
    assert len(set(allocated) | set(ids)) == 8
    assert [client.get(client.key("Note", i))["i"] for i in ids] == [0, 1, 2]


def test_queries_filter_order_limit_and_page_with_cursors(client: Any) -> None:
    from google.cloud import datastore
    from google.cloud.datastore.query import PropertyFilter

    items = []
    for i in range(12):
        entity = datastore.Entity(client.key("Item", f"i{i:02}"))
        entity.update({"n": i, "even": i % 2 == 0})
        items.append(entity)
    client.put_multi(items)
    query = client.query(kind="Item")
    query.add_filter(filter=PropertyFilter("even", "=", True))
    query.order = ["-n"]
    assert [e["n"] for e in query.fetch()] == [10, 8, 6, 4, 2, 0]
    assert [e["n"] for e in query.fetch(limit=2, offset=1)] == [8, 6]
    pages, cursor = [], None
    while True:
        iterator = query.fetch(limit=4, start_cursor=cursor)
        page = list(next(iterator.pages))
        pages.append([e["n"] for e in page])
        cursor = iterator.next_page_token
        if not page or cursor is None or len(page) < 4:
            break
    assert [n for page in pages for n in page] == [10, 8, 6, 4, 2, 0]
    keys_only = client.query(kind="Item")
    keys_only.keys_only()
    assert len(list(keys_only.fetch())) == 12
    counted = client.aggregation_query(client.query(kind="Item")).count(alias="all")
    assert [[(a.alias, a.value) for a in row] for row in counted.fetch()] == [[("all", 12)]]


def test_a_transaction_commits_and_a_conflicting_one_is_aborted(client: Any) -> None:
    from google.cloud import datastore

    counter = datastore.Entity(client.key("Counter", "c"))
    counter["n"] = 0
    client.put(counter)
    with client.transaction():
        current = client.get(counter.key)
        current["n"] += 1
        client.put(current)
    assert client.get(counter.key)["n"] == 1

    first, second = client.transaction(), client.transaction()
    first.begin()
    second.begin()
    mine = client.get(counter.key, transaction=first)
    theirs = client.get(counter.key, transaction=second)
    mine["n"], theirs["n"] = 10, 20
    first.put(mine)
    first.commit()
    second.put(theirs)
    with pytest.raises(gexc.Aborted):
        second.commit()
    assert client.get(counter.key)["n"] == 10


def test_a_bad_request_is_invalid_argument_and_writes_nothing(client: Any) -> None:
    from google.cloud import datastore

    good = datastore.Entity(client.key("Book", "ok"))
    bad = datastore.Entity(client.key("Book", "__reserved__"))
    with pytest.raises(gexc.InvalidArgument, match="reserved"):
        client.put_multi([good, bad])
    assert client.get(good.key) is None
    with pytest.raises(gexc.InvalidArgument, match="unknown"):
        client.get(good.key, transaction=_Unknown())


class _Unknown:
    """A transaction the server never began, as the client's read option takes one."""

    id = b"never-begun"
    _id = b"never-begun"

    def current(self) -> Any:
        return self


def test_a_key_of_another_project_is_told_apart_from_the_requests_own(client: Any, server: Any, namespace: str) -> None:
    """The server keeps one store for every project, so "another project"
    is another than the request's (``serve-test`` here): a filter value of
    another project sorts by project first, a ``__key__`` filter on one is
    refused, and the same text naming the request's own project is an
    ordinary key (issue 25)."""
    import grpc
    from google.cloud import datastore, datastore_v1
    from google.cloud.datastore.query import PropertyFilter
    from google.cloud.datastore_v1.services.datastore.transports import DatastoreGrpcTransport

    entity = datastore.Entity(client.key("D", 1))
    entity["a"] = client.key("D", 5)
    client.put(entity)
    # Structured, through google-cloud-datastore: the key value travels with its project.
    for project, above, found in (("aaa", 9, [1]), ("zzz", 1, []), ("serve-test", 9, []), ("serve-test", 3, [1])):
        query = client.query(kind="D")
        query.add_filter(filter=PropertyFilter("a", ">", datastore.Key("D", above, project=project, namespace=namespace)))
        assert [e.key.id for e in query.fetch()] == found, project
    # GQL text, which the server parses against the request's project.
    channel = grpc.insecure_channel(server.emulator_host)
    raw = datastore_v1.DatastoreClient(transport=DatastoreGrpcTransport(channel=channel))
    try:
        def run(text: str) -> list[int]:
            request = {"project_id": "serve-test", "partition_id": {"project_id": "serve-test", "namespace_id": namespace},
                       "gql_query": {"query_string": text, "allow_literals": True}}
            return [r.entity.key.path[-1].id for r in raw.run_query(request=request).batch.entity_results]

        assert run("SELECT __key__ FROM D WHERE a > KEY(PROJECT('aaa'), D, 9)") == [1]
        assert run("SELECT __key__ FROM D WHERE a > KEY(PROJECT('zzz'), D, 1)") == []
        assert run(f"SELECT __key__ FROM D WHERE a = KEY(PROJECT('serve-test'), NAMESPACE('{namespace}'), D, 5)") == [1]
        assert run(f"SELECT __key__ FROM D WHERE __key__ = KEY(PROJECT('serve-test'), NAMESPACE('{namespace}'), D, 1)") == [1]
        with pytest.raises(gexc.InvalidArgument, match="project 'other'"):
            run(f"SELECT __key__ FROM D WHERE __key__ = KEY(PROJECT('other'), NAMESPACE('{namespace}'), D, 1)")
    finally:
        channel.close()


def test_a_request_of_a_project_datastore_refuses_is_invalid_argument(server: Any, namespace: str) -> None:
    """The request's project is what keys of other projects are told apart
    from, by name: one Datastore would refuse (``PROJ_A``) is refused, as is
    a query whose partition names another project than the request."""
    import grpc
    from google.cloud import datastore_v1
    from google.cloud.datastore_v1.services.datastore.transports import DatastoreGrpcTransport

    channel = grpc.insecure_channel(server.emulator_host)
    raw = datastore_v1.DatastoreClient(transport=DatastoreGrpcTransport(channel=channel))
    try:
        text = {"query_string": "SELECT * FROM D", "allow_literals": True}
        with pytest.raises(gexc.InvalidArgument, match="'PROJ_A' is not a project id"):
            raw.run_query(request={"project_id": "PROJ_A", "partition_id": {"namespace_id": namespace}, "gql_query": text})
        with pytest.raises(gexc.InvalidArgument, match="partition names project 'other'"):
            raw.run_query(request={"project_id": "serve-test", "partition_id": {"project_id": "other", "namespace_id": namespace},
                                   "gql_query": text})
    finally:
        channel.close()
