"""GQL text, differentially: the Firestore emulator's own GQL engine is the
oracle for the embedded engine's GQL parser and query engine together.

``test_differential.py`` compares structured ``Query`` objects, so it never
tests the step from text to query. Here hypothesis (fixed seed,
``derandomize``) writes GQL TEXT from the whole grammar, and each text runs
on both sides over the same data:

* the oracle: the Firestore emulator in Datastore mode runs the text itself
  (``RunQueryRequest.gql_query`` / ``RunAggregationQueryRequest.gql_query``
  with ``allow_literals``, sent by a plain ``datastore_v1`` client below, not
  by our gateway), so the emulator's GQL parser decides what the text means;
* the embedded engine: ``gql.parse`` (or ``gql.parse_aggregation``) and then
  ``iterate_batches`` (or ``run_aggregation``) on a memory gateway.

What is drawn: SELECT ``*`` / ``__key__`` / projections / DISTINCT /
DISTINCT ON, FROM a kind (bare or quoted, another kind, none), WHERE with
AND, OR, parentheses and every condition form (``= < <= > >= !=``, IN, NOT
IN, CONTAINS, IS NULL, HAS ANCESTOR, ``KEY(...) HAS DESCENDANT __key__``, the
value first), ORDER BY, LIMIT (an integer, a binding, a cursor, FIRST(...)),
OFFSET (an integer, a binding, a cursor, ``@c + n``), aggregations (``SELECT
COUNT(*) ...`` and ``AGGREGATE ... OVER (...)``); literals of every kind, in
their different spellings (integers at the 64-bit edges, doubles with
exponents and -0.0, strings in both quotes with doubled quotes and escapes,
TRUE/FALSE/NULL, KEY with PROJECT and NAMESPACE, DATETIME with offsets and
fractions, BLOB, ARRAY), with ``@name`` / ``@1`` bindings for the values GQL
has no literal for (NaN, the infinities, geopoints), and now and then a
named or positional binding the text never uses; quoted and keyword-like
names, keywords in any case, whitespace variations. About a fifth of the
texts are then broken (a token deleted, swapped or inserted, a keyword
misspelled, a bad literal, a bad LIMIT / OFFSET), so refusals are compared
too. Values come from the data sets' own values, so filters hit. Spellings
beyond the GQL reference that the emulator's grammar may take are drawn now
and then and compared like the rest (``alt_*`` in the counts: a leading
``+``, ``.5``, ``5.``, ``1e400``, IN with one value, CONTAINS with a list,
``\\%`` in a string, KEY with another PROJECT), and so is unusual whitespace
(``\\v``, ``\\f``, no-break and ideographic spaces).

Comparison: rows in order, key and properties by type (``canon_entity``);
aggregations alias by alias, by type. A text the emulator refuses must be
refused by the embedded engine (with a gds_counter error) and the other way
round. Every difference is collected and the test fails listing them all.
``counts`` records how many cases reached each clause, condition form and
literal kind; the test fails if one of them was never reached, so the
generator cannot silently degenerate.

The deliberate differences (docs/gql.md) are undone exactly as
``test_differential.py`` undoes them, with its helpers: a query that reads a
list property's index without projecting it gets no LIMIT, OFFSET or cursor,
and the emulator's repeated rows are dropped (``repeats_per_element``); an
OR with a bare HAS ANCESTOR branch is run but not compared
(``bare_ancestor_branch``); a DATETIME on 1 or 2 January of the year 1 (the
emulator fails, UNKNOWN) is not compared. An emulator failure (UNKNOWN,
INTERNAL) counts as a refusal, as in ``test_differential.py``, except on a
cursor the emulator issued itself, which its cursor differential leaves out
too (docs/gql.md). Aggregations follow
``test_aggregation.py``'s emulator quirks: SUM/AVG of a list property that
also has an equality filter, or of a property holding embedded entities,
are run but not compared.

One more kind of difference is counted, not failed
(``the_query_alone_is_refused`` below, recognised narrowly, a row of
docs/gql.md): an aggregation the emulator answers over a query it refuses
alone (deliberate: the embedded engine applies the query's rules either
way).

``GDS_GQL_DIFFERENTIAL_QUERIES`` (1,000 in the full run, 600 in the quick run: fewer leave a grammar feature unreached) sets the number of texts,
``GDS_GQL_DIFFERENTIAL_SEED`` the seed.
"""

from __future__ import annotations

import base64
import datetime as dt
import math
import os
import random
import re
import uuid
from collections import Counter
from typing import Any, Callable, Iterator

import attrs
import grpc
import pytest
from google.api_core import exceptions as gexc
from google.cloud import datastore_v1
from google.cloud.datastore_v1.services.datastore.transports import DatastoreGrpcTransport
from google.cloud.datastore_v1.types import datastore as ds_types
from google.cloud.datastore_v1.types import query as q_types
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from sizes import sized
from test_differential import (  # pytest's default (prepend) import mode puts this folder on sys.path
    KIND,
    bare_ancestor_branch,
    canon,
    canon_entity,
    first_rows,
    make_data_set,
    parents,
    repeats_per_element,
    value_pool,
)

from gds_counter import open_gateway
from gds_counter.errors import GDSError
from gds_counter.gateway.base import iterate_batches
from gds_counter.gateway.datastore._codec import Codec
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.query import (
    CompositeFilter,
    Cursor,
    GqlSource,
    Order,
    PropertyFilter,
    Query,
    conjuncts_of,
    leaves_of,
)
from gds_counter.gateway.values import Geopoint, RawEntity
from gds_counter.gds import gql

UTC = dt.timezone.utc
QUERIES = sized("GDS_GQL_DIFFERENTIAL_QUERIES", 600, 1000)
SEED = int(os.environ.get("GDS_GQL_DIFFERENTIAL_SEED", "20250611"))
#: Other seeds than test_differential's: the same shape, other data.
DATA_SEEDS = (11, 12, 13, 14)
OTHER_KIND = "E"

# --- the data -------------------------------------------------------------------------

#: Strings whose GQL spelling needs quotes doubled, escapes, or raw non-ASCII;
#: each is stored, so a misread escape finds the wrong entity (or none).
SPECIAL_STRINGS = (
    "a'b", 'a"b', "a\\b", "a\nb", "a\tb", "a\rb", "a%b", "a\\%b", "a_b", "a\\_b", "a`b", "a\\`b",
    "\x00", "\x1a", "\b", "日本", "😀", "ab ", "''", "it's", 'say "hi"', "'", '"',
)
#: Values at the edges of their types, stored next to the special strings.
EDGE_VALUES = (
    2**63 - 1, -(2**63), 1000.0, 0.001, 1e-300, 123456789.125, -1.0, 7,
    dt.datetime(2020, 1, 1, 0, 0, 0, 500000, tzinfo=UTC), dt.datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    dt.datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), b"", b"\x00\xfe", "", True, False,
)
#: Filter-only values: the emulator fails (UNKNOWN) on 1 and 2 January of the
#: year 1 (docs/gql.md, deliberate differences).
YEAR_ONE = (dt.datetime(1, 1, 1, tzinfo=UTC), dt.datetime(1, 1, 2, 12, 30, tzinfo=UTC))
YEAR_ONE_END = dt.datetime(1, 1, 3, tzinfo=UTC)


def extras(ns: str) -> list[RawEntity]:
    out = []
    for i, text in enumerate(SPECIAL_STRINGS):
        props = {"a": text, "b": EDGE_VALUES[i % len(EDGE_VALUES)], "l": [text, i]}
        out.append(RawEntity(Key.of(KIND, f"s{i:02d}", namespace=ns), props))
    out.append(RawEntity(Key.of(KIND, "odd", namespace=ns), {name: i for i, name in enumerate(ODD_NAMES)}))
    out.append(RawEntity(Key.of(OTHER_KIND, 1, namespace=ns), {"a": 1, "n": 2.5}))
    out.append(RawEntity(Key.of(OTHER_KIND, "x", namespace=ns), {"a": "a", "b": True}))
    out.append(RawEntity(Key.of("P", "p1", OTHER_KIND, 2, namespace=ns), {"a": None, "l": [1, 2]}))
    return out


def data_set(index: int, ns: str) -> list[RawEntity]:
    return make_data_set(DATA_SEEDS[index], ns) + extras(ns)


def entity_keys(ns: str) -> list[Key]:
    keys = [Key.of(*(p.flat_path if p else ()), KIND, name, namespace=ns) for p in parents(ns) for name in ("e05", "e10")]
    keys += [Key.of(KIND, 7, namespace=ns), Key.of(KIND, -28, namespace=ns), Key.of(KIND, -1, namespace=ns),
             Key.of(KIND, "s03", namespace=ns), Key.of("P", "p1", namespace=ns), Key.of(OTHER_KIND, 1, namespace=ns)]
    return keys


def filter_pool(ns: str) -> list[Any]:
    """What conditions compare with: the data's own values (so filters hit),
    the edges, and keys of stored entities and of their parents."""
    return [*value_pool(ns), *SPECIAL_STRINGS, *EDGE_VALUES, *entity_keys(ns), *YEAR_ONE]


# --- writing GQL text --------------------------------------------------------------------

PROPERTIES = ("a", "b", "n", "l", "u", "m", "e.k")
SORTABLE = ("a", "b", "n", "l", "m", "e.k", "__key__")
PROJECTABLE = ("a", "b", "n", "l", "m", "e.k")
SCALARS = ("a", "b", "n", "m", "e.k")
AGGREGATED = ("a", "b", "n", "n", "l", "m", "e.k", "u", "e")
#: Names that are GQL words somewhere (function words, aggregation words,
#: words of the emulator's grammar), used bare as property names.
WORDLIKE = ("key", "first", "array", "blob", "datetime", "project", "namespace", "of", "parent", "child",
            "sum", "avg", "count", "count_up_to", "over", "as", "aggregate", "by", "on", "group", "having",
            "cursor", "like", "between", "join", "all", "any", "ancestor", "descendant", "dataset", "value",
            "kind", "é", "$x", "_")
