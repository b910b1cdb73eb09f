"""The php-gds Store over Firestore documents (issue 39, goal 5): a kind is
a collection (its documents at any depth), a key name a document id. What
Firestore in native mode runs, the Store runs: lookups, upserts, deletes,
GQL with filters, orders, limits and cursors, aggregations; what it cannot
run is a ``GDSError`` naming the query, raised before anything is sent."""

from __future__ import annotations

import pytest

from gds_counter import BadValueError, Schema, Store

pytestmark = pytest.mark.emulator


@pytest.fixture
def books(firestore_native_gateway):
    store = Store(Schema("Book").add_string("title").add_integer("year"), gateway=firestore_native_gateway)
    for number in range(6):
        book = store.create_entity({"title": f"t{number}", "year": 2000 + number})
        book.set_key_name(f"b{number}")
        store.upsert(book)
    return store


def test_lookups_upserts_and_deletes(books):
    assert books.fetch_by_name("b2").title == "t2"
    assert [b.title for b in books.fetch_by_names(["b5", "missing", "b0"]) if b is not None] == ["t5", "t0"]
    books.delete(books.fetch_by_name("b0"))
    assert books.fetch_by_name("b0") is None


def test_gql_filters_orders_limits_and_bindings(books):
    found = books.fetch_all("SELECT * FROM Book WHERE year >= @y ORDER BY year DESC LIMIT 3", {"y": 2001})
    assert [b.title for b in found] == ["t5", "t4", "t3"]
    assert books.count("SELECT * FROM Book WHERE year > 2001") == 4
    assert books.sum("year", "SELECT * FROM Book WHERE year < 2002") == 4001


def test_pages_follow_cursors(books):
    books.query("SELECT * FROM Book ORDER BY year")
    pages = [[b.title for b in books.fetch_page(2)] for _ in range(4)]
    assert pages == [["t0", "t1"], ["t2", "t3"], ["t4", "t5"], []]


@pytest.mark.parametrize("gql, why", [
    ("SELECT * WHERE year > 1", "kindless"),
    ("SELECT DISTINCT ON (year) * FROM Book", "DISTINCT ON"),
])
def test_what_firestore_cannot_run_is_refused_naming_it(books, gql, why):
    with pytest.raises(BadValueError, match=why):
        books.fetch_all(gql)
