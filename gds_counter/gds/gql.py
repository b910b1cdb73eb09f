"""GQL text to structured ``Query``, and back.

Why a parser of our own: the embedded SQLite gateway has no GQL engine, and
php-gds's regex "parser" lost conditions (a lower-case ``and``), split
property names such as ``BRAND`` at "AND", compared unquoted numbers as
strings and turned ``KEY(...)`` into a string. A tokenizer plus a
recursive-descent parser cannot make those mistakes, and every gateway then
runs the same structured ``Query``. The Cloud Datastore gateway may still
send the original text (``Query.gql``) to the server.

The grammar is Cloud Datastore's GQL reference (v1 API)::

    SELECT ( * | <name>+, | DISTINCT <name>+, | DISTINCT ON ( <name>+, ) ( * | <name>+, ) )
    [ FROM <kind> ]
    [ WHERE <compound-condition> ]
    [ ORDER BY ( <name> [ ASC | DESC ] )+, ]
    [ LIMIT ( <result-position> | FIRST ( <result-position> , <result-position> ) ) ]
    [ OFFSET <result-position> [ + <result-position> ] ]

Decisions where the reference leaves room, or where we differ from it:

* ``SELECT __key__`` (alone) is a keys-only query; ``__key__`` among other
  names is an ordinary projection.
* Conditions: ``name (= < <= > >= !=) value``, ``name CONTAINS value``
  (stored as ``=``, which is what equality means on a list property),
  ``name IN list``, ``name NOT IN list``, ``name IS NULL`` (stored as
  ``= None``), ``__key__ HAS ANCESTOR key``; and with the value first:
  ``value (= < <= > >= !=) name`` (the comparator is mirrored),
  ``value IN name`` (the reference's old spelling of CONTAINS) and
  ``key HAS DESCENDANT __key__`` (stored as HAS_ANCESTOR). ``AND`` binds
  tighter than ``OR``; parentheses group. One condition in a group
  collapses to itself and nested groups of the same operator are
  flattened, so equal filters always have the same structure.
* ``LIMIT n`` sets ``limit``; ``LIMIT @c`` with a bound ``Cursor`` sets
  ``end_cursor``; ``LIMIT FIRST(a, b)`` takes one integer and one cursor (in
  either order) and sets both. ``OFFSET n`` sets ``offset``; ``OFFSET @c``
  sets ``start_cursor``; ``OFFSET @c + n`` sets both. LIMIT comes before
  OFFSET, each at most once: older references allowed OFFSET first, but
  Cloud Datastore rejects it, so we do too rather than accept text that
  would fail in production.
* Literals: ``'...'`` and ``"..."`` strings (the quote doubled, or these
  backslash escapes: ``\\\\ \\' \\" \\` \\0 \\b \\n \\r \\t \\Z``; any other
  escape is an error rather than a guess), integers (64-bit, optionally
  negative), doubles, TRUE, FALSE, NULL, ``KEY([PROJECT('p'),]
  [NAMESPACE('ns'),] Kind, id_or_name, ...)``, ``ARRAY(v, ...)``,
  ``BLOB('base64')`` and ``DATETIME('2013-09-29T09:30:20.00002-08:00')``
  (a zone is required; at most microseconds; read as UTC). ``KEY``'s
  ``PROJECT`` (or the older ``DATASET``) is accepted and ignored because
  our ``Key`` carries no project: the gateway decides the project. A KEY
  without NAMESPACE takes the query's namespace, as Datastore does.
* Names: ``[A-Za-z_$][A-Za-z_$0-9]*`` (letters may be non-ASCII) or
  backtick-quoted with a doubled backtick (or a backslash escape) inside.
  Property names may be dotted (``a.b``, a sub-property of an embedded
  entity); kinds may not, unless quoted. Keywords are case-insensitive; the
  words that could be mistaken for names where a name is expected are
  reserved and must be quoted to be used as names (``_RESERVED``). The
  function words (KEY, ARRAY, BLOB, DATETIME, FIRST, ON, ...) only act as
  keywords before ``(``, so a property called ``key`` needs no quotes.
* Bindings: ``@name`` and ``@1`` (1-based). ``bindings`` may be a
  ``Mapping`` (``str`` keys for ``@name``, ``int`` keys for ``@1``...) or a
  ``Sequence`` (positional only). Every site must be bound and, unlike the
  Datastore API (which lets named parameters go unused), every binding must
  be used: an unused binding is nearly always a typo. Positional bindings
  must be numbered from 1 without gaps, as the Datastore API requires.
  Values: None, bool, int, float, str, bytes, tz-aware datetime (stored in
  UTC; naive ones are refused), ``Key``, ``Geopoint``, any object with a
  ``__gds_key__()`` method (an ``Entity``: bound as its key), and
  lists/tuples for IN, NOT IN and ARRAY. ``Cursor`` goes only at LIMIT and
  OFFSET positions. ``Query.gql`` records the text with the converted
  bindings (lists as ``list``, cursors as ``Cursor``) so a gateway can send
  cursors as cursors and values as values.

Not supported: aggregation queries (COUNT, SUM, AVG, AGGREGATE ... OVER),
because ``Query`` has no aggregation; they fail with a message saying so.
"""