#: Stored property names that only a quoted name can spell.
ODD_NAMES = ("x y", "q`t", "1st")
COMPARISONS = ("=", "<", "<=", ">", ">=", "!=")
MIRRORED = {"=": "=", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
ESCAPES = {"\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\x00": "\\0", "\x1a": "\\Z"}
PUNCTUATION = set("(),*=<>!")
#: Keywords and symbols whose loss (or a neighbour's) breaks the text; never
#: ASC/DESC/DISTINCT/NOT, whose loss leaves another valid query.
STRUCTURAL = {"SELECT", "FROM", "WHERE", "AND", "OR", "ORDER", "BY", "LIMIT", "OFFSET", "IS", "IN", "HAS",
              "CONTAINS", "OVER", "AGGREGATE", "AS", ",", "(", ")", "*", *COMPARISONS}
TYPOS = {"SELECT": "SELCT", "FROM": "FORM", "WHERE": "WHER", "AND": "ADN", "OR": "OOR", "ORDER": "ORDR",
         "BY": "BYY", "LIMIT": "LIMT", "OFFSET": "OFSET", "IS": "IZ", "IN": "INN", "HAS": "HAZ", "DESC": "DSC",
         "ASC": "ASCC", "CONTAINS": "CONTAIN", "DISTINCT": "DISTINC", "OVER": "OVR", "AGGREGATE": "AGGREGAT"}
JUNK = (";", "GROUP BY a", "HAVING", "JOIN", "==", "<>", "--", "#", "@", "@0", "%", "&&", "||", "FORM", "WHER",
        "SELECT", "LIMIT", "OFFSET", ",", "(", ")", "[", "]", "{", "?", "'", "`", "\\", "ASC DESC", "IS NOT NULL",
        "HAS PARENT", "HAS CHILD")
BAD_LITERALS = (
    "9223372036854775808", "-9223372036854775809", "99999999999999999999", "0x1F", "1_000", "1e", "1.2.3",
    "--1", "- 1", "'unterminated", "'a\\qb'", "'a\\u0041'", "'a\\x41'", "\"a\\fb\"", "'a\nb'",
    "BLOB('YQ==')", "BLOB('Y')", "BLOB('+/')", "BLOB('Y Q')", "BLOB(1)", "BLOB()",
    "DATETIME('2020-01-01T00:00:00')", "DATETIME('2020-01-01T00:00:00+00:00')", "DATETIME('2020-02-30T00:00:00Z')",
    "DATETIME('2020-01-01T24:00:00Z')", "DATETIME('2020-01-01T00:00:00.1234567Z')", "DATETIME('2020-01-01 00:00:00Z')",
    "DATETIME('2020-01-01T00:00:00+14:01')", "DATETIME('2020-01-01T00:00:00-13:01')", "DATETIME('2020-01-01T00:00Z')",
    "DATETIME(1)", "DATETIME('')", "KEY(D, 0)", "KEY(D, '')", "KEY('D', 1)", "KEY(D)", "KEY(D, 1, E)",
    "KEY(DATASET('x'), D, 1)", "KEY(NAMESPACE('x'), PROJECT('y'), D, 1)", "KEY(D, 1.5)", "KEY(D, NULL)",
    "KEY()", "ARRAY()", "ARRAY(ARRAY(1))", "NaN", "Infinity", "TRUE()", "NULL NULL", "@", "@0", "@__x__",
)
BAD_COUNTS = ("2147483648", "9223372036854775808", "-1", "1.5", "'5'", "NULL", "FIRST(1, 2)", "1, 2", "@unbound",
              "TRUE", "KEY(D, 1)")
BAD_TAILS = ("LIMIT 2147483648", "OFFSET 2147483648", "OFFSET 1 LIMIT 2", "LIMIT 1, 2", "LIMIT -1", "OFFSET -1",
             "LIMIT 1 LIMIT 2", "OFFSET 1 + 1", "LIMIT FIRST(1, 2)", "LIMIT 1.5", "LIMIT 3000000000")
RESERVED_BOTH = ("SELECT", "FROM", "WHERE", "AND", "OR", "NOT", "IS", "NULL", "TRUE", "FALSE", "IN", "CONTAINS",
                 "HAS", "ORDER", "ASC", "DESC", "LIMIT", "OFFSET", "DISTINCT")
ALIASES = ("total", "c", "s1", "avg_n", "x$", "`count`", "`sum`", "`over`", "`my alias`", "property_9", "Total")


class CursorSite:
    """A binding that becomes each side's end cursor of the issuing query."""

    def __repr__(self) -> str:
        return "<cursor>"


CURSOR = CursorSite()


@attrs.frozen
class Case:
    data_set: int
    namespace: str
    text: str
    aggregation: bool
    named: tuple[tuple[str, Any], ...]
    positional: tuple[Any, ...]
    issuing: str | None  # a query whose end cursor is bound where CURSOR is
    issuing_named: tuple[str, ...]
    issuing_positional: int
    features: frozenset[str]
    repeats: bool  # the emulator repeats an entity per list element (deliberate)
    not_compared: str | None  # why rows are not compared (a deliberate difference or quirk)
    mutation: str | None

    def describe(self) -> str:
        out = [f"set {self.data_set}: {self.text!r}"]
        if self.named or self.positional:
            bound = dict(self.named)
            bound.update({i + 1: v for i, v in enumerate(self.positional)})
            out.append(f"bindings {bound!r}")
        if self.issuing:
            out.append(f"cursor from {self.issuing!r}")
        if self.mutation:
            out.append(f"(broken: {self.mutation})")
        return "; ".join(out)


def has_or(f: Any) -> bool:
    return isinstance(f, CompositeFilter) and (f.op == "OR" or any(has_or(child) for child in f.filters))


#: Projects other than the emulator's (``gds-counter-test``) that key
#: literals name: one sorting after it, two before it.
OTHER_PROJECTS = ("other-project", "aaa", "example.com:gds")


def combine(op: str, items: list[Any]) -> Any:
    """As the parsers normalize a filter: one condition stays itself, nested
    groups of the same operator are flattened."""
    if len(items) == 1:
        return items[0]
    flat: list[Any] = []
    for item in items:
        flat.extend(item.filters if isinstance(item, CompositeFilter) and item.op == op else [item])
    return CompositeFilter(op, flat)


class Writer:
    """One case's text: hypothesis draws the structure, ``rng`` (seeded by a
    draw) the spelling noise (keyword case, quotes, whitespace)."""

    def __init__(self, draw: Any, ns: str, project: str, pool: list[Any], keys: list[Key],
                 held: dict[str, list[Any]]) -> None:
        self.draw = draw
        self.held = held
        self.rng = random.Random(draw(st.integers(0, 2**32 - 1)))
        self.ns = ns
        self.project = project
        self.pool = pool
        self.keys = keys
        self.features: set[str] = set()
        self.named: dict[str, Any] = {}
        self.positional: list[Any] = []
        self.positional_style = draw(st.integers(0, 9)) >= 7
        self.case_style = draw(st.sampled_from(("upper", "upper", "upper", "lower", "mixed")))
        self.tokens: list[tuple[str, str]] = []  # (text, role)
        self.cursor_site: str | None = None
        self.year_one = False
        #: The properties the aggregation being written sums or averages:
        #: its filter names them often (an equality in an OR branch on one
        #: is read from its index rows, ``row_query``).
        self.aggregated: tuple[str, ...] = ()

    # drawing
    def one(self, options: Any) -> Any:
        return self.draw(st.sampled_from(options))

    def maybe(self, percent: int) -> bool:
        # (the high end, so that hypothesis's simplest draw, 0, is "no")
        return self.draw(st.integers(0, 99)) >= 100 - percent

    def value_for(self, prop: str) -> Any:
        """Mostly a value the property holds somewhere in the data, so that
        filters hit; else any value of the pool."""
        held = self.held.get(prop)
        return self.one(held) if held and self.maybe(60) else self.one(self.pool)

    def feature(self, *names: str) -> None:
        self.features.update(names)

    # tokens
    def add(self, text: str, role: str = "other") -> None:
        self.tokens.append((text, role))

    def kw(self, word: str) -> None:
        self.add(self.spell(word), "kw")

    def spell(self, word: str) -> str:
        if self.case_style == "upper":
            return word
        self.feature("keyword_case")
        if self.case_style == "lower":
            return word.lower()
        return "".join(c.lower() if self.rng.random() < 0.5 else c for c in word)

    def quoted(self, text: str) -> str:
        return "`" + text.replace("`", "``") + "`"

    def name(self, prop: str) -> str:
        if prop == "__key__":
            if self.rng.random() < 0.1:
                self.feature("quoted_name")
                return "`__key__`"
            return prop
        if "." in prop:
            self.feature("dotted_name")
            form = self.rng.random()
            if form < 0.15:
                self.feature("quoted_name")
                return ".".join(self.quoted(p) for p in prop.split("."))
            if form < 0.25:
                self.feature("quoted_name")
                return self.quoted(prop)
            return prop
        if prop in WORDLIKE:
            self.feature("wordlike_name")
            return prop
        if prop in ODD_NAMES:
            self.feature("quoted_name", "quoted_name_odd")
            if "`" in prop and self.rng.random() < 0.5:
                return "`" + prop.replace("`", "\\`") + "`"
            return self.quoted(prop)
        if self.rng.random() < 0.2:
            self.feature("quoted_name")
            return self.quoted(prop)
        return prop

    def prop(self, choices: tuple[str, ...] = PROPERTIES) -> str:
        if self.aggregated and self.maybe(30):
            return self.one(self.aggregated)
        if self.maybe(4):
            return self.one(WORDLIKE)
        if self.maybe(3):
            return self.one(ODD_NAMES)
        if self.maybe(2):
            return "__key__"  # (compared with a value that is not a key: refused)
        return self.one(choices)

    def kind_name(self, kind: str) -> str:
        if self.rng.random() < 0.2:
            self.feature("quoted_kind")
            return self.quoted(kind)
        return kind

    # bindings
    def bind(self, value: Any) -> str:
        if isinstance(value, list):
            self.feature("binding_list")
        if self.positional_style:
            self.feature("binding_positional")
            self.positional.append(value)
            return f"@{len(self.positional)}"
        self.feature("binding_named")
        name = f"{self.rng.choice(('v', 'V', '_v', '$v', 'val_'))}{len(self.named)}"
        self.named[name] = value
        return "@" + name

    def bind_cursor(self) -> str:
        if self.cursor_site is None:
            self.cursor_site = self.bind(CURSOR)
        return self.cursor_site

    # literals
    def literal(self, value: Any) -> str:
        if isinstance(value, dt.datetime) and value < YEAR_ONE_END:
            self.year_one = True
        if isinstance(value, Geopoint) or (isinstance(value, float) and not math.isfinite(value)):
            if isinstance(value, float) and math.isinf(value) and self.rng.random() < 0.15:
                self.feature("alt_double_overflow")
                return "1e400" if value > 0 else "-1e400"
            return self.bind(value)
        if self.maybe(4):
            return self.bind(value)
        if value is None:
            self.feature("lit_null")
            return self.spell("NULL")
        if isinstance(value, bool):
            self.feature("lit_true" if value else "lit_false")
            return self.spell("TRUE" if value else "FALSE")
        if isinstance(value, int):
            return self.integer(value)
        if isinstance(value, float):
            return self.double(value)
        if isinstance(value, str):
            return self.string(value)
        if isinstance(value, bytes):
            self.feature("lit_blob")
            return f"{self.spell('BLOB')}({self.string(base64.urlsafe_b64encode(value).decode().rstrip('='), plain=True)})"
        if isinstance(value, dt.datetime):
            return self.datetime(value)
        if isinstance(value, Key):
            return self.key(value)
        raise AssertionError(value)

    def integer(self, value: int) -> str:
        self.feature("lit_int")
        if value < 0:
            self.feature("lit_int_negative")
        if abs(value) >= 2**62:
            self.feature("lit_int64_edge")
        form = self.rng.random()
        if form < 0.02 and value >= 0:
            self.feature("alt_plus_sign")
            return f"+{value}"
        if form < 0.08:
            self.feature("lit_int_leading_zero")
            return ("-" if value < 0 else "") + "0" + str(abs(value))
        return str(value)

    def double(self, value: float) -> str:
        self.feature("lit_double")
        if value == 0 and math.copysign(1, value) < 0:
            self.feature("lit_negative_zero")
        text = repr(value)
        form = self.rng.random()
        if form < 0.35:  # the digits as an integer mantissa and an exponent: 1.5 -> 15e-1
            self.feature("lit_double_exponent")
            sign, body = ("-", text[1:]) if text.startswith("-") else ("", text)
            mantissa, _, exp_text = body.partition("e")
            exponent = int(exp_text or 0)
            whole, _, fraction = mantissa.partition(".")
            exponent -= len(fraction)
            plus = "+" if exponent >= 0 and self.rng.random() < 0.5 else ""
            return f"{sign}{whole}{fraction}{self.rng.choice('eE')}{plus}{exponent}"
        if form < 0.37 and text.startswith("0."):
            self.feature("alt_double_leading_dot")
            return text[1:]
        if form < 0.39 and text.endswith(".0"):
            self.feature("alt_double_trailing_dot")
            return text[:-1]
        if form < 0.40 and not text.startswith("-"):
            self.feature("alt_plus_sign")
            return "+" + text
        if "e" in text:
            self.feature("lit_double_exponent")
        return text

    def string(self, value: str, plain: bool = False) -> str:
        quote = self.rng.choice("'\"")
        if not plain:
            self.feature("lit_string_single" if quote == "'" else "lit_string_double")
        out = [quote]
        for char in value:
            if char == quote:
                doubled = self.rng.random() < 0.5
                self.feature("lit_string_doubled_quote" if doubled else "lit_string_escape")
                out.append(quote * 2 if doubled else "\\" + quote)
            elif char in ESCAPES:
                self.feature("lit_string_escape")
                out.append(ESCAPES[char] if char in "\\\n\r" or self.rng.random() < 0.9 else char)
            elif char in "'\"`" and self.rng.random() < 0.3:
                self.feature("lit_string_escape")
                out.append("\\" + char)
            elif char in "%_" and self.rng.random() < 0.1:
                self.feature("alt_string_escape")
                out.append("\\" + char)
            else:
                if not char.isascii():
                    self.feature("lit_string_non_ascii")
                out.append(char)
        out.append(quote)
        return "".join(out)

    def datetime(self, value: dt.datetime) -> str:
        self.feature("lit_datetime")
        offset = self.rng.choice((0, 0, 0, 60, -480, 330, 840, -780, 765, -30))
        try:
            local = value + dt.timedelta(minutes=offset)
        except OverflowError:
            local, offset = value, 0
        if not 1 <= local.year <= 9999:
            local, offset = value, 0
        text = local.strftime("%Y-%m-%d") + self.rng.choice("TTTt") + local.strftime("%H:%M:%S")
        if local.microsecond:
            self.feature("lit_datetime_fraction")
            digits = f"{local.microsecond:06d}"
            text += "." + (digits.rstrip("0") if self.rng.random() < 0.5 else digits)
        elif self.rng.random() < 0.15:
            self.feature("lit_datetime_fraction")
            text += self.rng.choice((".0", ".000", ".000000"))
        if offset:
            self.feature("lit_datetime_offset")
            sign = "+" if offset > 0 else "-"
            text += f"{sign}{abs(offset) // 60:02d}:{abs(offset) % 60:02d}"
        else:
            text += self.rng.choice("ZZZz")
        return f"{self.spell('DATETIME')}({self.string(text, plain=True)})"

    def key(self, key: Key) -> str:
        self.feature("lit_key")
        parts = []
        form = self.rng.random()
        if key.namespace == self.ns:
            if form < 0.12:
                self.feature("lit_key_namespace")
                parts.append(f"{self.spell('NAMESPACE')}({self.string(self.ns, plain=True)})")
            elif form < 0.2:
                self.feature("lit_key_project", "lit_key_namespace")
                parts.append(f"{self.spell('PROJECT')}({self.string(self.project, plain=True)})")
                parts.append(f"{self.spell('NAMESPACE')}({self.string(self.ns, plain=True)})")
            elif form < 0.24:
                # another project, sorting after the emulator's or before it (a prefix of it too)
                self.feature("alt_key_other_project")
                other = self.one(OTHER_PROJECTS + (self.project[:-1],))
                parts.append(f"{self.spell('PROJECT')}({self.string(other, plain=True)})")
                parts.append(f"{self.spell('NAMESPACE')}({self.string(self.ns, plain=True)})")
        else:
            self.feature("lit_key_other_namespace")
            if key.namespace == "" and form < 0.5:
                self.feature("lit_key_project")
                parts.append(f"{self.spell('PROJECT')}({self.string(self.project, plain=True)})")
            else:
                parts.append(f"{self.spell('NAMESPACE')}({self.string(key.namespace, plain=True)})")
        if len(key.path) > 1:
            self.feature("lit_key_path")
        for element in key.path:
            parts.append(self.kind_name(element.kind))
            if element.name is not None:
                parts.append(self.string(element.name, plain=True))
            else:
                if element.id is not None and element.id < 0:
                    self.feature("lit_key_negative_id")
                parts.append(str(element.id))
        separator = self.rng.choice((", ", ",", " , "))
        return f"{self.spell('KEY')}({separator.join(parts)})"

    def values(self, op: str, prop: str) -> tuple[str, tuple[Any, ...]]:
        """An IN / NOT IN operand: ARRAY(...), a bound list, now and then
        one value, or a long list (Datastore takes at most 30 / 10)."""
        if self.maybe(12):
            items: list[Any] = list(self.draw(st.lists(st.integers(-5, 40), min_size=9, max_size=34, unique=True)))
        else:
            items = [self.value_for(prop) for _ in range(self.draw(st.integers(1, 4)))]
        form = self.draw(st.integers(0, 99))
        if form < 8:
            return self.bind(items), tuple(items)
        if form < 11 and op == "IN":
            self.feature("alt_in_scalar")
            return self.literal(items[0]), (items[0],)
        self.feature("lit_array")
        sep = self.rng.choice((", ", ",", " ,  "))
        return f"{self.spell('ARRAY')}({sep.join(self.literal(v) for v in items)})", tuple(items)

    # the grammar
    def condition(self, depth: int = 0) -> tuple[list[tuple[str, str]], Any]:
        if depth < 2 and self.maybe(38 if depth == 0 else 28):
            op = "OR" if self.aggregated and self.maybe(40) else self.one(("AND", "OR"))
            self.feature("and" if op == "AND" else "or")
            parts = [self.condition(depth + 1) for _ in range(self.draw(st.integers(2, 3)))]
            tokens: list[tuple[str, str]] = []
            for i, (inner, flt) in enumerate(parts):
                if i:
                    tokens.append((self.spell(op), "kw"))
                grouped = isinstance(flt, CompositeFilter) and not (op == "OR" and flt.op == "AND" and self.maybe(50))
                if isinstance(flt, CompositeFilter) and not grouped:
                    self.feature("precedence")
                if grouped or self.maybe(8):
                    self.feature("parentheses")
                    inner = [("(", "other"), *inner, (")", "other")]
                tokens.extend(inner)
            return tokens, combine(op, [flt for _, flt in parts])
        return self.leaf()

    def leaf(self) -> tuple[list[tuple[str, str]], Any]:
        if self.aggregated and self.maybe(20):  # an equality on what the aggregation sums
            prop = self.one(self.aggregated)
            value = self.value_for(prop)
            self.feature("op =")
            return [(self.name(prop), "name"), ("=", "other"), (self.literal(value), "lit")], PropertyFilter(prop, "=", value)
        form = self.one(("cmp",) * 8 + ("reversed", "reversed", "in", "in", "not_in", "contains", "value_in",
                                         "is_null", "key_cmp", "key_cmp", "key_in", "ancestor", "descendant"))
        if form in ("cmp", "reversed"):
            prop, op = self.prop(), self.one(COMPARISONS)
            value = self.value_for(prop)
            self.feature(f"op {op}")
            if form == "reversed":
                self.feature("reversed_condition")
                text = self.literal(value)
                return [(text, "lit"), (op, "other"), (self.name(prop), "name")], PropertyFilter(prop, MIRRORED[op], value)
            return [(self.name(prop), "name"), (op, "other"), (self.literal(value), "lit")], PropertyFilter(prop, op, value)
        if form in ("in", "not_in"):
            prop = self.prop()
            operand, items = self.values("IN" if form == "in" else "NOT_IN", prop)
            self.feature("op IN" if form == "in" else "op NOT IN")
            words = [(self.spell("IN"), "kw")] if form == "in" else [(self.spell("NOT"), "not"), (self.spell("IN"), "kw")]
            return [(self.name(prop), "name"), *words, (operand, "lit")], PropertyFilter(prop, "IN" if form == "in" else "NOT_IN", items)
        if form in ("contains", "value_in") and self.maybe(4):  # a list where one value goes
            prop = self.prop()
            operand, items = self.values("IN", prop)
            self.feature("alt_list_for_contains")
            if form == "contains":
                return [(self.name(prop), "name"), (self.spell("CONTAINS"), "kw"), (operand, "lit")], PropertyFilter(prop, "IN", items)
            return [(operand, "lit"), (self.spell("IN"), "kw"), (self.name(prop), "name")], PropertyFilter(prop, "IN", items)
        if form == "contains":
            prop = self.prop()
            value = self.value_for(prop)
            self.feature("op CONTAINS")
            return [(self.name(prop), "name"), (self.spell("CONTAINS"), "kw"), (self.literal(value), "lit")], PropertyFilter(prop, "=", value)
        if form == "value_in":
            prop = self.prop()
            value = self.value_for(prop)
            self.feature("op value IN property", "reversed_condition")
            return [(self.literal(value), "lit"), (self.spell("IN"), "kw"), (self.name(prop), "name")], PropertyFilter(prop, "=", value)
        if form == "is_null":
            prop = self.prop()
            self.feature("op IS NULL")
            return [(self.name(prop), "name"), (self.spell("IS"), "kw"), (self.spell("NULL"), "kw")], PropertyFilter(prop, "=", None)
        key_values = self.keys
        if form == "key_cmp":
            op, key = self.one(COMPARISONS), self.one(key_values)
            self.feature(f"op {op}", "key_condition")
            return [(self.name("__key__"), "name"), (op, "other"), (self.literal(key), "lit")], PropertyFilter("__key__", op, key)
        if form == "key_in":
            op = self.one(("IN", "NOT_IN"))
            items = tuple(self.draw(st.lists(st.sampled_from(key_values), min_size=1, max_size=3)))
            self.feature("key_condition", "lit_array", "op IN" if op == "IN" else "op NOT IN")
            words = [(self.spell("IN"), "kw")] if op == "IN" else [(self.spell("NOT"), "not"), (self.spell("IN"), "kw")]
            array = f"{self.spell('ARRAY')}({', '.join(self.literal(k) for k in items)})"
            return [(self.name("__key__"), "name"), *words, (array, "lit")], PropertyFilter("__key__", op, items)
        ancestors = [p for p in parents(self.ns) if p is not None] + key_values[:2] + [Key.of(KIND, 7, namespace=self.ns)]
        key = self.one(ancestors)
        if form == "ancestor":
            self.feature("op HAS ANCESTOR")
            return ([(self.name("__key__"), "name"), (self.spell("HAS"), "kw"), (self.spell("ANCESTOR"), "kw"),
                     (self.literal(key), "lit")], PropertyFilter("__key__", "HAS_ANCESTOR", key))
        self.feature("op HAS DESCENDANT", "reversed_condition")
        return ([(self.literal(key), "lit"), (self.spell("HAS"), "kw"), (self.spell("DESCENDANT"), "kw"),
                 (self.name("__key__"), "name")], PropertyFilter("__key__", "HAS_ANCESTOR", key))

    def names(self, names: tuple[str, ...]) -> None:
        for i, name in enumerate(names):
            if i:
                self.add(",")
            self.add(self.name(name), "name")

    def from_where(self, kind: str | None, where_percent: int) -> Any:
        """``FROM kind`` (none for a kindless query) and, ``where_percent``
        times in 100, ``WHERE`` a condition; the filter written, or None."""
        if kind is not None:
            self.feature("from")
            self.kw("FROM")
            self.add(self.kind_name(kind), "name")
        if not self.maybe(where_percent):
            return None
        self.feature("where")
        self.kw("WHERE")
        tokens, flt = self.condition()
        self.tokens.extend(tokens)
        return flt

    def query(self, *, inside_aggregation: bool) -> dict[str, Any]:
        """An ordinary query's tokens; returns its structure."""
        start = len(self.tokens)
        self.kw("SELECT")
        mode = self.one(("star", "star", "star", "keys", "projection", "distinct", "distinct_on", "distinct_on_star",
                         "distinct_on_other"))
        projection: tuple[str, ...] = ()
        distinct_on: tuple[str, ...] = ()
        if mode in ("projection", "distinct", "distinct_on"):
            projection = tuple(self.draw(st.lists(st.sampled_from(PROJECTABLE + ("__key__",)), min_size=1, max_size=3,
                                                  unique=not self.maybe(5))))
            if projection == ("__key__",):
                projection = ("a", "__key__")
            if "__key__" in projection:
                self.feature("key_in_projection")
        if mode == "distinct":
            self.feature("distinct")
            self.kw("DISTINCT")
            distinct_on = projection
            self.names(projection)
        elif mode.startswith("distinct_on"):
            self.feature("distinct_on")
            pool = projection if mode == "distinct_on" else SCALARS
            distinct_on = tuple(self.draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2, unique=True)))
            self.kw("DISTINCT")
            self.kw("ON")
            self.add("(")
            self.names(distinct_on)
            self.add(")")
            if mode == "distinct_on_star":
                self.feature("distinct_on_star")
                self.add("*")
            else:
                if mode == "distinct_on_other":
                    projection = tuple(self.draw(st.lists(st.sampled_from(SCALARS), min_size=1, max_size=2, unique=True)))
                self.feature("projection")
                self.names(projection)
        elif mode == "star":
            self.add("*")
        elif mode == "keys":
            self.feature("keys_only")
            self.add(self.name("__key__"), "name")
        else:
            self.feature("projection")
            self.names(projection)
        kind = self.one((KIND,) * 7 + (OTHER_KIND, None, "Z"))
        if kind is None:
            self.feature("kindless")
        elif kind == OTHER_KIND:
            self.feature("other_kind")
        flt = self.from_where(kind, 75)
        orders: list[Order] = []
        if self.maybe(45):
            names = self.draw(st.lists(st.sampled_from(SORTABLE), min_size=1, max_size=3, unique=not self.maybe(8)))
            self.feature("order_by")
            self.kw("ORDER")
            self.kw("BY")
            for i, name in enumerate(names):
                if i:
                    self.add(",")
                self.add(self.name(name), "name")
                direction = self.one(("", "", "ASC", "DESC", "DESC"))
                if direction:
                    self.feature(direction.lower())
                    self.add(self.spell(direction), "direction")
                orders.append(Order(name, direction == "DESC"))
        body_end = len(self.tokens)
        body_named, body_positional = tuple(self.named), len(self.positional)
        keys_only = mode == "keys"
        repeats = not inside_aggregation and repeats_per_element(orders, () if keys_only else projection, flt)
        if repeats:
            self.feature("repeats_per_element")
        else:
            self.limit_offset()
        return {"filter": flt, "orders": orders, "projection": projection, "start": start, "body_end": body_end,
                "body_named": body_named, "body_positional": body_positional, "repeats": repeats, "kind": kind}

    def limit_offset(self) -> None:
        limit = self.one((None,) * 6 + ("n", "n", "n", "n", "bind", "cursor", "first", "max", "zero", "comma"))
        offset = self.one((None,) * 9 + ("n", "n", "bind", "cursor", "cursor_plus", "max"))
        if limit is not None:
            self.feature("limit")
            self.kw("LIMIT")
            if limit == "n":
                self.add(self.integer(self.draw(st.integers(1, 8))), "count")
            elif limit == "comma":  # an older reference's LIMIT offset, count (Datastore: no)
                self.feature("limit_comma")
                self.add(self.bind_cursor() if self.maybe(50) else str(self.draw(st.integers(0, 3))), "count")
                self.add(",")
                self.add(str(self.draw(st.integers(1, 4))), "count")
            elif limit == "zero":
                self.add("0", "count")
            elif limit == "max":
                self.add(self.one(("2147483647", "2147483647", "2147483648")), "count")
            elif limit == "bind":
                self.feature("limit_binding")
                self.add(self.bind(self.draw(st.integers(1, 6))), "count")
            elif limit == "cursor":
                self.feature("cursor_limit")
                self.add(self.bind_cursor(), "count")
            else:
                self.feature("cursor_first")
                count = str(self.draw(st.integers(0, 6)))
                pair = (self.bind_cursor(), count) if self.maybe(50) else (count, self.bind_cursor())
                self.add(f"{self.spell('FIRST')}({pair[0]}, {pair[1]})", "count")
        if offset is not None:
            self.feature("offset")
            self.kw("OFFSET")
            if offset == "n":
                self.add(self.integer(self.draw(st.integers(0, 4))), "count")
            elif offset == "max":
                self.add(self.one(("2147483647", "2147483648")), "count")
            elif offset == "bind":
                self.feature("offset_binding")
                self.add(self.bind(self.draw(st.integers(0, 3))), "count")
            else:
                self.feature("cursor_offset")
                self.add(self.bind_cursor(), "count")
                if offset == "cursor_plus":
                    self.feature("cursor_plus")
                    self.add("+")
                    skip = self.draw(st.integers(0, 3))
                    self.add(self.bind(skip) if self.maybe(25) else str(skip), "count")

    def aggregation(self) -> dict[str, Any]:
        self.feature("aggregation")
        form = self.one(("select", "aggregate", "aggregate"))
        count = self.one((1, 1, 2, 2, 3, 4, 5, 6) if self.maybe(10) else (1, 1, 2, 2, 3, 4, 5))
        items: list[tuple[str, str | None]] = []
        if form == "aggregate":
            self.feature("aggregate_over")
            self.kw("AGGREGATE")
        else:
            self.feature("select_aggregation")
            self.kw("SELECT")
        aliases = list(ALIASES)
        for i in range(count):
            if i:
                self.add(",")
            kind = self.one(("COUNT", "COUNT_UP_TO", "SUM", "SUM", "AVG", "AVG"))
            self.feature(kind.lower())
            if kind == "COUNT":
                self.add(f"{self.spell('COUNT')}(*)", "other")
                items.append((kind, None))
            elif kind == "COUNT_UP_TO":
                self.add(f"{self.spell('COUNT_UP_TO')}({self.draw(st.integers(0, 50))})", "other")
                items.append((kind, None))
            else:
                prop = self.one(AGGREGATED)
                self.add(f"{self.spell(kind)}({self.name(prop)})", "other")
                items.append((kind, prop))
            if self.maybe(40):
                self.feature("alias")
                self.kw("AS")
                alias = self.one(aliases)
                if not self.maybe(5):
                    aliases.remove(alias)
                self.add(alias, "name")
        self.aggregated = tuple(prop for _, prop in items if prop is not None and prop in PROPERTIES)
        if form == "aggregate":
            self.kw("OVER")
            self.add("(")
            structure = self.query(inside_aggregation=True)
            self.add(")")
        else:
            start = len(self.tokens)
            flt = self.from_where(self.one((KIND,) * 6 + (OTHER_KIND, None)), 70)
            structure = {"filter": flt, "orders": [], "projection": (), "start": start, "body_end": len(self.tokens),
                         "body_named": tuple(self.named), "body_positional": len(self.positional), "repeats": False}
        structure["aggregations"] = items
        return structure

    # breaking a text
    def mutate(self) -> str:
        tokens = self.tokens
        how = self.one(("delete", "swap", "junk", "typo", "bad_literal", "bad_count", "reserved_name"))
        structural = [i for i, (t, role) in enumerate(tokens) if t.upper() in STRUCTURAL and role in ("kw", "other")]
        if how == "delete" and structural:
            i = self.one(structural)
            del tokens[i]
            return f"deleted {i}"
        if how == "swap" and structural:
            i = self.one(structural)
            j = i + 1 if i + 1 < len(tokens) else i - 1
            if tokens[i][0] != tokens[j][0]:
                tokens[i], tokens[j] = tokens[j], tokens[i]
                return f"swapped {min(i, j)}"
        if how == "typo":
            words = [i for i, (t, role) in enumerate(tokens) if t.upper() in TYPOS and role in ("kw", "direction")]
            if words:
                i = self.one(words)
                tokens[i] = (self.spell(TYPOS[tokens[i][0].upper()]), "kw")
                return "misspelled"
        if how == "bad_literal":
            literals = [i for i, (_, role) in enumerate(tokens) if role == "lit"]
            if literals:
                tokens[self.one(literals)] = (self.one(BAD_LITERALS), "lit")
                return "bad literal"
        if how == "bad_count":
            counts = [i for i, (_, role) in enumerate(tokens) if role == "count"]
            if counts:
                tokens[self.one(counts)] = (self.one(BAD_COUNTS), "count")
            else:
                tokens.append((self.one(BAD_TAILS), "count"))
            return "bad LIMIT/OFFSET"
        if how == "reserved_name":
            names = [i for i, (_, role) in enumerate(tokens) if role == "name"]
            if names:
                tokens[self.one(names)] = (self.spell(self.one(RESERVED_BOTH)), "name")
                return "reserved word as a name"
        tokens.insert(self.draw(st.integers(1, len(tokens))), (self.one(JUNK), "other"))
        return "junk inserted"

    def join(self, tokens: list[tuple[str, str]]) -> str:
        style = self.one(("plain",) * 6 + ("varied", "tight"))
        out = []
        for i, (text, _) in enumerate(tokens):
            if i:
                before = out[-1]
                tight = before[-1] in PUNCTUATION or text[0] in PUNCTUATION
                if style == "tight" and tight and not (before[-1] in "<>!=" and text[0] in "<>=") and self.rng.random() < 0.7:
                    self.feature("whitespace_none")
                elif style == "varied":
                    self.feature("whitespace_varied")
                    gap = self.rng.choice((" ", "  ", "\t", "\n", "\r\n", " \n\t"))
                    if self.rng.random() < 0.02:
                        self.feature("whitespace_unusual")
                        gap = self.rng.choice(("\u00a0", "\u3000", "\f", "\v"))
                    out.append(gap)
                else:
                    out.append(" ")
            out.append(text)
        text = "".join(out)
        if style == "varied" and self.rng.random() < 0.3:
            text = self.rng.choice(("", " ", "\n")) + text + self.rng.choice(("", " ", "\n", "\t"))
        return text


