"""A lone surrogate is refused as bad input, wherever it comes in (issue 23,
item 9).

A Python ``str`` may hold a surrogate code point on its own (what
``json.loads('"\\ud800"')`` gives a web app), but no UTF-8 text can, so
no Datastore kind, key name, namespace, property name, string value or
GQL text can either. Such input used to meet the first encoder on its way
(SQLite's, JSON's, protobuf's) and raise ``UnicodeEncodeError``, which is
no ``GDSError`` and says nothing about what was wrong. Every entry point
must refuse it with ``BadValueError`` (``BadKeyError``, ``SchemaError``)
or ``GQLError``, naming where it is (an index in the value, or a column in
the GQL text), and before anything is written.

Hypothesis draws the bad text (valid text around one or more surrogates,
``st.characters(categories=["Cs"])``) and the entry point: the Store's
writes, key reads and queries (GQL with bindings and literals, and Query
objects), aggregations, and both counters' names, through both faces
(blocking and ``gds_counter.aio``). On ``memory://`` by default; on the
Firestore emulator (Datastore mode) with ``-m emulator``, where the
gateway is the Datastore one.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
from typing import Any, Callable, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sizes import size

from gds_counter import CounterShardDS, GeneralCounter, Store, aio
from gds_counter.errors import BadValueError, GDSError, GQLError
from gds_counter.gateway import open_gateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.query import Order, PropertyFilter, Query
from gds_counter.gds import Schema

KIND = "Book"

valid = st.text(st.characters(exclude_categories=["Cs"]), max_size=8)
#: Valid text around at least one surrogate (two in a row are no pair in a
#: Python str: each is a code point of its own, and as invalid).
bad_text = st.builds(
    lambda before, surrogates, after: before + "".join(surrogates) + after,
    valid,
    st.lists(st.characters(categories=["Cs"]), min_size=1, max_size=2),
    valid,
)


class Face:
    """One face (blocking or aio) on one gateway; ``call`` runs what an
    entry point returned, awaiting it on the face's own loop if need be
    (bounded, so a regression fails instead of hanging)."""

    def __init__(self, name: str, gateway: Any, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self.name = name
        self.gateway = gateway
        self.loop = loop

    def store(self, kind: Any = KIND) -> Any:
        return (aio.Store if self.loop else Store)(kind, self.gateway)

    def counter_shard_ds(self, target_type: str, target_id: Any) -> Any:
        return (aio.CounterShardDS if self.loop else CounterShardDS)(target_type, target_id, gateway=self.gateway)

    def general_counter(self, name: str) -> Any:
        return (aio.GeneralCounter if self.loop else GeneralCounter)(name, gateway=self.gateway)

    def call(self, result: Any) -> Any:
        if inspect.isawaitable(result):
            assert self.loop is not None
            return self.loop.run_until_complete(asyncio.wait_for(_awaited(result), 60))
        return result

    def stored(self) -> list[Any]:
        """Every entity in the gateway's namespace (a kindless query)."""
        query = Query(namespace=self.gateway.namespace)
        return list(self.call(self.gateway.run_query(query)).entities)


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


