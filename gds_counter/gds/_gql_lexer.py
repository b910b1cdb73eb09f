"""GQL text to tokens, for ``_gql_parser``.

Why a tokenizer before the parser: php-gds matched regular expressions over
the whole text, so it split ``BRAND`` at "AND" and compared unquoted
numbers as strings. Here every character outside whitespace belongs to
exactly one token, each token knows its shape (name, quoted name, string,
integer, double, binding, symbol), and the parser never looks at raw text
again.

Literal rules that are decided here (the grammar itself is described in
``gds_counter.gds.gql``): strings take a doubled quote or one of a closed
list of backslash escapes, and an unknown escape is an error rather than a
guess (``\\%`` and ``\\_`` keep their backslash, as the Firestore emulator
keeps it); integers must fit in 64 bits, because Datastore could not
store anything else, while a double too large is an infinity (``1e400``),
as the emulator reads it; ``5.`` and ``.5`` are doubles; a binding name is ASCII and
``@__x__`` is reserved, as the Datastore API has it; a lone surrogate
anywhere in the text is refused, as no UTF-8 encoder takes it. Every
error names the 1-based column, and ``GQLError.position`` is the 0-based
offset.

``TokenStream`` is the parser's reading position in the tokens; it lives
here so the parser module holds grammar rules only.
"""

from __future__ import annotations

from typing import Any, NoReturn

import attrs

from gds_counter._checks import INT64_MAX, INT64_MIN, lone_surrogate
from gds_counter.errors import GQLError

__all__ = [
    "COMPARATORS",
    "DIGITS",
    "DOUBLE",
    "END",
    "INT",
    "Lexer",
    "PARAM",
    "PUNCT",
    "QUOTED",
    "STRING",
    "Token",
    "TokenStream",
    "WORD",
    "column",
    "is_binding_name",
    "is_reserved_binding",
    "shorten",
]

DIGITS = "0123456789"
_ASCII_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: Longest first, so that ``<=`` is never read as ``<`` then ``=``.
COMPARATORS = ("<=", ">=", "!=", "=", "<", ">")
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
    # Kept with their backslash, as the Firestore emulator keeps them (LIKE's escapes in MySQL's grammar).
    "%": "\\%",
    "_": "\\_",
}

# Token kinds.
END = "end"
WORD = "word"  # unquoted name or keyword
QUOTED = "quoted"  # `backtick quoted` name
STRING = "string"
INT = "int"
DOUBLE = "double"
PARAM = "param"  # @name (str value) or @1 (int value)
PUNCT = "punct"  # ( ) , * + . and the comparators


@attrs.frozen
class Token:
    """One lexeme: ``value`` is already decoded (a string without its quotes
    and escapes, an ``int``, a binding's name or position), while ``text`` and
    ``pos`` keep what was written and where, for error messages."""

    kind: str
    text: str  # as written, for error messages
    value: Any
    pos: int

    @property
    def word(self) -> str | None:
        # Keywords are ASCII: "ın".upper() == "IN" must not make a keyword.
        return self.value.upper() if self.kind == WORD and self.value.isascii() else None


def column(pos: int) -> int:
    """Messages count columns from 1, as editors do; offsets count from 0."""
    return pos + 1


#: The whitespace between tokens. The Firestore emulator refuses \v and
#: \f, and reads any other character beyond ASCII (a no-break space too)
#: as part of a name, as the ones below do.
WHITESPACE = " \t\n\r"


def _is_name_start(char: str) -> bool:
    return char in _ASCII_LETTERS or char in "_$" or not char.isascii()


def _is_name_char(char: str) -> bool:
    return _is_name_start(char) or char in DIGITS


def shorten(text: str, limit: int = 30) -> str:
    """Quote at most ``limit`` characters of the input in a message, so that
    hostile text cannot make an error message as large as itself."""
    return text if len(text) <= limit else text[:limit] + "..."