@st.composite
def cases(draw: Any, namespaces: list[str], project: str) -> Case:
    index = draw(st.integers(0, len(namespaces) - 1))
    ns = namespaces[index]
    w = Writer(draw, ns, project, POOLS[ns], KEYS[ns], HELD[ns])
    aggregation = w.maybe(15)
    structure = w.aggregation() if aggregation else w.query(inside_aggregation=False)
    tokens = list(w.tokens)
    issuing = None
    if w.cursor_site is not None:  # the same query, up to ORDER BY, with a LIMIT: its end cursor is bound
        body = tokens[structure["start"] : structure["body_end"]]
        issuing = w.join(body + [(w.spell("LIMIT"), "kw"), (str(draw(st.integers(1, 4))), "count")])
    mutation = w.mutate() if w.maybe(20) else None
    if mutation:
        w.feature("broken")
    text = w.join(w.tokens)
    # (drawn from the writer's own random stream, after the text, so that
    # hypothesis's draws and every other case stay as they were)
    if w.rng.random() < 0.1:  # a named binding the text never uses: ignored by both (docs/gql.md)
        w.feature("binding_unused_named")
        w.named[f"unused{len(w.named)}"] = w.rng.choice(w.pool)
    if w.rng.random() < 0.03 and not aggregation:  # a positional one: refused by both (an aggregation: docs/gql.md)
        w.feature("binding_unused_positional")
        w.positional.append(w.rng.choice(w.pool))
    flt = structure["filter"]
    not_compared = None
    if bare_ancestor_branch(flt):
        not_compared = "an OR with a bare HAS ANCESTOR branch (docs/gql.md)"
    elif w.year_one:
        not_compared = "a DATETIME on 1 or 2 January of the year 1 (docs/gql.md)"
    elif aggregation:
        summed = {prop for kind, prop in structure["aggregations"] if prop is not None}
        if has_or(flt):
            fixed_in_and = {c.name for c in conjuncts_of(flt) if c.op in ("=", "IN")}
            if any(leaf.op in ("=", "IN") and leaf.name in summed - fixed_in_and for leaf in leaves_of(flt)):
                w.feature("aggregated_fixed_in_or_branch")
        equal_on_list = any(leaf.name == "l" and leaf.op in ("=", "IN") for leaf in (leaves_of(flt) if flt is not None else ()))
        if "e" in summed:
            not_compared = "SUM/AVG of embedded entities (test_aggregation.py quirk 2)"
        elif "l" in summed and equal_on_list:
            not_compared = "SUM/AVG of a list with an equality filter on it (test_aggregation.py quirk 1)"
        elif any(o.name == "l" for o in structure["orders"]) and any(c.name == "l" and c.op in ("=", "IN") for c in conjuncts_of(flt)):
            not_compared = "an aggregation ordered by a list an equality fixes (test_aggregation.py quirk 1)"
    return Case(
        data_set=index,
        namespace=ns,
        text=text,
        aggregation=aggregation,
        named=tuple(w.named.items()),
        positional=tuple(w.positional),
        issuing=issuing,
        issuing_named=structure["body_named"],
        issuing_positional=structure["body_positional"],
        features=frozenset(w.features),
        repeats=structure["repeats"],
        not_compared=not_compared,
        mutation=mutation,
    )


