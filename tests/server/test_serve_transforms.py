"""google-cloud-datastore's own client sends every property transform of
Datastore v1 (``Mutation.property_transforms``) to ``gds-counter serve`` and
to the Firestore emulator in Datastore mode: serve must apply them and answer
as the emulator does (``serve`` used to refuse all but increment)."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

import pytest


def _commit(client: Any, name: str) -> tuple[list[Any], dict[str, Any]]:
    """Store an entity, then one upsert of it that keeps its properties
    (mask ``__key__``) and carries all six transforms: their results and
    what is stored, REQUEST_TIME's time as "NOW" (each server's own clock)."""
    from google.cloud import datastore
    from google.cloud.datastore import helpers
    from google.cloud.datastore_v1.types import PropertyMask
    from google.cloud.datastore_v1.types import datastore as ds
    from google.cloud.datastore_v1.types import entity as ent

    def value(x: Any) -> Any:
        pb = ent.Value()._pb
        helpers._set_protobuf_value(pb, x)
        return ent.Value.wrap(pb)

    def array(*items: Any) -> Any:
        return ent.ArrayValue(values=[value(x) for x in items])

    key = client.key("Tr", name)
    stored = datastore.Entity(key)
    stored.update({"n": 5, "f": 1.5, "a": [1, 2, 2, "x"], "e": 1})
    client.put(stored)
    transform = ds.PropertyTransform
    mutation = ds.Mutation(upsert=helpers.entity_to_protobuf(datastore.Entity(key)), property_mask=PropertyMask(paths=["__key__"]))
    mutation.property_transforms.extend([
        transform(property="n", maximum=value(7.5)),
        transform(property="f", minimum=value(2)),
        transform(property="a", append_missing_elements=array(1.0, 3, 3)),
        transform(property="a", remove_all_from_array=array(2, "y")),
        transform(property="t", set_to_server_value=transform.ServerValue.REQUEST_TIME),
        transform(property="e", increment=value(2)),
        transform(property="m", maximum=value(math.nan)),
    ])
    response = client._datastore_api.commit(
        request={"project_id": client.project, "mode": ds.CommitRequest.Mode.NON_TRANSACTIONAL, "mutations": [mutation]}
    )
    results = [helpers._get_value_from_value_pb(v._pb) for v in response.mutation_results[0].transform_results]
    found = client.get(key)
    assert found is not None
    return [_plain(v) for v in results], {name: _plain(v) for name, v in found.items()}


def _plain(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        return "NOW"
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return (type(value).__name__, value)


@pytest.fixture
def oracle(firestore_emulator: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    from google.cloud import datastore

    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", firestore_emulator.host)
    return datastore.Client(project=firestore_emulator.project, namespace=namespace)


def test_serve_applies_every_transform_the_client_sends_as_the_firestore_emulator(oracle: Any, client: Any) -> None:
    assert oracle.base_url != client.base_url  # (two servers)
    theirs = _commit(oracle, "all")
    ours = _commit(client, "all")
    assert ours == theirs
    assert theirs[0] == [("float", 7.5), ("float", 1.5), ("NoneType", None), ("NoneType", None), "NOW", ("int", 3), "NaN"]
