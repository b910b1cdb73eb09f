"""A query's batches on the embedded engine: each query shape compiled once
(its scan, its Python filter check, its first batch's SQL, whose its cursors
are) and kept, and one batch's rows read from a connection in the query's
order, between its cursors, past its offset.

Apart from ``_engine`` (the gateway's hooks: transactions, commits, stats),
because it is the read path's own idea and needs no transaction: a plain
query reads its batch through it, a transaction's query reads it on the
transaction's snapshot, and a commit's check reads it again to see whether
the answer changed (``answer``).
"""

from __future__ import annotations

import itertools
import sqlite3
from typing import Any, Callable, Generator, Hashable

import attrs

from gds_counter.gateway.embedded._cursors import BatchCursors, Point, cursor_owner, encode_cursor, read_cursor
from gds_counter.gateway.embedded._encoding import REMEMBERED_TEXT, Decodings
from gds_counter.gateway.embedded._filter_check import Doc, compile_filter
from gds_counter.gateway.embedded._index_sql import candidate_sql, sql_is_exact
from gds_counter.gateway.embedded._scans import Row, Scan
from gds_counter.gateway.query import Query, QueryResult
from gds_counter.gateway.stats import Stats
from gds_counter.gateway.values import RawEntity

__all__ = ["BATCH_SIZE", "COMPILED_QUERIES", "BatchRead", "Compiled", "QueryBatches", "answer", "explain"]

#: Results per batch: small enough that callers must follow cursors (as with
#: Datastore), large enough that following them is cheap.
BATCH_SIZE = 300

#: One batch: its rows, the position of the last row read, and whether there are more.
BatchRead = tuple[list[Row], tuple[bytes, ...] | None, bool]

#: Compiled query shapes a gateway keeps (see ``QueryBatches.compiled``).
COMPILED_QUERIES = 256


@attrs.frozen
class Compiled:
    """What a query compiles to, whatever its cursors, limit and offset: its
    scan, the Python filter check (None when SQL's candidates are exactly the
    matches), the SQL of its first batch, and whose its cursors are
    (``_cursors.cursor_owner``); and, from its scan, whether its rows stream
    in SQLite's order and whether each is made from its key alone."""

    scan: Scan
    matches: Callable[[Doc], bool] | None
    sql: str
    params: tuple[Any, ...]
    owner: bytes
    streams: bool = attrs.field(init=False, default=attrs.Factory(lambda self: self.scan.streams, takes_self=True))
    keyed: bool = attrs.field(init=False, default=attrs.Factory(lambda self: self.scan.key_width is not None, takes_self=True))


