"""The REST face of ``gds-counter serve``, as php-gds's REST gateway uses
it: Datastore v1 JSON over HTTP/1.1 on the same port as gRPC, Google's error
shape and HTTP statuses, and ``GET /`` answering ``Ok``."""

from __future__ import annotations

import base64
from typing import Any

import httpx
import pytest

from gds_counter.gateway.keys import Key
from gds_counter.server import Server


@pytest.fixture
def http(server: Server) -> Any:
    with httpx.Client(base_url=f"http://{server.emulator_host}", timeout=10) as session:
        yield session


def key(namespace: str, *path: Any) -> dict[str, Any]:
    elements = []
    for kind, ident in zip(path[0::2], path[1::2]):
        elements.append({"kind": kind, "id" if isinstance(ident, int) else "name": str(ident) if isinstance(ident, int) else ident})
    return {"partitionId": {"projectId": "php-app", "namespaceId": namespace}, "path": elements}


def call(http: Any, verb: str, body: dict[str, Any], project: str = "php-app") -> httpx.Response:
    return http.post(f"/v1/projects/{project}:{verb}", json=body)


def test_get_root_answers_ok(http: Any) -> None:
    answer = http.get("/")
    assert answer.status_code == 200 and answer.text == "Ok"


def test_commit_lookup_and_query_in_json(http: Any, namespace: str, served: Any) -> None:
    shard = {"key": key(namespace, "IK_CounterShardEntity", "Counter Test_1_3"),
             "properties": {"target": {"stringValue": "Counter Test_1", "excludeFromIndexes": False},
                            "count": {"integerValue": "41", "excludeFromIndexes": True}}}
    done = call(http, "commit", {"mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": shard}]})
    assert done.status_code == 200, done.text
    assert done.json()["mutationResults"] == [{}]  # a complete key is not sent back

    found = call(http, "lookup", {"keys": [shard["key"], key(namespace, "IK_CounterShardEntity", "nope")]}).json()
    assert [f["entity"]["properties"]["count"] for f in found["found"]] == [{"integerValue": "41", "excludeFromIndexes": True}]
    assert found["found"][0]["entity"]["key"] == shard["key"]
    assert [m["entity"]["key"]["path"][0]["name"] for m in found["missing"]] == ["nope"]

    _, gateway = served  # the engine stored it as php-gds wrote it
    [stored] = gateway.lookup([Key.of("IK_CounterShardEntity", "Counter Test_1_3", namespace=namespace)])
    assert stored.properties == {"target": "Counter Test_1", "count": 41} and stored.unindexed == {"count"}

    structured = {"partitionId": {"namespaceId": namespace}, "query": {
        "kind": [{"name": "IK_CounterShardEntity"}],
        "filter": {"propertyFilter": {"property": {"name": "target"}, "op": "EQUAL", "value": {"stringValue": "Counter Test_1"}}}}}
    gql = {"partitionId": {"namespaceId": namespace}, "gqlQuery": {
        "queryString": "SELECT * FROM IK_CounterShardEntity WHERE target = @target", "allowLiterals": True,
        "namedBindings": {"target": {"value": {"stringValue": "Counter Test_1"}}}}}
    for body in (structured, gql):
        batch = call(http, "runQuery", body).json()["batch"]
        assert [r["entity"]["properties"]["count"]["integerValue"] for r in batch["entityResults"]] == ["41"]
        assert batch["moreResults"] == "NO_MORE_RESULTS" and batch["entityResultType"] == "FULL"
    assert call(http, "runQuery", gql).json()["query"]["kind"] == [{"name": "IK_CounterShardEntity"}]

    total = call(http, "runAggregationQuery", {"partitionId": {"namespaceId": namespace}, "gqlQuery": {
        "queryString": "SELECT COUNT(*) AS shards FROM IK_CounterShardEntity WHERE target = 'Counter Test_1'",
        "allowLiterals": True}}).json()
    assert total["batch"]["aggregationResults"][0]["aggregateProperties"]["shards"]["integerValue"] == "1"


def test_a_transaction_over_rest(http: Any, namespace: str) -> None:
    begun = call(http, "beginTransaction", {}).json()["transaction"]
    assert base64.b64decode(begun)
    row = {"key": key(namespace, "Row", "r"), "properties": {"n": {"integerValue": "1"}}}
    read = call(http, "lookup", {"keys": [row["key"]], "readOptions": {"transaction": begun}}).json()
    assert read["missing"] and "found" not in read
    done = call(http, "commit", {"mode": "TRANSACTIONAL", "transaction": begun, "mutations": [{"insert": row}]})
    assert done.status_code == 200, done.text
    again = call(http, "commit", {"mode": "TRANSACTIONAL", "transaction": begun, "mutations": [{"upsert": row}]})
    assert again.status_code == 400 and again.json()["error"]["status"] == "INVALID_ARGUMENT"  # used up

    rolled = call(http, "beginTransaction", {"transactionOptions": {"readOnly": {}}}).json()["transaction"]
    assert call(http, "rollback", {"transaction": rolled}).status_code == 200


