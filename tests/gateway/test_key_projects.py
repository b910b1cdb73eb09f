"""Keys naming another project (issue 25): the Datastore codec keeps the
project both ways, and the embedded engine tells such a key apart from its
own (orders it by project first, refuses ``__key__`` filters on it and
refuses to read or write it). The emulator's answers to the same GQL texts
are compared in tests/conformance/test_gql_differential.py."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from gds_counter import open_gateway
from gds_counter.errors import BadKeyError, GDSError
from gds_counter.gateway.base import run_query_all
from gds_counter.gateway.datastore._codec import Codec
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Upsert
from gds_counter.gateway.values import RawEntity
from gds_counter.gds import gql


def other(*flat: Any, project: str = "other-p", namespace: str = "") -> Key:
    return Key(Key.of(*flat).path, namespace, project=project)


def test_the_codec_sends_and_reads_back_a_key_of_another_project() -> None:
    codec = Codec("mine", "")
    foreign = other("D", 1, "E", "x", namespace="ns")
    pb = codec.key_to_pb(foreign)
    assert pb.partition_id.project_id == "other-p" and pb.partition_id.namespace_id == "ns"
    assert codec.key_from_pb(pb) == foreign
    value, _ = codec.value_from_pb(codec.value_to_pb(foreign, False))
    assert value == foreign and value.project == "other-p"
    # The codec's own project, or none, is an ordinary key: keys compare equal across gateways.
    assert codec.key_from_pb(codec.key_to_pb(Key.of("D", 1))) == Key.of("D", 1)
    assert codec.key_from_pb(codec.key_to_pb(other("D", 1, project="mine"))).project is None
    empty = codec.key_to_pb(Key.of("D", 1))
    empty.partition_id.project_id = ""
    assert codec.key_from_pb(empty) == Key.of("D", 1)
    # Another codec (another project) reads the first one's keys as another project's.
    assert Codec("theirs", "").key_from_pb(codec.key_to_pb(Key.of("D", 1))) == other("D", 1, project="mine")


def test_project_ids_are_checked_as_datastore_checks_them() -> None:
    for taken in ("a", "1abc", "a-", "example.com:p", ":b", "a.com:", "__x__", "x" * 100):
        assert other("D", 1, project=taken).project == taken
    for refused in ("A", "a_b", "a.b", "-a", "a:b:c", "__a_b__", "x" * 101, "a b"):
        with pytest.raises(BadKeyError, match="not a project id"):
            other("D", 1, project=refused)
    assert other("D", 1, project="").project is None


@pytest.fixture
def engine() -> Iterator[Any]:
    gateway = open_gateway("memory://?project=mmm")
    gateway.commit([
        Upsert(RawEntity(Key.of("D", 1), {"a": Key.of("D", 5), "b": 1})),
        Upsert(RawEntity(Key.of("D", 2), {"a": 7, "b": 2})),
        Upsert(RawEntity(Key.of("D", 3), {"a": "s", "b": 3})),
    ])
    yield gateway
    gateway.close()


def keys(gateway: Any, text: str) -> list[Key | None]:
    return [e.key for e in run_query_all(gateway, gql.parse(text))]


def test_the_engine_orders_another_projects_key_by_project_first(engine: Any) -> None:
    assert engine.projects.home == "mmm"
    assert keys(engine, "SELECT __key__ FROM D WHERE a > KEY(PROJECT('aaa'), D, 9)") == [Key.of("D", 1)]
    assert keys(engine, "SELECT __key__ FROM D WHERE a > KEY(PROJECT('zzz'), D, 1)") == []
    assert keys(engine, "SELECT __key__ FROM D WHERE a < KEY(PROJECT('aaa'), D, 9)") == [Key.of("D", 2), Key.of("D", 3)]
    assert keys(engine, "SELECT __key__ FROM D WHERE a = KEY(PROJECT('other'), D, 5)") == []
    assert len(keys(engine, "SELECT __key__ FROM D WHERE a != KEY(PROJECT('other'), D, 5)")) == 3
    # Its own project, named, or PROJECT(''): an ordinary key.
    assert keys(engine, "SELECT __key__ FROM D WHERE a = KEY(PROJECT('mmm'), D, 5)") == [Key.of("D", 1)]
    assert keys(engine, "SELECT __key__ FROM D WHERE a = KEY(PROJECT(''), D, 5)") == [Key.of("D", 1)]
    assert keys(engine, "SELECT __key__ FROM D WHERE __key__ = KEY(PROJECT('mmm'), D, 2)") == [Key.of("D", 2)]
    # Inside gds-counter serve, the request's project is the engine's own.
    with engine.projects.acting_for("zzzz"):
        assert keys(engine, "SELECT __key__ FROM D WHERE a > KEY(PROJECT('zzz'), D, 1)") == [Key.of("D", 1)]
    assert keys(engine, "SELECT __key__ FROM D WHERE a > KEY(PROJECT('zzz'), D, 1)") == []  # its own again after


@pytest.mark.parametrize("condition", [
    "__key__ = KEY(PROJECT('other'), D, 1)", "__key__ > KEY(PROJECT('aaa'), D, 1)",
    "__key__ IN ARRAY(KEY(D, 1), KEY(PROJECT('other'), D, 1))", "__key__ HAS ANCESTOR KEY(PROJECT('other'), D, 1)",
    "b = 1 OR __key__ != KEY(PROJECT('other'), D, 1)",
])
def test_a_key_filter_on_another_projects_key_is_refused_naming_it(engine: Any, condition: str) -> None:
    with pytest.raises(BadKeyError, match=r"project '(other|aaa)'") as caught:
        keys(engine, f"SELECT __key__ FROM D WHERE {condition}")
    assert "Key('D', 1" in str(caught.value) and "'mmm'" in str(caught.value)


def test_the_engine_refuses_to_read_or_write_another_projects_keys(engine: Any) -> None:
    for call in (
        lambda: engine.lookup([other("D", 1)]),
        lambda: engine.commit([Delete(other("D", 1))]),
        lambda: engine.commit([Upsert(RawEntity(other("D", 9), {}))]),
        lambda: engine.commit([Upsert(RawEntity(Key.of("D", 9), {"k": [1, other("D", 1)]}))]),
        lambda: engine.commit([Upsert(RawEntity(Key.of("D", 9), {"e": RawEntity(None, {"k": other("D", 1)})}))]),
    ):
        with pytest.raises(GDSError, match="other-p"):
            call()
    assert engine.lookup([Key.of("D", 1)])[0] is not None  # nothing was deleted
    assert engine.lookup([other("D", 1, project="mmm")])[0] is not None  # its own project, named


def test_the_engines_project_comes_from_the_url_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the emulator gateway's does (``keys.local_project``), so a key
    literal naming a project means one thing on both."""
    monkeypatch.delenv("DATASTORE_PROJECT_ID", raising=False)
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    with open_gateway("memory://") as gateway:
        assert gateway.projects.home == "gds-counter-local"
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "from-cloud")  # production's project: not local storage's
    with open_gateway("memory://") as gateway:
        assert gateway.projects.home == "gds-counter-local"
    monkeypatch.setenv("DATASTORE_PROJECT_ID", "from-emulator")
    with open_gateway("memory://") as gateway:
        assert gateway.projects.home == "from-emulator"
    with open_gateway("memory://?project=from-url") as gateway:
        assert gateway.projects.home == "from-url"


