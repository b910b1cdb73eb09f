"""Reads at a past ``read_time`` through google-cloud-datastore's own client,
on ``gds-counter serve`` and on the Firestore emulator in Datastore mode
(the oracle): ``client.get``, ``query.fetch`` and aggregation queries with
``read_time=``, and a read-only transaction begun at a time
(``TransactionOptions.ReadOnly.read_time``), answer the same, with the same
``read_time`` in their responses and the same statuses for a time in the
future, a time too old, and a time finer than a microsecond."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.protobuf import timestamp_pb2
from moments import after_commit, now

from gds_counter.emulators import Emulator
from gds_counter.server import Server


def _refusal(call: Any) -> tuple[str, str]:
    """The status class a call raised, and which of the emulator's words it has."""
    with pytest.raises(gexc.GoogleAPICallError) as caught:
        call()
    words = ("cannot be in the future", "is too old", "more than microseconds precision")
    return type(caught.value).__name__, next((w for w in words if w in str(caught.value)), str(caught.value))


def _story(client: Any) -> dict[str, Any]:
    """Two writes and a delete of one entity; what each kind of read at the
    time before, between and after them answers, and the refusals."""
    from google.cloud import datastore

    api = client._datastore_api
    key = client.key("Past", "a")
    partition = {"project_id": client.project, "namespace_id": client.namespace}
    times = [after_commit()]
    for n in (1, 2):
        entity = datastore.Entity(key)
        entity["n"] = n
        client.put(entity)
        times.append(after_commit())
    client.delete(key)
    times.append(after_commit())
    out: dict[str, Any] = {}
    for i, t in enumerate(times):
        got = client.get(key, read_time=t)
        counted = client.aggregation_query(client.query(kind="Past")).count(alias="n").fetch(read_time=t)
        stamp = timestamp_pb2.Timestamp()
        stamp.FromDatetime(t)
        lookup = api.lookup(request={"project_id": client.project, "keys": [key.to_protobuf()], "read_options": {"read_time": t}})._pb
        query = api.run_query(request={
            "project_id": client.project, "partition_id": partition,
            "query": {"kind": [{"name": "Past"}]}, "read_options": {"read_time": t},
        })._pb
        out[f"at {i}"] = {
            "get": None if got is None else dict(got),
            "fetch": [dict(e) for e in client.query(kind="Past").fetch(read_time=t)],
            "count": [[r.value for r in row] for row in counted],
            "lookup read_time is the time asked": lookup.read_time == stamp,
            "query read_time is the time asked": query.batch.read_time == stamp,
        }
    begun = api.begin_transaction(request={
        "project_id": client.project, "transaction_options": {"read_only": {"read_time": times[1]}},
    }).transaction
    inside = api.lookup(request={"project_id": client.project, "keys": [key.to_protobuf()], "read_options": {"transaction": begun}})._pb
    out["read-only transaction at the first write"] = [e.entity.properties["n"].integer_value for e in inside.found]
    api.rollback(request={"project_id": client.project, "transaction": begun})
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(times[1])
    stamp.nanos += 1
    out["refused"] = {
        "future": _refusal(lambda: client.get(key, read_time=now() + dt.timedelta(minutes=5))),
        "eight days": _refusal(lambda: client.get(key, read_time=now() - dt.timedelta(days=8))),
        "a nanosecond": _refusal(lambda: api.lookup(request={
            "project_id": client.project, "keys": [key.to_protobuf()], "read_options": {"read_time": stamp},
        })),
        "future transaction": _refusal(lambda: api.begin_transaction(request={
            "project_id": client.project,
            "transaction_options": {"read_only": {"read_time": now() + dt.timedelta(minutes=5)}},
        })),
    }
    return out


