"""GQL execution, specified by example: the same GQL through ``Store`` on
every gateway, against one fixed data set, with every expected result written
out by hand (never computed by the code under test).

How to read a case: ``Case(id, gql, expected, bindings)``. ``expected`` is the
list of key names in result order (``(name, data)`` pairs for projections and
keys-only queries), or ``Raises(error)``. Where backends differ, ``expected``
is ``on(default, backend=...)``: the difference is asserted, never skipped.

The data set (``ITEMS`` below) is twelve ``Item`` entities: nine root ones
``i01``..``i09`` and three under the parent ``Shelf/top``: ``c1``, ``c2`` and
``g1`` (a child of ``c2``). Key order compares paths element by element, and
kind ``Item`` sorts before kind ``Shelf``, so the key order of the whole kind
is i01 .. i09, c1, c2, g1. A second namespace holds ``x-other``, a copy of
``i01`` that must never appear.

Rules the cases pin down (Datastore's; all four backends agree, except as
listed under the differences below):

* A query without ORDER BY comes back in the order Datastore reads its
  index: a bare kind scan in key order; with inequalities (``<``, ``>``,
  ``!=``, ``NOT IN``...) by the inequality properties (several: by name),
  then key, so a LIMIT keeps the smallest. Ties after the last sort order
  break by key in that order's direction (but see difference 4).
* An entity that lacks a property named in a filter or sort order is not a
  result; a null value is a value (it sorts first, and null != 'apple').
* Unindexed properties are invisible to filters and sort orders.
* A filter on a multi-valued property matches if any element matches;
  inequalities on one property must be met by one element, and a
  projection or sort on that property uses only the elements that pass.
* Values of different types compare by type first. Observed on both
  emulators, and followed by the embedded engine: null < integers and
  timestamps (ONE class: a timestamp compares as microseconds since the
  epoch, so 10**18 sorts after 2020) < booleans < byte strings and text (ONE
  class, compared as UTF-8 bytes, so b"l" < "m" < b"n" and the blob b"l"
  equals the text 'l') < doubles < geopoints < keys. An inequality spans
  types: ``price < 1.0`` matches a null price; ``mixed > 5`` matches a key.
  An integer never equals a double (``price = 4`` finds no ``4.0``).

Where the backends differ (the Firestore emulator in Datastore mode is the
oracle: ``test_differential.py`` compares it with the embedded engine on
1,000 random queries; docs/gql.md's "Deliberate differences from Datastore"
table lists where the embedded engine departs from it, and why):

1. The legacy Datastore emulator predates ``!=``, ``IN``, ``NOT IN`` and
   ``OR`` and rejects them: ``!=`` fails with ``GatewayError`` (the emulator
   answers UNKNOWN with no message), ``IN``, ``NOT IN`` and ``OR`` with
   ``BadValueError`` (INVALID_ARGUMENT). The embedded engine and the
   Firestore emulator run them, as Cloud Datastore does today.
2. ORDER BY a multi-valued property: the embedded engine and the legacy
   Datastore emulator return each entity once, placed by its smallest
   element (ascending) or its largest (descending), as Datastore documents;
   the Firestore emulator returns one row per element (deliberate).
3. Inequalities (``<``, ``>``, ``!=``, ``NOT IN``...) on a multi-valued
   property sorted by that property: the Firestore emulator returns an
   entity once per element that passes (one index row each); the embedded
   engine (and the legacy emulator, for the operators it has) returns it
   once (deliberate, as 2). ``IN``, ``OR`` and ``=`` return each entity once
   everywhere.
4. Ties after a DESCENDING last sort order: the Firestore emulator and the
   embedded engine break them by key descending; the legacy Datastore
   emulator by key ascending, whatever the direction.
5. Inequalities on two properties: the legacy Datastore emulator refuses
   them ("Only one inequality filter per query"); the Firestore emulator and
   the embedded engine run them, as Cloud Datastore does today.

``OFFSET n LIMIT m`` (allowed by older references) is rejected by our parser
on every gateway, because Cloud Datastore rejects it: text that works on
SQLite must not fail in production.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import attrs
import pytest

from gds_counter import BadValueError, Entity, GatewayError, Geopoint, GQLError, Key, Schema, Store
from gds_counter.gateway import open_gateway
from gds_counter.gds._store_core import decode_cursor
from gds_counter.gds.gql import Cursor
from gds_counter.testing import GATEWAY_NAMES

UTC = dt.timezone.utc


def when(*parts: int, tz: dt.tzinfo = UTC) -> dt.datetime:
    return dt.datetime(*parts, tzinfo=tz)


# --- the data set ---------------------------------------------------------------


def item_schema() -> Schema:
    # "mixed" has no schema entry on purpose: its type is detected per entity.
    return (
        Schema("Item")
        .add_string("name")
        .add_integer("qty")
        .add_float("price")
        .add_boolean("active")
        .add_datetime("added")
        .add_string_list("tags")
        .add_key("owner")
        .add_geopoint("place")
        .add_string("note", index=False)
        .add_integer("order")  # a reserved word in GQL: quoted as `order`
    )


@attrs.frozen
class K:
    """A key in the test's namespace, written as a flat path."""

    flat: tuple[Any, ...]

    def __init__(self, *flat: Any) -> None:
        object.__setattr__(self, "flat", flat)


