"""google-cloud-datastore's HTTP transport (``GOOGLE_CLOUD_DISABLE_GRPC``,
the second variant of its own system tests) against ``gds-counter serve``
and the Firestore emulator in Datastore mode, side by side: it sends each
request as ``Content-Type: application/x-protobuf`` and reads the answer,
and every error as a binary ``google.rpc.Status``. The same calls must give
the same outcomes on both (the emulator is the oracle)."""

from __future__ import annotations

import uuid
from typing import Any, Callable

import httpx
import pytest
import requests


def http_client(target: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    from google.cloud import datastore

    host, project = target
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", host)
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    client = datastore.Client(project=project, namespace=namespace, _http=requests.Session(), _use_grpc=False)
    assert type(client._datastore_api).__name__ == "HTTPDatastoreAPI"
    return client


def outcome(call: Callable[[], Any]) -> Any:
    """What a call gave: its value, or the class and HTTP code of its error."""
    try:
        return call()
    except Exception as exc:  # the client's exceptions, compared by class
        return type(exc).__name__, getattr(exc, "code", None)


def test_the_http_transport_round_trips_entities_queries_and_transactions(
        target: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from google.cloud import datastore

    client = http_client(target, monkeypatch)
    rows = []
    for number in range(5):
        row = datastore.Entity(client.key("Row", f"r{number}"), exclude_from_indexes=("blob",))
        row.update({"n": number, "tag": "odd" if number % 2 else "even", "blob": b"\x00\xff" * number,
                    "items": [number, "x"]})
        rows.append(row)
    client.put_multi(rows)

    got = client.get(client.key("Row", "r3"))
    assert got is not None and dict(got) == dict(rows[3])
    assert client.get(client.key("Row", "none")) is None
    query = client.query(kind="Row")
    query.add_filter(filter=datastore.query.PropertyFilter("tag", "=", "odd"))
    assert [entity.key.name for entity in query.fetch()] == ["r1", "r3"]
    page = client.query(kind="Row", order=["-n"]).fetch(limit=2)
    assert [entity["n"] for entity in page] == [4, 3]
    count = client.aggregation_query(client.query(kind="Row")).count(alias="total")
    assert [[(result.alias, result.value) for result in results] for results in count.fetch()] == [[("total", 5)]]

    with client.transaction():
        current = client.get(client.key("Row", "r0"))
        current["n"] = 100
        client.put(current)
    assert client.get(client.key("Row", "r0"))["n"] == 100
    first, last = client.allocate_ids(client.key("Row"), 2)[0], None
    assert first.id is not None and last is None


def test_errors_come_back_as_status_messages_with_the_emulators_classes(
        target: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """``google.rpc.Status`` in binary: the client parses every error body
    as one, so a JSON error body would fail as 'Wire format was corrupt'."""
    from google.cloud import datastore

    client = http_client(target, monkeypatch)
    row = datastore.Entity(client.key("Row", "once"))
    api = client._datastore_api
    insert = [{"insert": datastore.helpers.entity_to_protobuf(row)._pb}]
    outcomes = [
        outcome(lambda: api.commit(request={"project_id": client.project, "mode": 2, "mutations": insert}) and "stored"),
        outcome(lambda: api.commit(request={"project_id": client.project, "mode": 2, "mutations": insert})),
        outcome(lambda: api.commit(request={"project_id": client.project, "mode": 1, "transaction": b"no such"})),
        outcome(lambda: api.run_query(request={"project_id": client.project, "gql_query": {"query_string": "SELECT FROM WHERE"}})),
        outcome(lambda: api.lookup(request={"project_id": client.project, "keys": []}) and "looked up"),
    ]
    assert outcomes == ["stored", ("Conflict", 409), ("BadRequest", 400), ("BadRequest", 400), "looked up"]


def test_a_body_that_is_not_the_message_is_invalid_argument(target: tuple[str, str]) -> None:
    from google.rpc import status_pb2

    host, project = target
    answer = httpx.post(f"http://{host}/v1/projects/{project}:lookup", content=b"\xff\xff not protobuf",
                        headers={"Content-Type": "application/x-protobuf"}, timeout=10)
    assert (answer.status_code, answer.headers["Content-Type"]) == (400, "application/x-protobuf")
    status = status_pb2.Status.FromString(answer.content)
    assert (status.code, status.message) == (3, "Payload isn't valid for request.")