from __future__ import annotations

import base64
import binascii
import datetime as _dt
from typing import Any, Mapping, NoReturn, Sequence

import attrs

from gds_counter.errors import GDSError, GQLError
from gds_counter.gateway.base import (
    Cursor,
    KEY_PROPERTY,
    MAX_ID,
    CompositeFilter,
    Filter,
    Geopoint,
    GqlSource,
    Key,
    Order,
    PathElement,
    PropertyFilter,
    Query,
)

__all__ = ["Cursor", "parse", "to_gql"]

_UTC = _dt.timezone.utc
_MIN_INT = -(2**63)
_MAX_NESTING = 64
_DIGITS = "0123456789"
_ASCII_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"

#: Unquoted, these are always keywords: each could otherwise be read as a
#: name somewhere a name is allowed, which is how php-gds lost conditions.
_RESERVED = frozenset(
    "SELECT DISTINCT FROM WHERE AND OR NOT IS NULL TRUE FALSE IN CONTAINS HAS ORDER ASC DESC LIMIT OFFSET".split()
)
_COMPARATORS = ("<=", ">=", "!=", "=", "<", ">")
_MIRRORED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_AGGREGATES = frozenset({"COUNT", "COUNT_UP_TO", "SUM", "AVG"})
_STRING_ESCAPES = {
    "\\": "\\",
    "'": "'",
    '"': '"',
    "`": "`",
    "0": "\0",
    "b": "\b",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "Z": "\x1a",
}


# --- tokens --------------------------------------------------------------

_END = "end"
_WORD = "word"  # unquoted name or keyword
_QUOTED = "quoted"  # `backtick quoted` name
_STRING = "string"
_INT = "int"
_DOUBLE = "double"
_PARAM = "param"  # @name (str value) or @1 (int value)
_PUNCT = "punct"  # ( ) , * + . and the comparators


@attrs.frozen
class _Token:
    kind: str
    text: str  # as written, for error messages
    value: Any
    pos: int

    @property
    def word(self) -> str | None:
        # Keywords are ASCII: "ın".upper() == "IN" must not make a keyword.
        return self.value.upper() if self.kind == _WORD and self.value.isascii() else None


def _column(pos: int) -> int:
    return pos + 1


def _is_name_start(char: str) -> bool:
    return char.isalpha() or char in "_$"


def _is_name_char(char: str) -> bool:
    return char.isalnum() or char in "_$"