def _client(host: str, namespace: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    from google.cloud import datastore

    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", host)
    return datastore.Client(project="serve-test", namespace=namespace)


def test_reads_at_a_past_time_answer_as_on_the_emulator(
    server: Server, firestore_emulator: Emulator, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same story on both: each read sees the version of its time, the
    responses carry the time asked, and the refusals have the emulator's
    statuses and words."""
    served = _story(_client(server.emulator_host, namespace, monkeypatch))
    emulated = _story(_client(firestore_emulator.host, namespace, monkeypatch))
    assert served == emulated
    assert served["at 1"]["get"] == {"n": 1} and served["at 2"]["fetch"] == [{"n": 2}]
    assert served["at 3"]["get"] is None and served["read-only transaction at the first write"] == [1]
    assert served["refused"]["eight days"] == ("FailedPrecondition", "is too old")


def test_a_time_between_one_hour_and_seven_days_is_too_old_on_serve(client: Any) -> None:
    """gds-counter keeps replaced versions for one hour, as Datastore does
    without point-in-time recovery (the emulator answers for 7 days):
    older is FAILED_PRECONDITION, with the emulator's words and the reason."""
    with pytest.raises(gexc.FailedPrecondition, match="is too old.*one hour|is too old.*3600"):
        client.get(client.key("Past", "a"), read_time=now() - dt.timedelta(hours=2))


def test_a_read_that_begins_a_read_only_transaction_at_a_time_reads_at_it(client: Any) -> None:
    """``read_options.new_transaction.read_only.read_time``: the transaction
    the read begins reads at that time, as the API describes it, and later
    reads in it too. (The Firestore emulator ignores this read_time and
    reads the newest data: docs/serve.md records the difference.)"""
    from google.cloud import datastore

    api = client._datastore_api
    key = client.key("Past", "a")
    entity = datastore.Entity(key)
    entity["n"] = 1
    client.put(entity)
    then = after_commit()
    entity["n"] = 2
    client.put(entity)
    first = api.lookup(request={
        "project_id": client.project, "keys": [key.to_protobuf()],
        "read_options": {"new_transaction": {"read_only": {"read_time": then}}},
    })._pb
    again = api.lookup(request={
        "project_id": client.project, "keys": [key.to_protobuf()], "read_options": {"transaction": first.transaction},
    })._pb
    api.rollback(request={"project_id": client.project, "transaction": first.transaction})
    assert [r.entity.properties["n"].integer_value for r in (*first.found, *again.found)] == [1, 1]
    assert client.get(key)["n"] == 2


def test_read_time_over_rest_json(server: Server, namespace: str) -> None:
    """php-gds's REST face: ``readOptions.readTime`` as RFC 3339 text; the
    answer's ``readTime`` is the time asked, and a time too old is HTTP
    400 FAILED_PRECONDITION in Google's error shape."""
    import httpx

    path = {"partitionId": {"projectId": "php-app", "namespaceId": namespace}, "path": [{"kind": "Past", "name": "a"}]}
    with httpx.Client(base_url=f"http://{server.emulator_host}", timeout=10) as http:
        def call(verb: str, body: dict[str, Any]) -> Any:
            return http.post(f"/v1/projects/php-app:{verb}", json=body)

        entity = {"key": path, "properties": {"n": {"integerValue": "1"}}}
        assert call("commit", {"mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": entity}]}).status_code == 200
        then = after_commit()
        call("commit", {"mode": "NON_TRANSACTIONAL", "mutations": [{"delete": path}]})
        past = call("lookup", {"keys": [path], "readOptions": {"readTime": then.strftime("%Y-%m-%dT%H:%M:%S.%fZ")}}).json()
        assert [f["entity"]["properties"]["n"] for f in past["found"]] == [{"integerValue": "1"}]
        assert dt.datetime.fromisoformat(past["readTime"].replace("Z", "+00:00")) == then
        old = (now() - dt.timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        refused = call("lookup", {"keys": [path], "readOptions": {"readTime": old}})
        assert refused.status_code == 400 and refused.json()["error"]["status"] == "FAILED_PRECONDITION"