def _gql_string(text: str) -> str:
    """``text`` as a GQL string literal (quotes doubled, backslashes escaped)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "''") + "'"


def _gql_name(text: str) -> str:
    return "`" + text.replace("`", "``") + "`"


def _entity(face: Face, data: dict[str, Any], schema: Schema | None = None) -> Any:
    return face.store(schema or KIND).create_entity(data)


def _upsert(face: Face, data: dict[str, Any], schema: Schema | None = None) -> Any:
    return face.store(schema or KIND).upsert(_entity(face, data, schema))


def _named(face: Face, name: str) -> Any:
    entity = _entity(face, {"title": "x"})
    entity.set_key_name(name)
    return entity


#: Entry point -> how the bad text reaches it. Each returns what the face
#: returns (a value, or for aio an awaitable that ``Face.call`` awaits).
ENTRY_POINTS: dict[str, Callable[[Face, str], Any]] = {
    # writes
    "upsert: key name": lambda f, bad: f.store().upsert(_named(f, "k" + bad)),
    "upsert: kind": lambda f, bad: _upsert(f, {"title": "x"}, Schema("K" + bad)),
    "Store: kind": lambda f, bad: f.store("K" + bad).fetch_all(),
    "upsert: property name": lambda f, bad: _upsert(f, {"p" + bad: 1}),
    "upsert: schema property name": lambda f, bad: _upsert(f, {}, Schema(KIND).add_string("p" + bad)),
    "upsert: indexed string": lambda f, bad: _upsert(f, {"title": bad}),
    "upsert: unindexed string": lambda f, bad: _upsert(f, {"body": bad}, Schema(KIND).add_string("body", index=False)),
    "upsert: string in a list": lambda f, bad: _upsert(f, {"tags": ["ok", bad]}),
    "upsert: string in an embedded entity": lambda f, bad: _upsert(f, {"inner": {"note": bad}}, Schema(KIND).add_entity("inner")),
    "upsert: key name of a key value": lambda f, bad: _upsert(f, {"ref": Key.of("Author", "a" + bad)}),
    "upsert: parent key name": lambda f, bad: f.store().upsert(_entity(f, {"title": "x"}).set_ancestry(Key.of("Author", "a" + bad))),
    "increment: property name": lambda f, bad: f.store().increment(_named(f, "counted"), "n" + bad),
    # key reads
    "fetch_by_name": lambda f, bad: f.store().fetch_by_name("k" + bad),
    "fetch_by_names": lambda f, bad: f.store().fetch_by_names(["ok", "k" + bad]),
    "fetch_by_keys: namespace": lambda f, bad: f.store().fetch_by_keys([Key.of(KIND, "k", namespace="n" + bad)]),
    "fetch_by_keys: kind": lambda f, bad: f.store().fetch_by_keys([Key.of("K" + bad, "k")]),
    # GQL: bindings
    "GQL: named binding": lambda f, bad: f.store().fetch_all("SELECT * FROM Book WHERE title = @t", {"t": bad}),
    "GQL: positional binding": lambda f, bad: f.store().fetch_all("SELECT * FROM Book WHERE title = @1", [bad]),
    "GQL: binding in an IN list": lambda f, bad: f.store().fetch_all("SELECT * FROM Book WHERE title IN @t", {"t": ["ok", bad]}),
    "GQL: binding of fetch_one": lambda f, bad: f.store().fetch_one("SELECT * FROM Book WHERE title > @t", {"t": bad}),
    "GQL: binding of a count": lambda f, bad: f.store().count("SELECT * FROM Book WHERE title = @t", {"t": bad}),
    # GQL: literals and names in the text
    "GQL: string literal": lambda f, bad: f.store().fetch_all(f"SELECT * FROM Book WHERE title = {_gql_string(bad)}"),
    "GQL: kind": lambda f, bad: f.store().fetch_all(f"SELECT * FROM {_gql_name('K' + bad)}"),
    "GQL: property name": lambda f, bad: f.store().fetch_all(f"SELECT * FROM Book WHERE {_gql_name('p' + bad)} = 1"),
    "GQL: KEY name": lambda f, bad: f.store().fetch_all(f"SELECT * FROM Book WHERE __key__ = KEY(Book, {_gql_string('k' + bad)})"),
    "GQL: NAMESPACE": lambda f, bad: f.store().fetch_all(
        f"SELECT * FROM Book WHERE __key__ = KEY(NAMESPACE({_gql_string('n' + bad)}), Book, 'k')"
    ),
    "GQL: aggregation text": lambda f, bad: f.store().aggregate(f"SELECT COUNT(*) AS {_gql_name('c' + bad)} FROM Book"),
    # Query objects
    "Query: kind": lambda f, bad: f.store().fetch_all(Query("K" + bad)),
    "Query: filter value": lambda f, bad: f.store().fetch_all(Query(KIND, filter=PropertyFilter("title", "=", bad))),
    "Query: IN value": lambda f, bad: f.store().fetch_all(Query(KIND, filter=PropertyFilter("title", "IN", ("ok", bad)))),
    "Query: filter property": lambda f, bad: f.store().fetch_all(Query(KIND, filter=PropertyFilter("p" + bad, "=", 1))),
    "Query: order": lambda f, bad: f.store().fetch_all(Query(KIND, order=[Order("p" + bad)])),
    "Query: projection": lambda f, bad: f.store().fetch_all(Query(KIND, projection=["p" + bad])),
    "sum: property name": lambda f, bad: f.store().sum("p" + bad),
    # counters
    "CounterShardDS: target type": lambda f, bad: f.counter_shard_ds("t" + bad, 1).increment(),
    "CounterShardDS: target id": lambda f, bad: f.counter_shard_ds("t", "i" + bad).increment(),
    "GeneralCounter: name": lambda f, bad: f.general_counter("g" + bad).increment(),
}

#: How a refusal names where the surrogate is: an index into the value, or
#: a column of the GQL text.
WHERE = re.compile(r"\b(index|column) \d+")


def _check_refused(face: Face, entry: str, bad: str) -> None:
    with pytest.raises(GDSError) as caught:
        face.call(ENTRY_POINTS[entry](face, bad))
    error = caught.value
    assert isinstance(error, (BadValueError, GQLError)), (entry, type(error), error)
    assert WHERE.search(str(error)), (entry, str(error))
    assert face.stored() == [], entry


@pytest.fixture(params=["blocking", "aio"])
def memory_face(request) -> Iterator[Face]:
    yield from _face(request.param, open_gateway("memory://"), owns=True)


@pytest.fixture(params=["blocking", "aio"])
def firestore_face(request, firestore_gateway) -> Iterator[Face]:
    yield from _face(request.param, firestore_gateway, owns=False)


def _face(name: str, blocking: Any, *, owns: bool) -> Iterator[Face]:
    if name == "blocking":
        try:
            yield Face(name, blocking)
        finally:
            if owns:
                blocking.close()
        return
    loop = asyncio.new_event_loop()
    gateway = aio.async_twin(blocking, owns=owns)
    try:
        yield Face(name, gateway, loop)
    finally:
        # (a gateway it does not own is closed by the fixture that made it)
        loop.run_until_complete(asyncio.wait_for(gateway.close(), 60))
        loop.close()


def test_the_strategy_draws_text_that_cannot_be_encoded():
    """The premise: what the tests feed in is exactly what UTF-8 refuses."""

    @given(bad_text)
    def check(text: str) -> None:
        with pytest.raises(UnicodeEncodeError):
            text.encode("utf-8")

    check()


@settings(max_examples=size(80, 400), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(entry=st.sampled_from(sorted(ENTRY_POINTS)), bad=bad_text)
def test_a_lone_surrogate_is_refused_at_every_entry_point(memory_face, entry, bad):
    _check_refused(memory_face, entry, bad)


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_each_entry_point_refuses_a_lone_surrogate(memory_face, entry):
    """Every entry point at least once, whatever hypothesis draws."""
    _check_refused(memory_face, entry, "half a pair \ud800 of surrogates")


@pytest.mark.emulator
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_the_datastore_gateway_refuses_a_lone_surrogate_before_sending_it(firestore_face, entry):
    """On the Datastore gateway (to the Firestore emulator), both faces: the
    same refusals, before any RPC could carry the text."""
    _check_refused(firestore_face, entry, "a\udfffb")


@pytest.mark.parametrize("url", ["sqlite:///x\ud800.db", "sqlite:///dir\udfff/x.db", "sqlite:///a\x00b.db"])
def test_a_sqlite_url_with_a_lone_surrogate_is_bad_input(url: str) -> None:
    """``open_gateway`` names the URL (BadValueError) instead of letting the
    file system's UnicodeEncodeError out; nothing is created."""
    from gds_counter.gateway import open_gateway

    with pytest.raises(BadValueError, match="cannot be a file name"):
        open_gateway(url)


def test_a_sqlite_path_of_undecodable_bytes_still_opens(tmp_path: Any) -> None:
    """Bytes the command line could not decode arrive as surrogate escapes
    (``\\udc80``..``\\udcff``), which name a real file: those stay allowed."""
    from gds_counter.gateway import open_gateway

    name = os.fsdecode(bytes(tmp_path) + b"/caf\xe9.db")
    gateway = open_gateway(f"sqlite:///{name}")
    gateway.close()
    assert os.path.exists(bytes(tmp_path) + b"/caf\xe9.db")