def test_a_key_naming_the_engines_own_project_is_an_ordinary_key_everywhere(engine: Any) -> None:
    """Written as a key value, looked up, allocated and reserved: it is the
    engine's own key, read back without a project (as the Datastore codec
    reads a key of its own project)."""
    own = other("D", 7, project="mmm")
    engine.commit([Upsert(RawEntity(own, {"ref": [other("D", 1, project="mmm")], "e": RawEntity(None, {"k": own})}))])
    stored = engine.lookup([own])[0]
    assert stored is not None and stored.key == Key.of("D", 7)
    assert stored.properties["ref"] == [Key.of("D", 1)] and stored.properties["e"].properties["k"] == Key.of("D", 7)
    assert [k.project for k in engine.allocate_ids([Key.of("D", project="mmm")])] == [None]
    engine.reserve_ids([other("D", 1000, project="mmm")])


def test_ids_of_another_project_are_neither_allocated_nor_reserved(engine: Any) -> None:
    with pytest.raises(BadKeyError, match="allocate ids for .*'other-p'"):
        engine.allocate_ids([Key.of("D", project="other-p")])
    with pytest.raises(BadKeyError, match="reserve ids for .*'other-p'"):
        engine.reserve_ids([other("D", 5)])


def test_a_parent_of_another_project_is_never_moved_into_the_stores_own(engine: Any) -> None:
    """The Store keeps the parent's project on the child's key, so the
    engine refuses it by name instead of writing it under its own project."""
    from gds_counter import Schema, Store

    store = Store(Schema("K").add_integer("n"), engine)
    entity = store.create_entity({"n": 9}).set_ancestry(other("P", 1))
    assert entity.get_key() == Key.of("P", 1, "K", project="other-p")
    with pytest.raises(BadKeyError, match="'other-p'"):
        store.upsert(entity)
    with pytest.raises(BadKeyError, match="'other-p'"):
        store.fetch_by_id(5, other("P", 1))
    assert list(run_query_all(engine, gql.parse("SELECT * FROM K"))) == []


