"""What a masked write makes of a stored entity, for ``_storage.upsert``:
Datastore's increment (``incremented``), the index rows an entity has when
they are known without reading them (``index_rows``), and the shortcut for
the counter's every ``add()`` (``masked_plain``).

A counter's ``add()`` sends its shard's ``target`` as it is and an increment
of ``count``, onto a stored text this gateway wrote or decoded a moment ago.
The general path rebuilds the written entity through the property paths,
checks it against Datastore's limits, computes all its index entries and
encodes every value. ``masked_plain`` gives the same text, results and index
when the stored text's decoding is remembered (``Decodings.plain``: it is a
pure function of the text SQLite returned for the row, under the write
transaction, so never stale), every value in it and in the mutation is of a
plain JSON type, and every mask and transform path names a top-level
property:

* the properties are the stored ones with the named ones set, dropped or
  incremented;
* the index is the stored one with the named properties' entries remade;
* the limits need no count: an entity of plain values whose text is at
  most ``PLAIN_TEXT_LIMIT`` characters is far inside both (``PLAIN_TEXT_LIMIT``'s
  note);
* the index rows change only if the named properties' encodings do.

Anything else (a dotted path, a list, an embedded entity, a datetime, an
indexed float whose stored row may be of an older encoding, a text not
remembered) takes the general path. Tests: ``tests/gateway/test_embedded_hot_path.py``
(the shortcut gives what the general path gives, value for value).
"""

from __future__ import annotations

from typing import Any

from gds_counter._checks import INT64_MAX, INT64_MIN
from gds_counter.gateway.embedded._encoding import ROUND_TRIP, Decodings, Index, dump_plain, sortable
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert

__all__ = ["PLAIN_TEXT_LIMIT", "incremented", "index_rows", "masked_plain"]

#: Longest written text ``masked_plain`` writes without counting the limits.
#: Of plain values (null, bool, int, float, str; JSON with ASCII escapes),
#: each property costs at most its text's characters plus 8 bytes of
#: ``values.entity_size`` (a number's 8 bytes against its one digit) and a
#: key at most its text plus 8 per path element, and every property and
#: element takes at least 4 characters: under 48 + 5 x 4,096 = 20,528 bytes,
#: against the 1,048,572-byte limit; and at most 1,024 indexed values
#: (no lists), against 5,000 (``test_the_plain_text_limit_is_inside_datastores_limits``).
PLAIN_TEXT_LIMIT = 4096


def incremented(current: Any, amount: int | float) -> int | float:
    """Datastore's increment transform, as the Firestore emulator applies
    it: integers add and saturate at the 64-bit bounds (never an error, so
    a result at a bound may have been cut short); a double on either side
    makes a double (1.5 + 1 is 2.5); anything else stored (nothing, null, a
    string, a bool, a list, a timestamp) is replaced by the amount."""
    if not isinstance(current, (int, float)) or isinstance(current, bool):
        return amount
    if isinstance(current, float) or isinstance(amount, float):
        return float(current) + float(amount)
    return min(max(current + amount, INT64_MIN), INT64_MAX)


#: Index values whose encoding never changed: rows written for them are the
#: ones ``index_entries`` gives today (floats' NaN and -0.0 changed).
_STABLE = (str, bytes, int, Key, type(None))


def index_rows(index: Index) -> set[tuple[str, bytes]] | None:
    """The index rows of an entity with the index values ``index``, when
    every value is of a type whose encoding never changed (None: read them)."""
    if not all(isinstance(value, _STABLE) for values in index.values() for _, value in values):
        return None
    return {(name, enc) for name, values in index.items() for enc, _ in values}


#: What ``masked_plain`` answers: the text to store, the transforms'
#: results, the written entity's index, and whether its index rows changed.
Plain = tuple[str, tuple[Any, ...], Index, bool]


def masked_plain(mutation: Upsert, key: Key, text: str, decodings: Decodings) -> Plain | None:
    """``mutation`` (masked) written onto the entity stored as ``text``,
    by the shortcut the module docstring describes; None when it does not
    apply (nothing is remembered or changed then)."""
    if key.project is not None:
        return None
    decoded = decodings.plain(text)
    if decoded is None:
        return None
    _, stored, stored_unindexed, stored_index, _ = decoded
    assert mutation.property_mask is not None
    given, excluded = mutation.entity.properties, mutation.entity.unindexed
    properties, unindexed, index = dict(stored), set(stored_unindexed), dict(stored_index)
    changed = False
    for name in mutation.property_mask:
        if "." in name or "`" in name:
            return None
        if name in given:
            value = given[name]
            if type(value) not in ROUND_TRIP:
                return None
            changed |= _put(properties, unindexed, index, name, value, name in excluded)
        else:  # in the mask but not the entity: Datastore removes it
            properties.pop(name, None)
            unindexed.discard(name)
            changed |= index.pop(name, None) is not None
    results = []
    for transform in mutation.transforms:
        name = transform.name
        if "." in name or "`" in name:
            return None
        total = incremented(properties.get(name), transform.amount)
        changed |= _put(properties, unindexed, index, name, total, name in excluded)
        results.append(total)
    unindexed.intersection_update(properties)
    written_unindexed = frozenset(unindexed)
    text = dump_plain(key, properties, written_unindexed)
    if len(text) > PLAIN_TEXT_LIMIT:
        return None
    index = {name: index[name] for name in properties if name in index}  # (in the entity's order, as index_entries)
    decodings.remember_plain(text, key, properties, written_unindexed, index)
    return text, tuple(results), index, changed


def _put(properties: dict[str, Any], unindexed: set[str], index: Index, name: str, value: Any, unindex: bool) -> bool:
    """Set ``name`` to the plain ``value`` (``paths.put`` of one member),
    remaking its index entry; whether its index rows changed."""
    properties[name] = value
    before = index.pop(name, None)
    if unindex:
        unindexed.add(name)
        return before is not None
    unindexed.discard(name)
    entry = sortable(value)
    index[name] = [(entry, value)]
    return before is None or len(before) != 1 or before[0][0] != entry