class Lexer:
    """Turns GQL text into tokens, one small reader per token shape."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.n = len(text)

    def tokens(self) -> list[Token]:
        # A lone surrogate can be in no name, string or keyword Datastore
        # accepts, and no encoder below would take it: refuse the text here,
        # where the column is known, wherever in the text it stands.
        bad = lone_surrogate(self.text)
        if bad is not None:
            raise GQLError(
                f"lone surrogate {self.text[bad]!r} at column {column(bad)} is not valid Unicode "
                "(GQL text must encode to UTF-8)",
                bad,
            )
        out: list[Token] = []
        i = 0
        while i < self.n:
            char = self.text[i]
            if char in WHITESPACE:
                i += 1
                continue
            token = self._read(i, out[-1] if out else None)
            out.append(token)
            i = token.pos + len(token.text)
        out.append(Token(END, "", None, self.n))
        return out

    def _read(self, i: int, before: Token | None) -> Token:
        text = self.text
        char = text[i]
        after_name = before is not None and (before.kind in (WORD, QUOTED) or before.text == ")")
        if char == "." and not after_name and i + 1 < self.n and text[i + 1] in DIGITS:
            return self._number(i)  # .5 (after a name, the dot of a.b)
        if char in "'\"":
            return self._quoted(i, STRING, "string")
        if char == "`":
            token = self._quoted(i, QUOTED, "quoted name")
            if not token.value:
                raise GQLError(f"empty quoted name `` at column {column(i)}", i)
            return token
        if char == "@":
            return self._param(i)
        if char in DIGITS or (char == "-" and i + 1 < self.n and text[i + 1] in DIGITS):
            return self._number(i)
        if _is_name_start(char):
            j = i + 1
            while j < self.n and _is_name_char(text[j]):
                j += 1
            return Token(WORD, text[i:j], text[i:j], i)
        for op in COMPARATORS:
            if text.startswith(op, i):
                return Token(PUNCT, op, op, i)
        if char == "!":
            raise GQLError(f"expected '=' after '!' at column {column(i)} (the operator is !=)", i)
        if char in "(),*+.":
            return Token(PUNCT, char, char, i)
        raise GQLError(f"unexpected character {char!r} at column {column(i)}", i)

    def _quoted(self, start: int, kind: str, what: str) -> Token:
        text, quote = self.text, self.text[start]
        out: list[str] = []
        i = start + 1
        while True:
            if i >= self.n:
                raise GQLError(f"unterminated {what} starting at column {column(start)}", start)
            char = text[i]
            if char == "\n":  # the Firestore emulator: "Lexical error" (a CR or any other character is kept)
                raise GQLError(f"a line break inside the {what} starting at column {column(start)}; write it as \\n", i)
            if char == quote:
                if i + 1 < self.n and text[i + 1] == quote:
                    out.append(quote)
                    i += 2
                    continue
                return Token(kind, text[start : i + 1], "".join(out), start)
            if char == "\\":
                if i + 1 >= self.n:
                    raise GQLError(f"unterminated {what} starting at column {column(start)}", start)
                escaped = text[i + 1]
                if escaped not in _STRING_ESCAPES:
                    raise GQLError(
                        f"unknown escape '\\{escaped}' in {what} at column {column(i)} "
                        "(known: \\\\ \\' \\\" \\` \\0 \\b \\n \\r \\t \\Z \\% \\_)",
                        i,
                    )
                out.append(_STRING_ESCAPES[escaped])
                i += 2
                continue
            out.append(char)
            i += 1

    def _param(self, start: int) -> Token:
        text = self.text
        i = start + 1
        if i < self.n and text[i] in DIGITS:
            while i < self.n and text[i] in DIGITS:
                i += 1
            digits = text[start + 1 : i]
            if i < self.n and _is_name_char(text[i]):
                raise GQLError(f"malformed binding {text[start : i + 1]!r} at column {column(start)}", start)
            if len(digits) > 9 or int(digits) == 0:
                raise GQLError(
                    f"positional binding @{shorten(digits)} at column {column(start)} is out of range "
                    "(positions count from @1)",
                    start,
                )
            return Token(PARAM, text[start:i], int(digits), start)
        if i < self.n and (text[i] in _ASCII_LETTERS or text[i] in "_$"):
            while i < self.n and (text[i] in _ASCII_LETTERS or text[i] in DIGITS or text[i] in "_$"):
                i += 1
            if i < self.n and _is_name_char(text[i]):
                raise GQLError(
                    f"binding name at column {column(start)} may only use A-Z, a-z, 0-9, _ and $ "
                    f"(found {text[i]!r})",
                    start,
                )
            name = text[start + 1 : i]
            if is_reserved_binding(name):
                raise GQLError(f"binding name @{name} at column {column(start)} is reserved (__x__)", start)
            return Token(PARAM, text[start:i], name, start)
        raise GQLError(f"expected a binding name or number after '@' at column {column(start)}", start)

    def _number(self, start: int) -> Token:
        text = self.text
        i = start + 1 if text[start] == "-" else start
        while i < self.n and text[i] in DIGITS:
            i += 1
        is_double = False
        if i < self.n and text[i] == ".":  # 1.5, and 5. and .5 as the emulator reads them
            is_double = True
            i += 1
            while i < self.n and text[i] in DIGITS:
                i += 1
        if i < self.n and text[i] in "eE":
            j = i + 1
            if j < self.n and text[j] in "+-":
                j += 1
            if j < self.n and text[j] in DIGITS:
                is_double = True
                i = j
                while i < self.n and text[i] in DIGITS:
                    i += 1
        if i < self.n and _is_name_char(text[i]):
            end = i
            while end < self.n and _is_name_char(text[end]):
                end += 1
            raise GQLError(f"malformed number {shorten(text[start:end])!r} at column {column(start)}", start)
        raw = text[start:i]
        if is_double:
            return Token(DOUBLE, raw, float(raw), start)  # beyond a double's range: an infinity, as the emulator reads it
        digits = raw.lstrip("-").lstrip("0") or "0"
        # More than 19 digits cannot fit; not converting them keeps int() off
        # hostile input thousands of digits long.
        integer = int(digits) * (-1 if raw.startswith("-") else 1) if len(digits) <= 19 else None
        if integer is None or not INT64_MIN <= integer <= INT64_MAX:
            raise GQLError(f"integer {shorten(raw)} at column {column(start)} does not fit in 64 bits", start)
        return Token(INT, raw, integer, start)


def is_reserved_binding(name: str) -> bool:
    """``@__x__`` names are reserved by the Datastore API."""
    return len(name) >= 4 and name.startswith("__") and name.endswith("__")


def is_binding_name(name: str) -> bool:
    """The ASCII-only name a ``@name`` binding may have, so a caller's mapping
    key can be checked against what the lexer would read."""
    return (
        bool(name)
        and (name[0] in _ASCII_LETTERS or name[0] in "_$")
        and all(c in _ASCII_LETTERS or c in DIGITS or c in "_$" for c in name)
    )


class TokenStream:
    """A position in the token list and the ways to move on or fail there.

    Why here and not in the parser: every syntax error reads the same way,
    "expected X at column N near 'Y'", whichever grammar rule raised it.
    """

    def __init__(self, tokens: list[Token]) -> None:
        self.tokens = tokens
        self.i = 0

    @property
    def tok(self) -> Token:
        return self.tokens[self.i]

    def peek(self, ahead: int = 1) -> Token:
        return self.tokens[min(self.i + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        token = self.tok
        if token.kind != END:
            self.i += 1
        return token

    def at_word(self, *words: str, token: Token | None = None) -> bool:
        return (token or self.tok).word in words

    def at_punct(self, symbol: str, token: Token | None = None) -> bool:
        token = token or self.tok
        return token.kind == PUNCT and token.value == symbol

    def at_call(self, *words: str) -> bool:
        """A function word (KEY, ARRAY, FIRST, ON...) is a keyword only
        before '(', so the same word stays free for property names."""
        return self.at_word(*words) and self.at_punct("(", self.peek())

    def fail(self, expected: str, token: Token | None = None, hint: str = "") -> NoReturn:
        token = token or self.tok
        near = "the end of the query" if token.kind == END else repr(shorten(token.text))
        message = f"expected {expected} at column {column(token.pos)} near {near}"
        raise GQLError(f"{message} ({hint})" if hint else message, token.pos)

    def error(self, message: str, token: Token) -> NoReturn:
        raise GQLError(f"{message} at column {column(token.pos)}", token.pos)

    def expect_word(self, word: str) -> Token:
        if not self.at_word(word):
            self.fail(word)
        return self.advance()

    def expect_punct(self, symbol: str, expected: str | None = None) -> Token:
        if not self.at_punct(symbol):
            self.fail(expected or f"'{symbol}'")
        return self.advance()
