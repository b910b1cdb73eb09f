"""Paging a DISTINCT query with the engine's own cursors ends, and gives
its groups once each, in the default namespace as in any other, whatever
the direction of its orders. (A DISTINCT cursor is a group point, and a
"after every key" marker byte once let the last group come back on every
page in the default namespace, where a key in descending order begins
with 0xff.)"""

from __future__ import annotations

import pytest

from gds_counter import Schema, Store

QUERIES = [
    "SELECT DISTINCT g FROM Item ORDER BY g DESC",
    "SELECT DISTINCT g FROM Item ORDER BY g",
    "SELECT DISTINCT g, h FROM Item ORDER BY g DESC, h DESC",
    "SELECT DISTINCT ON (g) * FROM Item ORDER BY g DESC",
]


@pytest.mark.parametrize("storage", ["memory", "sqlite"])
@pytest.mark.parametrize("namespace", ["", "other"])
@pytest.mark.parametrize("query", QUERIES)
def test_distinct_pages_end_and_give_each_group_once(make_gateway, storage, namespace, query):
    gateway = make_gateway(storage)
    store = Store(Schema("Item").add_integer("g").add_integer("h"), gateway, namespace=namespace)
    store.upsert([store.create_entity({"g": i % 4, "h": i % 2}) for i in range(1, 13)])
    whole = [(e.g, e.h) for e in store.fetch_all(query)]
    store.query(query)
    pages = []
    for _ in range(len(whole) + 2):
        page = store.fetch_page(2)
        if not page:
            break
        pages.append([(e.g, e.h) for e in page])
    assert [row for page in pages for row in page] == whole, pages
    assert len(whole) == len(set(whole)) > 1
