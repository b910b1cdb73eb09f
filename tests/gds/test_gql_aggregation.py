"""GQL aggregation queries: ``gql.parse_aggregation`` by example, its errors
(each naming the column), ``to_gql`` round trips, and fuzzing.

The grammar and every refusal below follow what Cloud Datastore's GQL does,
measured on the Firestore emulator in Datastore mode: ``SELECT COUNT(*)``
takes only FROM and WHERE, ``COUNT_UP_TO`` only an integer literal, an
alias or aggregated property may not be an unquoted keyword, at most five
aggregations, aliases (the default ``property_N`` included) distinct.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sizes import size
from test_gql import filters, names, queries  # the ordinary grammar's strategies

from gds_counter.errors import BadValueError, GQLError
from gds_counter.gateway._aggregation import check_aggregation
from gds_counter.gateway.keys import Key
from gds_counter.gateway.query import (
    Aggregation,
    AggregationQuery,
    CompositeFilter,
    GqlSource,
    Order,
    PropertyFilter,
    Query,
)
from gds_counter.gds.gql import Cursor, parse, parse_aggregation, to_gql

COUNT, SUM, AVG, UP_TO = Aggregation.count, Aggregation.sum, Aggregation.avg, Aggregation.count_up_to
K = Query(kind="K")


def over(query: Query, *aggregations: Aggregation) -> AggregationQuery:
    return AggregationQuery(query, aggregations)


# --- what parses, and into what ----------------------------------------------------

CASES: list[tuple[str, str, Any, AggregationQuery]] = [
    ("count", "SELECT COUNT(*) FROM K", None, over(K, COUNT())),
    ("lower-case", "select count(*) as n from K", None, over(K, COUNT("n"))),
    ("spaces-in-call", "SELECT COUNT ( * ) AS n FROM K", None, over(K, COUNT("n"))),
    ("no-kind", "SELECT COUNT(*)", None, over(Query(), COUNT())),
    ("up-to", "SELECT COUNT_UP_TO(5) AS n FROM K", None, over(K, UP_TO(5, "n"))),
    ("up-to-zero", "SELECT COUNT_UP_TO(0) FROM K", None, over(K, UP_TO(0))),
    ("sum-avg", "SELECT SUM(pages) AS s, AVG(pages) FROM K", None, over(K, SUM("pages", "s"), AVG("pages"))),
    ("dotted", "SELECT SUM(a.b) FROM K", None, over(K, SUM("a.b"))),
    ("quoted-keyword", "SELECT SUM(`count`) AS `from` FROM K", None, over(K, SUM("count", "from"))),
    ("quoted-alias-odd", "SELECT COUNT(*) AS `a b.c` FROM K", None, over(K, COUNT("a b.c"))),
    ("function-word-alias", "SELECT COUNT(*) AS key, COUNT(*) AS first FROM K", None, over(K, COUNT("key"), COUNT("first"))),
    (
        "where",
        "SELECT COUNT(*) FROM K WHERE a = @a AND b > 2",
        {"a": "x"},
        over(Query(kind="K", filter=CompositeFilter("AND", (PropertyFilter("a", "=", "x"), PropertyFilter("b", ">", 2)))), COUNT()),
    ),
    (
        "five",
        "SELECT COUNT(*), COUNT_UP_TO(1), SUM(a), AVG(a), SUM(b) AS property_9 FROM K",
        None,
        over(K, COUNT(), UP_TO(1), SUM("a"), AVG("a"), SUM("b", "property_9")),
    ),
    ("alias-skips-a-default", "SELECT COUNT(*) AS property_2, COUNT(*) FROM K", None, over(K, COUNT("property_2"), COUNT())),
    ("aggregate-over", "AGGREGATE COUNT(*) OVER (SELECT * FROM K)", None, over(K, COUNT())),
    ("aggregate-lower", "aggregate sum(a) as s over (select * from K)", None, over(K, SUM("a", "s"))),
    (
        "aggregate-everything",
        "AGGREGATE COUNT(*) AS n, AVG(p) OVER (SELECT * FROM K WHERE a IN @v ORDER BY p DESC, __key__ LIMIT @n OFFSET 2)",
        {"v": [1, 2], "n": 10},
        over(
            Query(
                kind="K",
                filter=PropertyFilter("a", "IN", (1, 2)),
                order=(Order("p", True), Order("__key__")),
                limit=10,
                offset=2,
            ),
            COUNT("n"),
            AVG("p"),
        ),
    ),
    (
        "aggregate-cursors",
        "AGGREGATE COUNT(*) OVER (SELECT * FROM K LIMIT @end OFFSET @start + 1)",
        {"end": Cursor(b"e"), "start": Cursor(b"s")},
        over(Query(kind="K", end_cursor=b"e", start_cursor=b"s", offset=1), COUNT()),
    ),
    ("aggregate-keys", "AGGREGATE COUNT(*) OVER (SELECT __key__ FROM K)", None, over(Query(kind="K", keys_only=True), COUNT())),
    (
        "aggregate-distinct",
        "AGGREGATE COUNT(*) OVER (SELECT DISTINCT a FROM K)",
        None,
        over(Query(kind="K", projection=("a",), distinct_on=("a",)), COUNT()),
    ),
    (
        "aggregate-nested-parentheses",
        "AGGREGATE COUNT(*) OVER (SELECT * FROM K WHERE (a = 1 OR (b = 2)))",
        None,
        over(Query(kind="K", filter=CompositeFilter("OR", (PropertyFilter("a", "=", 1), PropertyFilter("b", "=", 2)))), COUNT()),
    ),
    (
        "key-literal-namespace",
        "SELECT COUNT(*) FROM K WHERE __key__ HAS ANCESTOR KEY(P, 'x')",
        None,
        over(Query(kind="K", filter=PropertyFilter("__key__", "HAS_ANCESTOR", Key.of("P", "x"))), COUNT()),
    ),
]


@pytest.mark.parametrize(("text", "bindings", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_aggregation(text: str, bindings: Any, expected: AggregationQuery) -> None:
    assert parse_aggregation(text, bindings) == expected


def test_namespace_and_gql_source() -> None:
    parsed = parse_aggregation("SELECT COUNT(*) FROM K WHERE k = KEY(K, 1) AND a = @1", ["x"], namespace="ns")
    assert parsed.query.namespace == "ns"
    assert parsed.query.filter.filters[0].value == Key.of("K", 1, namespace="ns")  # type: ignore[union-attr]
    assert parsed.gql == GqlSource("SELECT COUNT(*) FROM K WHERE k = KEY(K, 1) AND a = @1", positional=("x",))
    assert parsed.query.gql is None  # the text is the aggregation's, not the nested query's


def test_default_aliases_are_datastores() -> None:
    parsed = parse_aggregation("AGGREGATE COUNT_UP_TO(1) AS a, COUNT_UP_TO(2), COUNT_UP_TO(3) AS c, COUNT(*) OVER (SELECT * FROM K)")
    assert parsed.aliases() == ("a", "property_1", "c", "property_2")


def test_the_aggregation_words_are_names_only_when_quoted() -> None:
    """As the Firestore emulator reads them: bare, they are refused."""
    assert parse("SELECT `count` FROM K WHERE `sum` = 1").projection == ("count",)
    with pytest.raises(GQLError, match="COUNT is a reserved word"):
        parse("SELECT count FROM K")


# --- what does not parse, and where --------------------------------------------------

ERRORS: list[tuple[str, str, Any, str, int | None]] = [
    ("order-in-select-form", "SELECT COUNT(*) FROM K ORDER BY a", None, "takes no ORDER BY", 23),
    ("limit-in-select-form", "SELECT COUNT(*) FROM K WHERE a = 1 LIMIT 2", None, "write AGGREGATE ... OVER (SELECT ... LIMIT ...)", 35),
    ("offset-in-select-form", "SELECT SUM(a) FROM K OFFSET 1", None, "SELECT SUM(...) takes no OFFSET", 21),
    ("up-to-binding", "SELECT COUNT_UP_TO(@n) FROM K", {"n": 1}, "takes a literal here, not a binding", 19),
    ("up-to-negative", "SELECT COUNT_UP_TO(-1) FROM K", None, "COUNT_UP_TO(-1) must not be negative", 19),
    ("up-to-double", "SELECT COUNT_UP_TO(1.5) FROM K", None, "expected an integer, the most to count", 19),
    ("count-property", "SELECT COUNT(a) FROM K", None, "expected '*' at column 14", 13),
    ("mixed-with-property", "SELECT COUNT(*), a FROM K", None, "expected COUNT(*), COUNT_UP_TO(n), SUM(property) or AVG(property) at column 18", 17),
    ("property-first", "SELECT a, COUNT(*) FROM K", None, "this is an ordinary query; parse it with gql.parse()", 7),
    ("ordinary", "SELECT * FROM K", None, "this is an ordinary query", 7),
    ("distinct", "SELECT DISTINCT COUNT(*) FROM K", None, "aggregations cannot be DISTINCT", 7),
    ("string-alias", "SELECT COUNT(*) AS 'n' FROM K", None, "expected an alias after AS at column 20", 19),
    ("keyword-alias", "SELECT COUNT(*) AS from FROM K", None, "FROM is a reserved word here; quote it as `from`", 19),
    ("function-alias", "SELECT COUNT(*) AS count FROM K", None, "COUNT is a reserved word here", 19),
    ("over-alias", "SELECT COUNT(*) AS over FROM K", None, "OVER is a reserved word here", 19),
    ("dotted-alias", "SELECT COUNT(*) AS a.b FROM K", None, "expected ',', FROM, WHERE or the end of the query at column 21", 20),
    ("reserved-alias", "SELECT COUNT(*) AS __n__ FROM K", None, "alias '__n__' is reserved", 19),
    ("missing-as", "SELECT COUNT(*) n FROM K", None, "expected AS, ',', FROM, WHERE or the end of the query at column 17", 16),
    ("keyword-property", "SELECT SUM(count) FROM K", None, "COUNT is a reserved word here", 11),
    ("sum-key", "SELECT SUM(__key__) FROM K", None, "Aggregations are not supported for the property: __key__ (SUM) at column 12", 11),
    ("six", "SELECT COUNT(*), COUNT(*), COUNT(*), COUNT(*), COUNT(*), COUNT(*) FROM K", None, "at most 5 aggregations at column 58", 57),
    ("same-alias", "SELECT COUNT(*) AS n, SUM(a) AS n FROM K", None, "Aggregation aliases contain duplicate alias: n.", 32),
    ("alias-takes-a-default", "SELECT COUNT(*) AS property_1, COUNT(*) FROM K", None, "Aggregation aliases contain duplicate alias: property_1.", 31),
    ("typo", "SELECT COUNT(*) FORM K", None, "expected FROM at column 17 near 'FORM'", 16),
    ("no-aggregation", "AGGREGATE OVER (SELECT * FROM K)", None, "expected COUNT(*), COUNT_UP_TO(n), SUM(property) or AVG(property) at column 11", 10),
    ("no-over", "AGGREGATE COUNT(*) (SELECT * FROM K)", None, "expected ',' or OVER at column 20", 19),
    ("over-without-parentheses", "AGGREGATE COUNT(*) OVER SELECT * FROM K", None, "expected '(' (the query to aggregate over", 24),
    ("over-two-parentheses", "AGGREGATE COUNT(*) OVER ((SELECT * FROM K))", None, "expected SELECT (the query to aggregate over)", 25),
    ("unclosed", "AGGREGATE COUNT(*) OVER (SELECT * FROM K WHERE a = 1", None, "expected AND, OR, ORDER BY, LIMIT, OFFSET or ')' to close OVER ( at column 53", 52),
    ("after-over", "AGGREGATE COUNT(*) OVER (SELECT * FROM K) LIMIT 1", None, "AGGREGATE ... OVER (...) ends with its ')'", 42),
    ("nested-aggregation", "AGGREGATE COUNT(*) OVER (SELECT COUNT(*) FROM K)", None, "an aggregation cannot be nested", 32),
    ("nested-aggregate", "AGGREGATE COUNT(*) OVER (AGGREGATE COUNT(*) OVER (SELECT * FROM K))", None, "expected SELECT", 25),
    ("nested-offset-first", "AGGREGATE COUNT(*) OVER (SELECT * FROM K OFFSET 1 LIMIT 2)", None, "LIMIT must come before OFFSET", 50),
    ("unused-binding", "SELECT COUNT(*) FROM K WHERE a = @1", [1, 2], "binding @2 is never used", None),
    ("unbound", "AGGREGATE COUNT(*) OVER (SELECT * FROM K WHERE a = @1)", None, "no value bound for @1 at column 52", 51),
]


@pytest.mark.parametrize(
    ("text", "bindings", "message", "position"), [e[1:] for e in ERRORS], ids=[e[0] for e in ERRORS]
)
def test_errors(text: str, bindings: Any, message: str, position: int | None) -> None:
    with pytest.raises(GQLError) as caught:
        parse_aggregation(text, bindings)
    assert message in str(caught.value)
    assert caught.value.position == position


@pytest.mark.parametrize(
    ("text", "message", "position"),
    [
        ("SELECT COUNT(*) FROM K", "COUNT(...) makes this an aggregation query; parse it with gql.parse_aggregation()", 7),
        ("SELECT SUM(a) AS s", "SUM(...) makes this an aggregation query", 7),
        ("AGGREGATE COUNT(*) OVER (SELECT * FROM K)", "AGGREGATE ... OVER is an aggregation query", 0),
    ],
)
def test_parse_refuses_aggregations(text: str, message: str, position: int) -> None:
    with pytest.raises(GQLError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")) as caught:
        parse(text)
    assert caught.value.position == position


def test_not_text() -> None:
    with pytest.raises(GQLError, match="GQL must be text"):
        parse_aggregation(None)  # type: ignore[arg-type]


# --- to_gql ----------------------------------------------------------------------


def test_to_gql_prints_the_aggregate_over_form_with_every_value_bound() -> None:
    query = over(Query(kind="K", filter=PropertyFilter("a", "=", "x' OR 1=1"), limit=3), COUNT("n"), UP_TO(7), SUM("a.b", "`s`"))
    text, bindings = to_gql(query)
    assert text == (
        "AGGREGATE COUNT(*) AS `n`, COUNT_UP_TO(7), SUM(`a.b`) AS ```s``` OVER (SELECT * FROM `K` WHERE `a` = @v1 LIMIT @limit)"
    )
    assert bindings == {"v1": "x' OR 1=1", "limit": 3}
    assert parse_aggregation(text, bindings) == query


@pytest.mark.parametrize(
    ("query", "message"),
    [
        (over(K), "1 to 5 aggregations, got 0"),
        (over(K, *[COUNT(f"a{i}") for i in range(6)]), "1 to 5 aggregations, got 6"),
        (over(K, SUM("__key__")), "Aggregations are not supported for the property: __key__"),
        (over(K, UP_TO(-1)), "COUNT_UP_TO limit must be at least 0"),
        (over(K, Aggregation("COUNT_UP_TO")), "COUNT_UP_TO limit must be an int, got NoneType"),
        (over(K, COUNT("x"), SUM("p", "x")), "Aggregation aliases contain duplicate alias: x."),
        (over(K, COUNT("__x__")), "aggregation alias '__x__' is reserved"),
        (over(K, SUM("")), "SUM property must be a non-empty string"),
    ],
)
def test_to_gql_refuses_what_would_not_parse(query: AggregationQuery, message: str) -> None:
    with pytest.raises(GQLError, match="cannot print this aggregation") as caught:
        to_gql(query)
    assert message in str(caught.value)


# --- property tests ------------------------------------------------------------------

aliases = st.none() | names.filter(lambda s: not (s.startswith("__") and s.endswith("__")))
properties = names.filter(lambda s: not (s.startswith("__") and s.endswith("__")))
single = st.one_of(
    st.builds(Aggregation.count, aliases),
    st.builds(Aggregation.count_up_to, st.integers(0, 2**63 - 1), aliases),
    st.builds(Aggregation.sum, properties, aliases),
    st.builds(Aggregation.avg, properties, aliases),
)


def distinct_aliases(items: list[Aggregation]) -> bool:
    resolved = AggregationQuery(Query(), items).aliases()
    return len(set(resolved)) == len(resolved)


def valid(query: AggregationQuery) -> bool:
    """Datastore runs it (SUM/AVG of a projected property, not over keys only...)."""
    try:
        check_aggregation(query)
    except BadValueError:
        return False
    return True


aggregation_queries = st.builds(
    AggregationQuery,
    queries(),
    st.lists(single, min_size=1, max_size=5).filter(distinct_aliases),
).filter(valid)


@settings(max_examples=size(40, 200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(aggregation_queries)
def test_to_gql_round_trips(query: AggregationQuery) -> None:
    text, bindings = to_gql(query)
    assert parse_aggregation(text, bindings, namespace=query.query.namespace) == query


@settings(max_examples=size(20, 100), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(single, min_size=1, max_size=5).filter(distinct_aliases), st.none() | filters)
def test_the_select_form_parses_like_the_aggregate_form(items: list[Aggregation], where: Any) -> None:
    """``SELECT <aggregations> FROM K WHERE ...`` is ``AGGREGATE <aggregations>
    OVER (SELECT * FROM K WHERE ...)``."""
    query = over(Query(kind="K", filter=where), *items)
    text, bindings = to_gql(query)
    head, nested = text.split(" OVER (SELECT * ")
    select_form = "SELECT " + head.removeprefix("AGGREGATE ") + " " + nested.removesuffix(")")
    assert parse_aggregation(select_form, bindings) == query


TOKENS = [
    "SELECT", "AGGREGATE", "OVER", "AS", "COUNT", "COUNT_UP_TO", "SUM", "AVG", "(", ")", "*", ",", "a", "`b c`",
    "FROM", "K", "WHERE", "=", "1", "-1", "@1", "@n", "ORDER", "BY", "LIMIT", "OFFSET", "DISTINCT", "__key__",
    "property_1", "`__x__`", ".", "1.5",
]


@settings(max_examples=size(60, 300), deadline=None)
@given(st.lists(st.sampled_from(TOKENS), max_size=25), st.sampled_from([None, {"n": 1}, [1]]))
def test_token_soup_raises_only_gql_error(tokens: list[str], bindings: Any) -> None:
    for parser in (parse_aggregation, parse):
        try:
            parser(" ".join(tokens), bindings)
        except GQLError:
            pass
