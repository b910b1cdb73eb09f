"""Tokens to the parts of a ``Query``: a recursive-descent parser for the
grammar described in ``gds_counter.gds.gql``.

Why recursive descent: one method per grammar rule keeps ``AND`` binding
tighter than ``OR``, reads a property name only where a name may stand,
and lets every error say what was expected at which column, which is what
php-gds's regular expressions could not do. The parser also checks here
the rules Datastore would only enforce later (``__key__`` compares with
keys, lists only with IN / NOT IN, cursors only in LIMIT and OFFSET), so
the message can still point at the text. Aggregation queries add their own
rules in ``_gql_aggregation``; the ``WHERE`` clause and the values it
compares with are ``_gql_conditions``'s.
"""

from __future__ import annotations

from typing import Any, NoReturn

import attrs

from gds_counter._checks import is_int
from gds_counter.gateway.query import KEY_PROPERTY, Cursor, Filter, Order, Query
from gds_counter.gds._gql_conditions import ConditionParser
from gds_counter.gds._gql_lexer import (
    END,
    INT,
    PARAM,
    Token,
)
from gds_counter.gds._gql_values import describe

__all__ = ["AGGREGATES", "Parser", "Parts"]

#: The aggregation words, keywords before ``(`` (``_gql_aggregation`` parses them).
AGGREGATES = ("COUNT", "COUNT_UP_TO", "SUM", "AVG")



def _distance(a: str, b: str) -> int:
    """Edit distance, for guessing the keyword a typo meant (``FORM``)."""
    previous = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        current = [i]
        for j, cb in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ca != cb)))
        previous = current
    return previous[-1]


@attrs.define
class Parts:
    """What the parser fills in, clause by clause, before ``gql.parse``
    builds the (frozen) ``Query`` with the namespace and ``Query.gql``."""

    kind: str | None = None
    filter: Filter | None = None
    order: tuple[Order, ...] = ()
    projection: tuple[str, ...] = ()
    distinct_on: tuple[str, ...] = ()
    keys_only: bool = False
    limit: int | None = None
    offset: int = 0
    start_cursor: bytes | None = None
    end_cursor: bytes | None = None

    def build(self, namespace: str, gql: Any = None) -> Query:
        return Query(
            kind=self.kind,
            namespace=namespace,
            filter=self.filter,
            order=self.order,
            projection=self.projection,
            distinct_on=self.distinct_on,
            keys_only=self.keys_only,
            limit=self.limit,
            offset=self.offset,
            start_cursor=self.start_cursor,
            end_cursor=self.end_cursor,
            gql=gql,
        )


