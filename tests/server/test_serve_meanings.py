"""Value meanings through ``gds-counter serve``, compared with the Firestore
emulator in Datastore mode: google-cloud-ndb's compressed properties, which
it decompresses by their meaning (22), and the raw wire, where every value
type with every meaning is accepted or refused, and read back, on serve as
on the emulator (generated: ``test_serve_keeps_and_refuses_meanings_as_the_emulator_does``)."""

from __future__ import annotations

import uuid
import zlib
from typing import Any, Iterator

import httpx
import pytest
from google.api_core import exceptions as gexc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sizes import sized

from gds_counter.server import Server

ndb = pytest.importorskip("google.cloud.ndb", reason="google-cloud-ndb is in the dev extra")

class Note(ndb.Model):
    """A legacy model: its blob and text compressed (zlib, meaning 22)."""

    body = ndb.BlobProperty(compressed=True)
    text = ndb.TextProperty(compressed=True)
    author = ndb.UserProperty()  # an embedded entity with meaning 20


class PlainNote(ndb.Model):
    """The same kind read by a model that no longer compresses: ndb then
    decompresses only what carries meaning 22."""

    body = ndb.BlobProperty()
    text = ndb.TextProperty()
    author = ndb.UserProperty()

    @classmethod
    def _get_kind(cls) -> str:
        return "Note"