class QueryBatches:
    """One gateway's compiled query shapes, and the batches read with them;
    ``stats`` is the gateway's (rows examined)."""

    def __init__(self, stats: Stats, decodings: Decodings) -> None:
        self._stats, self._decodings = stats, decodings
        self._shapes: dict[str, Compiled] = {}

    def result(
        self, query: Query, batch: list[Row], last: tuple[bytes, ...] | None, more: bool, compiled: Compiled | None = None,
    ) -> QueryResult:
        """The batch, its cursor after each row, and its end cursor: after
        ``last`` (offset included), else the start's. ``compiled``: the
        query's (``compiled``), when the caller has it already."""
        compiled = compiled or self.compiled(query)
        end = query.start_cursor if last is None else encode_cursor(last, compiled.owner, compiled.scan, batch=more)
        cursors = BatchCursors([r.position for r in batch], compiled.owner, compiled.scan, more)
        return QueryResult(tuple([r.entity for r in batch]), end, more, cursors)

    def batch(self, conn: sqlite3.Connection, query: Query, compiled: Compiled | None = None) -> BatchRead:
        """One batch of a query: its rows, the position of the last row
        read (offset included) and whether there are more. ``compiled``:
        the query's (``compiled``), when the caller has it already."""
        compiled = compiled or self.compiled(query)
        scan = compiled.scan
        start = self._bound(query, query.start_cursor, compiled)
        end = self._bound(query, query.end_cursor, compiled)
        wanted = BATCH_SIZE if query.limit is None else min(query.limit, BATCH_SIZE)
        if start is None and end is None and not query.offset and compiled.keyed and compiled.matches is None:
            return self._keyed_batch(conn, compiled, wanted, query.limit)
        batch: list[Row] = []
        last = None
        more = False
        rows = self._rows(conn, query, compiled, start)
        try:
            if end is None and not query.offset:  # the first ``wanted`` rows, and is there one more
                batch = list(itertools.islice(rows, wanted))
                if len(batch) == wanted and next(rows, None) is not None:
                    more = query.limit is None or query.limit > wanted
                return batch, batch[-1].position if batch else None, more
            skip = query.offset
            for row in rows:
                if isinstance(end, Point):
                    if not end.admits_until(scan, row.position):
                        break
                elif end is not None and row.position > end:
                    break
                if len(batch) == wanted:
                    more = query.limit is None or query.limit > wanted
                    break
                last = row.position
                if skip:
                    skip -= 1
                else:
                    batch.append(row)
        finally:
            rows.close()
        return batch, last, more

    def _keyed_batch(self, conn: sqlite3.Connection, compiled: Compiled, wanted: int, limit: int | None) -> BatchRead:
        """``batch`` from the start of a query whose rows are its entities in
        key order, none checked in Python (a counter's total): SQLite's
        rows are the answer, so they are fetched at once, one more than
        ``wanted`` to know whether there are more, and made into rows in
        one loop instead of through ``_rows``' generator."""
        cursor = conn.execute(compiled.sql, compiled.params)
        try:
            fetched = cursor.fetchmany(wanted + 1)
        finally:
            cursor.close()  # (on a file, a statement left open keeps its read transaction)
        self._stats.bump("rows_examined", len(fetched))
        batch = []
        found, load_indexed = self._decodings.finder(), self._decodings.load_indexed
        width, keys_only = compiled.scan.key_width, compiled.scan.keys_only
        assert width is not None
        for kb, version, data in fetched[:wanted]:  # (``Scan.key_row`` and ``load_indexed``, in line: twenty a total)
            decoded = found(data) if len(data) <= REMEMBERED_TEXT else None
            if decoded is None:
                entity, index = load_indexed(data)
            else:  # an entity and a properties dict of its own for each caller, as ``load_indexed``
                entity, index = RawEntity(decoded[0], dict(decoded[1]), decoded[2]), decoded[3]
            batch.append(Row((kb,) * width, Doc(kb, version, entity, index), RawEntity(entity.key) if keys_only else entity))
        more = len(fetched) > wanted and (limit is None or limit > wanted)
        return batch, batch[-1].position if batch else None, more

    @staticmethod
    def _bound(query: Query, cursor: bytes | None, compiled: Compiled) -> tuple[bytes, ...] | Point | None:
        """A cursor given to ``query``: a position in it, or a point (``_cursors``)."""
        if cursor is None:
            return None
        found = read_cursor(cursor, compiled.scan.width, compiled.owner)
        if isinstance(found, Point):
            found.check(query)
            found.bound(compiled.scan)  # refused now if it cannot be read in this query's order
        return found

    def compiled(self, query: Query) -> Compiled:
        """``query`` compiled, once per shape: compiling a query (its checks,
        sort orders, encoded filter values and SQL) took longer than reading
        the 20 shards a counter's total needs. The shape is named by its
        ``repr``, not by equality, which would take ``1``, ``1.0`` and
        ``True`` (or ``0.0`` and ``-0.0``) for one value though each has
        its own encoding. The cache is emptied when full."""
        shape = repr((query.kind, query.namespace, query.filter, query.order, query.projection, query.distinct_on, query.keys_only,
                      query.aggregated_rows))
        found = self._shapes.get(shape)
        if found is None:
            scan = Scan.of(query)
            exact = query.filter is None or sql_is_exact(query.filter)
            matches = None if exact or query.filter is None else compile_filter(query.filter)
            owner = cursor_owner(query.kind, query.namespace, scan.orders, scan.row_properties)
            found = Compiled(scan, matches, *candidate_sql(query, scan, None), owner)
            if len(self._shapes) >= COMPILED_QUERIES:
                self._shapes.clear()
            self._shapes[shape] = found
        return found

    def _rows(
        self, conn: sqlite3.Connection, query: Query, compiled: Compiled, start: tuple[bytes, ...] | Point | None,
    ) -> Generator[Row, None, None]:
        """Result rows after ``start`` in sort order. Key-ordered queries
        stream from SQLite and stop at the batch; other orders sort all the
        (index-narrowed) candidates for every batch, which is fine for
        filtered queries but makes following every batch of a large kind
        sorted by a property quadratic. A point (another query's cursor)
        is checked on each row: SQL seeks only to a position of this query."""
        scan, matches, streams, keyed = compiled.scan, compiled.matches, compiled.streams, compiled.keyed
        point = start if isinstance(start, Point) else None
        after = None if isinstance(start, Point) else start
        sql, params = (compiled.sql, compiled.params) if after is None else candidate_sql(query, scan, after)
        cursor = conn.execute(sql, params)
        examined = 0
        try:
            docs = []
            for kb, version, data in cursor:
                examined += 1
                entity, index = self._decodings.load_indexed(data)
                doc = Doc(kb, version, entity, index)
                if matches is not None and not matches(doc):
                    continue
                if keyed:
                    row = scan.key_row(doc)
                    if point is None or point.admits_from(scan, row.position):
                        yield row
                elif streams:
                    yield from (row for row in scan.rows(doc) if point is None or point.admits_from(scan, row.position))
                else:
                    docs.append(doc)
            if streams:
                return
            rows = sorted((row for doc in docs for row in scan.rows(doc)), key=lambda r: r.position)
            if point is not None:
                # Another query's cursor: DISTINCT starts its groups afresh
                # at the point, as the Firestore emulator does.
                rows = [row for row in rows if point.admits_from(scan, row.position)]
            if scan.distinct_on:
                rows = scan.first_of_each(rows)
            for row in rows:
                if after is None or row.position > after:
                    yield row
        finally:
            cursor.close()
            self._stats.bump("rows_examined", examined)


def answer(batch: list[Row], last: tuple[bytes, ...] | None, more: bool) -> Hashable:
    """What a query batch told its transaction, to compare at commit."""
    return tuple((row.doc.key_enc, row.doc.version, row.position) for row in batch), last, more


def explain(conn: sqlite3.Connection, query: Query) -> str:
    """SQLite's plan for the SQL ``query`` runs, so a workshop (and the
    index test) can see that a filter reads an index, not the whole kind."""
    sql, params = candidate_sql(query, Scan.of(query), None)
    return "\n".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + sql, params))