class Parser(ConditionParser):
    """Recursive descent over the token list; one method per grammar rule
    (a condition's and a value's are ``ConditionParser``'s)."""

    def fail_clause(self, allowed: list[str]) -> NoReturn:
        """Name the one keyword the writer most likely meant (``FORM`` ->
        FROM), or else everything that could come next."""
        word = self.tok.word
        if word is not None and len(word) >= 2:
            for candidate in allowed:
                keyword = candidate.split()[0]
                limit = 1 if len(keyword) <= 3 else 2
                if keyword.isalpha() and keyword.isupper() and _distance(word, keyword) <= limit:
                    self.fail(candidate)
        hint = ""
        if word in ("SELECT", "FROM", "WHERE", "ORDER", "LIMIT", "OFFSET"):
            hint = f"{word} is out of place: clauses go SELECT, FROM, WHERE, ORDER BY, then LIMIT and OFFSET"
        self.fail(", ".join(allowed[:-1]) + " or " + allowed[-1] if len(allowed) > 1 else allowed[0], hint=hint)

    # query

    def query(self) -> Parts:
        """An ordinary query, the whole text."""
        if self.at_word("AGGREGATE"):
            self.error("AGGREGATE ... OVER is an aggregation query; parse it with gql.parse_aggregation()", self.tok)
        token = self.peek()
        if self.at_word("SELECT") and self.at_word(*AGGREGATES, token=token) and self.at_punct("(", self.peek(2)):
            self.error(f"{token.word}(...) makes this an aggregation query; parse it with gql.parse_aggregation()", token)
        return self.select_query(closing=False)

    def select_query(self, *, closing: bool) -> Parts:
        """``SELECT ...`` up to the end of the text, or (``closing``) up to
        the ``)`` that closes ``AGGREGATE ... OVER (``."""
        parts = Parts()
        self.expect_word("SELECT")
        starred = self.select(parts)
        clauses = ["FROM", "WHERE", "ORDER BY", "LIMIT", "OFFSET"]
        extra = [] if starred else ["','"]
        if self.at_word("FROM"):
            self.advance()
            parts.kind = self.name("a kind")
            clauses.remove("FROM")
            extra = []
        if self.at_word("WHERE"):
            self.advance()
            parts.filter = self.disjunction()
            clauses = clauses[clauses.index("WHERE") + 1 :]
            extra = ["AND", "OR"]
        if self.at_word("ORDER"):
            self.advance()
            self.expect_word("BY")
            parts.order = self.order_list()
            clauses = ["LIMIT", "OFFSET"]
            extra = ["','"]
        while self.at_word("LIMIT", "OFFSET"):
            word = self.advance()
            clauses = [c for c in clauses if c in ("LIMIT", "OFFSET")]
            if word.word == "LIMIT" and "OFFSET" not in clauses:
                # Cloud Datastore rejects OFFSET ... LIMIT; accepting it here
                # would make the same text work on SQLite and fail in production.
                self.error("LIMIT must come before OFFSET (write LIMIT n OFFSET m)", word)
            if word.word not in clauses:
                self.error(f"{word.word} given twice", word)
            clauses.remove(word.word)
            extra = []
            self.limit(parts) if word.word == "LIMIT" else self.offset(parts)
        if not (self.at_punct(")") if closing else self.tok.kind == END):
            self.fail_clause(extra + clauses + ["')' to close OVER (" if closing else "the end of the query"])
        return parts

    def select(self, parts: Parts) -> bool:
        """Fill projection, distinct_on and keys_only; True for ``*``."""
        distinct = False
        distinct_on: tuple[str, ...] = ()
        if self.at_word("DISTINCT"):
            self.advance()
            if self.at_call("ON"):
                self.advance()
                self.advance()
                distinct_on = self.name_list("a property name")
                self.expect_punct(")", "',' or ')'")
            else:
                distinct = True
        if self.at_punct("*"):
            if distinct:
                self.fail("a property name", hint="SELECT DISTINCT needs the properties to project, not *")
            self.advance()
            parts.distinct_on = distinct_on
            return True
        if self.at_call(*AGGREGATES):
            # A top-level SELECT COUNT(...) never gets here (see query()).
            why = "aggregations cannot be DISTINCT" if distinct or distinct_on else (
                "an aggregation cannot be nested in the query AGGREGATE ... OVER (...) runs over"
            )
            self.error(f"{self.tok.word}(...) here: {why}", self.tok)
        names = self.name_list("'*', __key__ or a property name")
        if names == (KEY_PROPERTY,):
            parts.keys_only = True
        else:
            parts.projection = names
        parts.distinct_on = names if distinct else distinct_on
        return False

    def name_list(self, what: str) -> tuple[str, ...]:
        start = self.tok
        names = [self.property_name(what)]
        while self.at_punct(","):
            self.advance()
            names.append(self.property_name("a property name"))
        seen: set[str] = set()
        for name in names:
            if name in seen and name != KEY_PROPERTY:  # (__key__ twice is __key__, as the emulator reads it)
                self.error(f"property {name!r} is listed twice", start)
            seen.add(name)
        return tuple(dict.fromkeys(names))

    def order_list(self) -> tuple[Order, ...]:
        orders = []
        while True:
            name = self.property_name("a property name")
            descending = False
            if self.at_word("ASC", "DESC"):
                descending = self.advance().word == "DESC"
            orders.append(Order(name, descending))
            if not self.at_punct(","):
                return tuple(orders)
            self.advance()

    # LIMIT / OFFSET

    def position(self, clause: str) -> tuple[int | Cursor, Token]:
        token = self.unary_plus()
        if token.kind == INT:
            self.advance()
            value: Any = token.value
        elif token.kind == PARAM:
            self.advance()
            value = self.bindings.take(token)
            if not (is_int(value) or isinstance(value, Cursor)):
                self.error(f"{clause} binding {token.text} must be an integer or a Cursor, got {describe(value)}", token)
        else:
            self.fail(f"an integer or a binding after {clause}")
        if isinstance(value, int) and value < 0:
            self.error(f"{clause} {value} must not be negative", token)
        return value, token

    def limit(self, parts: Parts) -> None:
        if self.at_call("FIRST"):
            first = self.advance()
            self.advance()
            a = self.position("LIMIT FIRST(")
            self.expect_punct(",")
            b = self.position("LIMIT FIRST(")
            self.expect_punct(")")
            cursors = [v for v, _ in (a, b) if isinstance(v, Cursor)]
            counts = [v for v, _ in (a, b) if not isinstance(v, Cursor)]
            if len(cursors) != 1:
                self.error("LIMIT FIRST(a, b) takes one cursor and one integer", first)
            parts.end_cursor = cursors[0].value
            parts.limit = counts[0]
        else:
            value, _ = self.position("LIMIT")
            if isinstance(value, Cursor):
                parts.end_cursor = value.value
            else:
                parts.limit = value
        if self.at_punct(","):
            self.error("LIMIT takes one count, not 'offset, count'; write LIMIT n OFFSET m", self.tok)

    def offset(self, parts: Parts) -> None:
        value, token = self.position("OFFSET")
        if self.at_punct("+"):
            self.advance()
            extra, extra_token = self.position("OFFSET ... +")
            if not isinstance(value, Cursor):
                self.error("OFFSET a + b needs a bound Cursor before '+'", token)
            if isinstance(extra, Cursor):
                self.error("OFFSET a + b needs an integer after '+', not a Cursor", extra_token)
            parts.start_cursor, parts.offset = value.value, extra
        elif isinstance(value, Cursor):
            parts.start_cursor = value.value
        else:
            parts.offset = value