def _shorten(text: str, limit: int = 30) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class _Lexer:
    """Turns GQL text into tokens, one small reader per token shape."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)

    def tokens(self) -> list[_Token]:
        out: list[_Token] = []
        i = 0
        while i < self.n:
            char = self.text[i]
            if char.isspace():
                i += 1
                continue
            token = self._read(i)
            out.append(token)
            i = token.pos + len(token.text)
        out.append(_Token(_END, "", None, self.n))
        return out

    def _read(self, i: int) -> _Token:
        text = self.text
        char = text[i]
        if char in "'\"":
            return self._quoted(i, _STRING, "string")
        if char == "`":
            token = self._quoted(i, _QUOTED, "quoted name")
            if not token.value:
                raise GQLError(f"empty quoted name `` at column {_column(i)}", i)
            return token
        if char == "@":
            return self._param(i)
        if char in _DIGITS or (char == "-" and i + 1 < self.n and text[i + 1] in _DIGITS):
            return self._number(i)
        if _is_name_start(char):
            j = i + 1
            while j < self.n and _is_name_char(text[j]):
                j += 1
            return _Token(_WORD, text[i:j], text[i:j], i)
        for op in _COMPARATORS:
            if text.startswith(op, i):
                return _Token(_PUNCT, op, op, i)
        if char == "!":
            raise GQLError(f"expected '=' after '!' at column {_column(i)} (the operator is !=)", i)
        if char in "(),*+.":
            return _Token(_PUNCT, char, char, i)
        raise GQLError(f"unexpected character {char!r} at column {_column(i)}", i)

    def _quoted(self, start: int, kind: str, what: str) -> _Token:
        text, quote = self.text, self.text[start]
        out: list[str] = []
        i = start + 1
        while True:
            if i >= self.n:
                raise GQLError(f"unterminated {what} starting at column {_column(start)}", start)
            char = text[i]
            if char == quote:
                if i + 1 < self.n and text[i + 1] == quote:
                    out.append(quote)
                    i += 2
                    continue
                return _Token(kind, text[start : i + 1], "".join(out), start)
            if char == "\\":
                if i + 1 >= self.n:
                    raise GQLError(f"unterminated {what} starting at column {_column(start)}", start)
                escaped = text[i + 1]
                if escaped not in _STRING_ESCAPES:
                    raise GQLError(
                        f"unknown escape '\\{escaped}' in {what} at column {_column(i)} "
                        "(known: \\\\ \\' \\\" \\` \\0 \\b \\n \\r \\t \\Z)",
                        i,
                    )
                out.append(_STRING_ESCAPES[escaped])
                i += 2
                continue
            out.append(char)
            i += 1

    def _param(self, start: int) -> _Token:
        text = self.text
        i = start + 1
        if i < self.n and text[i] in _DIGITS:
            while i < self.n and text[i] in _DIGITS:
                i += 1
            digits = text[start + 1 : i]
            if i < self.n and _is_name_char(text[i]):
                raise GQLError(f"malformed binding {text[start : i + 1]!r} at column {_column(start)}", start)
            if len(digits) > 9 or int(digits) == 0:
                raise GQLError(
                    f"positional binding @{_shorten(digits)} at column {_column(start)} is out of range "
                    "(positions count from @1)",
                    start,
                )
            return _Token(_PARAM, text[start:i], int(digits), start)
        if i < self.n and (text[i] in _ASCII_LETTERS or text[i] in "_$"):
            while i < self.n and (text[i] in _ASCII_LETTERS or text[i] in _DIGITS or text[i] in "_$"):
                i += 1
            if i < self.n and _is_name_char(text[i]):
                raise GQLError(
                    f"binding name at column {_column(start)} may only use A-Z, a-z, 0-9, _ and $ "
                    f"(found {text[i]!r})",
                    start,
                )
            name = text[start + 1 : i]
            if _is_reserved_binding(name):
                raise GQLError(f"binding name @{name} at column {_column(start)} is reserved (__x__)", start)
            return _Token(_PARAM, text[start:i], name, start)
        raise GQLError(f"expected a binding name or number after '@' at column {_column(start)}", start)

    def _number(self, start: int) -> _Token:
        text = self.text
        i = start + 1 if text[start] == "-" else start
        while i < self.n and text[i] in _DIGITS:
            i += 1
        is_double = False
        if i + 1 < self.n and text[i] == "." and text[i + 1] in _DIGITS:
            is_double = True
            i += 1
            while i < self.n and text[i] in _DIGITS:
                i += 1
        if i < self.n and text[i] in "eE":
            j = i + 1
            if j < self.n and text[j] in "+-":
                j += 1
            if j < self.n and text[j] in _DIGITS:
                is_double = True
                i = j
                while i < self.n and text[i] in _DIGITS:
                    i += 1
        if i < self.n and _is_name_char(text[i]):
            end = i
            while end < self.n and _is_name_char(text[end]):
                end += 1
            raise GQLError(f"malformed number {_shorten(text[start:end])!r} at column {_column(start)}", start)
        raw = text[start:i]
        if is_double:
            value = float(raw)
            if value in (float("inf"), float("-inf")):
                raise GQLError(f"double {_shorten(raw)} at column {_column(start)} is out of range", start)
            return _Token(_DOUBLE, raw, value, start)
        digits = raw.lstrip("-").lstrip("0") or "0"
        value = int(digits) * (-1 if raw.startswith("-") else 1) if len(digits) <= 19 else None
        if value is None or not _MIN_INT <= value <= MAX_ID:
            raise GQLError(f"integer {_shorten(raw)} at column {_column(start)} does not fit in 64 bits", start)
        return _Token(_INT, raw, value, start)


def _is_reserved_binding(name: str) -> bool:
    return len(name) >= 4 and name.startswith("__") and name.endswith("__")


def _is_binding_name(name: str) -> bool:
    return (
        bool(name)
        and (name[0] in _ASCII_LETTERS or name[0] in "_$")
        and all(c in _ASCII_LETTERS or c in _DIGITS or c in "_$" for c in name)
    )


# --- bindings ------------------------------------------------------------


def _describe(value: Any) -> str:
    return f"{type(value).__name__} {_shorten(repr(value), 60)}"


def _neutral(value: Any, label: str, *, inner: bool = False) -> Any:
    """Convert a bound value to the gateway's neutral types, once, so that
    the filter and ``Query.gql`` hold the same thing."""
    if value is None or isinstance(value, (bool, Key, Geopoint)):
        return value
    if isinstance(value, Cursor):
        if inner:
            raise GQLError(f"binding {label}: a Cursor cannot be inside a list")
        return value
    if isinstance(value, int):
        if not _MIN_INT <= value <= MAX_ID:
            raise GQLError(f"binding {label}: integer {value} does not fit in 64 bits")
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise GQLError(
                f"binding {label}: naive datetime {value!r} has no timezone; "
                "give it one (e.g. tzinfo=datetime.timezone.utc)"
            )
        try:
            return value.astimezone(_UTC)
        except OverflowError as exc:
            raise GQLError(f"binding {label}: datetime {value!r} is out of range in UTC") from exc
    if isinstance(value, _dt.date):
        raise GQLError(f"binding {label}: {value!r} is a date; Datastore stores datetimes (with a timezone)")
    gds_key = getattr(value, "__gds_key__", None)
    if callable(gds_key):
        try:
            key = gds_key()
        except GDSError as exc:
            raise GQLError(f"binding {label}: {exc}") from exc
        if not isinstance(key, Key):
            raise GQLError(f"binding {label}: __gds_key__() returned {_describe(key)}, not a Key")
        return key
    if isinstance(value, (list, tuple)):
        if inner:
            raise GQLError(f"binding {label}: a list may not contain a list")
        return [_neutral(item, label, inner=True) for item in value]
    raise GQLError(f"binding {label}: cannot bind {_describe(value)}")


class _Bindings:
    """The caller's bindings, converted, with a record of which were used."""

    def __init__(self, bindings: Mapping[Any, Any] | Sequence[Any] | None) -> None:
        self.named: dict[str, Any] = {}
        self.positional: dict[int, Any] = {}
        self.used: set[str | int] = set()
        if bindings is None:
            return
        if isinstance(bindings, Mapping):
            for key, value in bindings.items():
                self._add(key, value)
        elif isinstance(bindings, (str, bytes, bytearray)) or not isinstance(bindings, Sequence):
            raise GQLError(f"bindings must be a mapping or a sequence, not {type(bindings).__name__}")
        else:
            for position, value in enumerate(bindings, 1):
                self._add(position, value)

    def _add(self, key: Any, value: Any) -> None:
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise GQLError(f"binding key {key!r} must be a name (str) or a position (int from 1)")
        if isinstance(key, int):
            if key < 1:
                raise GQLError(f"binding position {key} is out of range (positions count from 1)")
            self.positional[key] = _neutral(value, f"@{key}")
            return
        if not _is_binding_name(key):
            raise GQLError(f"binding name {key!r} is not a GQL name ([A-Za-z_$][A-Za-z_$0-9]*)")
        if _is_reserved_binding(key):
            raise GQLError(f"binding name {key!r} is reserved (__x__)")
        self.named[key] = _neutral(value, f"@{key}")

    def take(self, token: _Token) -> Any:
        key = token.value
        bound = self.positional if isinstance(key, int) else self.named
        if key not in bound:
            raise GQLError(f"no value bound for @{key} at column {_column(token.pos)}", token.pos)
        self.used.add(key)
        return bound[key]

    def source(self, text: str) -> GqlSource:
        unused = [f"@{k}" for k in self.named if k not in self.used]
        unused += [f"@{k}" for k in sorted(self.positional) if k not in self.used]
        if unused:
            raise GQLError(f"binding {', '.join(unused)} {'is' if len(unused) == 1 else 'are'} never used in the query")
        positions = range(1, max(self.positional, default=0) + 1)
        missing = [f"@{p}" for p in positions if p not in self.positional]
        if missing:
            raise GQLError(f"positional bindings must run from @1 without gaps; {', '.join(missing)} missing")
        return GqlSource(
            text,
            named=tuple(self.named.items()),
            positional=tuple(self.positional[p] for p in positions),
        )