def test_ids_over_rest(http: Any, namespace: str) -> None:
    reserved = call(http, "reserveIds", {"keys": [key(namespace, "Note", 5)]})
    assert reserved.status_code == 200, reserved.text
    allocated = call(http, "allocateIds", {"keys": [{"partitionId": {"namespaceId": namespace}, "path": [{"kind": "Note"}]}] * 3})
    ids = [int(k["path"][0]["id"]) for k in allocated.json()["keys"]]
    assert len(set(ids)) == 3 and 5 not in ids
    made = call(http, "commit", {"mode": "NON_TRANSACTIONAL", "mutations": [
        {"insert": {"key": {"partitionId": {"namespaceId": namespace}, "path": [{"kind": "Note"}]}}}]}).json()
    assert int(made["mutationResults"][0]["key"]["path"][0]["id"]) not in ids + [5]


def error_of(answer: httpx.Response) -> tuple[int, str, int]:
    body = answer.json()["error"]
    assert body["message"]
    return answer.status_code, body["status"], body["code"]


def test_errors_carry_the_emulators_statuses(http: Any, namespace: str) -> None:
    row = {"key": key(namespace, "Row", "x"), "properties": {}}
    assert call(http, "commit", {"mode": "NON_TRANSACTIONAL", "mutations": [{"insert": row}]}).status_code == 200
    exists = call(http, "commit", {"mode": "NON_TRANSACTIONAL", "mutations": [{"insert": row}]})
    assert error_of(exists) == (409, "ALREADY_EXISTS", 409)
    missing = {"key": key(namespace, "Row", "y"), "properties": {}}
    assert error_of(call(http, "commit", {"mode": "NON_TRANSACTIONAL", "mutations": [{"update": missing}]})) == (
        404, "NOT_FOUND", 404)
    bad_gql = {"partitionId": {"namespaceId": namespace}, "gqlQuery": {"queryString": "SELECT FROM WHERE"}}
    assert error_of(call(http, "runQuery", bad_gql)) == (400, "INVALID_ARGUMENT", 400)
    assert error_of(http.post("/v1/projects/p:frobnicate", json={})) == (404, "NOT_FOUND", 404)
    assert error_of(http.get("/v1/nothing")) == (404, "NOT_FOUND", 404)


def test_contention_is_409_aborted(http: Any, namespace: str) -> None:
    row = {"key": key(namespace, "Row", "c"), "properties": {"n": {"integerValue": "0"}}}
    call(http, "commit", {"mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": row}]})
    first, second = (call(http, "beginTransaction", {}).json()["transaction"] for _ in range(2))
    for token in (first, second):
        call(http, "lookup", {"keys": [row["key"]], "readOptions": {"transaction": token}})
    assert call(http, "commit", {"mode": "TRANSACTIONAL", "transaction": first, "mutations": [{"upsert": row}]}).status_code == 200
    lost = call(http, "commit", {"mode": "TRANSACTIONAL", "transaction": second, "mutations": [{"upsert": row}]})
    assert error_of(lost) == (409, "ABORTED", 409)


@pytest.mark.parametrize("body", [
    b"{not json",
    b'{"mutations": [{"upsert": {"key": {"path": [{"kind": "Row", "name": "__bad__"}]}}}]}',
    b'{"mutations": [{"upsert": {"key": {"path": [{"kind": "Row", "name": "z"}]}, "properties": {"s": {"stringValue": 5}}}}]}',
    b'{"unknownField": 1}',
    b'{"mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": {"key": {"path": [{"kind": "Row", "name": "ok"}]}}},'
    b' {"upsert": {"key": {"path": [{"kind": "Row", "id": "0"}]}}}]}',
])
def test_a_bad_request_is_400_and_writes_nothing(http: Any, served: Any, body: bytes) -> None:
    answer = http.post("/v1/projects/p:commit", content=body, headers={"Content-Type": "application/json"})
    assert error_of(answer) == (400, "INVALID_ARGUMENT", 400)
    _, gateway = served
    assert gateway.lookup([Key.of("Row", "ok"), Key.of("Row", "z")]) == [None, None]
    assert http.get("/").text == "Ok"  # and the server goes on
