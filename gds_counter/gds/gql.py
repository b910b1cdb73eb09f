"""GQL text to structured ``Query`` (or ``AggregationQuery``), and back.

Why a parser of our own: the embedded SQLite gateway has no GQL engine, and
php-gds's regex "parser" lost conditions (a lower-case ``and``), split
property names such as ``BRAND`` at "AND", compared unquoted numbers as
strings and turned ``KEY(...)`` into a string. A tokenizer plus a
recursive-descent parser cannot make those mistakes, and every gateway then
runs the same structured ``Query``. The Cloud Datastore gateway may still
send the original text (``Query.gql``) to the server.

This module is the public face; the work is done by ``_gql_lexer`` (text to
tokens), ``_gql_values`` (bound values and BLOB/DATETIME literals to the
gateway's types), ``_gql_parser`` (tokens to query parts: the statement),
``_gql_conditions`` (its WHERE clause and the values conditions compare with),
``_gql_aggregation`` (the aggregations around a query) and ``_gql_printer``
(``Query`` and ``AggregationQuery`` back to text).

The grammar is Cloud Datastore's GQL reference (v1 API)::

    SELECT ( * | <name>+, | DISTINCT <name>+, | DISTINCT ON ( <name>+, ) ( * | <name>+, ) )
    [ FROM <kind> ]
    [ WHERE <compound-condition> ]
    [ ORDER BY ( <name> [ ASC | DESC ] )+, ]
    [ LIMIT ( <result-position> | FIRST ( <result-position> , <result-position> ) ) ]
    [ OFFSET <result-position> [ + <result-position> ] ]

and, for aggregation queries (``parse_aggregation``)::

    SELECT <aggregation>+, [ FROM <kind> ] [ WHERE <compound-condition> ]
    AGGREGATE <aggregation>+, OVER ( <query> )

    <aggregation> := ( COUNT(*) | COUNT_UP_TO(<integer>) | SUM(<name>) | AVG(<name>) ) [ AS <alias> ]

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
  ``PROJECT('p')`` is kept on the key (``Key.project``; ``''`` is none, a
  project id Datastore refuses is refused, the older ``DATASET`` is refused
  as the emulator refuses it), and the gateway decides what it means
  against its own project: the Datastore gateway sends it, the embedded
  engine treats its own project as no project and orders any other before
  or after all of its keys, refusing a ``__key__`` filter on it
  (``gateway.embedded._projects``). A KEY without NAMESPACE takes the
  query's namespace, as Datastore does; one naming its PROJECT is in the
  default namespace unless it names one.
* Names: ``[A-Za-z_$][A-Za-z_$0-9]*`` (letters may be non-ASCII) or
  backtick-quoted with a doubled backtick (or a backslash escape) inside.
  Property names may be dotted (``a.b``, a sub-property of an embedded
  entity); kinds may not, unless quoted. Keywords are case-insensitive; the
  words that could be mistaken for names where a name is expected are
  reserved and must be quoted to be used as names (``_gql_conditions.RESERVED``). The
  function words (KEY, ARRAY, BLOB, DATETIME, FIRST, ON, ...) only act as
  keywords before ``(``, so a property called ``key`` needs no quotes.
* Bindings: ``@name`` and ``@1`` (1-based). ``bindings`` may be a
  ``Mapping`` (``str`` keys for ``@name``, ``int`` keys for ``@1``...) or a
  ``Sequence`` (positional only). Every site must be bound. As in the
  Datastore API (and on the Firestore emulator), a named binding the text
  never uses is ignored, while every positional binding must be used and
  they must be numbered from 1 without gaps.
  Values: None, bool, int, float, str, bytes, tz-aware datetime (stored in
  UTC; naive ones are refused), ``Key``, ``Geopoint``, any object with a
  ``__gds_key__()`` method (an ``Entity``: bound as its key), and
  lists/tuples for IN, NOT IN and ARRAY. ``Cursor`` goes only at LIMIT and
  OFFSET positions. ``Query.gql`` records the text with the converted
  bindings (lists as ``list``, cursors as ``Cursor``) so a gateway can send
  cursors as cursors and values as values.

Aggregations, as Cloud Datastore's GQL has them (checked against the
Firestore emulator in Datastore mode, which also runs the results' rules:
see ``gds_counter.gateway._aggregation``):

* ``parse`` returns ``Query`` and refuses an aggregation (pointing at
  ``parse_aggregation``); ``parse_aggregation`` returns ``AggregationQuery``
  and refuses an ordinary query. Bindings work in the query either way.
* One to five aggregations. ``COUNT(*)`` only (``COUNT(p)`` is refused);
  ``COUNT_UP_TO`` takes a non-negative integer literal, not a binding;
  ``SUM``/``AVG`` take a (dotted) property name, never ``__key__``.
* ``AS alias`` is optional; without it Datastore names the result
  ``property_1``, ``property_2``... counting the aggregations without an
  alias, and an alias that clashes with one of those (or another alias) is
  an error. Aliases of the form ``__x__`` are reserved. Unquoted, neither an
  alias nor an aggregated property may be one of ``_gql_aggregation.
  AGGREGATION_RESERVED`` (GQL keywords and COUNT, SUM, AVG, AS, OVER,
  AGGREGATE...): Datastore's GQL refuses them there, so quote them.
* ``SELECT COUNT(*) ...`` takes only FROM and WHERE (Datastore refuses ORDER
  BY, LIMIT and OFFSET there); ``AGGREGATE ... OVER (<query>)`` takes any
  query, including ORDER BY, LIMIT, OFFSET, cursors and projections, in
  parentheses, and nothing after them.
* ``to_gql`` prints an aggregation as ``AGGREGATE ... OVER (...)``.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from gds_counter.errors import GQLError
from gds_counter.gateway.query import AggregationQuery, Cursor, Query
from gds_counter.gds._gql_aggregation import AggregationParser
from gds_counter.gds._gql_lexer import DOUBLE, INT, STRING, Lexer, Token
from gds_counter.gds._gql_printer import Printer
from gds_counter.gds._gql_values import Bindings

# Cursor is re-exported: callers bind it at LIMIT / OFFSET positions.
__all__ = ["Cursor", "parse", "parse_aggregation", "to_gql"]


def parse(
    text: str,
    bindings: Mapping[Any, Any] | Sequence[Any] | None = None,
    *,
    namespace: str = "",
    allow_literals: bool = True,
) -> Query:
    """Parse and bind GQL ``text`` into a ``Query`` in ``namespace``.

    Raises only ``GQLError``; syntax errors name the 1-based column and the
    token found there, and ``GQLError.position`` is the 0-based offset.
    ``allow_literals=False`` (the Datastore API's ``GqlQuery.allow_literals``)
    refuses any value written in the text rather than bound.
    """
    parser, bound = _parser(text, bindings, namespace, allow_literals)
    parts = parser.query()  # an AggregationParser parses ordinary queries too
    return parts.build(namespace, gql=bound.source(text))


def parse_aggregation(
    text: str,
    bindings: Mapping[Any, Any] | Sequence[Any] | None = None,
    *,
    namespace: str = "",
    allow_literals: bool = True,
) -> AggregationQuery:
    """Parse and bind an aggregation query (``SELECT COUNT(*) ...`` or
    ``AGGREGATE ... OVER (...)``) into an ``AggregationQuery`` whose query is
    in ``namespace``. Raises only ``GQLError``, as ``parse`` does."""
    parser, bound = _parser(text, bindings, namespace, allow_literals)
    parts = parser.aggregation_query()
    return parts.build(namespace, gql=bound.source(text))


#: The words that begin a value written in the text (constants and GQL's synthetic literals).
_LITERAL_WORDS = frozenset({"NULL", "TRUE", "FALSE", "KEY", "DATETIME", "BLOB", "ARRAY"})


def _parser(text: str, bindings: Any, namespace: str, allow_literals: bool) -> tuple[AggregationParser, Bindings]:
    if not isinstance(text, str):
        raise GQLError(f"GQL must be text (str), not {type(text).__name__}")
    bound = Bindings(bindings)
    tokens = Lexer(text).tokens()
    if not allow_literals:
        _refuse_literals(tokens)
    return AggregationParser(tokens, bound, namespace or ""), bound


def _refuse_literals(tokens: list[Token]) -> None:
    """Without ``allow_literals`` every value must be bound: the first one
    written in the text (a string, a number, ``LIMIT 5`` included, NULL,
    TRUE, KEY(...), ARRAY(...)) is refused in the Firestore emulator's words."""
    for token in tokens:
        if token.kind in (STRING, INT, DOUBLE) or token.word in _LITERAL_WORDS:
            raise GQLError(f"Disallowed literal: {token.text}.", token.pos)


def to_gql(query: Query | AggregationQuery) -> tuple[str, dict[str, Any]]:
    """Print ``query`` as GQL text plus named bindings holding every value.

    ``parse(text, bindings, namespace=query.namespace) == query`` for every
    query ``parse`` could have produced: filters in canonical form (no
    single-child or same-operator nested groups), IN values as tuples, and
    no plain ``projection == ("__key__",)`` (that is ``keys_only``). GQL has
    no namespace clause, hence the namespace argument. An
    ``AggregationQuery`` prints as ``AGGREGATE ... OVER (...)`` and
    ``parse_aggregation`` gives it back the same way.
    """
    printer = Printer()
    if isinstance(query, AggregationQuery):
        return printer.aggregation(query), printer.bindings
    return printer.query(query), printer.bindings