def _ndb_round_trip(host: str, project: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """What ndb reads back of a compressed ``Note`` it wrote on ``host``,
    through both models, and what the raw client sees stored."""
    from google.cloud import datastore

    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", host)
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    client = ndb.Client(project=project, namespace=namespace)
    with client.context(cache_policy=False, global_cache_policy=False):
        key = Note(id="n", body=BODY, text=TEXT, author=ndb.User(email="a@example.com", _auth_domain="example.com")).put()
    with client.context(cache_policy=False, global_cache_policy=False):
        got, plain = key.get(), PlainNote.get_by_id("n")
    raw_client = datastore.Client(project=project, namespace=namespace)
    raw = raw_client.get(raw_client.key("Note", "n"))
    return {
        "compressed model": (got.body, got.text, got.author),
        "plain model": (plain.body, plain.text),
        "stored": {name: (zlib.decompress(raw[name]), raw._meanings[name][0]) for name in ("body", "text")},
        "author": (dict(raw["author"]), raw._meanings["author"][0]),
    }


BODY, TEXT = b"blob " * 200, "text \u00e9 " * 200


def test_ndb_reads_its_compressed_properties_back_decompressed_as_on_the_emulator(
    server: Server, firestore_emulator: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ndb writes a compressed BlobProperty and TextProperty as zlib blobs
    with meaning 22 and reads them back decompressed, by the model that
    wrote them and by one that does not compress (which decompresses only
    what carries the meaning): the same on serve as on the emulator. (A
    compressed TextProperty is read back still compressed, by either model,
    on both: ndb's own doing.)"""
    on_serve = _ndb_round_trip(server.emulator_host, "meanings-app", monkeypatch)
    assert on_serve == _ndb_round_trip(firestore_emulator.host, firestore_emulator.project, monkeypatch)
    assert on_serve["stored"] == {"body": (BODY, 22), "text": (TEXT.encode(), 22)}
    assert on_serve["compressed model"][0] == on_serve["plain model"][0] == BODY  # the plain model: by the meaning alone
    assert on_serve["compressed model"][2].email() == "a@example.com" and on_serve["author"][1] == 20


# --- the raw wire: serve against the emulator ------------------------------


@pytest.fixture(scope="module")
def both(served: Any, firestore_emulator: Any) -> Iterator[dict[str, Any]]:
    """A raw datastore_v1 API (google-cloud-datastore's own) on serve and on the emulator."""
    import os

    from google.cloud import datastore

    apis = {}
    for name, host, project in (("serve", served[0].emulator_host, "meanings-app"), ("firestore", firestore_emulator.host, firestore_emulator.project)):
        old = os.environ.get("DATASTORE_EMULATOR_HOST")
        os.environ["DATASTORE_EMULATOR_HOST"] = host
        try:
            apis[name] = (datastore.Client(project=project)._datastore_api, project)
        finally:
            if old is None:
                del os.environ["DATASTORE_EMULATOR_HOST"]
            else:
                os.environ["DATASTORE_EMULATOR_HOST"] = old
    yield apis


def _value(kind: str, meaning: int, excluded: bool) -> Any:
    from google.cloud.datastore_v1.types import entity as E

    pb = E.Value.pb()()
    if kind == "null":
        pb.null_value = 0
    elif kind == "bool":
        pb.boolean_value = True
    elif kind == "int":
        pb.integer_value = 50
    elif kind == "double":
        pb.double_value = 1.5
    elif kind == "str":
        pb.string_value = "abc"
    elif kind == "blob":
        pb.blob_value = b"abc"
    elif kind == "timestamp":
        pb.timestamp_value.seconds = 100
    elif kind == "geo":
        pb.geo_point_value.latitude = 1.0
    elif kind == "entity":
        pb.entity_value.properties["a"].integer_value = 1
    elif kind.startswith("user"):  # a user's properties (meaning 20 on the entity): unindexed strings
        for name in ("email", "auth_domain", "user_id")[: 3 if kind == "user+id" else 2]:
            pb.entity_value.properties[name].string_value = "x"
            pb.entity_value.properties[name].exclude_from_indexes = kind != "user-indexed"
    pb.meaning = meaning
    pb.exclude_from_indexes = excluded
    return pb


def _write_and_read(api: Any, project: str, namespace: str, name: str, value: Any, as_list: bool, list_meaning: int) -> Any:
    """Commit ``p`` = value (in a list when ``as_list``): the stored value as
    read back (without its key), or the gRPC status code of a refusal."""
    from google.cloud.datastore_v1.types import datastore as D
    from google.cloud.datastore_v1.types import entity as E

    mutation = D.Mutation.pb()()
    key = mutation.upsert.key
    key.partition_id.project_id, key.partition_id.namespace_id = project, namespace
    element = key.path.add()
    element.kind, element.name = "Meant", name
    written = mutation.upsert.properties["p"]
    if as_list:
        written.array_value.values.add().CopyFrom(value)
        plain = written.array_value.values.add()  # (flagged as the first: a flag per element is another matter)
        plain.string_value, plain.exclude_from_indexes = "plain", value.exclude_from_indexes
        written.meaning = list_meaning
    else:
        written.CopyFrom(value)
    try:
        api.commit(request={"project_id": project, "mode": 2, "mutations": [mutation]})
    except gexc.GoogleAPICallError as exc:
        return type(exc).__name__
    found = api.lookup(request={"project_id": project, "keys": [key]}).found
    return E.Entity.pb(found[0].entity).properties["p"].SerializeToString(deterministic=True)


_KINDS = ("null", "bool", "int", "double", "str", "blob", "timestamp", "geo", "entity", "user", "user+id", "user-indexed")


@settings(max_examples=sized("serve-meanings", 40, 200), deadline=None, suppress_health_check=list(HealthCheck))
@given(
    kind=st.sampled_from(_KINDS),
    meaning=st.one_of(st.integers(0, 31), st.sampled_from([13, 15, 16, 20, 22])),
    excluded=st.booleans(),
    as_list=st.booleans(),
    list_meaning=st.sampled_from([0, 0, 0, 22]),
)
def test_serve_keeps_and_refuses_meanings_as_the_emulator_does(
    both: dict[str, Any], kind: str, meaning: int, excluded: bool, as_list: bool, list_meaning: int
) -> None:
    """Any value type with any meaning, indexed or not, alone or in a list
    (which itself takes none): refused on serve exactly when the emulator
    refuses it, and else read back the same, meanings included."""
    namespace, name = f"t-{uuid.uuid4().hex[:12]}", "x"
    outcomes = {
        target: _write_and_read(api, project, namespace, name, _value(kind, meaning, excluded), as_list, list_meaning)
        for target, (api, project) in both.items()
    }
    assert outcomes["serve"] == outcomes["firestore"]


def test_a_projection_marks_its_values_as_the_emulator_does(both: dict[str, Any]) -> None:
    """A projected value comes back with meaning 18 (an index value), with
    or without a meaning of its own, on both."""
    from google.cloud.datastore_v1.types import entity as E
    from google.cloud.datastore_v1.types import query as Q

    answers = {}
    for target, (api, project) in both.items():
        namespace = f"t-{uuid.uuid4().hex[:12]}"
        for name, meaning in (("a", 2), ("b", 0)):
            assert isinstance(_write_and_read(api, project, namespace, name, _value("str", meaning, False), False, 0), bytes)
        query = Q.Query.pb()()
        query.kind.add().name = "Meant"
        query.projection.add().property.name = "p"
        batch = api.run_query(request={"project_id": project, "partition_id": {"project_id": project, "namespace_id": namespace}, "query": query}).batch
        answers[target] = [E.Entity.pb(result.entity).properties["p"].SerializeToString(deterministic=True) for result in batch.entity_results]
    assert answers["serve"] == answers["firestore"]
    assert len(answers["serve"]) == 2


def test_rest_json_keeps_meanings(server: Server, namespace: str) -> None:
    """Over REST (JSON, as php-gds speaks it) a meaning is kept too."""
    key = {"partitionId": {"projectId": "php-app", "namespaceId": namespace}, "path": [{"kind": "Meant", "name": "j"}]}
    properties = {
        "zipped": {"blobValue": "eJzLSM3JyVcozy/KSQEAGgQEXQ==", "meaning": 22, "excludeFromIndexes": True},
        "tags": {"arrayValue": {"values": [{"stringValue": "a", "meaning": 1}, {"stringValue": "b"}]}},
    }
    with httpx.Client(base_url=f"http://{server.emulator_host}", timeout=10) as http:
        done = http.post("/v1/projects/php-app:commit", json={"mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": {"key": key, "properties": properties}}]})
        assert done.status_code == 200, done.text
        found = http.post("/v1/projects/php-app:lookup", json={"keys": [key]}).json()
    assert found["found"][0]["entity"]["properties"] == properties