#: Filled by the fixture: each namespace's filter values and keys.
POOLS: dict[str, list[Any]] = {}
KEYS: dict[str, list[Key]] = {}
HELD: dict[str, dict[str, list[Any]]] = {}


def held_values(entities: list[RawEntity]) -> dict[str, list[Any]]:
    """Each property's stored values (list elements, and ``e.k`` inside ``e``)."""
    out: dict[str, list[Any]] = {}
    for entity in entities:
        for name, value in entity.properties.items():
            if isinstance(value, RawEntity):
                name, value = name + ".k", value.properties.get("k")
            for item in value if isinstance(value, list) else [value]:
                out.setdefault(name, []).append(item)
    return out


# --- the two sides ------------------------------------------------------------------------

NOT_FINISHED = q_types.QueryResultBatch.MoreResultsType.NOT_FINISHED
#: The emulator's answers to a text it will not run; anything else (UNKNOWN,
#: INTERNAL) is the emulator failing, which the comparison also counts as a
#: refusal, as test_differential does, except where a deliberate difference says.
REFUSALS = (gexc.InvalidArgument, gexc.FailedPrecondition, gexc.OutOfRange)


def refused(exc: BaseException, label: str = "") -> tuple[str, str, str]:
    kind = "refused" if isinstance(exc, (*REFUSALS, GDSError)) else "failed"
    return (kind, type(exc).__name__, (label + str(exc))[:200])


