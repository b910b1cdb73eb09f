"""The embedded engine's answers where it once differed from the Firestore
emulator in Datastore mode, compared through google-cloud-datastore's own
client: the same requests to the emulator and to ``gds-counter serve``
(docs/gql.md records each case and which side the engine follows).

* A property mask's or an increment's path: a member that is not a plain
  name (``a-b``, ``1x``, ``é``) must be quoted in backticks; the escapes
  inside (``\\``` ``\\\\`` ``\\n`` ``\\u00e9`` ``\\101``...) are read as the
  emulator reads them, and any other is refused.
* An increment's result is indexed, whatever the written entity (or the
  stored one) says of that property.
* A named GQL binding the text never uses is ignored; a positional one is
  refused.
* Properties of entities inside a list value: the deliberate difference
  (the emulator indexes none of them; production and the engine do), and
  a single embedded entity's properties, indexed on both.
"""

from __future__ import annotations

import uuid
from typing import Any, Callable

import pytest

Probe = Callable[[Any, str], Any]


def _both(firestore_emulator: Any, serve_server: Any, monkeypatch: pytest.MonkeyPatch, probe: Probe) -> tuple[Any, Any]:
    """``probe(client, namespace)`` on the emulator, then on the server,
    each through google-cloud-datastore's client in a fresh namespace."""
    from google.cloud import datastore

    answers = []
    for host, project in ((firestore_emulator.host, firestore_emulator.project), (serve_server.emulator_host, "serve-test")):
        monkeypatch.setenv("DATASTORE_EMULATOR_HOST", host)
        namespace = f"t-{uuid.uuid4().hex[:12]}"
        answers.append(probe(datastore.Client(project=project, namespace=namespace), namespace))
    return answers[0], answers[1]


def _key(client: Any, kind: str, name: str) -> Any:
    from google.cloud.datastore_v1.types import entity as entity_pb

    partition = entity_pb.PartitionId(project_id=client.project, namespace_id=client.namespace)
    return entity_pb.Key(partition_id=partition, path=[entity_pb.Key.PathElement(kind=kind, name=name)])


def _commit(client: Any, *mutations: Any) -> Any:
    from google.cloud.datastore_v1.types import datastore as ds_pb

    request = {"project_id": client.project, "mode": ds_pb.CommitRequest.Mode.NON_TRANSACTIONAL, "mutations": list(mutations)}
    return client._datastore_api.commit(request=request)


def _outcome(call: Callable[[], Any]) -> Any:
    from google.api_core.exceptions import GoogleAPICallError

    try:
        return call()
    except GoogleAPICallError as exc:
        return ("refused", exc.code)


#: (path, the property the written entity holds): masks whose paths the
#: emulator takes or refuses, each written onto a fresh entity.
MASKS: list[tuple[str, str]] = [
    ("a-b", "a-b"), ("1x", "1x"), ("é", "é"), ("$x", "$x"), ("a b", "a b"), ("a/b", "a/b"), ("a\\b", "a\\b"),
    ("`a-b`", "a-b"), ("`1x`", "1x"), ("`é`", "é"), ("`$x`", "$x"), ("`a b`", "a b"),
    ("_x", "_x"), ("x1", "x1"), ("a.1x", "a"), ("a.`1x`", "a"), ("a-b.c", "a-b"), ("`a.b`", "a.b"),
    ("`a\\`b`", "a`b"), ("`a\\\\b`", "a\\b"), ("`a\\bb`", "a\bb"), ("`a\\nb`", "a\nb"), ("`a\\tb`", "a\tb"),
    ("`a\\u00e9`", "aé"), ("`a\\u00E9`", "aé"), ("`\\U00000041`", "A"), ("`a\\101b`", "aAb"),
    ("`a\\\"b`", 'a"b'), ("`a\\'b`", "a'b"), ("`a\\fb`", "a\fb"), ("`a\\rb`", "a\rb"),
    ("`a\\xb`", "axb"), ("`a\\.b`", "a.b"), ("`a\\/b`", "a/b"), ("`a\\0b`", "a\0b"), ("`a\\12b`", "a\nb"),
    ("`a\\400`", "a 0"), ("`a\\u00`", "a"), ("`a\\uuuu00e9`", "aé"),
    ("`a``b`", "a`b"), ("a`b", "a`b"), ("`a", "a"), ("a..b", "a"), ("x.", "x"), ("``", ""),
]


