"""The aggregation grammar of GQL (``SELECT COUNT(*) ...`` and ``AGGREGATE
... OVER (...)``), on top of ``_gql_parser``'s, for ``gql.parse_aggregation``.

Why a parser of its own: an aggregation is a list of aggregations around an
ordinary query, so it reuses every rule of the ordinary grammar and adds
Datastore's own for aggregations, checked here where the error can still
name the column: one to five aggregations, ``COUNT(*)`` only,
``COUNT_UP_TO`` with a non-negative integer literal, no ``__key__`` to sum,
aliases distinct once the defaults (``property_N``) are counted, no
``__x__`` aliases, and the keywords Datastore's GQL reserves in an alias or
an aggregated property. Each was measured on the Firestore emulator in
Datastore mode; see ``gds_counter.gds.gql`` for the grammar.
"""

from __future__ import annotations

from typing import Any

import attrs

from gds_counter.gateway.keys import RESERVED_NAME
from gds_counter.gateway.query import KEY_PROPERTY, MAX_AGGREGATIONS, Aggregation, AggregationQuery, Query
from gds_counter.gds._gql_conditions import RESERVED
from gds_counter.gds._gql_lexer import END, INT, PARAM, WORD, Token
from gds_counter.gds._gql_parser import AGGREGATES, Parser, Parts

__all__ = ["AGGREGATION_RESERVED", "AggregationParser", "AggregationParts"]

#: Unquoted, these cannot name an alias or an aggregated property: Cloud
#: Datastore's GQL refuses them there (measured on the Firestore emulator),
#: so text we accept never fails in production.
AGGREGATION_RESERVED = RESERVED | frozenset(
    "AS OVER AGGREGATE COUNT COUNT_UP_TO SUM AVG ON BY ANCESTOR DESCENDANT".split()
)
_AGGREGATIONS_EXPECTED = "COUNT(*), COUNT_UP_TO(n), SUM(property) or AVG(property)"


@attrs.frozen
class AggregationParts:
    """An aggregation query: the aggregations, and the parts of the query
    they run over."""

    aggregations: tuple[Aggregation, ...]
    parts: Parts

    def build(self, namespace: str, gql: Any = None) -> AggregationQuery:
        return AggregationQuery(self.parts.build(namespace), self.aggregations, gql=gql)


