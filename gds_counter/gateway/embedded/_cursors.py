"""Cursors of the embedded engine: a position in its own query, and a point
any query of the same kind and namespace can continue from.

A result row's position (``_scans.Scan``) sorts the rows and continues
the query that issued it exactly, also past rows that share every sort
value. Datastore's cursor is more than that: the Firestore emulator reads a
cursor as a point in index order, the sort values of the last row and its
key, and continues *another* query of the same kind and namespace from it
(measured, docs/gql.md):

* the point's values meet the other query's sort orders one by one, and its
  key meets the key (or, when it has fewer values than the query has sort
  orders, the next sort order's value, where a key sorts above numbers,
  strings and the rest);
* a point has a side, after the row (a query scanning its index forward
  ended there) or before it (one scanning backward, its first order
  descending, ended there); read by a query that scans the other way, the
  row itself comes first: ``ORDER BY n``'s cursor after ``n = 1`` on
  ``ORDER BY n DESC`` gives ``n = 1`` and then ``n = 0``;
* a point with more values than the other query has sort orders, or from
  another kind or namespace, is refused;
* a DISTINCT query's point holds its row's values but no key: it stands
  after (or before) every row with those values; and a DISTINCT query
  continued from a point starts its groups afresh there, its own cursor
  included (only its own next batch goes on exactly).

So a cursor (``GDSC3``) carries both: the digest of the query that issued
it with its exact position, and the point. Cursors of the earlier formats
(``GDSC2``: digest and position; ``GDSC1``: the position alone) continue
only their own query.
"""

from __future__ import annotations

import hashlib
from typing import Any, Iterable, Sequence, overload

from gds_counter.errors import BadValueError
from gds_counter.gateway.embedded._encoding import descending, key_place, key_value
from gds_counter.gateway.embedded._scans import Scan
from gds_counter.gateway.query import KEY_PROPERTY, Query

__all__ = ["BatchCursors", "Point", "cursor_owner", "decode_cursor", "encode_cursor", "read_cursor"]

_V1, _V2, _V3 = b"GDSC1", b"GDSC2", b"GDSC3"
#: The side of a point from a query whose key is an index value (see
#: ``_keyed``): Datastore continues no cursor of such a query, but the
#: Firestore emulator returns it whole, so the embedded engine's own batches
#: of it (``_BATCH``) go on in that very query.
_KEYED, _BATCH = b"!", b"="
#: The sides of a DISTINCT query's point: after (or before) every row with
#: its values, whatever the key (the Firestore emulator's cursor of such a
#: query holds no key: continued elsewhere, the rest of its group follows).
_GROUP_AFTER, _GROUP_BEFORE = b"]", b"["
#: The first part of a point after its row: the side ``>``, length-prefixed.
_SIDE_AFTER = (1).to_bytes(4, "big") + b">"
_OWNER_SIZE = 8


def cursor_owner(kind: str | None, namespace: str, orders: Iterable[Any], row_properties: Iterable[str]) -> bytes:
    """What a position means, as 8 bytes: the kind, the namespace, the sort
    orders with their directions, the row's properties."""
    shape = repr((kind, namespace, [(o.name, o.descending) for o in orders], list(row_properties)))
    return hashlib.blake2b(shape.encode("utf-8", "surrogatepass"), digest_size=_OWNER_SIZE).digest()


def _parts(data: bytes, at: int) -> list[bytes] | None:
    parts: list[bytes] = []
    while at < len(data):
        length = int.from_bytes(data[at : at + 4], "big")
        parts.append(data[at + 4 : at + 4 + length])
        at += 4 + length
    return parts if at == len(data) else None


def _joined(parts: Iterable[bytes]) -> bytes:
    return b"".join([len(part).to_bytes(4, "big") + part for part in parts])


def _columns(scan: Scan) -> int:
    """How many of the scan's sort orders are index values: all but a last
    order by key, which is the index's own key. Also where a row's position
    holds that key (that last order's component, else the key after the
    orders), in its direction (``_key_descending``)."""
    orders = scan.orders
    return len(orders) - 1 if orders and orders[-1].name == KEY_PROPERTY else len(orders)


def _key_descending(scan: Scan) -> bool:
    if _columns(scan) < len(scan.orders):
        return scan.orders[-1].descending
    return scan.key_descending


def _scans_backward(scan: Scan) -> bool:
    return bool(scan.orders) and scan.orders[0].descending