class Oracle:
    """The Firestore emulator running GQL text itself, through a plain
    ``datastore_v1`` client. Results are decoded with the gateway's codec
    (values only; the text is never parsed on this side)."""

    def __init__(self, host: str, project: str, gateway: Any = None) -> None:
        self.project = project
        #: The emulator through our gateway, for structured queries only
        #: (``the_query_alone_is_refused``).
        self.gateway = gateway
        self.codec = Codec(project, "")
        self.channel = grpc.insecure_channel(host)
        self.client = datastore_v1.DatastoreClient(transport=DatastoreGrpcTransport(channel=self.channel))

    def close(self) -> None:
        self.channel.close()

    def _gql(self, text: str, named: dict[str, Any], positional: list[Any]) -> Any:
        """The text as sent, its bindings encoded as our gateway encodes
        them (``Codec.gql_to_pb`` only encodes values: the text is not read)."""
        return self.codec.gql_to_pb(Query(gql=GqlSource(text, tuple(named.items()), tuple(positional))))

    def query(self, ns: str, text: str, named: dict[str, Any], positional: list[Any]) -> tuple[list[RawEntity], bytes | None]:
        request = ds_types.RunQueryRequest.pb()(project_id=self.project)
        request.partition_id.CopyFrom(self.codec.partition(ns))
        request.gql_query.CopyFrom(self._gql(text, named, positional))
        entities: list[RawEntity] = []
        for _ in range(1000):
            response = self.client.run_query(request=ds_types.RunQueryRequest(request), timeout=60)._pb
            batch = response.batch
            entities.extend(self.codec.entity_from_pb(r.entity) for r in batch.entity_results)
            if batch.more_results != NOT_FINISHED:
                break
            # Go on with the structured query the server read the text as.
            sent = request.query if request.HasField("query") else response.query
            following = q_types.Query.pb()()
            following.CopyFrom(sent)
            following.start_cursor = batch.end_cursor
            following.offset = max(0, sent.offset - batch.skipped_results)
            if sent.HasField("limit"):
                following.limit.value = sent.limit.value - len(batch.entity_results)
            request.query.CopyFrom(following)
        return entities, bytes(batch.end_cursor) or None

    def aggregate(self, ns: str, text: str, named: dict[str, Any], positional: list[Any]) -> dict[str, Any]:
        request = ds_types.RunAggregationQueryRequest.pb()(project_id=self.project)
        request.partition_id.CopyFrom(self.codec.partition(ns))
        request.gql_query.CopyFrom(self._gql(text, named, positional))
        response = self.client.run_aggregation_query(request=ds_types.RunAggregationQueryRequest(request), timeout=60)._pb
        results = response.batch.aggregation_results
        return {alias: self.codec.value_from_pb(pb)[0] for alias, pb in (results[0].aggregate_properties.items() if results else ())}


