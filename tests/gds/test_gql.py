"""GQL parser and printer: each GQL string beside the Query it must give."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sizes import size

from gds_counter.errors import BadKeyError, GQLError
from gds_counter.gateway.keys import Key
from gds_counter.gateway.query import CompositeFilter, GqlSource, Order, PropertyFilter, Query
from gds_counter.gateway.values import Geopoint
from gds_counter.gds.gql import Cursor, parse, parse_aggregation, to_gql

UTC = dt.timezone.utc


def F(name: str, op: str, value: Any) -> PropertyFilter:
    return PropertyFilter(name, op, value)


def AND(*filters: Any) -> CompositeFilter:
    return CompositeFilter("AND", filters)


def OR(*filters: Any) -> CompositeFilter:
    return CompositeFilter("OR", filters)


K = Query(kind="K")
ANCESTOR = Key.of("Parent", "p1")


class FakeEntity:
    """Stands in for gds.Entity: bound as its key through __gds_key__."""

    def __init__(self, key: Key | None) -> None:
        self.key = key

    def __gds_key__(self) -> Key:
        if self.key is None:
            raise BadKeyError("FakeEntity has no complete key to bind (save it first)")
        return self.key


# (id, gql, bindings, expected query)
CASES: list[tuple[str, str, Any, Query]] = [
    # SELECT
    ("star", "SELECT * FROM K", None, K),
    ("keys-only", "SELECT __key__ FROM K", None, Query(kind="K", keys_only=True)),
    ("projection", "SELECT a, b FROM K", None, Query(kind="K", projection=("a", "b"))),
    ("projection-with-key", "SELECT a, __key__ FROM K", None, Query(kind="K", projection=("a", "__key__"))),
    (
        "distinct",
        "SELECT DISTINCT a, b FROM K",
        None,
        Query(kind="K", projection=("a", "b"), distinct_on=("a", "b")),
    ),
    (
        "distinct-on",
        "SELECT DISTINCT ON (a) a, b FROM K",
        None,
        Query(kind="K", projection=("a", "b"), distinct_on=("a",)),
    ),
    ("distinct-on-star", "SELECT DISTINCT ON (a, b) * FROM K", None, Query(kind="K", distinct_on=("a", "b"))),
    ("dotted-property", "SELECT a.b, `c`.d FROM K", None, Query(kind="K", projection=("a.b", "c.d"))),
    ("quoted-dotted-property", "SELECT `a.b` FROM K", None, Query(kind="K", projection=("a.b",))),
    ("property-named-key", "SELECT key, first, array FROM K", None, Query(kind="K", projection=("key", "first", "array"))),
    # as the Firestore emulator reads them (tests/conformance/test_gql_differential.py):
    ("in-one-value", "SELECT * FROM K WHERE a IN 5", None, Query(kind="K", filter=F("a", "IN", (5,)))),
    ("contains-array", "SELECT * FROM K WHERE l CONTAINS ARRAY(1, 2)", None, Query(kind="K", filter=F("l", "IN", (1, 2)))),
    ("array-in-property", "SELECT * FROM K WHERE ARRAY(1, 2) IN l", None, Query(kind="K", filter=F("l", "IN", (1, 2)))),
    ("unary-plus", "SELECT * FROM K WHERE a = +1 LIMIT +2", None, Query(kind="K", filter=F("a", "=", 1), limit=2)),
    ("doubles-without-a-digit-on-one-side", "SELECT * FROM K WHERE a = .5 OR a = 5.", None,
     Query(kind="K", filter=CompositeFilter("OR", (F("a", "=", 0.5), F("a", "=", 5.0))))),
    ("double-beyond-range", "SELECT * FROM K WHERE a = 1e400", None, Query(kind="K", filter=F("a", "=", float("inf")))),
    ("key-twice-is-keys-only", "SELECT __key__, __key__ FROM K", None, Query(kind="K", keys_only=True)),
    ("percent-escape-kept", "SELECT * FROM K WHERE s = 'a\\%b'", None, Query(kind="K", filter=F("s", "=", "a\\%b"))),
    ("reserved-word-quoted", "SELECT `order`, `from` FROM K", None, Query(kind="K", projection=("order", "from"))),
    # FROM
    ("no-from", "SELECT *", None, Query()),
    ("kindless-where", "SELECT * WHERE a = 1", None, Query(filter=F("a", "=", 1))),
    ("quoted-kind", "SELECT * FROM `my kind`", None, Query(kind="my kind")),
    ("quoted-kind-escapes", "SELECT * FROM `a``b\\\\c`", None, Query(kind="a`b\\c")),
    ("keywords-any-case", "sElEcT * fRoM K", None, K),
    ("metadata-kind", "SELECT * FROM __kind__", None, Query(kind="__kind__")),
    ("unicode-names", "SELECT * FROM Käse WHERE größe = 1", None, Query(kind="Käse", filter=F("größe", "=", 1))),
    # comparisons
    ("eq-int", "SELECT * FROM K WHERE n = 5", None, Query(kind="K", filter=F("n", "=", 5))),
    ("lt", "SELECT * FROM K WHERE n < 5", None, Query(kind="K", filter=F("n", "<", 5))),
    ("le", "SELECT * FROM K WHERE n <= 5", None, Query(kind="K", filter=F("n", "<=", 5))),
    ("gt", "SELECT * FROM K WHERE n > 5", None, Query(kind="K", filter=F("n", ">", 5))),
    ("ge", "SELECT * FROM K WHERE n >= 5", None, Query(kind="K", filter=F("n", ">=", 5))),
    ("ne", "SELECT * FROM K WHERE n != 5", None, Query(kind="K", filter=F("n", "!=", 5))),
    ("no-spaces", "SELECT * FROM K WHERE n>=-5", None, Query(kind="K", filter=F("n", ">=", -5))),
    ("contains", "SELECT * FROM K WHERE tags CONTAINS 'x'", None, Query(kind="K", filter=F("tags", "=", "x"))),
    ("is-null", "SELECT * FROM K WHERE a IS NULL", None, Query(kind="K", filter=F("a", "=", None))),
    ("in-array", "SELECT * FROM K WHERE a IN ARRAY(1, 'x')", None, Query(kind="K", filter=F("a", "IN", (1, "x")))),
    ("not-in", "SELECT * FROM K WHERE a NOT IN ARRAY(2)", None, Query(kind="K", filter=F("a", "NOT_IN", (2,)))),
    ("in-bound-list", "SELECT * FROM K WHERE a IN @v", {"v": [1, 2]}, Query(kind="K", filter=F("a", "IN", (1, 2)))),
    ("in-bound-tuple", "SELECT * FROM K WHERE a IN @1", [("x",)], Query(kind="K", filter=F("a", "IN", ("x",)))),
    (
        "array-with-bindings",
        "SELECT * FROM K WHERE a IN ARRAY(@x, KEY(A, 1))",
        {"x": 3},
        Query(kind="K", filter=F("a", "IN", (3, Key.of("A", 1)))),
    ),
    (
        "has-ancestor",
        "SELECT * FROM K WHERE __key__ HAS ANCESTOR KEY(Parent, 'p1')",
        None,
        Query(kind="K", filter=F("__key__", "HAS_ANCESTOR", ANCESTOR)),
    ),
    (
        "has-descendant",
        "SELECT * FROM K WHERE KEY(Parent, 'p1') HAS DESCENDANT __key__",
        None,
        Query(kind="K", filter=F("__key__", "HAS_ANCESTOR", ANCESTOR)),
    ),
    ("reversed-lt", "SELECT * FROM K WHERE 5 < n", None, Query(kind="K", filter=F("n", ">", 5))),
    ("reversed-ge", "SELECT * FROM K WHERE 5 >= n", None, Query(kind="K", filter=F("n", "<=", 5))),
    ("reversed-eq", "SELECT * FROM K WHERE @v = n", {"v": "x"}, Query(kind="K", filter=F("n", "=", "x"))),
    ("reversed-in", "SELECT * FROM K WHERE 'x' IN tags", None, Query(kind="K", filter=F("tags", "=", "x"))),
    (
        "key-compare",
        "SELECT * FROM K WHERE __key__ > KEY(K, 'a')",
        None,
        Query(kind="K", filter=F("__key__", ">", Key.of("K", "a"))),
    ),
    # AND / OR
    (
        "and",
        "SELECT * FROM K WHERE a = 1 AND b = 2",
        None,
        Query(kind="K", filter=AND(F("a", "=", 1), F("b", "=", 2))),
    ),
    (
        "lower-case-and-keeps-both",
        "SELECT * FROM K WHERE a = 1 and b = 2",
        None,
        Query(kind="K", filter=AND(F("a", "=", 1), F("b", "=", 2))),
    ),
    (
        "brand-not-split-at-and",
        "SELECT * FROM K WHERE BRAND = 'x' AND ANDROID = 2",
        None,
        Query(kind="K", filter=AND(F("BRAND", "=", "x"), F("ANDROID", "=", 2))),
    ),
    (
        "or",
        "SELECT * FROM K WHERE a = 1 OR b = 2",
        None,
        Query(kind="K", filter=OR(F("a", "=", 1), F("b", "=", 2))),
    ),
    (
        "and-binds-tighter",
        "SELECT * FROM K WHERE a = 1 OR b = 2 AND c = 3",
        None,
        Query(kind="K", filter=OR(F("a", "=", 1), AND(F("b", "=", 2), F("c", "=", 3)))),
    ),
    (
        "parentheses",
        "SELECT * FROM K WHERE (a = 1 OR b = 2) AND c = 3",
        None,
        Query(kind="K", filter=AND(OR(F("a", "=", 1), F("b", "=", 2)), F("c", "=", 3))),
    ),
    ("single-in-parens-collapses", "SELECT * FROM K WHERE ((a = 1))", None, Query(kind="K", filter=F("a", "=", 1))),
    (
        "same-op-flattened",
        "SELECT * FROM K WHERE a = 1 AND (b = 2 AND (c = 3 AND d = 4))",
        None,
        Query(kind="K", filter=AND(F("a", "=", 1), F("b", "=", 2), F("c", "=", 3), F("d", "=", 4))),
    ),
    (
        "nested-mixed",
        "SELECT * FROM K WHERE (a = 1 AND (b = 2 OR (c = 3 OR d = 4))) OR e = 5",
        None,
        Query(
            kind="K",
            filter=OR(
                AND(F("a", "=", 1), OR(F("b", "=", 2), F("c", "=", 3), F("d", "=", 4))),
                F("e", "=", 5),
            ),
        ),
    ),
    # ORDER BY
    (
        "order",
        "SELECT * FROM K ORDER BY a ASC, b DESC, c, __key__",
        None,
        Query(kind="K", order=(Order("a"), Order("b", True), Order("c"), Order("__key__"))),
    ),
    # LIMIT / OFFSET
    ("limit", "SELECT * FROM K LIMIT 5", None, Query(kind="K", limit=5)),
    ("limit-zero", "SELECT * FROM K LIMIT 0", None, Query(kind="K", limit=0)),
    ("offset", "SELECT * FROM K OFFSET 3", None, Query(kind="K", offset=3)),
    ("limit-offset", "SELECT * FROM K LIMIT 5 OFFSET 3", None, Query(kind="K", limit=5, offset=3)),
    ("bound-limit", "SELECT * FROM K LIMIT @n OFFSET @1", {"n": 5, 1: 1}, Query(kind="K", limit=5, offset=1)),
    ("limit-cursor", "SELECT * FROM K LIMIT @c", {"c": Cursor(b"end")}, Query(kind="K", end_cursor=b"end")),
    (
        "limit-first",
        "SELECT * FROM K LIMIT FIRST(@c, 10)",
        {"c": Cursor(b"end")},
        Query(kind="K", limit=10, end_cursor=b"end"),
    ),
    (
        "limit-first-int-first",
        "SELECT * FROM K LIMIT FIRST(10, @c)",
        {"c": Cursor(b"end")},
        Query(kind="K", limit=10, end_cursor=b"end"),
    ),
    ("offset-cursor", "SELECT * FROM K OFFSET @c", {"c": Cursor(b"go")}, Query(kind="K", start_cursor=b"go")),
    (
        "offset-cursor-plus",
        "SELECT * FROM K OFFSET @c + 5",
        {"c": Cursor(b"go")},
        Query(kind="K", start_cursor=b"go", offset=5),
    ),
    (
        "everything",
        "SELECT DISTINCT ON (a) a, b FROM K WHERE a > 1 ORDER BY a DESC LIMIT FIRST(@e, 3) OFFSET @s + 2",
        {"e": Cursor(b"e"), "s": Cursor(b"s")},
        Query(
            kind="K",
            projection=("a", "b"),
            distinct_on=("a",),
            filter=F("a", ">", 1),
            order=(Order("a", True),),
            limit=3,
            offset=2,
            start_cursor=b"s",
            end_cursor=b"e",
        ),
    ),
    # literals
    ("string-single", "SELECT * FROM K WHERE s = 'it''s'", None, Query(kind="K", filter=F("s", "=", "it's"))),
    ("string-double", 'SELECT * FROM K WHERE s = "say ""hi"""', None, Query(kind="K", filter=F("s", "=", 'say "hi"'))),
    (
        "string-backslash",
        r"SELECT * FROM K WHERE s = 'a\'b\\c\nd\te\"'",
        None,
        Query(kind="K", filter=F("s", "=", "a'b\\c\nd\te\"")),
    ),
    ("string-keeps-keywords", "SELECT * FROM K WHERE s = 'a AND b'", None, Query(kind="K", filter=F("s", "=", "a AND b"))),
    ("empty-string", "SELECT * FROM K WHERE s = ''", None, Query(kind="K", filter=F("s", "=", ""))),
    ("number-is-int", "SELECT * FROM K WHERE n = 5", None, Query(kind="K", filter=F("n", "=", 5))),
    ("negative-int", "SELECT * FROM K WHERE n = -9223372036854775808", None, Query(kind="K", filter=F("n", "=", -(2**63)))),
    ("double", "SELECT * FROM K WHERE x = 1.5", None, Query(kind="K", filter=F("x", "=", 1.5))),
    ("double-exp", "SELECT * FROM K WHERE x = -2.5e-3", None, Query(kind="K", filter=F("x", "=", -2.5e-3))),
    ("double-exp-no-dot", "SELECT * FROM K WHERE x = 1E3", None, Query(kind="K", filter=F("x", "=", 1000.0))),
    ("true", "SELECT * FROM K WHERE b = TRUE", None, Query(kind="K", filter=F("b", "=", True))),
    ("false", "SELECT * FROM K WHERE b = false", None, Query(kind="K", filter=F("b", "=", False))),
    ("null", "SELECT * FROM K WHERE b = NULL", None, Query(kind="K", filter=F("b", "=", None))),
    (
        "key-literal",
        "SELECT * FROM K WHERE k = KEY(A, 'x', B, 12)",
        None,
        Query(kind="K", filter=F("k", "=", Key.of("A", "x", "B", 12))),
    ),
    (
        "key-literal-project-namespace",
        "SELECT * FROM K WHERE k = KEY(PROJECT('p'), NAMESPACE('ns'), A, 1)",
        None,
        Query(kind="K", filter=F("k", "=", Key(Key.of("A", 1).path, "ns", project="p"))),
    ),
    (
        "key-literal-empty-project",  # '' is the request's own project, as Datastore reads it
        "SELECT * FROM K WHERE k = KEY(PROJECT(''), A, 1)",
        None,
        Query(kind="K", filter=F("k", "=", Key.of("A", 1))),
    ),
    (
        "key-literal-quoted-kind",
        "SELECT * FROM K WHERE k = KEY(`my kind`, 1)",
        None,
        Query(kind="K", filter=F("k", "=", Key.of("my kind", 1))),
    ),
    (
        "datetime",
        "SELECT * FROM K WHERE t = DATETIME('2013-09-29T09:30:20.00002-08:00')",
        None,
        Query(kind="K", filter=F("t", "=", dt.datetime(2013, 9, 29, 17, 30, 20, 20, tzinfo=UTC))),
    ),
    (
        "datetime-z",
        "SELECT * FROM K WHERE t > DATETIME('2020-01-02T03:04:05Z')",
        None,
        Query(kind="K", filter=F("t", ">", dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=UTC))),
    ),
    ("blob", "SELECT * FROM K WHERE b = BLOB('aGVsbG8')", None, Query(kind="K", filter=F("b", "=", b"hello"))),
    ("blob-urlsafe", "SELECT * FROM K WHERE b = BLOB('-_8')", None, Query(kind="K", filter=F("b", "=", b"\xfb\xff"))),
    ("blob-empty", "SELECT * FROM K WHERE b = BLOB('')", None, Query(kind="K", filter=F("b", "=", b""))),
    # bindings of every type
    ("bind-str", "SELECT * FROM K WHERE a = @v", {"v": "x"}, Query(kind="K", filter=F("a", "=", "x"))),
    ("bind-int", "SELECT * FROM K WHERE a = @v", {"v": 7}, Query(kind="K", filter=F("a", "=", 7))),
    ("bind-float", "SELECT * FROM K WHERE a = @v", {"v": 0.5}, Query(kind="K", filter=F("a", "=", 0.5))),
    ("bind-bool", "SELECT * FROM K WHERE a = @v", {"v": True}, Query(kind="K", filter=F("a", "=", True))),
    ("bind-none", "SELECT * FROM K WHERE a = @v", {"v": None}, Query(kind="K", filter=F("a", "=", None))),
    ("bind-bytes", "SELECT * FROM K WHERE a = @v", {"v": b"\x00\x01"}, Query(kind="K", filter=F("a", "=", b"\x00\x01"))),
    (
        "bind-datetime-to-utc",
        "SELECT * FROM K WHERE a = @v",
        {"v": dt.datetime(2020, 1, 1, 12, tzinfo=dt.timezone(dt.timedelta(hours=2)))},
        Query(kind="K", filter=F("a", "=", dt.datetime(2020, 1, 1, 10, tzinfo=UTC))),
    ),
    ("bind-key", "SELECT * FROM K WHERE a = @v", {"v": ANCESTOR}, Query(kind="K", filter=F("a", "=", ANCESTOR))),
    (
        "bind-entity",
        "SELECT * FROM K WHERE __key__ HAS ANCESTOR @p",
        {"p": FakeEntity(ANCESTOR)},
        Query(kind="K", filter=F("__key__", "HAS_ANCESTOR", ANCESTOR)),
    ),
    (
        "bind-geopoint",
        "SELECT * FROM K WHERE a = @v",
        {"v": Geopoint(1.5, 2.5)},
        Query(kind="K", filter=F("a", "=", Geopoint(1.5, 2.5))),
    ),
    (
        "positional",
        "SELECT * FROM K WHERE a = @1 AND b = @2",
        ["x", 2],
        Query(kind="K", filter=AND(F("a", "=", "x"), F("b", "=", 2))),
    ),
    (
        "named-and-positional",
        "SELECT * FROM K WHERE a = @name AND b = @1",
        {"name": "x", 1: 2},
        Query(kind="K", filter=AND(F("a", "=", "x"), F("b", "=", 2))),
    ),
    (
        "binding-used-twice",
        "SELECT * FROM K WHERE a = @v OR b = @v",
        {"v": 1},
        Query(kind="K", filter=OR(F("a", "=", 1), F("b", "=", 1))),
    ),
    ("binding-dollar-name", "SELECT * FROM K WHERE a = @$x_1", {"$x_1": 1}, Query(kind="K", filter=F("a", "=", 1))),
    ("whitespace", "\n SELECT\t*\nFROM K\r\n", None, K),
]