def _as_value(encoded_key: bytes, desc: bool) -> bytes:
    """A key sort order's component (raw key bytes) as an index value."""
    value = key_value(descending(encoded_key) if desc else encoded_key)
    return descending(value) if desc else value


def _keyed(scan: Scan) -> bool:
    """Whether a sort order by key comes before another (the key is then an
    index value, and Datastore continues no cursor of such a query)."""
    return any(order.name == KEY_PROPERTY for order in scan.orders[: _columns(scan)])


def encode_cursor(position: tuple[bytes, ...], owner: bytes, scan: Scan | None = None, *, batch: bool = False) -> bytes:
    """The cursor after ``position``: its own query's (``owner``) and, given
    the ``scan`` that made it, the point too (see the module's notes).
    ``batch``: the query has more rows than its batch held (not a LIMIT)."""
    if scan is None:
        return _V2 + owner + _joined(position)
    if not scan.orders:  # key order (a counter's total): the point is the key, after it
        key = position[0]
        return b"".join((_V3, owner, _SIDE_AFTER, len(key).to_bytes(4, "big"), key, b"|", _joined(position)))
    if _keyed(scan):
        side, values = (_BATCH if batch else _KEYED), []
    else:
        backward = _scans_backward(scan)  # before the row or after it, in index order
        grouped = scan.distinct_on and not batch  # its own next batch goes on exactly, groups and all
        side = (_GROUP_BEFORE if backward else _GROUP_AFTER) if grouped else (b"<" if backward else b">")
        values = [descending(position[at]) if scan.orders[at].descending else position[at] for at in range(_columns(scan))]
    key = position[_columns(scan)]
    key = descending(key) if _key_descending(scan) else key
    return _V3 + owner + _joined([side, *values, key]) + b"|" + _joined(position)


class BatchCursors(Sequence[bytes]):
    """The cursor after each row of a batch (Datastore gives every result
    its own), from the rows' ``positions``: each made when asked, since
    most callers follow only the batch's end cursor. ``more``: as
    ``encode_cursor``'s ``batch``."""

    __slots__ = ("_positions", "_owner", "_scan", "_more")

    def __init__(self, positions: list[tuple[bytes, ...]], owner: bytes, scan: Scan | None, more: bool) -> None:
        self._positions, self._owner, self._scan, self._more = positions, owner, scan, more

    def __len__(self) -> int:
        return len(self._positions)

    @overload
    def __getitem__(self, at: int) -> bytes: ...
    @overload
    def __getitem__(self, at: slice) -> list[bytes]: ...

    def __getitem__(self, at: int | slice) -> bytes | list[bytes]:
        if isinstance(at, slice):
            return [self[i] for i in range(*at.indices(len(self)))]
        return encode_cursor(self._positions[at], self._owner, self._scan, batch=self._more)


def decode_cursor(cursor: bytes, size: int, owner: bytes) -> tuple[bytes, ...]:
    """The position of a cursor that ``owner``'s query issued (of ``size``
    parts); ``BadValueError`` for any other."""
    found = read_cursor(cursor, size, owner)
    if isinstance(found, Point):
        raise BadValueError(
            "cursor belongs to another query (another kind, namespace, sort order or direction, or projection)"
        )
    return found