class Embedded:
    """The embedded engine: our parser, then the memory gateway."""

    def __init__(self, gateway: Any = None) -> None:
        self.gateway = gateway if gateway is not None else open_gateway("memory://")

    def close(self) -> None:
        self.gateway.close()

    @staticmethod
    def _bindings(named: dict[str, Any], positional: list[Any]) -> Any:
        bound: dict[Any, Any] = dict(named)
        bound.update({i + 1: v for i, v in enumerate(positional)})
        return bound or None

    def query(self, ns: str, text: str, named: dict[str, Any], positional: list[Any]) -> tuple[list[RawEntity], bytes | None]:
        query = gql.parse(text, self._bindings(named, positional), namespace=ns)
        entities: list[RawEntity] = []
        end = None
        for batch in iterate_batches(self.gateway, query):
            entities.extend(batch.entities)
            end = batch.end_cursor
        return entities, end

    def aggregate(self, ns: str, text: str, named: dict[str, Any], positional: list[Any]) -> dict[str, Any]:
        aggregation = gql.parse_aggregation(text, self._bindings(named, positional), namespace=ns)
        return dict(self.gateway.run_aggregation(aggregation).items())


def answer(side: Any, case: Case) -> Any:
    """Rows (canonical, in order), an aggregation's values by alias, or
    ('refused' | 'failed' | 'crashed', error class, message)."""
    named, positional = dict(case.named), list(case.positional)
    try:
        if case.issuing is not None:
            try:
                issued = side.query(case.namespace, case.issuing, {k: named[k] for k in case.issuing_named},
                                    positional[: case.issuing_positional])
            except Exception as exc:  # noqa: BLE001 - classified below
                if not isinstance(exc, (gexc.GoogleAPICallError, GDSError)):
                    raise
                return refused(exc, "the issuing query: ")
            if issued[1] is None:
                return ("no cursor", "", "the issuing query gave no end cursor")
            cursor = Cursor(issued[1])
            named = {k: cursor if v is CURSOR else v for k, v in named.items()}
            positional = [cursor if v is CURSOR else v for v in positional]
        if case.aggregation:
            values = side.aggregate(case.namespace, case.text, named, positional)
            return {"aggregation": tuple(sorted((alias, canon(v)) for alias, v in values.items()))}
        entities, _ = side.query(case.namespace, case.text, named, positional)
        return [canon_entity(e, True) for e in entities]
    except (gexc.GoogleAPICallError, GDSError) as exc:
        return refused(exc)
    except Exception as exc:  # noqa: BLE001 - a crash is a difference, with its class and message
        return ("crashed", type(exc).__name__, str(exc)[:200])


def outcome(result: Any) -> str:
    if isinstance(result, tuple):
        return "refused" if result[0] in ("refused", "failed") else result[0]
    return "rows"


def show(result: Any, around: int | None = None) -> str:
    if isinstance(result, tuple):
        return repr(result)
    if isinstance(result, dict):
        return repr(dict(result["aggregation"]))
    start = 0 if around is None else max(0, around - 2)
    rows = result[start : start + 6]
    text = ", ".join("/".join(map(str, key)) + (f" {dict(props)}" if props else "") for key, props in rows)
    more = f" ... ({len(result)} rows)" if len(result) > start + 6 or start else f" ({len(result)} rows)"
    return ("... " if start else "") + "[" + text + "]" + more


def difference(case: Case, theirs: Any, ours: Any) -> str:
    around = None
    if isinstance(theirs, list) and isinstance(ours, list):
        around = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
    return f"{case.describe()}\n    emulator: {show(theirs, around)}\n    embedded: {show(ours, around)}"


# --- the tests ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sides(firestore_emulator: Any) -> Iterator[tuple[Oracle, Embedded, list[str], str]]:
    """Both sides hold the same data sets, one namespace each; written to the
    emulator through our gateway (writes are not under test here)."""
    run_id = uuid.uuid4().hex[:8]
    namespaces = [f"gqldiff-{run_id}-{i}" for i in range(len(DATA_SEEDS))]
    writer = firestore_emulator.gateway(namespace=namespaces[0])
    oracle = Oracle(firestore_emulator.host, firestore_emulator.project, writer)
    embedded = Embedded(open_gateway(f"memory://?project={firestore_emulator.project}"))
    for index, ns in enumerate(namespaces):
        entities = data_set(index, ns)
        for gateway in (writer, embedded.gateway):
            gateway.commit([Upsert(e) for e in entities])
        POOLS[ns] = filter_pool(ns)
        KEYS[ns] = entity_keys(ns)
        HELD[ns] = held_values(entities)
    try:
        yield oracle, embedded, namespaces, firestore_emulator.project
    finally:
        writer.close()
        oracle.close()
        embedded.close()


@pytest.fixture(scope="module")
def served(sides: Any, serve_server: Any) -> Iterator[tuple[Embedded, Oracle]]:
    """``gds-counter serve`` (a ``Server`` over its own SQLite file) holding
    the same data sets, asked two ways: through gds_counter's Datastore
    gateway (``Embedded`` on it: the text parsed here, then sent as GQL
    text, which the server parses again and runs; aggregations structured),
    and as raw GQL text by a plain ``datastore_v1`` client (``Oracle`` on
    it: the server alone reads the text, as php-gds sends it)."""
    from gds_counter.gateway.datastore import DatastoreGateway

    _, _, namespaces, project = sides
    gateway = DatastoreGateway(project, namespace=namespaces[0], emulator_host=serve_server.emulator_host)
    for index, ns in enumerate(namespaces):
        gateway.commit([Upsert(e) for e in data_set(index, ns)])
    text = Oracle(serve_server.emulator_host, project, gateway)
    try:
        yield Embedded(gateway), text
    finally:
        text.close()
        gateway.close()