def _masked_writes(client: Any, namespace: str) -> list[Any]:
    from google.cloud.datastore_v1.types import datastore as ds_pb
    from google.cloud.datastore_v1.types import entity as entity_pb

    out = []
    for i, (path, held) in enumerate(MASKS):
        key = _key(client, "M", f"m{i}")
        properties = {held: entity_pb.Value(integer_value=1)} if held else {}
        mutation = ds_pb.Mutation(upsert=entity_pb.Entity(key=key, properties=properties), property_mask=ds_pb.PropertyMask(paths=[path]))

        def write(mutation: Any = mutation, i: int = i) -> Any:
            _commit(client, mutation)
            stored = client.get(client.key("M", f"m{i}"))
            return sorted(dict(stored).items()) if stored is not None else None

        out.append((path, _outcome(write)))
    return out


def test_property_mask_paths_are_read_and_refused_as_the_emulator_reads_them(
    firestore_emulator: Any, serve_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each mask path on a fresh entity holding the property it names: the
    same ones refused (INVALID_ARGUMENT) and the same properties stored."""
    theirs, ours = _both(firestore_emulator, serve_server, monkeypatch, _masked_writes)
    assert ("a-b", ("refused", 400)) in theirs and ("`a-b`", [("a-b", 1)]) in theirs  # the emulator, measured each run
    differences = [f"{path!r}: emulator {t}, served {o}" for (path, t), (_, o) in zip(theirs, ours) if t != o]
    assert not differences, "\n".join(differences)


def _incremented_paths(client: Any, namespace: str) -> list[Any]:
    from google.cloud.datastore_v1.types import datastore as ds_pb
    from google.cloud.datastore_v1.types import entity as entity_pb

    out = []
    for i, path in enumerate(("a-b", "1x", "`a-b`", "`1x`", "e.`a-b`", "`a\\`b`", "n")):
        key = _key(client, "T", f"t{i}")
        transform = ds_pb.PropertyTransform(property=path, increment=entity_pb.Value(integer_value=2))
        mutation = ds_pb.Mutation(upsert=entity_pb.Entity(key=key), property_transforms=[transform])

        def write(mutation: Any = mutation, i: int = i) -> Any:
            _commit(client, mutation)
            stored = client.get(client.key("T", f"t{i}"))
            return sorted((name, dict(v) if hasattr(v, "keys") else v) for name, v in stored.items())

        out.append((path, _outcome(write)))
    return out


def test_increment_paths_are_read_and_refused_as_the_emulator_reads_them(
    firestore_emulator: Any, serve_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    theirs, ours = _both(firestore_emulator, serve_server, monkeypatch, _incremented_paths)
    assert ("a-b", ("refused", 400)) in theirs
    assert theirs == ours


#: (stored, written, mask) for an increment of ``n``: what is stored before
#: (None: nothing), the written entity's properties ((value, excluded)),
#: and its mask (None: none; () the key alone).
INDEXING: list[tuple[Any, dict[str, tuple[int, bool]], tuple[str, ...] | None]] = [
    (stored, written, mask)
    for stored in (None, {"n": (1, True)}, {"n": (1, False)})
    for written in ({}, {"n": (1, True)}, {"n": (1, False)}, {"n": (1, True), "x": (0, False)})
    for mask in (None, (), ("n",), ("x",))
]


def _increment_indexing(client: Any, namespace: str) -> list[Any]:
    from google.cloud.datastore.query import PropertyFilter
    from google.cloud.datastore_v1.types import datastore as ds_pb
    from google.cloud.datastore_v1.types import entity as entity_pb

    def properties(values: dict[str, tuple[int, bool]]) -> dict[str, Any]:
        return {name: entity_pb.Value(integer_value=v, exclude_from_indexes=ex) for name, (v, ex) in values.items()}

    out = []
    for i, (stored, written, mask) in enumerate(INDEXING):
        key = _key(client, "I", f"i{i}")
        if stored is not None:
            _commit(client, ds_pb.Mutation(upsert=entity_pb.Entity(key=key, properties=properties(stored))))
        transform = ds_pb.PropertyTransform(property="n", increment=entity_pb.Value(integer_value=1))
        mutation = ds_pb.Mutation(upsert=entity_pb.Entity(key=key, properties=properties(written)), property_transforms=[transform])
        if mask is not None:
            mutation.property_mask.paths.extend(mask or ("__key__",))
        _commit(client, mutation)
        found = client.get(client.key("I", f"i{i}"))
        query = client.query(kind="I")
        query.add_filter(filter=PropertyFilter("n", "=", found["n"]))
        hit = f"i{i}" in [e.key.name for e in query.fetch()]
        out.append(((stored, written, mask), found["n"], sorted(found.exclude_from_indexes), hit))
    return out


def test_an_increments_result_is_indexed_as_on_the_emulator(
    firestore_emulator: Any, serve_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever the written entity or the stored one says of ``n`` (excluded
    or not, masked or not), the emulator indexes the increment's result: a
    query on it finds the entity, and a read says it is not excluded."""
    theirs, ours = _both(firestore_emulator, serve_server, monkeypatch, _increment_indexing)
    assert all(hit for *_, hit in theirs)  # the emulator, measured each run
    differences = [f"{t[0]}: emulator {t[1:]}, served {o[1:]}" for t, o in zip(theirs, ours) if t != o]
    assert not differences, "\n".join(differences)


def _bindings(client: Any, namespace: str) -> list[Any]:
    from google.cloud.datastore_v1.types import entity as entity_pb
    from google.cloud.datastore_v1.types import query as query_pb

    entity = client.entity(client.key("B", "b"))
    entity["x"] = 1
    client.put(entity)

    def run(text: str, named: dict[str, int], positional: list[int]) -> Any:
        def value(v: int) -> Any:
            return query_pb.GqlQueryParameter(value=entity_pb.Value(integer_value=v))

        gql = query_pb.GqlQuery(
            query_string=text, allow_literals=True,
            named_bindings={k: value(v) for k, v in named.items()}, positional_bindings=[value(v) for v in positional],
        )
        partition = entity_pb.PartitionId(project_id=client.project, namespace_id=namespace)
        request = {"project_id": client.project, "partition_id": partition, "gql_query": gql}
        if text.startswith("AGGREGATE"):
            batch = lambda: client._datastore_api.run_aggregation_query(request=request).batch  # noqa: E731
            return _outcome(lambda: batch().aggregation_results[0].aggregate_properties["n"].integer_value)
        return _outcome(lambda: len(client._datastore_api.run_query(request=request).batch.entity_results))

    return [
        run("SELECT * FROM B WHERE x = @a", {"a": 1, "unused": 2}, []),
        run("SELECT * FROM B", {"unused": 2}, []),
        run("SELECT * FROM B WHERE x = @1", {"unused": 2}, [1]),
        run("SELECT * FROM B WHERE x = @1", {}, [1, 2]),
        run("SELECT * FROM B WHERE x = @2", {}, [1, 1]),
        run("SELECT * FROM B", {}, [1]),
        run("AGGREGATE COUNT(*) AS n OVER (SELECT * FROM B WHERE x = @a)", {"a": 1, "unused": 2}, []),
        run("AGGREGATE COUNT(*) AS n OVER (SELECT * FROM B WHERE x = @1)", {}, [1, 2]),
    ]


def test_an_unused_named_binding_is_ignored_and_an_unused_positional_one_refused(
    firestore_emulator: Any, serve_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query and an aggregation with a named binding they never use run on
    both; a query with an unused positional binding is refused by both.
    An aggregation with one is the deliberate difference (docs/gql.md): the
    emulator counts, the server refuses it as the v1 reference's GqlQuery
    says ("For each binding site numbered i ... there must be an i-th
    numbered parameter. The inverse must also be true")."""
    theirs, ours = _both(firestore_emulator, serve_server, monkeypatch, _bindings)
    refused = ("refused", 400)
    assert theirs == [1, 1, 1, refused, refused, refused, 1, 1]  # the emulator, measured each run
    assert ours == theirs[:-1] + [refused]


def _embedded_properties(client: Any, namespace: str) -> dict[str, list[str]]:
    from google.cloud import datastore
    from google.cloud.datastore.query import PropertyFilter

    def inner(k: int) -> Any:
        entity = datastore.Entity()
        entity["k"] = k
        return entity

    listed = client.entity(client.key("L", "listed"))
    listed["le"] = [inner(1), inner(2)]
    single = client.entity(client.key("L", "single"))
    single["e"] = inner(2)
    client.put_multi([listed, single])

    def names(prop: str, op: str | None) -> list[str]:
        query = client.query(kind="L")
        if op is None:
            query.order = [prop]
        else:
            query.add_filter(filter=PropertyFilter(prop, op, 2))
        return [e.key.name for e in query.fetch()]

    return {f"{prop} {op or 'order'}": names(prop, op) for prop in ("le.k", "e.k") for op in ("=", ">=", None)}


def test_properties_of_entities_in_a_list_are_indexed_on_the_server_only(
    firestore_emulator: Any, serve_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/gql.md, deliberate differences: ``le = [{k: 1}, {k: 2}]`` is
    found by ``le.k = 2``, ``le.k >= 2`` and ``ORDER BY le.k`` on the server,
    as production finds it, and by none of them on the emulator; a single
    embedded entity's ``e.k`` is indexed on both."""
    theirs, ours = _both(firestore_emulator, serve_server, monkeypatch, _embedded_properties)
    assert theirs == {"le.k =": [], "le.k >=": [], "le.k order": [], "e.k =": ["single"], "e.k >=": ["single"], "e.k order": ["single"]}
    assert ours == {**theirs, "le.k =": ["listed"], "le.k >=": ["listed"], "le.k order": ["listed"]}


def nested(depth: int) -> dict[str, Any]:
    """A REST JSON value: ``depth`` entity values, one inside the other."""
    value: dict[str, Any] = {"integerValue": "1"}
    for _ in range(depth):
        value = {"entityValue": {"properties": {"p": value}}}
    return value


def test_entity_values_nest_at_most_twenty_deep_as_on_the_emulator(target: tuple[str, str]) -> None:
    """Datastore's documented limit, in the emulator's words: 20 entity
    values inside each other are written, 21 refused, nothing written (a
    deeper one could be written and then not read back over REST JSON)."""
    import requests

    host, project = target

    namespace = f"t-{uuid.uuid4().hex[:12]}"
    answers = {}
    for depth in (20, 21):
        key = {"partitionId": {"projectId": project, "namespaceId": namespace}, "path": [{"kind": "N", "name": f"d{depth}"}]}
        body = {"mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": {"key": key, "properties": {"p": nested(depth)}}}]}
        answer = requests.post(f"http://{host}/v1/projects/{project}:commit", json=body, timeout=10)
        answers[depth] = (answer.status_code, answer.json().get("error", {}).get("message", "")[:47].strip())
    assert answers == {20: (200, ""), 21: (400, "At most 20 nested entity values are supported.")}


def test_a_transform_cannot_nest_entity_values_past_twenty(server: Any) -> None:
    """An entity appended at a path inside an entity value adds their
    depths: what the commit makes is held to the limit too (else it is
    stored, then refused when written back as it was read). serve's own
    rule: the emulator checks only what is sent."""
    import requests

    answers = {}
    for depth in (19, 20):  # and "a", one more
        key = {"path": [{"kind": "Deep", "name": f"x{depth}"}]}
        body = {"mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": {"key": key}, "propertyTransforms": [
            {"property": "a.b", "appendMissingElements": {"values": [nested(depth)]}}]}]}
        answers[depth] = requests.post(f"http://{server.emulator_host}/v1/projects/p:commit", json=body,
                                       timeout=10).status_code
    assert answers == {19: 200, 20: 400}
