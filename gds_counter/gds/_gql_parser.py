"""Tokens to the parts of a ``Query``: a recursive-descent parser for the
grammar described in ``gds_counter.gds.gql``.

Why recursive descent: one method per grammar rule keeps ``AND`` binding
tighter than ``OR``, reads a property name only where a name may stand,
and lets every error say what was expected at which column, which is what
php-gds's regular expressions could not do. The parser also checks here
the rules Datastore would only enforce later (``__key__`` compares with
keys, lists only with IN / NOT IN, cursors only in LIMIT and OFFSET), so
the message can still point at the text. Aggregation queries add their own
rules in ``_gql_aggregation``.
"""

from __future__ import annotations

from typing import Any, NoReturn

import attrs

from gds_counter._checks import is_int
from gds_counter.errors import GDSError
from gds_counter.gateway.keys import Key, PathElement, project_name
from gds_counter.gateway.query import KEY_PROPERTY, CompositeFilter, Cursor, Filter, Order, PropertyFilter, Query
from gds_counter.gds._gql_lexer import (
    COMPARATORS,
    DOUBLE,
    END,
    INT,
    PARAM,
    PUNCT,
    QUOTED,
    STRING,
    WORD,
    Token,
    TokenStream,
    column,
)
from gds_counter.gds._gql_values import Bindings, decode_blob, describe, parse_datetime

__all__ = ["AGGREGATES", "RESERVED", "Parser", "Parts"]

#: Parentheses recurse; a bound keeps hostile text from reaching Python's
#: recursion limit (a RecursionError instead of a GQLError).
_MAX_NESTING = 64

#: Unquoted, these are always keywords: each could otherwise be read as a
#: name somewhere a name is allowed, which is how php-gds lost conditions.
RESERVED = frozenset(
    "SELECT DISTINCT FROM WHERE AND OR NOT IS NULL TRUE FALSE IN CONTAINS HAS ORDER ASC DESC LIMIT OFFSET".split()
    # ... and these, which the Firestore emulator refuses as bare names too
    + "PARENT CHILD SUM AVG COUNT COUNT_UP_TO OVER AS AGGREGATE BY ON GROUP HAVING CURSOR LIKE BETWEEN JOIN ALL ANY "
    "ANCESTOR DESCENDANT".split()
)
_MIRRORED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
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


def _combine(op: str, items: list[Filter]) -> Filter:
    """One filter stays itself; same-operator groups are flattened, so the
    structure of a filter does not depend on how it was parenthesised."""
    if len(items) == 1:
        return items[0]
    flat: list[Filter] = []
    for item in items:
        if isinstance(item, CompositeFilter) and item.op == op:
            flat.extend(item.filters)
        else:
            flat.append(item)
    return CompositeFilter(op, tuple(flat))  # type: ignore[arg-type]


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