@attrs.frozen
class E:
    """The stored entity at this key, fetched at run time (to bind an Entity)."""

    key: K


ALICE, BOB = K("User", "alice"), K("User", "bob")
TOP = K("Shelf", "top")

#: (key path, properties). Missing properties are absent, not null.
ITEMS: list[tuple[K, dict[str, Any]]] = [
    (K("Item", "i01"), dict(name="apple", qty=5, price=1.5, active=True, added=when(2021, 1, 1), tags=["red", "fruit"],
                            owner=ALICE, place=Geopoint(48.85, 2.35), note="crunchy", mixed=None, order=2)),
    (K("Item", "i02"), dict(name="banana", qty=12, price=0.25, active=False, added=when(2021, 3, 15, 12, 30),
                            tags=["yellow", "fruit"], owner=BOB, place=Geopoint(-33.87, 151.21), note="soft", mixed=7, order=1)),
    (K("Item", "i03"), dict(name="cherry", qty=5, price=4.0, active=True, added=when(2020, 7, 4, 0, 0, 0, 1),
                            tags=["red", "fruit", "small"], owner=ALICE, mixed=when(2020, 1, 1), order=3)),
    (K("Item", "i04"), dict(name="daikon", qty=3, price=2.0, active=False, added=when(2022, 2, 2), tags=["white", "vegetable"],
                            owner=None, mixed=10**18)),
    (K("Item", "i05"), dict(name="eggplant", qty=0, price=None, active=None, added=None, tags=["purple", "vegetable"],
                            owner=BOB, mixed=True)),
    (K("Item", "i06"), dict(name="fig", qty=-2, price=3.5, active=True, added=when(2019, 12, 31, 23, 59, 59),
                            tags=["purple", "fruit", "small"], mixed="m")),
    (K("Item", "i07"), dict(name="grape", qty=40, price=3.5, active=True, tags=["green", "purple", "fruit", "small"], mixed=b"l")),
    (K("Item", "i08"), dict(name=None, qty=7, price=0.5, active=False, mixed=b"n")),
    (K("Item", "i09"), dict(name="kiwi", price=2.5, active=True, added=when(2021, 1, 1), tags=["green", "fruit"], mixed=2.5)),
    (K("Shelf", "top", "Item", "c1"), dict(name="lemon", qty=12, price=1.0, active=True, tags=["yellow", "fruit"],
                                           mixed=Geopoint(1, 2))),
    (K("Shelf", "top", "Item", "c2"), dict(name="mango", qty=8, price=1.25, active=False, tags=["orange", "fruit"], mixed=ALICE)),
    (K("Shelf", "top", "Item", "c2", "Item", "g1"), dict(name="nectarine", qty=2, price=1.75, active=True,
                                                         tags=["orange", "fruit"], mixed=-1.0)),
]

KEY_ORDER = ["i01", "i02", "i03", "i04", "i05", "i06", "i07", "i08", "i09", "c1", "c2", "g1"]
OTHER_NAMESPACE_SUFFIX = "-other"


def resolve(value: Any, store: Store) -> Any:
    """Turn K / E placeholders into real keys and entities in ``store``'s namespace."""
    if isinstance(value, K):
        return Key.of(*value.flat, namespace=store.namespace)
    if isinstance(value, E):
        key = resolve(value.key, store)
        [entity] = store.fetch_by_keys([key])
        assert entity is not None, key
        return entity
    if isinstance(value, list):
        return [resolve(v, store) for v in value]
    if isinstance(value, dict):
        return {k: resolve(v, store) for k, v in value.items()}
    return value