# --- parser --------------------------------------------------------------


def _distance(a: str, b: str) -> int:
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
class _Parts:
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


class _Parser:
    """Recursive descent over the token list; one method per grammar rule."""

    def __init__(self, tokens: list[_Token], bindings: _Bindings, namespace: str) -> None:
        self.tokens = tokens
        self.i = 0
        self.bindings = bindings
        self.namespace = namespace
        self.depth = 0

    # token helpers

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def peek(self, ahead: int = 1) -> _Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def advance(self) -> _Token:
        token = self.tok
        if token.kind != _END:
            self.i += 1
        return token

    def at_word(self, *words: str, token: _Token | None = None) -> bool:
        return (token or self.tok).word in words

    def at_punct(self, symbol: str, token: _Token | None = None) -> bool:
        token = token or self.tok
        return token.kind == _PUNCT and token.value == symbol

    def at_call(self, *words: str) -> bool:
        """A function word (KEY, ARRAY, FIRST, ON...) is a keyword only
        before '(', so the same word stays free for property names."""
        return self.at_word(*words) and self.at_punct("(", self.peek())

    def fail(self, expected: str, token: _Token | None = None, hint: str = "") -> NoReturn:
        token = token or self.tok
        near = "the end of the query" if token.kind == _END else repr(_shorten(token.text))
        message = f"expected {expected} at column {_column(token.pos)} near {near}"
        raise GQLError(f"{message} ({hint})" if hint else message, token.pos)

    def error(self, message: str, token: _Token) -> NoReturn:
        raise GQLError(f"{message} at column {_column(token.pos)}", token.pos)

    def expect_word(self, word: str) -> _Token:
        if not self.at_word(word):
            self.fail(word)
        return self.advance()

    def expect_punct(self, symbol: str, expected: str | None = None) -> _Token:
        if not self.at_punct(symbol):
            self.fail(expected or f"'{symbol}'")
        return self.advance()

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

    def query(self) -> _Parts:
        parts = _Parts()
        if self.at_word("AGGREGATE"):
            self.error("aggregation queries (AGGREGATE ... OVER) are not supported", self.tok)
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
            clauses.remove(word.word)  # type: ignore[arg-type]
            extra = []
            self.limit(parts) if word.word == "LIMIT" else self.offset(parts)
        if self.tok.kind != _END:
            self.fail_clause(extra + clauses + ["the end of the query"])
        return parts

    def select(self, parts: _Parts) -> bool:
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
        if self.at_call(*_AGGREGATES):
            self.error(f"aggregation queries ({self.tok.word}(...)) are not supported", self.tok)
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
            if name in seen:
                self.error(f"property {name!r} is listed twice", start)
            seen.add(name)
        return tuple(names)

    def name(self, what: str) -> str:
        token = self.tok
        if token.kind == _QUOTED:
            self.advance()
            return token.value  # type: ignore[no-any-return]
        if token.kind == _WORD:
            if token.word in _RESERVED:
                self.fail(what, hint=f"{token.word} is a reserved word; quote it as `{token.value}` to use it as a name")
            self.advance()
            return token.value  # type: ignore[no-any-return]
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

    def position(self, clause: str) -> tuple[int | Cursor, _Token]:
        token = self.tok
        if token.kind == _INT:
            self.advance()
            value: Any = token.value
        elif token.kind == _PARAM:
            self.advance()
            value = self.bindings.take(token)
            if isinstance(value, bool) or not isinstance(value, (int, Cursor)):
                self.error(f"{clause} binding {token.text} must be an integer or a Cursor, got {_describe(value)}", token)
        else:
            self.fail(f"an integer or a binding after {clause}")
        if isinstance(value, int) and value < 0:
            self.error(f"{clause} {value} must not be negative", token)
        return value, token

    def limit(self, parts: _Parts) -> None:
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
            parts.limit = counts[0]  # type: ignore[assignment]
        else:
            value, _ = self.position("LIMIT")
            if isinstance(value, Cursor):
                parts.end_cursor = value.value
            else:
                parts.limit = value
        if self.at_punct(","):
            self.error("LIMIT takes one count, not 'offset, count'; write LIMIT n OFFSET m", self.tok)

    def offset(self, parts: _Parts) -> None:
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
            self.fail(f"AND, OR or ')' to close the '(' at column {_column(opening.pos)}")
        self.advance()
        self.depth -= 1
        return inner

    def starts_value(self) -> bool:
        return (
            self.tok.kind in (_STRING, _INT, _DOUBLE, _PARAM)
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
        if token.kind == _PUNCT and token.value in _COMPARATORS:
            self.advance()
            value_token = self.tok
            return self.make(name, token.value, self.scalar(), name_token, value_token)
        if self.at_word("CONTAINS"):
            self.advance()
            value_token = self.tok
            return self.make(name, "=", self.scalar(), name_token, value_token)
        if self.at_word("IN"):
            self.advance()
            value_token = self.tok
            return self.make(name, "IN", self.values("IN"), name_token, value_token)
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
        value = self.scalar()
        token = self.tok
        if token.kind == _PUNCT and token.value in _COMPARATORS:
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

    def make(self, name: str, op: str, value: Any, name_token: _Token, value_token: _Token) -> PropertyFilter:
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
                self.error(f"HAS ANCESTOR / HAS DESCENDANT need a key, got {_describe(value)}", value_token)
        elif name == KEY_PROPERTY:
            for item in items:
                if not isinstance(item, Key):
                    self.error(f"__key__ compares only with keys, got {_describe(item)}", value_token)
        return PropertyFilter(name, op, value)

    # values

    def scalar(self) -> Any:
        token = self.tok
        value = self.value()
        if isinstance(value, list):
            shown = "ARRAY(...)" if token.word == "ARRAY" else token.text
            self.error(f"a list ({shown}) goes only with IN or NOT IN", token)
        if isinstance(value, Cursor):
            self.error(f"a Cursor ({token.text}) goes only in LIMIT or OFFSET", token)
        return value

    def values(self, op: str) -> tuple[Any, ...]:
        token = self.tok
        value = self.value()
        if isinstance(value, Cursor):
            self.error(f"a Cursor ({token.text}) goes only in LIMIT or OFFSET", token)
        if not isinstance(value, list):
            self.error(f"{op} needs ARRAY(...) or a bound list, got {_describe(value)}", token)
        if not value:
            self.error(f"{op} needs at least one value; {token.text} is empty", token)
        return tuple(value)

    def value(self) -> Any:
        token = self.tok
        if token.kind in (_STRING, _INT, _DOUBLE):
            self.advance()
            return token.value
        if token.kind == _PARAM:
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
            return _decode_blob(*self.string_argument())
        if self.at_call("DATETIME"):
            return _parse_datetime(*self.string_argument())
        hint = ""
        if token.kind == _QUOTED or (token.kind == _WORD and token.word not in _RESERVED):
            hint = "a condition compares a property with a value, not with another property"
        self.fail("a value", hint=hint)

    def string_argument(self) -> tuple[str, _Token]:
        self.advance()
        self.advance()
        token = self.tok
        if token.kind != _STRING:
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
        if self.at_call("PROJECT", "DATASET"):
            self.string_argument()  # the gateway's project applies; see module docstring
            self.expect_punct(",")
        if self.at_call("NAMESPACE"):
            namespace, _ = self.string_argument()
            self.expect_punct(",")
        path = []
        while True:
            kind_token = self.tok
            if kind_token.kind not in (_WORD, _QUOTED, _STRING):
                self.fail("a kind in KEY(...)")
            self.advance()
            self.expect_punct(",")
            id_token = self.tok
            if id_token.kind not in (_INT, _STRING):
                hint = "KEY(...) takes literals; bind the whole key instead" if id_token.kind == _PARAM else ""
                self.fail("an integer id or a string name", hint=hint)
            self.advance()
            try:
                if id_token.kind == _INT:
                    path.append(PathElement(kind_token.value, id=id_token.value))
                else:
                    path.append(PathElement(kind_token.value, name=id_token.value))
            except GDSError as exc:
                self.error(f"bad key element: {exc}", kind_token)
            if self.at_punct(")"):
                self.advance()
                return Key(tuple(path), namespace)
            self.expect_punct(",", "',' or ')'")


def _decode_blob(text: str, token: _Token) -> bytes:
    try:  # standard or URL-safe alphabet, but never silently skip junk
        return base64.b64decode(text.replace("-", "+").replace("_", "/").encode("ascii"), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise GQLError(f"BLOB at column {_column(token.pos)} is not valid base64: {exc}", token.pos) from exc


def _digits(text: str) -> bool:
    return bool(text) and all(c in _DIGITS for c in text)


def _parse_datetime(text: str, token: _Token) -> _dt.datetime:
    """RFC 3339 with a required zone; read by hand so that the accepted
    forms do not depend on the Python version's ``fromisoformat``."""

    def bad(why: str) -> NoReturn:
        raise GQLError(
            f"DATETIME {_shorten(text)!r} at column {_column(token.pos)} {why} "
            "(expected YYYY-MM-DDThh:mm:ss[.ffffff] then Z or +hh:mm)",
            token.pos,
        )

    head, rest = text[:19], text[19:]
    if (
        len(head) != 19
        or head[4] != "-"
        or head[7] != "-"
        or head[10] not in "Tt "
        or head[13] != ":"
        or head[16] != ":"
        or not all(_digits(head[a:b]) for a, b in ((0, 4), (5, 7), (8, 10), (11, 13), (14, 16), (17, 19)))
    ):
        bad("is not a date and time")
    micro = 0
    if rest.startswith("."):
        end = 1
        while end < len(rest) and rest[end] in _DIGITS:
            end += 1
        fraction = rest[1:end]
        if not fraction:
            bad("has no digits after '.'")
        if len(fraction) > 6:
            bad("is finer than microseconds, which is all Datastore keeps")
        micro = int(fraction.ljust(6, "0"))
        rest = rest[end:]
    if rest in ("Z", "z"):
        offset = _dt.timedelta(0)
    elif len(rest) == 6 and rest[0] in "+-" and rest[3] == ":" and _digits(rest[1:3]) and _digits(rest[4:6]):
        hours, minutes = int(rest[1:3]), int(rest[4:6])
        if hours > 23 or minutes > 59:
            bad("has an impossible zone offset")
        offset = _dt.timedelta(hours=hours, minutes=minutes) * (-1 if rest[0] == "-" else 1)
    elif rest == "":
        bad("has no timezone")
    else:
        bad("has a malformed ending")
    try:
        moment = _dt.datetime(
            int(head[0:4]),
            int(head[5:7]),
            int(head[8:10]),
            int(head[11:13]),
            int(head[14:16]),
            int(head[17:19]),
            micro,
            tzinfo=_dt.timezone(offset),
        )
        return moment.astimezone(_UTC)
    except (ValueError, OverflowError) as exc:
        bad(f"is not a valid moment: {exc}")


def parse(
    text: str,
    bindings: Mapping[Any, Any] | Sequence[Any] | None = None,
    *,
    namespace: str = "",
) -> Query:
    """Parse and bind GQL ``text`` into a ``Query`` in ``namespace``.

    Raises only ``GQLError``; syntax errors name the 1-based column and the
    token found there, and ``GQLError.position`` is the 0-based offset.
    """
    if not isinstance(text, str):
        raise GQLError(f"GQL must be text (str), not {type(text).__name__}")
    bound = _Bindings(bindings)
    tokens = _Lexer(text).tokens()
    parts = _Parser(tokens, bound, namespace or "").query()
    return Query(
        kind=parts.kind,
        namespace=namespace,
        filter=parts.filter,
        order=parts.order,
        projection=parts.projection,
        distinct_on=parts.distinct_on,
        keys_only=parts.keys_only,
        limit=parts.limit,
        offset=parts.offset,
        start_cursor=parts.start_cursor,
        end_cursor=parts.end_cursor,
        gql=bound.source(text),
    )


# --- printer -------------------------------------------------------------

_PRINTED_OPS = {"NOT_IN": "NOT IN", "HAS_ANCESTOR": "HAS ANCESTOR"}


def _quote(name: Any) -> str:
    if not isinstance(name, str) or not name:
        raise GQLError(f"cannot print {name!r} as a GQL name (names are non-empty strings)")
    if name == KEY_PROPERTY:
        return name
    return "`" + name.replace("\\", "\\\\").replace("`", "``") + "`"


class _Printer:
    """Builds GQL text in which every value is a named binding, so no value
    is ever pasted into the text (no quoting bugs, no injection)."""

    def __init__(self) -> None:
        self.bindings: dict[str, Any] = {}

    def bind(self, value: Any, name: str | None = None) -> str:
        name = name or f"v{len(self.bindings) + 1}"
        while name in self.bindings:
            name = f"{name}_"
        self.bindings[name] = value
        return f"@{name}"

    def query(self, query: Query) -> str:
        words = ["SELECT", self.select(query)]
        if query.kind is not None:
            words += ["FROM", _quote(query.kind)]
        if query.filter is not None:
            words += ["WHERE", self.filter(query.filter, nested=False)]
        if query.order:
            orders = ", ".join(f"{_quote(o.name)} {'DESC' if o.descending else 'ASC'}" for o in query.order)
            words += ["ORDER BY", orders]
        words += self.paging(query)
        return " ".join(words)

    def select(self, query: Query) -> str:
        projection = ", ".join(_quote(name) for name in query.projection)
        distinct_on = ", ".join(_quote(name) for name in query.distinct_on)
        if query.keys_only:
            if query.projection:
                raise GQLError("a query cannot be keys_only and have a projection too")
            projection = KEY_PROPERTY
        if query.distinct_on and query.distinct_on == query.projection:
            return f"DISTINCT {projection}"
        prefix = f"DISTINCT ON ({distinct_on}) " if query.distinct_on else ""
        return prefix + (projection or "*")

    def filter(self, node: Filter, *, nested: bool) -> str:
        if isinstance(node, PropertyFilter):
            value = list(node.value) if node.op in ("IN", "NOT_IN") else node.value
            return f"{_quote(node.name)} {_PRINTED_OPS.get(node.op, node.op)} {self.bind(value)}"
        if not node.filters:
            raise GQLError(f"cannot print an empty {node.op} filter")
        inner = f" {node.op} ".join(self.filter(child, nested=True) for child in node.filters)
        return f"({inner})" if nested and len(node.filters) > 1 else inner

    def paging(self, query: Query) -> list[str]:
        for field in ("limit", "offset"):
            value = getattr(query, field)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise GQLError(f"cannot print {field}={value!r}: it must be a non-negative integer")
        words = []
        if query.limit is not None and query.end_cursor is not None:
            limit, end = self.bind(query.limit, "limit"), self.bind(Cursor(query.end_cursor), "end_cursor")
            words += ["LIMIT", f"FIRST({limit}, {end})"]
        elif query.limit is not None:
            words += ["LIMIT", self.bind(query.limit, "limit")]
        elif query.end_cursor is not None:
            words += ["LIMIT", self.bind(Cursor(query.end_cursor), "end_cursor")]
        if query.start_cursor is not None:
            words += ["OFFSET", self.bind(Cursor(query.start_cursor), "start_cursor")]
            if query.offset:
                words += ["+", self.bind(query.offset, "offset")]
        elif query.offset:
            words += ["OFFSET", self.bind(query.offset, "offset")]
        return words


def to_gql(query: Query) -> tuple[str, dict[str, Any]]:
    """Print ``query`` as GQL text plus named bindings holding every value.

    ``parse(text, bindings, namespace=query.namespace) == query`` for every
    query ``parse`` could have produced: filters in canonical form (no
    single-child or same-operator nested groups), IN values as tuples, and
    no plain ``projection == ("__key__",)`` (that is ``keys_only``). GQL has
    no namespace clause, hence the namespace argument.
    """
    printer = _Printer()
    return printer.query(query), printer.bindings