class Parser(TokenStream):
    """Recursive descent over the token list; one method per grammar rule."""

    def __init__(self, tokens: list[Token], bindings: Bindings, namespace: str) -> None:
        super().__init__(tokens)
        self.bindings = bindings
        self.namespace = namespace
        self.depth = 0

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

    def name(self, what: str) -> str:
        token = self.tok
        if token.kind == QUOTED:
            self.advance()
            return token.value
        if token.kind == WORD:
            if token.word in RESERVED:
                self.fail(what, hint=f"{token.word} is a reserved word; quote it as `{token.value}` to use it as a name")
            self.advance()
            return token.value
        self.fail(what)

    def property_name(self, what: str) -> str:
        segments = [self.name(what)]
        while self.at_punct("."):
            self.advance()
            segments.append(self.name("a property name after '.'"))
        return ".".join(segments)

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

    def unary_plus(self) -> Token:
        """Past a ``+`` before a number (``+1``, as the emulator reads it): the number."""
        if self.at_plus_number():
            self.advance()
        return self.tok

    def at_plus_number(self) -> bool:
        """At ``+`` right before an unsigned number (``+-1`` and ``+ 1`` are
        refused, as the emulator refuses them)."""
        following = self.peek()
        return (self.at_punct("+") and following.kind in (INT, DOUBLE) and not following.text.startswith("-")
                and following.pos == self.tok.pos + 1)  # "+ 1" is refused too

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

    # WHERE

    def disjunction(self) -> Filter:
        items = [self.conjunction()]
        while self.at_word("OR"):
            self.advance()
            items.append(self.conjunction())
        return _combine("OR", items)

    def conjunction(self) -> Filter:
        items = [self.primary()]
        while self.at_word("AND"):
            self.advance()
            items.append(self.primary())
        return _combine("AND", items)

    def primary(self) -> Filter:
        if not self.at_punct("("):
            return self.condition()
        opening = self.advance()
        self.depth += 1
        if self.depth > _MAX_NESTING:
            self.error(f"conditions are nested more than {_MAX_NESTING} parentheses deep", opening)
        inner = self.disjunction()
        if not self.at_punct(")"):
            self.fail(f"AND, OR or ')' to close the '(' at column {column(opening.pos)}")
        self.advance()
        self.depth -= 1
        return inner

    def starts_value(self) -> bool:
        return (
            self.tok.kind in (STRING, INT, DOUBLE, PARAM)
            or self.at_plus_number()
            or self.at_word("TRUE", "FALSE", "NULL")
            or self.at_call("KEY", "ARRAY", "BLOB", "DATETIME")
        )

    def condition(self) -> Filter:
        if self.starts_value():
            return self.reversed_condition()
        name_token = self.tok
        name = self.property_name("a condition")
        token = self.tok
        if self.at_word("IS"):
            self.advance()
            if self.at_word("NOT"):
                self.fail("NULL", hint=f"IS NOT NULL is not GQL; write {name_token.text} != NULL")
            self.expect_word("NULL")
            return self.make(name, "=", None, name_token, token)
        if token.kind == PUNCT and token.value in COMPARATORS:
            self.advance()
            value_token = self.tok
            return self.make(name, token.value, self.scalar(), name_token, value_token)
        if self.at_word("CONTAINS"):
            self.advance()
            value_token = self.tok
            value = self.value()
            if isinstance(value, list):  # CONTAINS ARRAY(...) is IN, as the emulator reads it
                return self.make(name, "IN", self.checked_list(value, "CONTAINS", value_token), name_token, value_token)
            return self.make(name, "=", self.checked_scalar(value, value_token), name_token, value_token)
        if self.at_word("IN"):
            self.advance()
            value_token = self.tok
            return self.make(name, "IN", self.values("IN", one=True), name_token, value_token)
        if self.at_word("NOT"):
            self.advance()
            self.expect_word("IN")
            value_token = self.tok
            return self.make(name, "NOT_IN", self.values("NOT IN"), name_token, value_token)
        if self.at_word("HAS"):
            self.advance()
            if self.at_word("DESCENDANT"):
                self.fail("ANCESTOR", hint="HAS DESCENDANT takes the key first: KEY(...) HAS DESCENDANT __key__")
            self.expect_word("ANCESTOR")
            value_token = self.tok
            return self.make(name, "HAS_ANCESTOR", self.scalar(), name_token, value_token)
        self.fail("a comparison (=, <, <=, >, >=, !=, IN, NOT IN, CONTAINS, HAS ANCESTOR or IS NULL)")

    def reversed_condition(self) -> Filter:
        value_token = self.tok
        value = self.value()
        token = self.tok
        if isinstance(value, list) and self.at_word("IN"):  # ARRAY(...) IN p: p IN ARRAY(...), as the emulator reads it
            self.advance()
            name_token = self.tok
            name = self.property_name("a property name after IN")
            return self.make(name, "IN", self.checked_list(value, "IN", value_token), name_token, value_token)
        value = self.checked_scalar(value, value_token)
        if token.kind == PUNCT and token.value in COMPARATORS:
            self.advance()
            name_token = self.tok
            name = self.property_name("a property name after the comparison")
            return self.make(name, _MIRRORED[token.value], value, name_token, value_token)
        if self.at_word("IN"):
            self.advance()
            name_token = self.tok
            name = self.property_name("a property name after IN")
            return self.make(name, "=", value, name_token, value_token)
        if self.at_word("HAS"):
            self.advance()
            self.expect_word("DESCENDANT")
            name_token = self.tok
            name = self.property_name("__key__ after HAS DESCENDANT")
            return self.make(name, "HAS_ANCESTOR", value, name_token, value_token)
        self.fail("a comparison after the value (=, <, <=, >, >=, !=, IN or HAS DESCENDANT)")

    def make(self, name: str, op: str, value: Any, name_token: Token, value_token: Token) -> PropertyFilter:
        """Check the rules Datastore would enforce on a filter, here, where
        the error can still point at the text."""
        items = value if op in ("IN", "NOT_IN") else (value,)
        for item in items:
            if isinstance(item, Key) and item.is_partial:
                self.error(f"key {item} in a condition is incomplete (it has no id or name)", value_token)
        if op == "HAS_ANCESTOR":
            if name != KEY_PROPERTY:
                self.error(f"HAS ANCESTOR / HAS DESCENDANT apply to __key__, not to {name!r}", name_token)
            if not isinstance(value, Key):
                self.error(f"HAS ANCESTOR / HAS DESCENDANT need a key, got {describe(value)}", value_token)
        elif name == KEY_PROPERTY:
            for item in items:
                if not isinstance(item, Key):
                    self.error(f"__key__ compares only with keys, got {describe(item)}", value_token)
        return PropertyFilter(name, op, value)

    # values

    def scalar(self) -> Any:
        token = self.tok
        return self.checked_scalar(self.value(), token)

    def checked_scalar(self, value: Any, token: Token) -> Any:
        if isinstance(value, list):
            shown = "ARRAY(...)" if token.word == "ARRAY" else token.text
            self.error(f"a list ({shown}) goes only with IN or NOT IN", token)
        if isinstance(value, Cursor):
            self.error(f"a Cursor ({token.text}) goes only in LIMIT or OFFSET", token)
        return value

    def values(self, op: str, *, one: bool = False) -> tuple[Any, ...]:
        """A list for ``op``; with ``one``, a single value is a list of one
        (``n IN 1``, as the emulator reads it)."""
        token = self.tok
        value = self.value()
        if one and not isinstance(value, (list, Cursor)):
            return (value,)
        return self.checked_list(value, op, token)

    def checked_list(self, value: Any, op: str, token: Token) -> tuple[Any, ...]:
        if isinstance(value, Cursor):
            self.error(f"a Cursor ({token.text}) goes only in LIMIT or OFFSET", token)
        if not isinstance(value, list):
            self.error(f"{op} needs ARRAY(...) or a bound list, got {describe(value)}", token)
        if not value:
            self.error(f"{op} needs at least one value; {token.text} is empty", token)
        return tuple(value)

    def value(self) -> Any:
        token = self.unary_plus()
        if token.kind in (STRING, INT, DOUBLE):
            self.advance()
            return token.value
        if token.kind == PARAM:
            self.advance()
            return self.bindings.take(token)
        if self.at_word("TRUE", "FALSE", "NULL"):
            self.advance()
            return {"TRUE": True, "FALSE": False, "NULL": None}[token.word]  # type: ignore[index]
        if self.at_call("KEY"):
            return self.key_literal()
        if self.at_call("ARRAY"):
            return self.array_literal()
        if self.at_call("BLOB"):
            return decode_blob(*self.string_argument())
        if self.at_call("DATETIME"):
            return parse_datetime(*self.string_argument())
        hint = ""
        if token.kind == QUOTED or (token.kind == WORD and token.word not in RESERVED):
            hint = "a condition compares a property with a value, not with another property"
        self.fail("a value", hint=hint)

    def string_argument(self) -> tuple[str, Token]:
        self.advance()
        self.advance()
        token = self.tok
        if token.kind != STRING:
            self.fail("a string literal")
        self.advance()
        self.expect_punct(")")
        return token.value, token

    def array_literal(self) -> list[Any]:
        self.advance()
        self.advance()
        items = []
        while True:
            token = self.tok
            if self.at_call("ARRAY"):
                self.error("ARRAY(...) cannot contain another ARRAY", token)
            item = self.value()
            if isinstance(item, (list, Cursor)):
                self.error(f"ARRAY(...) items must be single values; {token.text} is a {type(item).__name__}", token)
            items.append(item)
            if self.at_punct(")"):
                self.advance()
                return items
            self.expect_punct(",", "',' or ')'")

    def key_literal(self) -> Key:
        self.advance()
        self.advance()
        namespace = self.namespace
        if self.at_call("DATASET"):
            # The Firestore emulator: 'Unknown partition dimension "DATASET"'.
            self.error("KEY(DATASET(...), ...) is not Datastore GQL; name the project with PROJECT(...)", self.tok)
        project = None
        if self.at_call("PROJECT"):
            project_token = self.tok
            project, _ = self.string_argument()  # kept: the gateway compares it with its own (gds_counter.gds.gql)
            try:
                project = project_name(project)
            except GDSError as exc:
                self.error(f"bad KEY(...): {exc}", project_token)
            self.expect_punct(",")
            namespace = ""  # a key naming its project is in the default namespace unless it names one
        if self.at_call("NAMESPACE"):
            namespace, _ = self.string_argument()
            self.expect_punct(",")
        path = []
        while True:
            kind_token = self.tok
            if kind_token.kind not in (WORD, QUOTED):  # a 'string' kind: the emulator refuses it
                self.fail("a kind in KEY(...)", hint="write the kind bare or in backticks: KEY(Kind, 5), KEY(`my kind`, 5)")
            self.advance()
            self.expect_punct(",")
            id_token = self.tok
            if id_token.kind not in (INT, STRING):
                hint = "KEY(...) takes literals; bind the whole key instead" if id_token.kind == PARAM else ""
                self.fail("an integer id or a string name", hint=hint)
            self.advance()
            try:
                if id_token.kind == INT:
                    path.append(PathElement(kind_token.value, id=id_token.value))
                else:
                    path.append(PathElement(kind_token.value, name=id_token.value))
            except GDSError as exc:
                self.error(f"bad key element: {exc}", kind_token)
            if self.at_punct(")"):
                self.advance()
                return Key(tuple(path), namespace, project=project)
            self.expect_punct(",", "',' or ')'")