def seed(store: Store) -> None:
    entities = []
    for path, fields in ITEMS:
        key = resolve(path, store)
        entity = store.create_entity(resolve(fields, store))
        entity.set_key_name(key.name)
        entity.set_ancestry(key.parent)
        entities.append(entity)
    store.upsert(entities)
    shelf = Store("Shelf", store.gateway, namespace=store.namespace)
    top = shelf.create_entity({"label": "top shelf"})
    top.set_key_name("top")
    shelf.upsert(top)
    # A copy of i01 in another namespace: it matches many queries, so any
    # leak across namespaces shows up as an unexpected "x-other".
    other = Store(item_schema(), store.gateway, namespace=store.namespace + OTHER_NAMESPACE_SUFFIX)
    ghost = other.create_entity(resolve(dict(ITEMS[0][1]), other))
    ghost.set_key_name("x-other")
    other.upsert(ghost)


# --- fixtures: one seeded data set per backend, shared by the module (read only) ---


@pytest.fixture(scope="module", params=GATEWAY_NAMES)
def gateway(request, tmp_path_factory):
    name = request.param
    if name in ("datastore", "firestore"):
        emulator = request.getfixturevalue(f"{name}_emulator")
        gw = emulator.gateway(namespace=f"gql-{uuid.uuid4().hex}")
    elif name == "memory":
        gw = open_gateway("memory://")
    else:
        gw = open_gateway(f"sqlite:///{tmp_path_factory.mktemp('gql') / 'items.sqlite3'}")
    yield gw
    gw.close()


@pytest.fixture(scope="module")
def seeded(gateway) -> str:
    store = Store(item_schema(), gateway)
    seed(store)
    return store.namespace


@pytest.fixture
def items(gateway, seeded) -> Store:
    """A fresh Store (no remembered query or cursor) over the seeded data."""
    return Store(item_schema(), gateway, namespace=seeded)


# --- the table --------------------------------------------------------------------


@attrs.frozen
class Raises:
    error: type[Exception]
    match: str | None = None


def on(default: Any, **per_backend: Any) -> dict[str, Any]:
    """Expected results per backend: ``default`` unless a backend is named."""
    unknown = set(per_backend) - set(GATEWAY_NAMES)
    assert not unknown, unknown
    return {name: per_backend.get(name, default) for name in GATEWAY_NAMES}


def legacy_rejects(default: Any, error: type[Exception] = BadValueError) -> dict[str, Any]:
    """The legacy Datastore emulator predates the operator (difference 1)."""
    match = "rejected by Datastore" if error is BadValueError else "run_query failed: Unknown"
    return on(default, datastore=Raises(error, match))


@attrs.frozen
class Case:
    id: str
    gql: str
    expected: Any
    bindings: Any = None