def test_the_engines_project_is_checked_wherever_it_comes_from(monkeypatch: pytest.MonkeyPatch) -> None:
    from gds_counter.errors import BadValueError

    monkeypatch.setenv("DATASTORE_PROJECT_ID", "Bad_Name")
    with pytest.raises(BadValueError, match="DATASTORE_PROJECT_ID .*'Bad_Name'"):
        open_gateway("memory://")
    monkeypatch.delenv("DATASTORE_PROJECT_ID")
    for url, why in (("memory://?project=ABC", "'ABC' is not a project id"), ("memory://?project=a&project=b", "more than once")):
        with pytest.raises(BadValueError, match=why) as raised:
            open_gateway(url)
        assert url in str(raised.value)


def test_a_key_named_with_the_gateways_own_project_is_the_same_key_to_the_commit_checks() -> None:
    """One entity named twice, once plainly and once with the gateway's own
    project, is refused as any key named twice is (the checks run after the
    own project is dropped); in a transaction the two are one entity."""
    from gds_counter.errors import BadValueError
    from gds_counter.gateway.mutations import Insert

    with open_gateway("memory://?project=mmm") as engine:
        plain, named = Key.of("D", 1), Key.of("D", 1, project="mmm")
        for pair in ([Upsert(RawEntity(plain, {"n": 1})), Upsert(RawEntity(named, {"n": 2}))],
                     [Upsert(RawEntity(plain, {"n": 1})), Delete(named)]):
            with pytest.raises(BadValueError, match="more than once|twice"):
                engine.commit(pair)
        assert engine.lookup([plain]) == [None]
        txn = engine.begin_transaction()
        with pytest.raises(BadValueError, match="insert"):
            engine.commit([Insert(RawEntity(Key.of("D", 2), {})), Insert(RawEntity(Key.of("D", 2, project="mmm"), {}))],
                          transaction=txn)


def test_explain_query_reads_keys_of_projects_as_run_query_does(engine: Any) -> None:
    own = engine.explain_query(gql.parse("SELECT * FROM D WHERE a = KEY(PROJECT('mmm'), D, 5)"))
    assert own and engine.explain_query(gql.parse("SELECT * FROM D WHERE a > KEY(PROJECT('aaa'), D, 5)"))
    with pytest.raises(BadKeyError, match="'other-p'"):
        engine.explain_query(gql.parse("SELECT * FROM D WHERE __key__ = KEY(PROJECT('other-p'), D, 5)"))


def test_an_embedded_entitys_key_of_another_project_is_named_by_its_property(engine: Any) -> None:
    with pytest.raises(BadKeyError, match="property 'e' of Key\\('D', 1\\) holds .*'other-p'"):
        engine.commit([Upsert(RawEntity(Key.of("D", 1), {"e": RawEntity(other("E", 1), {})}))])


def test_a_child_is_looked_up_in_its_parents_namespace_as_it_is_written() -> None:
    from gds_counter import Schema, Store

    store = Store(Schema("K").add_integer("n"), open_gateway("memory://"))
    entity = store.create_entity({"n": 1}).set_ancestry(Key.of("P", 2, namespace="x"))
    entity.set_key_name("b")
    store.upsert(entity)
    found = store.fetch_by_name("b", Key.of("P", 2, namespace="x"))
    assert found is not None and found.get_key() == Key.of("P", 2, "K", "b", namespace="x")


def test_the_emulator_gateway_and_the_engine_take_one_local_project(monkeypatch: pytest.MonkeyPatch) -> None:
    from gds_counter.errors import BadValueError
    from gds_counter.gateway.keys import local_project

    monkeypatch.delenv("DATASTORE_PROJECT_ID", raising=False)
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "prod-project")
    assert local_project() == "gds-counter-local"
    monkeypatch.setenv("DATASTORE_PROJECT_ID", "Bad_Name")
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", "127.0.0.1:1")
    monkeypatch.delenv("GDS_URL", raising=False)
    with pytest.raises(BadValueError, match="DATASTORE_PROJECT_ID"):
        open_gateway()
    with pytest.raises(BadValueError, match="datastore://Bad_P"):
        open_gateway("datastore://Bad_P")