@pytest.mark.parametrize(("text", "bindings", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse(text: str, bindings: Any, expected: Query) -> None:
    assert parse(text, bindings) == expected


def test_key_literal_takes_the_query_namespace() -> None:
    query = parse("SELECT * FROM K WHERE k = KEY(A, 1)", namespace="ns")
    assert query == Query(kind="K", namespace="ns", filter=F("k", "=", Key.of("A", 1, namespace="ns")))


def test_key_literal_namespace_wins() -> None:
    query = parse("SELECT * FROM K WHERE k = KEY(NAMESPACE(''), A, 1)", namespace="ns")
    assert query.filter == F("k", "=", Key.of("A", 1))


def test_numbers_are_numbers_not_strings() -> None:
    """php-gds compared unquoted numbers as strings."""
    value = parse("SELECT * FROM K WHERE n = 5").filter.value  # type: ignore[union-attr]
    assert value == 5 and type(value) is int
    assert type(parse("SELECT * FROM K WHERE n = 5.0").filter.value) is float  # type: ignore[union-attr]


def test_key_literal_is_a_key_not_a_string() -> None:
    """php-gds turned KEY(...) into a string."""
    assert isinstance(parse("SELECT * FROM K WHERE k = KEY(A, 1)").filter.value, Key)  # type: ignore[union-attr]


def test_gql_source_is_recorded_with_converted_bindings() -> None:
    text = "SELECT * FROM K WHERE a = @x AND b IN @1 AND __key__ HAS ANCESTOR @p LIMIT @c"
    when = dt.datetime(2020, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    query = parse(text, {"x": when, 1: ("a", "b"), "p": FakeEntity(ANCESTOR), "c": Cursor(b"z")})
    assert query.gql == GqlSource(
        text,
        named=(("x", dt.datetime(2020, 1, 1, tzinfo=UTC)), ("p", ANCESTOR), ("c", Cursor(b"z"))),
        positional=(["a", "b"],),
    )
    assert query.gql.named[0][1].tzinfo is UTC  # type: ignore[union-attr]


# (id, gql, bindings, message that str(GQLError) must contain, 0-based position)
ERRORS: list[tuple[str, str, Any, str, int | None]] = [
    ("misspelt-from", "SELECT * FORM x", None, "expected FROM at column 10 near 'FORM'", 9),
    ("misspelt-where", "SELECT * FROM K WHER a = 1", None, "expected WHERE at column 17 near 'WHER'", 16),
    ("empty", "", None, "expected SELECT at column 1 near the end of the query", 0),
    ("no-select", "FROM K", None, "expected SELECT at column 1 near 'FROM'", 0),
    ("select-nothing", "SELECT FROM K", None, "expected '*', __key__ or a property name at column 8 near 'FROM'", 7),
    ("trailing-comma", "SELECT a, FROM K", None, "expected a property name at column 11 near 'FROM'", 10),
    ("distinct-star", "SELECT DISTINCT * FROM K", None, "SELECT DISTINCT needs the properties to project", 16),
    ("duplicate-projection", "SELECT a, a FROM K", None, "property 'a' is listed twice at column 8", 7),
    ("no-kind", "SELECT * FROM", None, "expected a kind at column 14 near the end of the query", 13),
    ("dotted-kind", "SELECT * FROM a.b", None, "expected WHERE, ORDER BY, LIMIT, OFFSET or the end of the query at column 16 near '.'", 15),
    (
        "reserved-property",
        "SELECT * FROM K WHERE order = 1",
        None,
        "expected a condition at column 23 near 'order' (ORDER is a reserved word; quote it as `order`",
        22,
    ),
    ("reserved-kind", "SELECT * FROM Order", None, "ORDER is a reserved word; quote it as `Order`", 14),
    ("property-vs-property", "SELECT * FROM K WHERE a = b", None, "not with another property", 26),
    ("missing-value", "SELECT * FROM K WHERE a =", None, "expected a value at column 26 near the end of the query", 25),
    ("missing-and", "SELECT * FROM K WHERE a = 1 b = 2", None, "expected AND, OR, ORDER BY, LIMIT, OFFSET or the end of the query at column 29 near 'b'", 28),
    ("no-operator", "SELECT * FROM K WHERE a 1", None, "expected a comparison (=, <, <=, >, >=, !=, IN, NOT IN, CONTAINS, HAS ANCESTOR or IS NULL) at column 25 near '1'", 24),
    ("diamond", "SELECT * FROM K WHERE a <> 1", None, "expected a value at column 26 near '>'", 25),
    ("bang", "SELECT * FROM K WHERE a ! 1", None, "expected '=' after '!' at column 25", 24),
    ("is-not-null", "SELECT * FROM K WHERE a IS NOT NULL", None, "IS NOT NULL is not GQL; write a != NULL", 27),
    ("unclosed-paren", "SELECT * FROM K WHERE (a = 1", None, "expected AND, OR or ')' to close the '(' at column 23 at column 29 near the end of the query", 28),
    ("extra-paren", "SELECT * FROM K WHERE a = 1)", None, "near ')'", 27),
    ("too-deep", "SELECT * FROM K WHERE " + "(" * 100 + "a = 1" + ")" * 100, None, "nested more than 64 parentheses deep", None),
    ("not-in-scalar", "SELECT * FROM K WHERE a NOT IN 5", None, "NOT IN needs ARRAY(...) or a bound list, got int 5 at column 32", 31),
    ("bare-on", "SELECT on FROM K", None, "ON is a reserved word", 7),
    ("vertical-tab", "SELECT __key__\vFROM K", None, "unexpected character '\\x0b'", 14),
    ("in-empty", "SELECT * FROM K WHERE a IN @v", {"v": []}, "IN needs at least one value; @v is empty", 27),
    ("empty-array", "SELECT * FROM K WHERE a IN ARRAY()", None, "expected a value at column 34 near ')'", 33),
    ("array-with-eq", "SELECT * FROM K WHERE a = ARRAY(1)", None, "a list (ARRAY(...)) goes only with IN or NOT IN at column 27", 26),
    ("list-binding-with-eq", "SELECT * FROM K WHERE a = @v", {"v": [1]}, "a list (@v) goes only with IN or NOT IN at column 27", 26),
    ("nested-array", "SELECT * FROM K WHERE a IN ARRAY(ARRAY(1))", None, "ARRAY(...) cannot contain another ARRAY", 33),
    ("list-in-array", "SELECT * FROM K WHERE a IN ARRAY(@v)", {"v": [1]}, "ARRAY(...) items must be single values; @v is a list", 33),
    ("ancestor-not-key", "SELECT * FROM K WHERE a HAS ANCESTOR KEY(A, 1)", None, "apply to __key__, not to 'a'", 22),
    ("ancestor-needs-key", "SELECT * FROM K WHERE __key__ HAS ANCESTOR 'x'", None, "need a key, got str 'x'", 43),
    ("has-descendant-forward", "SELECT * FROM K WHERE __key__ HAS DESCENDANT KEY(A, 1)", None, "HAS DESCENDANT takes the key first", 34),
    ("descendant-not-key-prop", "SELECT * FROM K WHERE KEY(A, 1) HAS DESCENDANT a", None, "apply to __key__, not to 'a'", 47),
    ("key-vs-int", "SELECT * FROM K WHERE __key__ = 5", None, "__key__ compares only with keys, got int 5", 32),
    ("incomplete-key", "SELECT * FROM K WHERE k = @v", {"v": Key.of("A")}, "is incomplete", 26),
    ("key-odd-path", "SELECT * FROM K WHERE k = KEY(A)", None, "expected ',' at column 32 near ')'", 31),
    ("key-bad-id", "SELECT * FROM K WHERE k = KEY(A, 0)", None, "bad key element: key id 0 is out of range", 30),
    ("key-reserved-name", "SELECT * FROM K WHERE k = KEY(A, '__x__')", None, "bad key element: key name '__x__' is reserved", 30),
    ("key-binding-inside", "SELECT * FROM K WHERE k = KEY(A, @v)", {"v": 1}, "KEY(...) takes literals; bind the whole key instead", 33),
    ("key-double-id", "SELECT * FROM K WHERE k = KEY(A, 1.5)", None, "expected an integer id or a string name at column 34 near '1.5'", 33),
    ("unterminated-string", "SELECT * FROM K WHERE a = 'abc", None, "unterminated string starting at column 27", 26),
    ("unterminated-name", "SELECT * FROM `K", None, "unterminated quoted name starting at column 15", 14),
    ("empty-quoted-name", "SELECT * FROM ``", None, "empty quoted name", 14),
    ("bad-escape", r"SELECT * FROM K WHERE a = 'a\qb'", None, "unknown escape '\\q' in string at column 29", 28),
    ("bad-character", "SELECT * FROM K WHERE a = 1;", None, "unexpected character ';' at column 28", 27),
    ("malformed-number", "SELECT * FROM K WHERE a = 12abc", None, "malformed number '12abc' at column 27", 26),
    ("int-too-big", "SELECT * FROM K WHERE a = 9223372036854775808", None, "does not fit in 64 bits", 26),
    ("int-huge", "SELECT * FROM K WHERE a = " + "9" * 5000, None, "does not fit in 64 bits", 26),
    ("datetime-no-zone", "SELECT * FROM K WHERE t = DATETIME('2020-01-01T00:00:00')", None, "has no timezone", 35),
    ("datetime-bad", "SELECT * FROM K WHERE t = DATETIME('yesterday')", None, "is not a date and time", 35),
    ("datetime-impossible", "SELECT * FROM K WHERE t = DATETIME('2020-02-30T00:00:00Z')", None, "is not a valid moment", 35),
    ("datetime-nanos", "SELECT * FROM K WHERE t = DATETIME('2020-01-01T00:00:00.1234567Z')", None, "finer than microseconds", 35),
    # Refused by the Firestore emulator ("does not match pattern", "zero offset must be Z"):
    ("datetime-space", "SELECT * FROM K WHERE t = DATETIME('2020-01-01 00:00:00Z')", None, "is not a date and time", 35),
    ("datetime-plus-zero", "SELECT * FROM K WHERE t = DATETIME('2020-01-01T00:00:00+00:00')", None, "zero offset", 35),
    ("datetime-minus-zero", "SELECT * FROM K WHERE t = DATETIME('2020-01-01T00:00:00.5-00:00')", None, "zero offset", 35),
    ("datetime-not-string", "SELECT * FROM K WHERE t = DATETIME(5)", None, "expected a string literal at column 36 near '5'", 35),
    ("blob-bad", "SELECT * FROM K WHERE b = BLOB('not base64!')", None, "BLOB at column 32 is not valid base64", 31),
    # The Firestore emulator reads BLOB literals as URL-safe base64 without padding: it refuses these.
    ("blob-padded", "SELECT * FROM K WHERE b = BLOB('aGk=')", None, "BLOB at column 32 is not valid base64", 31),
    ("blob-standard-alphabet", "SELECT * FROM K WHERE b = BLOB('+/8')", None, "BLOB at column 32 is not valid base64", 31),
    ("blob-one-char-over", "SELECT * FROM K WHERE b = BLOB('Y')", None, "BLOB at column 32 is not valid base64", 31),
    ("order-without-by", "SELECT * FROM K ORDER a", None, "expected BY at column 23 near 'a'", 22),
    ("offset-before-limit", "SELECT * FROM K OFFSET 3 LIMIT 5", None, "LIMIT must come before OFFSET (write LIMIT n OFFSET m) at column 26", 25),
    ("order-after-limit", "SELECT * FROM K LIMIT 1 ORDER BY a", None, "expected OFFSET or the end of the query at column 25 near 'ORDER' (ORDER is out of place: clauses go SELECT, FROM, WHERE, ORDER BY, then LIMIT and OFFSET)", 24),
    ("limit-twice", "SELECT * FROM K LIMIT 1 LIMIT 2", None, "LIMIT given twice at column 25", 24),
    ("limit-negative", "SELECT * FROM K LIMIT -1", None, "LIMIT -1 must not be negative", 22),
    ("limit-comma", "SELECT * FROM K LIMIT 10, 5", None, "LIMIT takes one count, not 'offset, count'", 24),
    ("limit-string", "SELECT * FROM K LIMIT 'x'", None, "expected an integer or a binding after LIMIT at column 23", 22),
    ("limit-bound-str", "SELECT * FROM K LIMIT @n", {"n": "5"}, "LIMIT binding @n must be an integer or a Cursor, got str '5'", 22),
    ("limit-bound-bool", "SELECT * FROM K LIMIT @n", {"n": True}, "must be an integer or a Cursor, got bool True", 22),
    ("limit-bytes-not-cursor", "SELECT * FROM K LIMIT @n", {"n": b"c"}, "got bytes b'c'", 22),
    ("first-two-ints", "SELECT * FROM K LIMIT FIRST(1, 2)", None, "LIMIT FIRST(a, b) takes one cursor and one integer", 22),
    ("offset-int-plus", "SELECT * FROM K OFFSET 1 + 2", None, "OFFSET a + b needs a bound Cursor before '+'", 23),
    (
        "offset-plus-cursor",
        "SELECT * FROM K OFFSET @a + @b",
        {"a": Cursor(b"a"), "b": Cursor(b"b")},
        "needs an integer after '+', not a Cursor",
        28,
    ),
    ("cursor-as-value", "SELECT * FROM K WHERE a = @c", {"c": Cursor(b"c")}, "a Cursor (@c) goes only in LIMIT or OFFSET", 26),
    ("unbound-named", "SELECT * FROM K WHERE a = @missing", {"other": 1}, "no value bound for @missing at column 27", 26),
    ("unbound-positional", "SELECT * FROM K WHERE a = @2", [1], "no value bound for @2 at column 27", 26),
    ("unused-positional", "SELECT * FROM K WHERE a = @1", [1, 2], "binding @2 is never used in the query", None),
    ("positional-gap", "SELECT * FROM K WHERE a = @1 AND b = @3", {1: 1, 3: 3}, "without gaps; @2 missing", None),
    ("at-zero", "SELECT * FROM K WHERE a = @0", None, "positional binding @0 at column 27 is out of range", 26),
    ("bare-at", "SELECT * FROM K WHERE a = @", None, "expected a binding name or number after '@' at column 27", 26),
    ("reserved-binding", "SELECT * FROM K WHERE a = @__x__", None, "binding name @__x__ at column 27 is reserved", 26),
    ("naive-datetime", "SELECT * FROM K WHERE a = @t", {"t": dt.datetime(2020, 1, 1)}, "binding @t: naive datetime", None),
    ("date-binding", "SELECT * FROM K WHERE a = @t", {"t": dt.date(2020, 1, 1)}, "binding @t: datetime.date(2020, 1, 1) is a date", None),
    ("unbindable", "SELECT * FROM K WHERE a = @v", {"v": object()}, "binding @v: cannot bind object", None),
    ("set-binding", "SELECT * FROM K WHERE a IN @v", {"v": {1}}, "binding @v: cannot bind set", None),
    ("nested-list-binding", "SELECT * FROM K WHERE a IN @v", {"v": [[1]]}, "binding @v: a list may not contain a list", None),
    ("int-binding-too-big", "SELECT * FROM K WHERE a = @v", {"v": 2**64}, "binding @v: integer 18446744073709551616 does not fit", None),
    ("entity-without-key", "SELECT * FROM K WHERE a = @v", {"v": FakeEntity(None)}, "binding @v: FakeEntity has no complete key", None),
    ("bindings-str", "SELECT * FROM K", "abc", "bindings must be a mapping or a sequence, not str", None),
    ("binding-key-type", "SELECT * FROM K", {1.5: 1}, "binding key 1.5 must be a name", None),
    ("binding-bad-name", "SELECT * FROM K", {"a-b": 1}, "binding name 'a-b' is not a GQL name", None),
    ("aggregation", "SELECT COUNT(*) FROM K", None, "COUNT(...) makes this an aggregation query; parse it with gql.parse_aggregation()", 7),
    ("aggregate-over", "AGGREGATE COUNT(*) OVER (SELECT * FROM K)", None, "AGGREGATE ... OVER is an aggregation query; parse it with gql.parse_aggregation()", 0),
    ("trailing-junk", "SELECT * FROM K LIMIT 1 OFFSET 2 x", None, "expected the end of the query at column 34 near 'x'", 33),
    ("long-token-shortened", "SELECT * FROM K " + "x" * 100, None, "near '" + "x" * 30 + "...'", 16),
]


@pytest.mark.parametrize(
    ("text", "bindings", "message", "position"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_errors(text: str, bindings: Any, message: str, position: int | None) -> None:
    with pytest.raises(GQLError) as caught:
        parse(text, bindings)
    assert message in str(caught.value)
    if position is not None:
        assert caught.value.position == position


def test_a_named_binding_the_text_never_uses_is_ignored_and_a_positional_one_refused() -> None:
    """As Datastore reads them (the v1 reference's ``GqlQuery``: every named
    site needs a parameter "but not necessarily the inverse"; for positional
    ones "the inverse must also be true") and as the Firestore emulator
    answers (``Unused positional binding: 2.``): an extra named binding
    changes nothing, in a query or an aggregation, with positional
    bindings beside it too; an extra positional one is refused."""
    plain = parse("SELECT * FROM K WHERE a = @x", {"x": 1})
    extra = parse("SELECT * FROM K WHERE a = @x", {"x": 1, "extra": 2})
    assert (extra.filter, extra.order, extra.limit) == (plain.filter, plain.order, plain.limit)
    assert parse("SELECT * FROM K", {"unused": [1, 2]}).filter is None
    mixed = parse("SELECT * FROM K WHERE a = @1", {1: 5, "extra": "x"})
    assert mixed.filter == PropertyFilter("a", "=", 5)
    assert parse_aggregation("SELECT COUNT(*) FROM K WHERE a = @a", {"a": 1, "b": 2}).query.filter == PropertyFilter("a", "=", 1)
    with pytest.raises(GQLError, match="binding @2 is never used in the query"):
        parse("SELECT * FROM K WHERE a = @1", [1, 2])
    with pytest.raises(GQLError, match="binding @1 is never used in the query"):
        parse("SELECT * FROM K", [1])


def test_not_text() -> None:
    with pytest.raises(GQLError, match="GQL must be text"):
        parse(b"SELECT *")  # type: ignore[arg-type]


# --- to_gql --------------------------------------------------------------


def test_to_gql_binds_every_value() -> None:
    query = Query(
        kind="K",
        filter=AND(F("a", "=", "x' OR 1=1 --"), F("__key__", "HAS_ANCESTOR", ANCESTOR), F("c", "IN", (1, 2))),
        order=(Order("a", True),),
        limit=5,
        offset=2,
        start_cursor=b"s",
    )
    text, bindings = to_gql(query)
    assert text == (
        "SELECT * FROM `K` WHERE `a` = @v1 AND __key__ HAS ANCESTOR @v2 AND `c` IN @v3 "
        "ORDER BY `a` DESC LIMIT @limit OFFSET @start_cursor + @offset"
    )
    assert bindings == {
        "v1": "x' OR 1=1 --",
        "v2": ANCESTOR,
        "v3": [1, 2],
        "limit": 5,
        "start_cursor": Cursor(b"s"),
        "offset": 2,
    }
    assert parse(text, bindings) == query


@pytest.mark.parametrize(
    ("query", "text"),
    [
        (Query(), "SELECT *"),
        (Query(keys_only=True), "SELECT __key__"),
        (Query(projection=("a", "b"), distinct_on=("a", "b")), "SELECT DISTINCT `a`, `b`"),
        (Query(projection=("a", "b"), distinct_on=("b",)), "SELECT DISTINCT ON (`b`) `a`, `b`"),
        (Query(distinct_on=("b",)), "SELECT DISTINCT ON (`b`) *"),
        (Query(kind="a`b\\c"), "SELECT * FROM `a``b\\\\c`"),
        (Query(kind="line\nbreak", order=(Order("a\nb"),)), "SELECT * FROM `line\\nbreak` ORDER BY `a\\nb` ASC"),
        (Query(end_cursor=b"e"), "SELECT * LIMIT @end_cursor"),
        (Query(limit=3, end_cursor=b"e"), "SELECT * LIMIT FIRST(@limit, @end_cursor)"),
        (Query(offset=3), "SELECT * OFFSET @offset"),
        (Query(start_cursor=b"s"), "SELECT * OFFSET @start_cursor"),
        (
            Query(filter=OR(AND(F("a", "=", 1), F("b", "=", 2)), F("c", "NOT_IN", (3,)))),
            "SELECT * WHERE (`a` = @v1 AND `b` = @v2) OR `c` NOT IN @v3",
        ),
    ],
    ids=["star", "keys", "distinct", "distinct-on", "distinct-on-star", "escaped-kind", "line-break-in-names", "end-cursor", "first", "offset", "start-cursor", "and-in-or"],
)
def test_to_gql_text(query: Query, text: str) -> None:
    printed, bindings = to_gql(query)
    assert printed == text
    assert parse(printed, bindings) == query


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (Query(keys_only=True, projection=("a",)), "cannot be keys_only and have a projection"),
        (Query(filter=CompositeFilter("AND", ())), "cannot print an empty AND filter"),
        (Query(kind="K", order=(Order(""),)), "cannot print '' as a GQL name"),  # (kind "" is kindless, as Datastore reads it)
        (Query(limit=-1), "cannot print limit=-1"),
    ],
    ids=["keys-and-projection", "empty-and", "empty-kind", "negative-limit"],
)
def test_to_gql_refuses_invalid_queries(query: Query, message: str) -> None:
    with pytest.raises(GQLError, match=message):
        to_gql(query)


# --- property tests ------------------------------------------------------

names = st.text(min_size=1, max_size=12).filter(lambda s: s != "__key__")
kinds_in_keys = st.text(min_size=1, max_size=8).filter(lambda s: not (s.startswith("__") and s.endswith("__")))
key_names = st.text(min_size=1, max_size=8).filter(lambda s: not (s.startswith("__") and s.endswith("__")))
ids_or_names = st.one_of(st.integers(-(2**63), 2**63 - 1).filter(bool), key_names)  # any id but 0
#: What Datastore takes as a namespace: [0-9A-Za-z._-]{0,100}, not __x__.
namespaces = st.from_regex(r"[0-9A-Za-z._-]{0,6}", fullmatch=True).filter(lambda s: not (s.startswith("__") and s.endswith("__")))
keys = st.builds(
    lambda path, ns: Key.of(*[x for pair in path for x in pair], namespace=ns),
    st.lists(st.tuples(kinds_in_keys, ids_or_names), min_size=1, max_size=3),
    namespaces,
)
datetimes = st.datetimes(
    min_value=dt.datetime(2, 1, 1),
    max_value=dt.datetime(9998, 12, 31),
    timezones=st.builds(lambda m: dt.timezone(dt.timedelta(minutes=m)), st.integers(-23 * 60, 23 * 60)),
)
geopoints = st.builds(
    Geopoint,
    st.floats(-90, 90, allow_nan=False),
    st.floats(-180, 180, allow_nan=False),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=10),
    st.binary(max_size=10),
    datetimes,
    keys,
    geopoints,
)
comparisons = st.sampled_from(["=", "<", "<=", ">", ">=", "!="])


def property_filters() -> st.SearchStrategy[PropertyFilter]:
    plain = st.one_of(
        st.builds(PropertyFilter, names, comparisons, scalars),
        st.builds(PropertyFilter, names, st.sampled_from(["IN", "NOT_IN"]), st.lists(scalars, min_size=1, max_size=4).map(tuple)),
    )
    on_key = st.one_of(
        st.builds(PropertyFilter, st.just("__key__"), comparisons, keys),
        st.builds(PropertyFilter, st.just("__key__"), st.sampled_from(["IN", "NOT_IN"]), st.lists(keys, min_size=1, max_size=3).map(tuple)),
        st.builds(PropertyFilter, st.just("__key__"), st.just("HAS_ANCESTOR"), keys),
    )
    return st.one_of(plain, on_key)


def canonical(op: str, children: list[Any]) -> Any:
    """Group children the way the parser would: flattened, never single."""
    flat: list[Any] = []
    for child in children:
        flat.extend(child.filters if isinstance(child, CompositeFilter) and child.op == op else [child])
    return flat[0] if len(flat) == 1 else CompositeFilter(op, tuple(flat))


filters = st.recursive(
    property_filters(),
    lambda inner: st.builds(canonical, st.sampled_from(["AND", "OR"]), st.lists(inner, min_size=2, max_size=3)),
    max_leaves=8,
)
unique_names = st.lists(names, min_size=1, max_size=3, unique=True)


@st.composite
def queries(draw: st.DrawFn) -> Query:
    shape = draw(st.sampled_from(["entities", "keys", "projection"]))
    projection: tuple[str, ...] = ()
    keys_only = shape == "keys"
    if shape == "projection":
        projection = tuple(draw(unique_names))
    distinct = draw(st.sampled_from(["none", "on", "all"]))
    if distinct == "all" and projection:
        distinct_on = projection
    elif distinct == "none":
        distinct_on = ()
    else:
        distinct_on = tuple(draw(unique_names))
    return Query(
        kind=draw(st.none() | names),
        namespace=draw(namespaces),
        filter=draw(st.none() | filters),
        order=tuple(draw(st.lists(st.builds(Order, names | st.just("__key__"), st.booleans()), max_size=3))),
        projection=projection,
        distinct_on=distinct_on,
        keys_only=keys_only,
        limit=draw(st.none() | st.integers(0, 2**63 - 1)),
        offset=draw(st.integers(0, 2**31)),
        start_cursor=draw(st.none() | st.binary(max_size=8)),
        end_cursor=draw(st.none() | st.binary(max_size=8)),
    )


@settings(max_examples=size(40, 200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(queries())
def test_to_gql_round_trips(query: Query) -> None:
    text, bindings = to_gql(query)
    assert parse(text, bindings, namespace=query.namespace) == query


@settings(max_examples=size(40, 200), deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_raises_only_gql_error(text: str) -> None:
    try:
        parse(text)
    except GQLError:
        pass


TOKENS = [
    "SELECT", "select", "DISTINCT", "ON", "*", "__key__", "a", "b", "`q q`", "FROM", "K", "WHERE", "AND", "and",
    "OR", "NOT", "IN", "IS", "NULL", "CONTAINS", "HAS", "ANCESTOR", "DESCENDANT", "ORDER", "BY", "ASC", "DESC",
    "LIMIT", "OFFSET", "FIRST", "(", ")", ",", "+", ".", "=", "<", "<=", ">", ">=", "!=", "!", "@", "@a", "@1",
    "@2", "@c", "1", "-1", "0", "1.5", "1e3", "'s'", '"s"', "'", "TRUE", "false", "KEY", "KEY(A, 1)", "ARRAY",
    "BLOB", "BLOB('aGk=')", "BLOB('aGk')", "DATETIME", "DATETIME('2020-01-01T00:00:00Z')", "PROJECT", "NAMESPACE", "COUNT",
    "AGGREGATE", "`", "\\", ";", "9999999999999999999999",
]


@settings(max_examples=size(60, 300), deadline=None)
@given(
    st.lists(st.sampled_from(TOKENS), max_size=25),
    st.sampled_from([None, {"a": 1}, {"a": [1, 2], "c": Cursor(b"c")}, [1], [Cursor(b"c"), 5], {1: ANCESTOR}]),
)
def test_token_soup_raises_only_gql_error(tokens: list[str], bindings: Any) -> None:
    try:
        parse(" ".join(tokens), bindings)
    except GQLError:
        pass