CASES = [
    # --- whole kind, key order --------------------------------------------------
    Case("kind-scan-is-key-order", "SELECT * FROM Item", KEY_ORDER),
    Case("order-by-key", "SELECT * FROM Item ORDER BY __key__", KEY_ORDER),
    Case("order-by-key-desc", "SELECT * FROM Item ORDER BY __key__ DESC", KEY_ORDER[::-1]),
    Case("backticked-kind-and-name", "SELECT * FROM `Item` WHERE `name` = 'fig'", ["i06"]),
    Case("keywords-any-case", "select * from Item where qty = 5 and active = true order by __key__ desc", ["i03", "i01"]),
    # --- equality on each type ----------------------------------------------------
    Case("eq-string", "SELECT * FROM Item WHERE name = 'cherry'", ["i03"]),
    Case("eq-string-double-quoted", 'SELECT * FROM Item WHERE name = "cherry"', ["i03"]),
    Case("eq-int", "SELECT * FROM Item WHERE qty = 5", ["i01", "i03"]),
    Case("eq-negative-int", "SELECT * FROM Item WHERE qty = -2", ["i06"]),
    Case("eq-float", "SELECT * FROM Item WHERE price = 3.5", ["i06", "i07"]),
    Case("int-never-equals-double", "SELECT * FROM Item WHERE price = 4", []),
    Case("eq-bool-true", "SELECT * FROM Item WHERE active = TRUE", ["i01", "i03", "i06", "i07", "i09", "c1", "g1"]),
    Case("eq-bool-false", "SELECT * FROM Item WHERE active = FALSE", ["i02", "i04", "i08", "c2"]),
    Case("eq-datetime", "SELECT * FROM Item WHERE added = DATETIME('2021-01-01T00:00:00Z')", ["i01", "i09"]),
    Case("eq-datetime-other-zone", "SELECT * FROM Item WHERE added = DATETIME('2020-07-04T02:00:00.000001+02:00')", ["i03"]),
    Case("eq-key-literal", "SELECT * FROM Item WHERE owner = KEY(User, 'alice')", ["i01", "i03"]),
    Case("eq-key-of-child", "SELECT * FROM Item WHERE __key__ = KEY(Shelf, 'top', Item, 'c2')", ["c2"]),
    Case("eq-null", "SELECT * FROM Item WHERE owner = NULL", ["i04"]),
    Case("is-null", "SELECT * FROM Item WHERE owner IS NULL", ["i04"]),
    Case("null-string", "SELECT * FROM Item WHERE name = NULL", ["i08"]),
    Case("null-float", "SELECT * FROM Item WHERE price IS NULL", ["i05"]),
    Case("eq-geopoint-bound", "SELECT * FROM Item WHERE place = @p", ["i01"], {"p": Geopoint(48.85, 2.35)}),
    Case("eq-mixed-int", "SELECT * FROM Item WHERE mixed = 7", ["i02"]),
    Case("text-equals-same-bytes", "SELECT * FROM Item WHERE mixed = 'l'", ["i07"]),
    # --- ranges -----------------------------------------------------------------------
    Case("gt", "SELECT * FROM Item WHERE qty > 5 ORDER BY qty", ["i08", "c2", "i02", "c1", "i07"]),
    Case("ge-lt-desc", "SELECT * FROM Item WHERE qty >= 5 AND qty < 12 ORDER BY qty DESC",
         on(["c2", "i08", "i03", "i01"], datastore=["c2", "i08", "i01", "i03"])),  # difference 4
    Case("le", "SELECT * FROM Item WHERE qty <= 0 ORDER BY qty", ["i06", "i05"]),
    Case("lt-includes-null", "SELECT * FROM Item WHERE price < 1.0 ORDER BY price", ["i05", "i02", "i08"]),
    Case("string-range", "SELECT * FROM Item WHERE name >= 'f' AND name < 'l' ORDER BY name", ["i06", "i07", "i09"]),
    Case("datetime-range", "SELECT * FROM Item WHERE added > DATETIME('2021-01-01T00:00:00Z') ORDER BY added", ["i02", "i04"]),
    Case("datetime-le-bound-desc", "SELECT * FROM Item WHERE added <= @t ORDER BY added DESC", ["i03", "i06", "i05"],
         {"t": when(2020, 7, 4, 0, 0, 0, 1)}),
    Case("key-range", "SELECT * FROM Item WHERE __key__ > KEY(Item, 'i07') ORDER BY __key__", ["i08", "i09", "c1", "c2", "g1"]),
    Case("range-spans-types", "SELECT * FROM Item WHERE mixed > 5 ORDER BY mixed",
         ["i02", "i03", "i04", "i05", "i07", "i06", "i08", "g1", "i09", "c1", "c2"]),
    Case("range-across-two-types", "SELECT * FROM Item WHERE mixed >= 'a' AND mixed < 0.0 ORDER BY mixed",
         ["i07", "i06", "i08", "g1"]),
    Case("value-first-comparison", "SELECT * FROM Item WHERE 0 >= qty ORDER BY qty", ["i06", "i05"]),
    # without ORDER BY, inequalities come back in their properties' order (by name), then key
    Case("inequality-implies-its-order", "SELECT * FROM Item WHERE qty > 5", ["i08", "c2", "i02", "c1", "i07"]),
    Case("inequality-order-picks-the-limit", "SELECT * FROM Item WHERE qty > 5 LIMIT 2", ["i08", "c2"]),
    Case("two-inequalities-order-by-name", "SELECT * FROM Item WHERE qty > 2 AND price < 2.0",
         on(["i02", "i08", "c1", "c2", "i01"], datastore=Raises(BadValueError, "Only one inequality filter"))),  # difference 5
    Case("ne-implies-its-order", "SELECT * FROM Item WHERE qty != 5 LIMIT 3", legacy_rejects(["i06", "i05", "g1"], GatewayError)),
    # --- != , IN, NOT IN ------------------------------------------------------------------
    Case("ne", "SELECT * FROM Item WHERE qty != 5 ORDER BY qty",
         legacy_rejects(["i06", "i05", "g1", "i04", "i08", "c2", "i02", "c1", "i07"], GatewayError)),
    Case("ne-keeps-null", "SELECT * FROM Item WHERE name != 'apple' ORDER BY name",
         legacy_rejects(["i08", "i02", "i03", "i04", "i05", "i06", "i07", "i09", "c1", "c2", "g1"], GatewayError)),
    Case("in", "SELECT * FROM Item WHERE name IN ARRAY('kiwi', 'apple', 'zucchini') ORDER BY __key__",
         legacy_rejects(["i01", "i09"])),
    Case("in-bound-list", "SELECT * FROM Item WHERE qty IN @qtys ORDER BY qty", legacy_rejects(["i01", "i03", "i02", "c1"]),
         {"qtys": [12, 5]}),
    Case("in-multi-valued-once", "SELECT * FROM Item WHERE tags IN ARRAY('red', 'small') ORDER BY __key__",
         legacy_rejects(["i01", "i03", "i06", "i07"])),
    Case("not-in", "SELECT * FROM Item WHERE name NOT IN ARRAY('apple', 'banana', 'cherry') ORDER BY name",
         legacy_rejects(["i08", "i04", "i05", "i06", "i07", "i09", "c1", "c2", "g1"])),
    Case("ne-multi-valued", "SELECT * FROM Item WHERE active = FALSE AND tags != 'fruit' ORDER BY tags",
         on(["c2", "i04", "i02"], datastore=Raises(GatewayError, "run_query failed: Unknown"),
            firestore=["c2", "i04", "i04", "i02"])),  # difference 3
    Case("not-in-multi-valued", "SELECT * FROM Item WHERE active = FALSE AND tags NOT IN ARRAY('fruit', 'yellow') ORDER BY tags",
         on(["c2", "i04"], datastore=Raises(BadValueError, "NOT_IN"), firestore=["c2", "i04", "i04"])),  # difference 3
    Case("ne-projection", "SELECT tags FROM Item WHERE active = FALSE AND tags != 'fruit'",
         legacy_rejects([("c2", {"tags": "orange"}), ("i04", {"tags": "vegetable"}), ("i04", {"tags": "white"}),
                         ("i02", {"tags": "yellow"})], GatewayError)),
    # --- multi-valued properties -------------------------------------------------------------
    Case("contains", "SELECT * FROM Item WHERE tags CONTAINS 'small'", ["i03", "i06", "i07"]),
    Case("eq-on-list", "SELECT * FROM Item WHERE tags = 'small'", ["i03", "i06", "i07"]),
    Case("value-in-list-property", "SELECT * FROM Item WHERE 'small' IN tags", ["i03", "i06", "i07"]),
    Case("two-elements", "SELECT * FROM Item WHERE tags = 'red' AND tags = 'small'", ["i03"]),
    Case("element-and-range", "SELECT * FROM Item WHERE tags = 'fruit' AND qty > 10 ORDER BY qty", ["i02", "c1", "i07"]),
    Case("one-element-meets-both-bounds", "SELECT * FROM Item WHERE tags > 'r' AND tags < 'v' ORDER BY tags",
         on(["i01", "i03", "i06", "i07"], firestore=["i01", "i03", "i03", "i06", "i07"])),  # difference 3: i03 has red and small
    # --- AND / OR ---------------------------------------------------------------------------
    Case("and", "SELECT * FROM Item WHERE active = TRUE AND qty = 5 AND tags = 'small'", ["i03"]),
    Case("or-in-parentheses", "SELECT * FROM Item WHERE (name = 'apple' OR name = 'banana') AND active = TRUE",
         legacy_rejects(["i01"])),
    Case("or-of-and", "SELECT * FROM Item WHERE name = 'kiwi' OR (active = FALSE AND qty = 12) ORDER BY __key__",
         legacy_rejects(["i02", "i09"])),
    Case("or-multi-valued-once", "SELECT * FROM Item WHERE tags = 'white' OR tags = 'small' ORDER BY __key__",
         legacy_rejects(["i03", "i04", "i06", "i07"])),
    # --- ancestors -------------------------------------------------------------------------
    Case("has-ancestor-literal", "SELECT * FROM Item WHERE __key__ HAS ANCESTOR KEY(Shelf, 'top')", ["c1", "c2", "g1"]),
    Case("has-ancestor-bound-entity", "SELECT * FROM Item WHERE __key__ HAS ANCESTOR @parent", ["c2", "g1"],
         {"parent": E(K("Shelf", "top", "Item", "c2"))}),
    Case("has-descendant", "SELECT * FROM Item WHERE KEY(Shelf, 'top') HAS DESCENDANT __key__", ["c1", "c2", "g1"]),
    Case("own-ancestor", "SELECT * FROM Item WHERE __key__ HAS ANCESTOR KEY(Item, 'i01')", ["i01"]),
    Case("kindless-ancestor", "SELECT * WHERE __key__ HAS ANCESTOR KEY(Shelf, 'top')", ["top", "c1", "c2", "g1"]),
    Case("ancestor-and-filter", "SELECT * FROM Item WHERE __key__ HAS ANCESTOR KEY(Shelf, 'top') AND active = TRUE", ["c1", "g1"]),
    # --- sort orders ---------------------------------------------------------------------------
    Case("asc-then-desc", "SELECT * FROM Item ORDER BY active ASC, qty DESC",
         on(["i05", "i02", "c2", "i08", "i04", "i07", "c1", "i03", "i01", "g1", "i06"],
            datastore=["i05", "i02", "c2", "i08", "i04", "i07", "c1", "i01", "i03", "g1", "i06"])),  # difference 4
    Case("asc-then-desc-ties", "SELECT * FROM Item ORDER BY price, name DESC",
         ["i05", "i02", "i08", "c1", "c2", "i01", "g1", "i04", "i09", "i07", "i06", "i03"]),
    Case("missing-excluded-null-first", "SELECT * FROM Item ORDER BY added", ["i05", "i06", "i03", "i01", "i09", "i02", "i04"]),
    Case("type-order", "SELECT * FROM Item ORDER BY mixed",
         ["i01", "i02", "i03", "i04", "i05", "i07", "i06", "i08", "g1", "i09", "c1", "c2"]),
    Case("type-order-desc", "SELECT * FROM Item ORDER BY mixed DESC",
         ["c2", "c1", "i09", "g1", "i08", "i06", "i07", "i05", "i04", "i03", "i02", "i01"]),
    Case("sort-by-list", "SELECT * FROM Item WHERE active = FALSE ORDER BY tags",
         on(["i02", "c2", "i04"], firestore=["i02", "c2", "c2", "i04", "i04", "i02"])),  # difference 2
    Case("sort-by-list-desc", "SELECT * FROM Item WHERE active = FALSE ORDER BY tags DESC",
         on(["i02", "i04", "c2"], firestore=["i02", "i04", "i04", "c2", "c2", "i02"])),  # differences 2, 4
    Case("quoted-reserved-word", "SELECT * FROM Item ORDER BY `order`", ["i02", "i01", "i03"]),
    Case("quoted-reserved-word-filter", "SELECT * FROM Item WHERE `order` = 2", ["i01"]),
    # --- LIMIT and OFFSET -----------------------------------------------------------------------
    Case("limit", "SELECT * FROM Item ORDER BY qty LIMIT 3", ["i06", "i05", "g1"]),
    Case("limit-offset", "SELECT * FROM Item ORDER BY qty LIMIT 3 OFFSET 2", ["g1", "i04", "i01"]),
    Case("offset-only", "SELECT * FROM Item ORDER BY qty OFFSET 9", ["c1", "i07"]),
    Case("offset-past-end", "SELECT * FROM Item ORDER BY qty OFFSET 100", []),
    Case("limit-offset-named", "SELECT * FROM Item ORDER BY qty LIMIT @n OFFSET @skip", ["i01", "i03"], {"n": 2, "skip": 4}),
    Case("limit-offset-positional", "SELECT * FROM Item ORDER BY qty LIMIT @1 OFFSET @2", ["i01", "i03"], [2, 4]),
    Case("offset-before-limit", "SELECT * FROM Item ORDER BY qty OFFSET 2 LIMIT 3",
         Raises(GQLError, "LIMIT must come before OFFSET")),
    # --- projections, keys only, DISTINCT ------------------------------------------------------
    Case("keys-only", "SELECT __key__ FROM Item WHERE qty = 5", [("i01", {}), ("i03", {})]),
    Case("keys-only-ancestor", "SELECT __key__ FROM Item WHERE __key__ HAS ANCESTOR KEY(Shelf, 'top')",
         [("c1", {}), ("c2", {}), ("g1", {})]),
    Case("projection", "SELECT name, qty FROM Item WHERE active = FALSE ORDER BY name",
         [("i08", {"name": None, "qty": 7}), ("i02", {"name": "banana", "qty": 12}),
          ("i04", {"name": "daikon", "qty": 3}), ("c2", {"name": "mango", "qty": 8})]),
    Case("projection-row-per-element", "SELECT tags FROM Item WHERE name = 'cherry' ORDER BY tags",
         [("i03", {"tags": "fruit"}), ("i03", {"tags": "red"}), ("i03", {"tags": "small"})]),
    Case("projected-datetime", "SELECT added FROM Item WHERE name = 'cherry'", [("i03", {"added": when(2020, 7, 4, 0, 0, 0, 1)})]),
    Case("distinct", "SELECT DISTINCT tags FROM Item WHERE active = FALSE ORDER BY tags",
         [("i02", {"tags": "fruit"}), ("c2", {"tags": "orange"}), ("i04", {"tags": "vegetable"}),
          ("i04", {"tags": "white"}), ("i02", {"tags": "yellow"})]),
    Case("distinct-on-star", "SELECT DISTINCT ON (active) * FROM Item ORDER BY active, name", ["i05", "i08", "i01"]),
    Case("projected-untyped-datetime-is-microseconds", "SELECT mixed FROM Item WHERE mixed > 5 ORDER BY mixed LIMIT 2",
         [("i02", {"mixed": 7}), ("i03", {"mixed": 1577836800000000})]),
    Case("projected-untyped-utf8-blob-is-text", "SELECT mixed FROM Item WHERE mixed >= 'a' AND mixed < 0.0 ORDER BY mixed",
         [("i07", {"mixed": "l"}), ("i06", {"mixed": "m"}), ("i08", {"mixed": "n"}), ("g1", {"mixed": -1.0})]),
    Case("distinct-on", "SELECT DISTINCT ON (active) active, name FROM Item ORDER BY active, name",
         [("i05", {"active": None, "name": "eggplant"}), ("i08", {"active": False, "name": None}),
          ("i01", {"active": True, "name": "apple"})]),
    # --- unindexed and missing properties -----------------------------------------------------------
    Case("unindexed-eq", "SELECT * FROM Item WHERE note = 'crunchy'", []),
    Case("unindexed-range", "SELECT * FROM Item WHERE note > ''", []),
    Case("unindexed-sort", "SELECT * FROM Item ORDER BY note", []),
    Case("missing-excluded", "SELECT * FROM Item WHERE qty < 100 ORDER BY qty",
         ["i06", "i05", "g1", "i04", "i01", "i03", "i08", "c2", "i02", "c1", "i07"]),
    # --- bindings ----------------------------------------------------------------------------------
    Case("positional", "SELECT * FROM Item WHERE qty = @1 AND active = @2", ["i01", "i03"], [5, True]),
    Case("positional-mapping", "SELECT * FROM Item WHERE price < @1 ORDER BY price", ["i05", "i02", "i08"], {1: 1.0}),
    Case("named-datetime", "SELECT * FROM Item WHERE added = @when", ["i03"],
         {"when": when(2020, 7, 4, 2, 0, 0, 1, tz=dt.timezone(dt.timedelta(hours=2)))}),
    Case("named-key", "SELECT * FROM Item WHERE owner = @who", ["i02", "i05"], {"who": BOB}),
    Case("named-key-of-entity", "SELECT * FROM Item WHERE __key__ = @k", ["c2"], {"k": K("Shelf", "top", "Item", "c2")}),
    Case("same-binding-twice", "SELECT * FROM Item WHERE qty >= @q AND qty <= @q", ["i01", "i03"], {"q": 5}),
]


