"""Where clients compare error messages, serve says what the Firestore
emulator in Datastore mode says: the same requests, through the raw
google-cloud-datastore client, on both; serve's message must hold the
emulator's (it may add which property or operator, after it)."""

from __future__ import annotations

import uuid
from typing import Any, Callable

import pytest


@pytest.fixture(params=["serve", "firestore-emulator"])
def target(request: pytest.FixtureRequest) -> tuple[str, str]:
    if request.param == "serve":
        return request.getfixturevalue("server").emulator_host, "serve-test"
    emulator = request.getfixturevalue("firestore_emulator")
    return emulator.host, emulator.project


def _cases(api: Any, project: str, namespace: str) -> dict[str, Callable[[], Any]]:
    partition = {"project_id": project, "namespace_id": namespace}
    nested = {"kind": [{"name": "K"}]}

    def aggregate(*aggregations: dict[str, Any]) -> Callable[[], Any]:
        return lambda: api.run_aggregation_query(request={
            "project_id": project, "partition_id": partition,
            "aggregation_query": {"nested_query": nested, "aggregations": list(aggregations)}})

    def gql_aggregate(text: str) -> Callable[[], Any]:
        return lambda: api.run_aggregation_query(request={
            "project_id": project, "partition_id": partition,
            "gql_query": {"query_string": text, "allow_literals": True}})

    def query(filter_: dict[str, Any]) -> Callable[[], Any]:
        return lambda: api.run_query(request={"project_id": project, "partition_id": partition,
                                              "query": {**nested, "filter": filter_}})

    empty = {"property_filter": {"property": {"name": "n"}, "op": "IN", "value": {"array_value": {}}}}
    return {
        "sum of __key__": aggregate({"sum": {"property": {"name": "__key__"}}}),
        "avg of __key__": aggregate({"avg": {"property": {"name": "__key__"}}}),
        "GQL sum of __key__": gql_aggregate("AGGREGATE SUM(__key__) OVER (SELECT * FROM K)"),
        "duplicate alias": aggregate({"count": {}, "alias": "x"}, {"sum": {"property": {"name": "n"}}, "alias": "x"}),
        "IN an empty list": query(empty),
    }


def _message(call: Callable[[], Any]) -> str:
    from google.api_core import exceptions

    with pytest.raises(exceptions.InvalidArgument) as refused:
        call()
    return str(refused.value.message)


def test_messages_clients_compare_are_the_emulators(target: tuple[str, str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from google.cloud import datastore

    host, project = target
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", host)
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    client = datastore.Client(project=project, namespace=namespace)
    messages = {name: _message(call) for name, call in _cases(client._datastore_api, project, namespace).items()}
    # The emulator's words, as it answered them (measured): serve must say them too.
    emulator_says = {
        "sum of __key__": "Aggregations are not supported for the property: __key__",
        "avg of __key__": "Aggregations are not supported for the property: __key__",
        "GQL sum of __key__": "Aggregations are not supported for the property: __key__",
        "duplicate alias": "Aggregation aliases contain duplicate alias: x.",
        "IN an empty list": "IN requires an non-empty ArrayValue.",
    }
    assert {name: emulator_says[name] in message for name, message in messages.items()} == dict.fromkeys(
        emulator_says, True), messages
