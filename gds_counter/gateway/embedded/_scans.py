"""How the embedded engine answers a query, as the index scan Datastore
would run for it: in which order the matching entities come back, and the
rows each gives (``Scan``: the index's sort orders, the rows an entity
gives, their positions).

A query is answered in three steps, each in its own module: SQL reads a
superset of the matching keys through the index table (``_index_sql``),
each candidate is checked in Python with Datastore's semantics
(``_filter_check``), and the scan here turns each match into ordered result
rows. So sort orders only ever see indexed values, and a row of a sorted or
projected list property uses only the list elements in the index's range.

Everything compares the byte encodings of ``_encoding``; a result row's
position in sort order is also its cursor.
"""

from __future__ import annotations

import datetime as _dt
import itertools
from typing import Any, Callable, Iterable, Iterator

import attrs

from gds_counter.errors import BadValueError
from gds_counter.gateway.embedded._encoding import descending
from gds_counter.gateway.embedded._filter_check import (
    Branch,
    Doc,
    branches_of,
    inequality_names,
    key_filtered,
    top_level_ranges,
)
from gds_counter.gateway.embedded._refusals import check_filter, check_shape
from gds_counter.gateway.query import KEY_PROPERTY, Order, Query, conjuncts_of, leaves_of
from gds_counter.gateway.values import EPOCH, RawEntity

_ONE_MICRO = _dt.timedelta(microseconds=1)



@attrs.define
class Row:
    """One query result in sort order: its position (also its cursor) and
    the entity it returns. Never changed once made; not ``frozen`` only
    because one is made per row of every read, and a frozen class takes
    2.5 times as long to make (a counter's total reads twenty)."""

    position: tuple[bytes, ...]
    doc: Doc
    entity: RawEntity


def projected(value: Any) -> Any:
    """A projected value as Datastore returns it from an index: a timestamp as
    integer microseconds since the epoch, a byte string that is valid UTF-8 as
    text (both share an index encoding with those types); the Store turns
    them back by the schema, the same way on every gateway."""
    if isinstance(value, _dt.datetime):
        return (value - EPOCH) // _ONE_MICRO
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value



