"""GQL's conditions and values: the ``WHERE`` clause (``OR`` over ``AND``
over conditions, parenthesised to a bound depth), each condition checked as
Datastore would check its filter, and the literal values a condition
compares with (``KEY(...)``, ``ARRAY(...)``, ``BLOB``, ``DATETIME``,
bindings), plus the names they are about.

Apart from ``_gql_parser`` (the statement: ``SELECT``, ``FROM``,
``ORDER BY``, ``LIMIT``, ``OFFSET``) because a condition is an expression
grammar of its own, with its own errors; ``Parser`` extends this class with
the statement's rules.
"""

from __future__ import annotations

from typing import Any

from gds_counter.errors import GDSError
from gds_counter.gateway.keys import Key, PathElement, project_name
from gds_counter.gateway.query import KEY_PROPERTY, CompositeFilter, Cursor, Filter, PropertyFilter
from gds_counter.gds._gql_lexer import (
    COMPARATORS,
    DOUBLE,
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

__all__ = ["RESERVED", "ConditionParser"]

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


class ConditionParser(TokenStream):
    """Recursive descent over a condition's tokens, one method per rule;
    ``bindings`` fill ``@name`` and ``@1``, ``namespace`` is a ``KEY(...)``
    literal's unless it names its own."""

    def __init__(self, tokens: list[Token], bindings: Bindings, namespace: str) -> None:
        super().__init__(tokens)
        self.bindings = bindings
        self.namespace = namespace
        self.depth = 0

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
