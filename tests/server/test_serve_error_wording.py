"""Where clients compare error messages, serve says what the Firestore
emulator in Datastore mode says: the same requests, through the raw
google-cloud-datastore client, on both; serve's message must hold the
emulator's (it may add which property or operator, after it)."""

from __future__ import annotations

import uuid
from typing import Any, Callable

import pytest


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


#: GQL texts with values written in them (and one with none), run with
#: ``allow_literals`` false: every value must then be bound.
LITERAL_TEXTS = [
    "SELECT * FROM K LIMIT 5", "SELECT * FROM K OFFSET 1", "SELECT * FROM K WHERE a = NULL",
    "SELECT * FROM K WHERE a = TRUE", "SELECT * FROM K WHERE a = 'x'", "SELECT * FROM K WHERE a = 1.5",
    "SELECT * FROM K WHERE a = -1", "SELECT * FROM K WHERE __key__ = KEY(K, 'a')",
    "SELECT * FROM K WHERE a = DATETIME('2020-01-01T00:00:00Z')", "SELECT * FROM K WHERE a = BLOB('YQ')",
    "SELECT * FROM K WHERE a IN ARRAY(@1)", "SELECT * FROM K WHERE a = @1 AND b = 'z'",
    "SELECT * FROM K WHERE a = @1",
]


def test_values_written_in_gql_are_refused_without_allow_literals_as_on_the_emulator(
        server: Any, firestore_emulator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same texts on both, the answers compared: refused with the
    emulator's message, or run, on each, alike; with ``allow_literals``
    every one runs."""
    from google.api_core import exceptions
    from google.cloud import datastore

    answers: dict[str, list[Any]] = {}
    for name, host, project in (("serve", server.emulator_host, "serve-test"),
                                ("emulator", firestore_emulator.host, firestore_emulator.project)):
        monkeypatch.setenv("DATASTORE_EMULATOR_HOST", host)
        api = datastore.Client(project=project)._datastore_api
        for allow in (False, True):
            for text in LITERAL_TEXTS:
                request = {"project_id": project, "gql_query": {
                    "query_string": text, "allow_literals": allow,
                    "positional_bindings": [{"value": {"integer_value": 1}}] if "@1" in text else []}}
                try:
                    api.run_query(request=request)
                    answers.setdefault(name, []).append((allow, text, "ran"))
                except exceptions.InvalidArgument as refused:
                    answers.setdefault(name, []).append((allow, text, refused.message))
    assert answers["serve"] == answers["emulator"]
    assert sum(answer == "ran" for _, _, answer in answers["emulator"]) == len(LITERAL_TEXTS) + 1