@attrs.frozen
class Scan:
    """The index scan a query amounts to: how it turns a matching entity
    into ordered result rows.

    The sort orders are the query's, then the ones Datastore adds: the
    DISTINCT ON properties, the inequality properties (by name), then the
    projected properties (by name), each in the
    direction of the last order. A row's position is (one component per sort
    order, the key, then the values of the projected and DISTINCT ON
    properties): it sorts the rows, breaks ties by key in the direction of
    the last sort order (as Datastore does), and is the cursor.
    """

    orders: tuple[Order, ...]
    projection: tuple[str, ...]
    keys_only: bool
    distinct_on: tuple[str, ...]
    ranges: dict[str, list[Callable[[bytes], bool]]]
    branches: tuple[Branch, ...] | None = None
    #: For whole entities in ascending key order (a counter's total, a
    #: kind's scan): how many times a row's position repeats its key, the
    #: whole of the position (``key_row``); None for any other scan, whose
    #: rows ``rows`` makes. Worked out once per scan.
    key_width: int | None = attrs.field(
        init=False, eq=False, default=attrs.Factory(lambda self: self._key_width(), takes_self=True)
    )

    @classmethod
    def of(cls, query: Query) -> Scan:
        check_filter(query.filter)
        check_shape(query)
        # keys only is the projection of __key__ alone: other projected names go (as the wire sends it)
        projection = () if query.keys_only else tuple(p for p in query.projection if p != KEY_PROPERTY)
        keys_only = query.keys_only or (bool(query.projection) and not projection)
        equalities = {leaf.name for leaf in leaves_of(query.filter) if leaf.op in ("=", "IN")} if query.filter is not None else set()
        for name in set(projection) & equalities:  # anywhere in the filter, OR branches too (as Datastore refuses)
            if not (query.aggregated_rows and all(c.name != name or c.op not in ("=", "IN") for c in conjuncts_of(query.filter))):
                raise BadValueError(f"cannot project property {name!r} that has an equality filter")
        for name in set(query.distinct_on) & equalities:  # also for DISTINCT ON with *: "Cannot use group by ..."
            raise BadValueError(f"cannot use DISTINCT ON property {name!r} that has an equality filter")
        orders = list(query.order)
        for at, order in enumerate(orders):
            if order.name not in query.distinct_on and not set(query.distinct_on) <= {o.name for o in orders[:at]}:
                raise BadValueError("all DISTINCT ON properties must be ordered before any other sort order")
        descending_last = bool(orders) and orders[-1].descending
        implied = [*query.distinct_on, *sorted(inequality_names(query.filter))]
        if key_filtered(query.filter, projection):
            implied.append(KEY_PROPERTY)  # then by key, before the projected properties (as the emulator does)
        implied += sorted(projection)  # Datastore reads the projected properties' index (by name)
        for name in implied:
            if name not in {o.name for o in orders}:
                orders.append(Order(name, descending_last))
        return cls(tuple(orders), projection, keys_only, query.distinct_on, top_level_ranges(query.filter), branches_of(query.filter))

    @property
    def row_properties(self) -> tuple[str, ...]:
        """The properties whose values make a row: the projected ones, then
        DISTINCT ON properties of a whole-entity query."""
        return self.projection + tuple(n for n in self.distinct_on if n not in self.projection)

    @property
    def key_descending(self) -> bool:
        """Ties break by key in the last sort order's direction."""
        return bool(self.orders) and self.orders[-1].descending and self.orders[-1].name != KEY_PROPERTY

    @property
    def width(self) -> int:
        return len(self.orders) + 1 + len(self.row_properties)

    @property
    def streams(self) -> bool:
        """Key order only, one row per entity: SQLite's key order is the answer."""
        return not self.row_properties and all(o.name == KEY_PROPERTY for o in self.orders[:1]) and len(self.orders) <= 1

    def _key_width(self) -> int | None:
        if not self.streams or any(o.descending for o in self.orders):
            return None
        return len(self.orders) + 1

    def key_row(self, doc: Doc) -> Row:
        """``doc``'s one row under a scan with a ``key_width``, made without
        ``rows``' general machinery (a counter's total reads twenty)."""
        assert self.key_width is not None
        return Row((doc.key_enc,) * self.key_width, doc, RawEntity(doc.entity.key) if self.keys_only else doc.entity)

    @property
    def first_property(self) -> str | None:
        names = [o.name for o in self.orders if o.name != KEY_PROPERTY]
        return names[0] if names else None

    def _candidates(self, doc: Doc, name: str) -> list[tuple[bytes, Any]]:
        """The values of ``name`` this entity has rows for, in the index's
        ranges (see ``_filter_check.top_level_ranges`` and ``branches_of``)."""
        if self.branches is None:
            ranges = [self.ranges.get(name, [])]
        else:
            ranges = [tests.get(name, []) for match, tests in self.branches if match(doc)]
        seen: set[bytes] = set()
        out = []
        for enc, v in doc.values(name):  # an index holds a repeated list element once
            if enc not in seen and any(all(t(enc) for t in tests) for tests in ranges):
                seen.add(enc)
                out.append((enc, v))
        return out

    def rows(self, doc: Doc) -> Iterator[Row]:
        """One row per entity, or one per combination of projected values;
        none if the entity lacks an indexed value for a sort or projection."""
        key = doc.entity.key
        names = self.row_properties
        if not names:
            # One row per entity, none of its values in it (a counter's
            # total reads twenty such rows): no combinations to make.
            position = self._position(doc, {})
            if position is not None:
                yield Row(position, doc, RawEntity(key) if self.keys_only else doc.entity)
            return
        choices = [self._candidates(doc, name) for name in names]
        for combo in itertools.product(*choices):
            chosen = dict(zip(names, combo))
            position = self._position(doc, chosen)
            if position is None:
                return  # not in a sort order's index: not a result
            if self.projection:
                entity = RawEntity(key, {name: projected(chosen[name][1]) for name in self.projection})
            elif self.keys_only:
                entity = RawEntity(key)
            else:
                entity = doc.entity
            yield Row(position + tuple(enc for enc, _ in combo), doc, entity)

    def _position(self, doc: Doc, chosen: dict[str, tuple[bytes, Any]]) -> tuple[bytes, ...] | None:
        """Where a row sorts, before its projected values: each sort order's
        value (the row's ``chosen`` one, else the least, or greatest when
        descending, of the entity's indexed values), then the key; None
        when the entity is not in a sort order's index."""
        position = []
        for order in self.orders:
            if order.name == KEY_PROPERTY:
                enc = doc.key_enc
            elif order.name in chosen:
                enc = chosen[order.name][0]
            else:
                values = [e for e, _ in self._candidates(doc, order.name)]
                if not values:
                    return None
                enc = max(values) if order.descending else min(values)
            position.append(descending(enc) if order.descending else enc)
        position.append(descending(doc.key_enc) if self.key_descending else doc.key_enc)
        return tuple(position)

    def first_of_each(self, rows: Iterable[Row]) -> list[Row]:
        seen: set[tuple[bytes, ...]] = set()
        out = []
        offset = len(self.orders) + 1
        names = self.row_properties
        for row in rows:
            group = tuple(row.position[offset + names.index(n)] for n in self.distinct_on)
            if group not in seen:
                seen.add(group)
                out.append(row)
        return out