class AggregationParser(Parser):
    """Recursive descent for aggregation queries; the query they run over is
    the ordinary grammar's (``Parser.select_query``)."""

    def aggregation_query(self) -> AggregationParts:
        """``SELECT <aggregations> [FROM k] [WHERE ...]`` or ``AGGREGATE
        <aggregations> OVER ( <query> )``, the whole text."""
        if self.at_word("AGGREGATE"):
            self.advance()
            aggregations = self.aggregation_list()
            if not self.at_word("OVER"):
                self.fail("',' or OVER")
            self.advance()
            self.expect_punct("(", "'(' (the query to aggregate over, in parentheses)")
            if not self.at_word("SELECT"):
                self.fail("SELECT (the query to aggregate over)")
            parts = self.select_query(closing=True)
            self.expect_punct(")", "')' to close OVER (")
            if self.tok.kind != END:
                self.fail("the end of the query", hint="AGGREGATE ... OVER (...) ends with its ')'")
            return AggregationParts(aggregations, parts)
        self.expect_word("SELECT")
        if not self.at_call(*AGGREGATES):
            distinct = self.at_word("DISTINCT") and self.at_word(*AGGREGATES, token=self.peek())
            hint = "aggregations cannot be DISTINCT" if distinct else "this is an ordinary query; parse it with gql.parse()"
            self.fail(_AGGREGATIONS_EXPECTED, hint=hint)
        aggregations = self.aggregation_list()
        parts = Parts()
        clauses = ["AS"] * (aggregations[-1].alias is None) + ["','", "FROM", "WHERE", "the end of the query"]
        if self.at_word("FROM"):
            self.advance()
            parts.kind = self.name("a kind")
            clauses = ["WHERE", "the end of the query"]
        if self.at_word("WHERE"):
            self.advance()
            parts.filter = self.disjunction()
            clauses = ["AND", "OR", "the end of the query"]
        if self.at_word("ORDER", "LIMIT", "OFFSET"):
            word = "ORDER BY" if self.tok.word == "ORDER" else self.tok.word
            self.error(
                f"SELECT {aggregations[0].kind}(...) takes no {word}: Cloud Datastore refuses it there; "
                f"write AGGREGATE ... OVER (SELECT ... {word} ...)",
                self.tok,
            )
        if self.tok.kind != END:
            self.fail_clause(clauses)
        return AggregationParts(aggregations, parts)

    def aggregation_list(self) -> tuple[Aggregation, ...]:
        """Aggregations separated by commas; one to five, aliases distinct
        (the defaults, ``property_N``, included)."""
        items: list[tuple[Aggregation, Token]] = []
        while True:
            start = self.tok
            if len(items) == MAX_AGGREGATIONS:
                self.error(f"an aggregation query has at most {MAX_AGGREGATIONS} aggregations", start)
            items.append(self.aggregation())
            if not self.at_punct(","):
                break
            self.advance()
        aliases = AggregationQuery(Query(), [item for item, _ in items]).aliases()
        for i, (_, token) in enumerate(items):
            if aliases[i] in aliases[:i]:
                self.error(
                    f"Aggregation aliases contain duplicate alias: {aliases[i]}. (Aggregations without AS are "
                    "named property_1, property_2, ...)",
                    token,
                )
        return tuple(item for item, _ in items)

    def aggregation(self) -> tuple[Aggregation, Token]:
        """One aggregation and its alias; the token is where a duplicate
        alias is reported (the alias, else the aggregation)."""
        start = self.tok
        if self.at_call("COUNT"):
            self.advance()
            self.advance()
            if not self.at_punct("*"):
                self.fail("'*'", hint="COUNT counts whole entities, COUNT(*); to count those with a property, filter on it")
            self.advance()
            item = Aggregation("COUNT")
        elif self.at_call("COUNT_UP_TO"):
            self.advance()
            self.advance()
            token = self.tok
            if token.kind != INT:
                hint = "Cloud Datastore takes a literal here, not a binding" if token.kind == PARAM else ""
                self.fail("an integer, the most to count", hint=hint)
            if token.value < 0:
                self.error(f"COUNT_UP_TO({token.value}) must not be negative", token)
            self.advance()
            item = Aggregation("COUNT_UP_TO", up_to=token.value)
        elif self.at_call("SUM", "AVG"):
            kind = self.advance().word or ""
            self.advance()
            token = self.tok
            name = self.strict_name("a property name", dotted=True)
            if name == KEY_PROPERTY:
                self.error(f"Aggregations are not supported for the property: __key__ ({kind})", token)
            item = Aggregation(kind, property=name)
        else:
            self.fail(_AGGREGATIONS_EXPECTED)
        self.expect_punct(")")
        if not self.at_word("AS"):
            return item, start
        self.advance()
        token = self.tok
        alias = self.strict_name("an alias after AS")
        if RESERVED_NAME.match(alias):
            self.error(f"alias {alias!r} is reserved (names of the form __x__ belong to Datastore)", token)
        return attrs.evolve(item, alias=alias), token

    def strict_name(self, what: str, *, dotted: bool = False) -> str:
        """A name where Datastore's GQL reserves more words: quote them."""
        segments = []
        while True:
            token = self.tok
            if token.kind == WORD and token.word in AGGREGATION_RESERVED:
                self.fail(what, hint=f"{token.word} is a reserved word here; quote it as `{token.value}`")
            segments.append(self.name(what))
            if not (dotted and self.at_punct(".")):
                return ".".join(segments)
            self.advance()
            what = "a property name after '.'"