def rows(entities: list[Entity], expected: list[Any]) -> list[Any]:
    """Results in the expected list's shape: key names, or (name, data)."""
    if any(isinstance(item, tuple) for item in expected):
        return [(e.get_key_name(), e.get_data()) for e in entities]
    return [e.get_key_name() for e in entities]


def expected_on(expected: Any, backend: str) -> Any:
    return expected[backend] if isinstance(expected, dict) else expected


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_gql(items, backend, case):
    expected = expected_on(case.expected, backend)
    bindings = resolve(case.bindings, items)
    if isinstance(expected, Raises):
        with pytest.raises(expected.error, match=expected.match):
            items.fetch_all(case.gql, bindings)
        return
    got = items.fetch_all(case.gql, bindings)
    assert rows(got, expected) == expected


def test_case_ids_are_unique():
    assert len({c.id for c in CASES}) == len(CASES)


# --- the Store's default query and the other namespace -------------------------------------


def test_the_default_query_is_the_kind_in_key_order(items):
    assert [e.get_key_name() for e in items.fetch_all()] == KEY_ORDER
    assert items.fetch_one().get_key_name() == "i01"


def test_fetch_one_takes_the_first_row(items):
    assert items.fetch_one("SELECT * FROM Item WHERE qty > @q ORDER BY qty DESC", {"q": 0}).get_key_name() == "i07"
    assert items.fetch_one("SELECT * FROM Item WHERE name = 'zucchini'") is None


