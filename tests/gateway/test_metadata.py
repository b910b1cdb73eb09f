"""Metadata queries on the embedded engine, as the Datastore metadata
documentation states them (cloud.google.com/datastore/docs/concepts/
metadataqueries). The Firestore emulator refuses them ("Kind queries are
not supported in the Datastore Mode emulator"), so it cannot be the oracle
here; the last test shows that. They returned [] on the embedded engine.

Facts taken from that page: a namespace query returns ``__namespace__``
entities keyed by the namespace's name, the default namespace by the id 1;
a kind query, ``__kind__`` entities keyed by kind name in the query's
namespace; a property query, ``__property__`` entities that are children
of their kind's ``__kind__`` key, with ``property_representation`` unless
keys only; only indexed properties appear; filters are ranges of
``__key__`` (an ancestor for properties), sorted by ``__key__`` ascending.
"""

from __future__ import annotations

import pytest

from gds_counter import Store
from gds_counter.errors import BadKeyError, BadValueError
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import Geopoint, RawEntity


@pytest.fixture(params=["memory", "file"])
def gw(request, tmp_path):
    gateway = EmbeddedGateway(None if request.param == "memory" else str(tmp_path / "meta.sqlite3"))
    gateway.commit([
        Upsert(RawEntity(Key.of("Book", "a"), {"title": "x", "n": 1, "gone": None, "note": "u"}, frozenset({"note"}))),
        Upsert(RawEntity(Key.of("Book", "b"), {"n": 2.5, "at": Geopoint(1.0, 2.0), "by": Key.of("Author", "z")})),
        Upsert(RawEntity(Key.of("Author", "z"), {"ok": True})),
        Upsert(RawEntity(Key.of("Author", "y", namespace="other"), {"ok": False})),
    ])
    yield gateway
    gateway.close()


def rows(gw, gql: str) -> list[tuple]:
    return [(e.get_key().flat_path, e.get_data()) for e in Store("__kind__", gw).fetch_all(gql)]


def test_a_namespace_query_names_each_namespace_the_default_by_id_1(gw):
    assert rows(gw, "SELECT * FROM __namespace__") == [(("__namespace__", 1), {}), (("__namespace__", "other"), {})]


def test_a_kind_query_names_the_kinds_of_the_querys_namespace(gw):
    assert rows(gw, "SELECT __key__ FROM __kind__") == [(("__kind__", "Author"), {}), (("__kind__", "Book"), {})]
    assert rows(gw, "SELECT * FROM __kind__ WHERE __key__ >= KEY(__kind__, 'B')") == [(("__kind__", "Book"), {})]
    other = Store("__kind__", gw, namespace="other")
    assert [e.get_key().flat_path for e in other.fetch_all()] == [("__kind__", "Author")]


def test_a_property_query_gives_each_indexed_property_and_its_representations(gw):
    book = rows(gw, "SELECT * FROM __property__ WHERE __key__ HAS ANCESTOR KEY(__kind__, 'Book')")
    assert book == [
        (("__kind__", "Book", "__property__", "at"), {"property_representation": ["POINT"]}),
        (("__kind__", "Book", "__property__", "by"), {"property_representation": ["REFERENCE"]}),
        (("__kind__", "Book", "__property__", "gone"), {"property_representation": ["NULL"]}),
        (("__kind__", "Book", "__property__", "n"), {"property_representation": ["DOUBLE", "INT64"]}),
        (("__kind__", "Book", "__property__", "title"), {"property_representation": ["STRING"]}),
    ]  # "note" is unindexed: not there
    keys_only = rows(gw, "SELECT __key__ FROM __property__")
    assert keys_only[0] == (("__kind__", "Author", "__property__", "ok"), {})
    assert len(keys_only) == 6


def test_limits_and_cursors_page_through_metadata(gw):
    store = Store("__kind__", gw)
    store.query("SELECT __key__ FROM __property__")
    pages = [[e.get_key().flat_path[-1] for e in page] for page in iter(lambda: store.fetch_page(4), [])]
    assert pages == [["ok", "at", "by", "gone"], ["n", "title"]]


@pytest.mark.parametrize("gql", [
    "SELECT * FROM __kind__ ORDER BY __key__ DESC",
    "SELECT * FROM __kind__ WHERE kind_name = 'Book'",
    "SELECT DISTINCT __key__ FROM __namespace__",
    # an OR inside an AND (the check looked only at the top of the filter, and matched every leaf as AND)
    "SELECT * FROM __kind__ WHERE __key__ > KEY(__kind__, 'A') AND (__key__ = KEY(__kind__, 'Author') OR __key__ = KEY(__kind__, 'Book'))",
])
def test_what_a_metadata_query_cannot_do_is_refused(gw, gql):
    with pytest.raises(BadValueError, match="metadata query"):
        rows(gw, gql)


def test_metadata_entities_are_never_written(gw):
    with pytest.raises(BadKeyError, match="metadata key"):
        gw.commit([Upsert(RawEntity(Key.of("__kind__", "Z"), {}))])


def test_the_firestore_emulator_refuses_metadata_queries(firestore_gateway):
    with pytest.raises(BadValueError, match="not supported"):
        Store("__kind__", firestore_gateway).fetch_all("SELECT * FROM __kind__")