def through_the_server(result: Any) -> Any:
    """A result as the server's sides are compared with the embedded
    engine's: rows and aggregations as they are; a refusal as the outcome
    class and the engine's message (without what the gateway or the status
    puts before it: ``run_query: rejected by Datastore:``, ``400 ...``)."""
    if isinstance(result, tuple) and result[0] in ("refused", "failed"):
        message = re.sub(r"^(the issuing query: )?(\w+: rejected by Datastore: )?(\d{3} )?([A-Z_]+: )?", "", result[2])
        return ("refused", message[:100])
    return result


def every_generated_text(namespaces: Any, project: str) -> Callable[[Callable[[Case], None]], Callable[[], None]]:
    """Run a check on each generated text of the run: the same seed and
    count for every side compared, so their answers pair up."""

    def run_on_each(check: Callable[[Case], None]) -> Callable[[], None]:
        generated = given(cases(namespaces, project))(check)
        return seed(SEED)(settings(max_examples=QUERIES, derandomize=True, deadline=None, database=None,
                                   suppress_health_check=list(HealthCheck))(generated))

    return run_on_each


def test_the_server_answers_every_gql_text_as_the_embedded_engine(sides: Any, served: Any) -> None:
    """The GQL differential through ``gds-counter serve``: the same texts
    (same seed and count as the emulator's GQL differential), through the
    Datastore gateway on the server and as raw text to the server, give
    exactly the embedded engine's rows in order, aggregations by alias, and
    refusals with its message."""
    _, embedded, namespaces, project = sides
    gateway_side, text_side = served
    differences: list[str] = []
    counts: Counter[str] = Counter()

    @every_generated_text(namespaces, project)
    def check(case: Case) -> None:
        counts["cases"] += 1
        ours = through_the_server(answer(embedded, case))
        counts[outcome(ours)] += 1
        for label, side in (("gateway", gateway_side), ("text", text_side)):
            theirs = through_the_server(answer(side, case))
            if theirs != ours:
                differences.append(difference(case, theirs, ours).replace("emulator:", f"server ({label}):"))

    check()
    distinct = list(dict.fromkeys(differences))
    print(f"\nGQL differential through the server (seed {SEED}): {dict(counts)}, {len(distinct)} differences")
    assert counts["cases"] >= QUERIES and counts["rows"] > QUERIES // 4 and counts["refused"] > QUERIES // 10, counts
    assert not distinct, f"{len(distinct)} of {counts['cases']} texts differ:\n" + "\n".join(distinct[:40])


# --- the differences left (docs/gql.md, "GQL: what the differential compares") ---------------------


def the_query_alone_is_refused(oracle: Oracle, case: Case, ours: Any) -> bool:
    """Deliberate: an aggregation the emulator answers, though it refuses
    the very query it runs over, alone, for the rule the embedded engine
    gives (a NOT IN beside an OR, two !=, an OR with a branch off the
    common ancestor). Datastore documents those rules for queries; the
    embedded engine applies them to the query either way."""
    if not (case.aggregation and isinstance(ours, tuple) and ours[0] == "refused"):
        return False
    try:
        aggregation = gql.parse_aggregation(case.text, Embedded._bindings(dict(case.named), list(case.positional)),
                                            namespace=case.namespace)
        oracle.gateway.run_query(aggregation.query.replace(limit=1))
    except GDSError as exc:
        return ours[2].rstrip(".") in str(exc)
    return False


def plain(ns: str, text: str, aggregation: bool = False) -> Case:
    return Case(0, ns, text, aggregation, (), (), None, (), 0, frozenset(), False, None, None)


def test_the_gql_oracle_answers_and_refuses(sides: Any) -> None:
    """The comparison means something only if the emulator really runs the
    text: a plain query returns every row, a count counts them, broken text
    is refused (and the embedded engine agrees on these)."""
    oracle, embedded, namespaces, _ = sides
    ns = namespaces[0]
    stored = sum(1 for e in data_set(0, ns) if e.key is not None and e.key.path[-1].kind == KIND)
    for side in (oracle, embedded):
        rows = answer(side, plain(ns, f"SELECT * FROM {KIND}"))
        assert isinstance(rows, list) and len(rows) == stored, show(rows)
        assert answer(side, plain(ns, f"SELECT COUNT(*) AS n FROM {KIND}", True)) == {"aggregation": (("n", ("int", stored)),)}
        for broken in (f"SELECT * FROM {KIND} WHERE", f"SELECT * FORM {KIND}", f"SELECT * FROM {KIND} LIMIT 2147483648"):
            assert outcome(answer(side, plain(ns, broken))) == "refused", broken
        hit = answer(side, plain(ns, f"SELECT __key__ FROM {KIND} WHERE a = 'a''b'"))
        assert hit == [((KIND, "s00"), ())], show(hit)


def test_limits_the_emulator_enforces_are_refused(sides: Any) -> None:
    """Texts at Datastore's limits, each just past a limit and just within
    it: the embedded engine refuses exactly where the emulator does (the
    first of each pair is refused there; the test checks that too)."""
    oracle, embedded, namespaces, _ = sides
    ns = namespaces[0]
    equalities = lambda n: " AND ".join(f"p{i} = 1" for i in range(n))  # noqa: E731
    pairs = [
        (f"SELECT * FROM {KIND} WHERE n > +-1", f"SELECT * FROM {KIND} WHERE n > +1"),
        (f"SELECT * FROM {KIND} WHERE n > + 1", f"SELECT * FROM {KIND} WHERE n >+1"),
        (f"SELECT * FROM {KIND} WHERE q IN ARRAY(1, 2, 3) AND {equalities(98)}",
         f"SELECT * FROM {KIND} WHERE q IN ARRAY(1, 1, 1) AND {equalities(98)}"),  # a repeated value counts once
        (f"SELECT * FROM {KIND} WHERE n = BLOB('!!')", f"SELECT * FROM {KIND} WHERE n = BLOB('-_')"),
        (f"SELECT * FROM {KIND} WHERE a = 'x\ny'", f"SELECT * FROM {KIND} WHERE a = 'x\ry'"),  # a line break in a string
        (f'SELECT * FROM {KIND} WHERE a = "x\ny"', f'SELECT * FROM {KIND} WHERE a = "x\\ny"'),
        (f"SELECT * FROM {KIND} WHERE `x\ny` = 1", f"SELECT * FROM {KIND} WHERE `x\ty` = 1"),
        (f"SELECT * FROM {KIND} WHERE a = '{'x' * 1501}'", f"SELECT * FROM {KIND} WHERE a = '{'x' * 1500}'"),
        (f"SELECT * FROM {KIND} WHERE a IN ARRAY(1, '{'x' * 1501}')", f"SELECT * FROM {KIND} WHERE a IN ARRAY(1, '{'x' * 1500}')"),
        (f"SELECT * FROM {KIND} WHERE __key__ = KEY({', '.join([f'{KIND}, 1'] * 101)})",
         f"SELECT * FROM {KIND} WHERE __key__ = KEY({', '.join([f'{KIND}, 1'] * 100)})"),
        (f"SELECT * FROM {KIND} WHERE {equalities(501)}", f"SELECT * FROM {KIND} WHERE {equalities(100)}"),
        (f"SELECT * FROM {KIND} WHERE {equalities(100)} ORDER BY x", f"SELECT * FROM {KIND} WHERE {equalities(99)} ORDER BY x"),
        (f"SELECT * FROM {KIND} WHERE {equalities(99)} AND __key__ HAS ANCESTOR KEY(P, 'p1') ORDER BY x",
         f"SELECT * FROM {KIND} WHERE {equalities(99)} AND __key__ HAS ANCESTOR KEY(P, 'p1')"),
        (f"SELECT * FROM {KIND} WHERE q IN ARRAY(1, 2, 3) AND {equalities(98)}",
         f"SELECT * FROM {KIND} WHERE q IN ARRAY(1, 2, 3) AND {equalities(97)}"),
        (f"SELECT * FROM {KIND} WHERE q NOT IN ARRAY(1, 2, 3) AND {equalities(98)}",
         f"SELECT * FROM {KIND} WHERE q NOT IN ARRAY(1, 2, 3) AND {equalities(97)}"),
        (f"SELECT * FROM {KIND} WHERE (q = 1 OR r = 1 OR s = 1) AND {equalities(98)}",
         f"SELECT * FROM {KIND} WHERE (q = 1 OR r = 1 OR s = 1) AND {equalities(97)}"),
        # the same filter repeated is that filter once, however often (it counts once)
        (f"SELECT * FROM {KIND} WHERE {equalities(101)}", f"SELECT * FROM {KIND} WHERE {' AND '.join(['a = 1'] * 600)}"),
        (f"SELECT * FROM {KIND} WHERE {equalities(101)}", f"SELECT * FROM {KIND} WHERE {' OR '.join(['a = 1'] * 600)}"),
    ]
    for past, within in pairs:
        for text, expected in ((past, "refused"), (within, "rows")):
            theirs, ours = answer(oracle, plain(ns, text)), answer(embedded, plain(ns, text))
            assert outcome(theirs) == expected, (text[:120], show(theirs))
            assert outcome(ours) == expected, (text[:120], show(ours))
            if expected == "refused":
                assert ours[0] == "refused", ours  # a gds_counter error, not a crash


