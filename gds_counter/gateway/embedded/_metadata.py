"""Datastore's metadata queries on the embedded engine: ``__namespace__``,
``__kind__`` and ``__property__``.

Production answers them; the Firestore emulator refuses them ("Kind
queries are not supported in the Datastore Mode emulator"), so the rules
here are the Datastore metadata documentation's
(cloud.google.com/datastore/docs/concepts/metadataqueries):

* a namespace query returns one ``__namespace__`` entity per namespace that
  holds an entity, keyed by its name; the default namespace, whose name
  (the empty string) cannot be a key name, by the id 1;
* a kind query, one ``__kind__`` entity per kind of the query's namespace;
* a property query, one ``__property__`` entity per indexed property of a
  kind, its key the child of the kind's ``__kind__`` key; unless keys only,
  with ``property_representation``: the representations its values use
  (``INT64`` for integers and timestamps, ``DOUBLE``, ``BOOLEAN``,
  ``STRING`` for text and bytes, ``POINT``, ``REFERENCE``, ``NULL``);
* they filter only by ranges of ``__key__`` (and, for properties, an
  ancestor ``__kind__`` key), and sort only by ``__key__`` ascending.

The entities are made from the index as it is now, read in one SQLite
snapshot; a query's LIMIT, OFFSET and cursors apply to them as to others.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from gds_counter.errors import BadValueError
from gds_counter.gateway.embedded._cursors import BatchCursors, cursor_owner, decode_cursor, encode_cursor
from gds_counter.gateway.embedded._encoding import key_bytes
from gds_counter.gateway.embedded._filter_check import RANGE_OPS
from gds_counter.gateway.embedded._refusals import composites
from gds_counter.gateway.keys import Key
from gds_counter.gateway.query import KEY_PROPERTY, PropertyFilter, Query, leaves_of
from gds_counter.gateway.values import RawEntity

__all__ = ["metadata_batch", "metadata_entities"]

#: The first byte of each type's index encoding (``_encoding.sortable``),
#: and the representation Datastore names it by.
_REPRESENTATIONS = {0x10: "NULL", 0x20: "INT64", 0x30: "BOOLEAN", 0x40: "STRING", 0x50: "DOUBLE", 0x60: "POINT", 0x70: "REFERENCE"}



def metadata_entities(conn: sqlite3.Connection, query: Query) -> list[RawEntity]:
    """The metadata entities ``query`` (of a metadata kind) matches, in key
    order; ``BadValueError`` for what Datastore refuses in such a query."""
    _check(query)
    ns = query.namespace
    if query.kind == "__namespace__":
        found = [_namespace_key(row[0], ns) for row in conn.execute("SELECT DISTINCT ns FROM entities").fetchall()]
        entities = [RawEntity(key) for key in found]
    elif query.kind == "__kind__":
        rows = conn.execute("SELECT DISTINCT kind FROM entities WHERE ns = ?", (ns,)).fetchall()
        entities = [RawEntity(Key.of("__kind__", kind, namespace=ns)) for (kind,) in rows]
    else:
        kinds: dict[tuple[str, str], set[str]] = {}
        for kind, name, tag in conn.execute("SELECT kind, name, substr(value, 1, 1) FROM props WHERE ns = ?", (ns,)).fetchall():
            kinds.setdefault((kind, name), set()).add(_REPRESENTATIONS.get(tag[0], "UNKNOWN") if tag else "UNKNOWN")
        entities = [
            RawEntity(Key.of("__kind__", kind, "__property__", name, namespace=ns),
                      {} if query.keys_only else {"property_representation": sorted(found)})
            for (kind, name), found in kinds.items()
        ]
    chosen = [e for e in entities if _matches(e.key, query)]
    return sorted(chosen, key=lambda e: key_bytes(e.key))


def _namespace_key(name: str, ns: str) -> Key:
    if name == "":
        return Key.of("__namespace__", 1, namespace=ns)  # (the empty string is no key name)
    return Key.of("__namespace__", name, namespace=ns)


def _check(query: Query) -> None:
    why = ""
    if query.projection or query.distinct_on:
        why = "they take no projection or DISTINCT"
    elif any(o.name != KEY_PROPERTY or o.descending for o in query.order):
        why = "they sort only by __key__ ascending"
    elif query.filter is not None:
        if any(c.op == "OR" for c in composites(query.filter)):  # (anywhere: _matches reads every leaf as AND)
            why = "they take no OR"
        elif not all(_key_range(leaf, query.kind) for leaf in leaves_of(query.filter)):
            why = "they filter only by ranges of __key__ (and a property query by an ancestor __kind__ key)"
    if why:
        raise BadValueError(f"a {query.kind} metadata query cannot do that: {why}")


def _key_range(leaf: PropertyFilter, kind: str | None) -> bool:
    allowed = leaf.op in RANGE_OPS or leaf.op == "=" or (leaf.op == "HAS_ANCESTOR" and kind == "__property__")
    return leaf.name == KEY_PROPERTY and allowed and isinstance(leaf.value, Key)


def _matches(key: Any, query: Query) -> bool:
    if query.filter is None:
        return True
    mine = key_bytes(key)
    for leaf in leaves_of(query.filter):
        theirs: Key = leaf.value
        if leaf.op == "HAS_ANCESTOR":
            if key.path[: len(theirs.path)] != theirs.path:
                return False
        elif leaf.op == "=" and mine != key_bytes(theirs):
            return False
        elif leaf.op in RANGE_OPS and not RANGE_OPS[leaf.op](mine, key_bytes(theirs)):
            return False
    return True


def metadata_batch(
    conn: sqlite3.Connection, query: Query
) -> tuple[list[RawEntity], BatchCursors, bytes | None, bool]:
    """One batch of a metadata query: its entities after the start cursor
    and offset, up to the limit and the end cursor; the cursor after each;
    the cursor after the last one; whether there may be more."""
    owner = cursor_owner(query.kind, query.namespace, (), ())
    start = decode_cursor(query.start_cursor, 1, owner)[0] if query.start_cursor else None
    end = decode_cursor(query.end_cursor, 1, owner)[0] if query.end_cursor else None
    rows = [(key_bytes(e.key), e) for e in metadata_entities(conn, query)]
    rows = [(kb, e) for kb, e in rows if (start is None or kb > start) and (end is None or kb <= end)]
    rows = rows[query.offset :]
    more = query.limit is not None and len(rows) > query.limit
    if query.limit is not None:
        rows = rows[: query.limit]
    last = rows[-1][0] if rows else start
    cursors = BatchCursors([(kb,) for kb, _ in rows], owner, None, more)
    return [e for _, e in rows], cursors, encode_cursor((last,), owner) if last is not None else None, more