class Point:
    """A cursor read by a query other than the one that issued it."""

    __slots__ = ("side", "values", "key", "_bound")

    def __init__(self, side: bytes, values: list[bytes], key: bytes) -> None:
        self.side, self.values, self.key = side, values, key
        self._bound: tuple[tuple[bytes, ...], bool] | None = None

    def check(self, query: Query) -> None:
        """Refuse a point from another namespace or kind, as Datastore does
        (a DISTINCT query's point holds no key there, so it continues
        anywhere, as the Firestore emulator's does)."""
        if self.side in (_GROUP_AFTER, _GROUP_BEFORE):
            return
        namespace, kind = key_place(self.key)
        if namespace != query.namespace:
            raise BadValueError(
                f"cursor's position is in namespace {namespace!r}, not the query's {query.namespace!r}"
            )
        if query.kind is not None and kind != query.kind:
            raise BadValueError(f"cursor's position is of kind {kind!r}, not the query's {query.kind!r}")

    def bound(self, scan: Scan) -> tuple[tuple[bytes, ...], bool]:
        """The point as a prefix of ``scan``'s row positions (index values,
        then the key when it has a value for every sort order), and whether
        it lies after the rows that share that prefix, in the scan's row
        order."""
        if self._bound is None:
            columns = _columns(scan)
            if len(self.values) > columns:
                raise BadValueError(
                    f"cursor does not match the query: its position has {len(self.values)} sort value(s), "
                    f"the query sorts by {columns} value(s) before the key"
                )
            if len(self.values) == columns and _keyed(scan):
                raise BadValueError(
                    "cursor does not match the query: the query sorts by __key__ before a property, and the "
                    "cursor's position has a value for each of its sort orders"
                )
            prefix = [descending(v) if scan.orders[at].descending else v for at, v in enumerate(self.values)]
            after = (self.side in (b">", _GROUP_AFTER)) != _scans_backward(scan)
            if len(self.values) == columns and self.side not in (_GROUP_AFTER, _GROUP_BEFORE):
                prefix.append(descending(self.key) if _key_descending(scan) else self.key)
            # Else the point names the rows whose first values are its own
            # and is compared with those values alone: a point after them
            # lies after all of them, one before them before all of them (as
            # a Firestore cursor with fewer values than sort orders, or a
            # DISTINCT query's). No byte stands for "after every key": a
            # key in descending order may begin with 0xff (the default
            # namespace's does), so such a marker once let a DISTINCT
            # query's last group come back on every page.
            self._bound = (tuple(prefix), after)
        return self._bound

    def admits_from(self, scan: Scan, position: tuple[bytes, ...]) -> bool:
        """Whether a row at ``position`` comes after this point (a start cursor)."""
        prefix, after = self.bound(scan)
        mine = _row_prefix(scan, position, len(prefix))
        return mine > prefix or (mine == prefix and not after)

    def admits_until(self, scan: Scan, position: tuple[bytes, ...]) -> bool:
        """Whether a row at ``position`` comes before this point (an end cursor)."""
        prefix, after = self.bound(scan)
        mine = _row_prefix(scan, position, len(prefix))
        return mine < prefix or (mine == prefix and after)


def _row_prefix(scan: Scan, position: tuple[bytes, ...], size: int) -> tuple[bytes, ...]:
    """A row's index values then its key, cut to ``size``, in its scan's
    order (a sort order by key among the values as a key value)."""
    columns = _columns(scan)
    out = []
    for at in range(min(size, columns)):
        order = scan.orders[at]
        out.append(_as_value(position[at], order.descending) if order.name == KEY_PROPERTY else position[at])
    if size > columns:
        out.append(position[columns])
    return tuple(out)


def read_cursor(cursor: bytes, size: int, owner: bytes) -> tuple[bytes, ...] | Point:
    """A cursor given to the query ``owner`` names (rows of ``size`` parts):
    its exact position when that query issued it, else its point."""
    if not isinstance(cursor, bytes) or not cursor.startswith((_V1, _V2, _V3)):
        raise BadValueError(f"cursor {cursor!r} was not issued by the embedded gateway")
    at = len(_V1)
    position: list[bytes] | None
    if cursor.startswith(_V1):
        position = _parts(cursor, at)
    else:
        issued_by = cursor[at : at + _OWNER_SIZE]
        at += _OWNER_SIZE
        point = None
        if cursor.startswith(_V3):
            end = _point_end(cursor, at)
            point = _parts(cursor[:end], at) if end is not None else None
            if end is None or not point or point[0] not in (b"<", b">", _GROUP_BEFORE, _GROUP_AFTER, _KEYED, _BATCH) or len(point) < 2:
                raise BadValueError(f"cursor {cursor!r} is damaged")
            if point[0] == _KEYED or (point[0] == _BATCH and issued_by != owner):
                raise BadValueError(
                    "a cursor of a query sorted by __key__ before another property (or projecting a property "
                    "it does not sort by first) cannot be continued: Datastore refuses it (index data should "
                    "not include primary key); sort by __key__ last"
                )
            at = end + 1
        if issued_by != owner or (point is not None and point[0] in (_GROUP_AFTER, _GROUP_BEFORE)):
            if point is None:
                raise BadValueError(
                    "cursor belongs to another query (another kind, namespace, sort order or direction, or "
                    "projection), and was issued before cursors carried their point; continue it in its own query"
                )
            return Point(point[0], point[1:-1], point[-1])
        position = _parts(cursor, at)
    if position is None or len(position) != size:
        raise BadValueError("cursor does not belong to this query (different sort orders or projection)")
    return tuple(position)


def _point_end(cursor: bytes, at: int) -> int | None:
    """Where the point's parts end (at the ``|`` before the position)."""
    while at < len(cursor):
        if cursor[at : at + 1] == b"|":
            return at
        at += 4 + int.from_bytes(cursor[at : at + 4], "big")
    return None