def test_keys_of_another_project_are_answered_as_the_emulator_answers_them(sides: Any) -> None:
    """``KEY(PROJECT(p), ...)`` where p is not the emulator's project (issue
    25): as a property filter's value the key sorts by project first (before
    every stored key, or after every one; never equal to one), and a
    ``__key__`` filter or an ancestor on it is refused. Each text, on both
    sides: the same rows in order, the same aggregation, or both refuse."""
    oracle, embedded, namespaces, project = sides
    ns = namespaces[0]
    key = f"KEY(P, 'p1', {KIND}, 'e05')"
    before, after, prefix = "KEY(PROJECT('aaa'), ", "KEY(PROJECT('zzz'), ", f"KEY(PROJECT('{project[:-1]}'), "
    own, empty, longer = f"KEY(PROJECT('{project}'), ", "KEY(PROJECT(''), ", f"KEY(PROJECT('{project}-x'), "
    texts = [
        *(f"SELECT __key__ FROM {KIND} WHERE {name} {op} {other}{KIND}, 'e05')"
          for name in ("a", "b", "l") for op in ("=", "!=", "<", "<=", ">", ">=")
          for other in (before, after, prefix, longer)),
        *(f"SELECT __key__ FROM {KIND} WHERE a {op} {other}NAMESPACE('{ns}'), {KIND}, 'e05')"
          for op in ("<", ">=") for other in (own, empty)),
        f"SELECT __key__ FROM {KIND} WHERE a IN ARRAY({before}{KIND}, 1), {after}{KIND}, 1), 'a''b')",
        f"SELECT __key__ FROM {KIND} WHERE a NOT IN ARRAY({before}{KIND}, 1), 7)",
        f"SELECT __key__ FROM {KIND} WHERE l CONTAINS {after}{KIND}, 1)",
        f"SELECT __key__ FROM {KIND} WHERE {before}{KIND}, 1) < a ORDER BY a DESC",
        f"SELECT a FROM {KIND} WHERE a > {before}{KIND}, 1) AND a < {after}{KIND}, 1)",
        f"SELECT * FROM {KIND} WHERE a > {after}{KIND}, 1) OR b = 7",
        f"SELECT __key__ FROM {KIND} WHERE a = {before}NAMESPACE('{ns}'), {KIND}, 's03') OR a = 'a''b'",
        *(f"SELECT __key__ FROM {KIND} WHERE __key__ {op} {other}NAMESPACE('{ns}'), {KIND}, 'e05')"
          for op in ("=", "!=", ">", "<=") for other in (before, after, own)),
        f"SELECT __key__ FROM {KIND} WHERE __key__ IN ARRAY({key}, {before}NAMESPACE('{ns}'), {KIND}, 7))",
        f"SELECT __key__ FROM {KIND} WHERE __key__ NOT IN ARRAY({after}NAMESPACE('{ns}'), {KIND}, 7))",
        f"SELECT __key__ FROM {KIND} WHERE __key__ HAS ANCESTOR {after}NAMESPACE('{ns}'), P, 'p1')",
        f"SELECT __key__ FROM {KIND} WHERE {before}NAMESPACE('{ns}'), P, 'p1') HAS DESCENDANT __key__",
        f"SELECT __key__ FROM {KIND} WHERE b = 1 OR __key__ = {after}NAMESPACE('{ns}'), {KIND}, 7)",
        f"SELECT __key__ FROM {KIND} WHERE a > KEY(PROJECT('Bad_Project'), {KIND}, 1)",
        f"SELECT __key__ FROM {KIND} WHERE a > KEY(PROJECT('example.com:gds'), {KIND}, 1)",
    ]
    aggregations = [
        f"SELECT COUNT(*) FROM {KIND} WHERE a > {before}{KIND}, 1)",
        f"SELECT COUNT(*) AS n, SUM(b) AS s FROM {KIND} WHERE a <= {after}{KIND}, 1)",
        f"SELECT COUNT(*) FROM {KIND} WHERE a = {after}{KIND}, 1)",
        f"SELECT COUNT(*) FROM {KIND} WHERE __key__ = {after}NAMESPACE('{ns}'), {KIND}, 7)",
    ]
    differences: list[str] = []
    outcomes: Counter[str] = Counter()
    for case in [plain(ns, text) for text in texts] + [plain(ns, text, True) for text in aggregations]:
        theirs, ours = answer(oracle, case), answer(embedded, case)
        outcomes[outcome(theirs)] += 1
        if outcome(theirs) == outcome(ours) == "refused":
            if ours[0] != "refused":  # a gds_counter error, not a crash
                differences.append(difference(case, theirs, ours))
        elif (first_rows(theirs) if isinstance(theirs, list) else theirs) != ours:
            differences.append(difference(case, theirs, ours))
    assert outcomes["refused"] >= 15 and outcomes["rows"] >= 50, outcomes  # both kinds of answer were reached
    assert not differences, f"{len(differences)} texts differ:\n" + "\n".join(differences)


def test_embedded_answers_every_gql_text_as_the_firestore_emulator(sides: Any) -> None:
    oracle, embedded, namespaces, project = sides
    differences: list[str] = []
    counts: Counter[str] = Counter()

    @every_generated_text(namespaces, project)
    def check(case: Case) -> None:
        counts["cases"] += 1
        counts.update(case.features)
        theirs = answer(oracle, case)
        ours = answer(embedded, case)
        failed = isinstance(theirs, tuple) and theirs[0] == "failed"
        if not failed and ours != theirs and outcome(theirs) != "refused" and the_query_alone_is_refused(oracle, case, ours):
            counts["deliberate: the emulator aggregates over a query it refuses alone"] += 1
            return
        if failed:
            counts["emulator failed (UNKNOWN/INTERNAL)"] += 1
        if failed and case.issuing is not None and not theirs[2].startswith("the issuing query"):
            # The cursor differential's rule (docs/gql.md): the emulator fails with UNKNOWN on some
            # cursors it issued itself; nothing to compare, but the embedded engine must not crash.
            counts["not compared: the emulator failed (UNKNOWN) on a cursor it issued"] += 1
            if outcome(ours) == "crashed":
                differences.append(difference(case, theirs, ours))
            return
        if case.not_compared and (failed or outcome(theirs) == "rows"):
            # A deliberate difference or an emulator quirk, as test_differential has them: where the
            # emulator answered, the embedded engine must run the text too; where the emulator failed
            # (UNKNOWN, before its other checks) there is nothing to compare.
            counts["not compared: " + case.not_compared] += 1
            if (not failed and outcome(ours) != "rows") or outcome(ours) == "crashed":
                differences.append(difference(case, theirs, ours))
            return
        if outcome(theirs) == "no cursor":
            counts["no cursor (the issuing query found nothing)"] += 1
        elif outcome(theirs) == "refused":
            counts["refused"] += 1
            if outcome(ours) != "refused":
                differences.append(difference(case, theirs, ours))
            return
        else:
            counts["compared rows" if not case.aggregation else "compared aggregations"] += 1
        if isinstance(theirs, list):
            if theirs:
                counts["nonempty"] += 1
                if "where" in case.features:
                    counts["where with rows"] += 1
            if case.repeats:
                theirs = first_rows(theirs)
        if ours != theirs:
            differences.append(difference(case, theirs, ours))

    check()
    distinct = list(dict.fromkeys(differences))  # hypothesis may draw one text more than once
    counts["differences"] = len(distinct)
    print(f"\nGQL differential (seed {SEED}, {QUERIES} queries):")
    for name, n in sorted(counts.items()):
        print(f"    {name}: {n}")
    problems = []
    if counts["cases"] < QUERIES:
        problems.append(f"only {counts['cases']} of {QUERIES} cases ran")
    # Every clause, condition and literal kind was reached, and both kinds of answer.
    required = [
        "where", "and", "or", "parentheses", "precedence", "order_by", "asc", "desc", "limit", "offset",
        "limit_binding", "offset_binding", "cursor_limit", "cursor_offset", "cursor_first", "cursor_plus",
        "projection", "keys_only", "key_in_projection", "distinct", "distinct_on", "distinct_on_star", "from",
        "kindless", "other_kind", "quoted_kind", "aggregation", "aggregate_over", "select_aggregation", "count",
        "count_up_to", "sum", "avg", "alias", *(f"op {op}" for op in COMPARISONS), "op IN", "op NOT IN",
        "op CONTAINS", "op IS NULL", "op HAS ANCESTOR", "op HAS DESCENDANT", "op value IN property",
        "reversed_condition", "key_condition", "lit_int", "lit_int_negative", "lit_int64_edge",
        "lit_int_leading_zero", "lit_double", "lit_double_exponent", "lit_negative_zero", "lit_string_single",
        "lit_string_double", "lit_string_escape", "lit_string_doubled_quote", "lit_string_non_ascii", "lit_true",
        "lit_false", "lit_null", "lit_key", "lit_key_project", "lit_key_namespace", "lit_key_path", "alt_key_other_project",
        "lit_key_negative_id", "lit_datetime", "lit_datetime_offset", "lit_datetime_fraction", "lit_blob",
        "lit_array", "binding_named", "binding_positional", "binding_list", "binding_unused_named",
        "binding_unused_positional", "quoted_name", "dotted_name",
        "wordlike_name", "quoted_name_odd", "limit_comma", "keyword_case", "whitespace_varied", "whitespace_none",
        "broken", "refused",
        "compared rows", "compared aggregations", "nonempty", "where with rows", "repeats_per_element",
        "aggregated_fixed_in_or_branch",
    ]
    missing = [name for name in required if counts[name] == 0]
    if missing:
        problems.append(f"never reached: {missing}")
    if counts["compared rows"] < QUERIES // 4 or counts["refused"] < QUERIES // 10 or counts["where with rows"] < QUERIES // 20:
        problems.append(f"too few compared rows, refusals or filters that hit: {dict(counts)}")
    if distinct:
        problems.append(f"{len(distinct)} distinct GQL texts of {counts['cases']} differ:\n" + "\n".join(distinct))
    assert not problems, "\n".join(problems)