def test_the_other_namespace_sees_only_its_own_entity(items, gateway):
    other = Store(item_schema(), gateway, namespace=items.namespace + OTHER_NAMESPACE_SUFFIX)
    assert [e.get_key_name() for e in other.fetch_all("SELECT * FROM Item WHERE qty = 5")] == ["x-other"]
    assert [e.get_key_name() for e in other.fetch_all()] == ["x-other"]


# --- cursors ------------------------------------------------------------------------------


QTY_ORDER = ["i06", "i05", "g1", "i04", "i01", "i03", "i08", "c2", "i02", "c1", "i07"]


def names(entities: list[Entity]) -> list[str]:
    return [e.get_key_name() for e in entities]


def test_fetch_page_follows_cursors_across_pages(items):
    items.query("SELECT * FROM Item WHERE qty >= @low ORDER BY qty", {"low": -10})
    pages = [names(items.fetch_page(4)) for _ in range(4)]
    assert pages == [QTY_ORDER[:4], QTY_ORDER[4:8], QTY_ORDER[8:], []]


def test_offset_cursor_starts_where_a_page_ended(items):
    items.query("SELECT * FROM Item ORDER BY qty")
    assert names(items.fetch_page(4)) == QTY_ORDER[:4]
    after_first_page = Cursor(decode_cursor(items.cursor))
    got = items.fetch_all("SELECT * FROM Item ORDER BY qty OFFSET @start", {"start": after_first_page})
    assert names(got) == QTY_ORDER[4:]
    got = items.fetch_all("SELECT * FROM Item ORDER BY qty LIMIT 2 OFFSET @start + 1", {"start": after_first_page})
    assert names(got) == QTY_ORDER[5:7]


def test_limit_cursor_ends_where_a_page_ended(items):
    items.query("SELECT * FROM Item ORDER BY qty")
    items.fetch_page(3)
    assert names(items.fetch_page(3)) == QTY_ORDER[3:6]
    end = Cursor(decode_cursor(items.cursor))
    assert names(items.fetch_all("SELECT * FROM Item ORDER BY qty LIMIT @end", {"end": end})) == QTY_ORDER[:6]
    got = items.fetch_all("SELECT * FROM Item ORDER BY qty LIMIT FIRST(4, @end) OFFSET 1", {"end": end})
    assert names(got) == QTY_ORDER[1:5]


def test_a_cursor_between_pages_of_a_filtered_query(items):
    items.query("SELECT * FROM Item WHERE active = TRUE ORDER BY __key__ DESC")
    assert names(items.fetch_page(2)) == ["g1", "c1"]
    cursor = items.cursor
    fresh = Store(item_schema(), items.gateway, namespace=items.namespace)
    fresh.query("SELECT * FROM Item WHERE active = TRUE ORDER BY __key__ DESC").set_cursor(cursor)
    assert names(fresh.fetch_page(10)) == ["i09", "i07", "i06", "i03", "i01"]
