"""The filter check of the embedded engine's scans: whether a candidate
entity matches a query's filter, with Datastore's semantics, in Python.

SQL only narrows a query to a superset of its keys (``_index_sql``); this is
where each candidate (``Doc``, its index values computed once) is checked.
A filter matches an entity when some indexed value matches; inequalities on
one property inside an AND are one index range, met by one list element;
inequality filters span types (``v < "b"`` also matches integers). It also
says which index ranges a query reads (``top_level_ranges``, ``branches_of``)
and which properties order its rows before any sort order is given
(``inequality_names``, ``key_filtered``), for ``_scans.Scan``.
"""

from __future__ import annotations

import functools
from collections import defaultdict
from typing import Any, Callable

import attrs

from gds_counter.errors import BadValueError
from gds_counter.gateway.embedded._encoding import descendant_range, index_entries, key_bytes, sortable
from gds_counter.gateway.embedded._refusals import composites, disjunctions
from gds_counter.gateway.keys import Key
from gds_counter.gateway.query import (
    KEY_PROPERTY,
    CompositeFilter,
    Filter,
    PropertyFilter,
    conjuncts_of,
    leaves_of,
)
from gds_counter.gateway.values import RawEntity

RANGE_OPS = {"<": bytes.__lt__, "<=": bytes.__le__, ">": bytes.__gt__, ">=": bytes.__ge__}


@attrs.define
class Doc:
    """One candidate entity while a query evaluates it, with its index values
    computed once."""

    key_enc: bytes
    version: int
    entity: RawEntity
    _index: dict[str, list[tuple[bytes, Any]]] | None = None

    def values(self, name: str) -> list[tuple[bytes, Any]]:
        if self._index is None:
            self._index = defaultdict(list)
            for entry_name, enc, value in index_entries(self.entity):
                self._index[entry_name].append((enc, value))
        return self._index.get(name, [])

    def encodings(self, name: str) -> list[bytes]:
        if name == KEY_PROPERTY:
            return [self.key_enc]
        return [enc for enc, _ in self.values(name)]


# --- filters ----------------------------------------------------------------


#: The filters that are one index range on their property.
_INEQUALITY_OPS = (*RANGE_OPS, "!=", "NOT_IN")


def filter_target(f: PropertyFilter) -> Any:
    """The filter's value, encoded (a frozenset for IN and NOT_IN)."""
    if f.op == "HAS_ANCESTOR":
        if f.name != KEY_PROPERTY or not isinstance(f.value, Key):
            raise BadValueError(f"HAS_ANCESTOR needs __key__ and a Key, got {f.name!r} {f.value!r}")
        return descendant_range(f.value)
    if f.name == KEY_PROPERTY:
        values = f.value if f.op in ("IN", "NOT_IN") else (f.value,)
        for value in values:
            if not isinstance(value, Key):
                raise BadValueError(f"filter on __key__ needs Key values, got {value!r}")
    encode = key_bytes if f.name == KEY_PROPERTY else sortable  # __key__ compares bare key encodings
    if f.op in ("IN", "NOT_IN"):
        if not isinstance(f.value, (tuple, list, set, frozenset)):
            raise BadValueError(f"{f.op} on {f.name!r} needs a tuple of values, got {f.value!r}")
        return frozenset(encode(v) for v in f.value)
    return encode(f.value)


def _value_test(op: str, target: Any) -> Callable[[bytes], bool]:
    if op == "=":
        return target.__eq__
    if op == "!=":
        return target.__ne__
    if op == "IN":
        return target.__contains__
    if op == "NOT_IN":
        return lambda enc: enc not in target
    if op == "HAS_ANCESTOR":
        low, high = target
        return lambda enc: low <= enc < high
    compare = RANGE_OPS[op]
    return lambda enc: compare(enc, target)


def compile_filter(f: Filter) -> Callable[[Doc], bool]:
    """``f`` as a predicate (``_compile``), where an equality (``=``, an
    ``IN`` value) whose value fails an inequality on the same property in
    the same disjunction matches nothing: that disjunction is one index
    range, and the value lies outside it. So ``l < 'x' AND l = 1.5`` finds
    nothing (a double sorts after every string), though a list ``['a',
    1.5]`` has a value meeting each filter; ``l > 5 AND l IN (1.5, 11)`` is
    ``l > 5 AND l = 11``. Measured on the Firestore emulator, ``!=`` and
    ``NOT IN`` included (tests/conformance/test_differential.py)."""
    groups = disjunctions(f) if _equality_meets_inequality(f) else None
    if groups is None:
        return _compile(f)
    tests = [_compile(CompositeFilter("AND", kept)) for kept in map(_possible, groups) if kept is not None]
    return lambda doc: any(test(doc) for test in tests)


def _equality_meets_inequality(f: Filter) -> bool:
    leaves = list(leaves_of(f))
    equal = {leaf.name for leaf in leaves if leaf.op in ("=", "IN")}
    return any(leaf.name in equal for leaf in leaves if leaf.op in _INEQUALITY_OPS)


def _possible(leaves: list[PropertyFilter]) -> list[PropertyFilter] | None:
    """One disjunction with each equality's values cut to those its
    property's inequalities admit; None when an equality keeps none."""
    tests: dict[str, list[Callable[[bytes], bool]]] = defaultdict(list)
    for leaf in leaves:
        if leaf.op in _INEQUALITY_OPS:
            tests[leaf.name].append(_value_test(leaf.op, filter_target(leaf)))
    out = []
    for leaf in leaves:
        if leaf.op in ("=", "IN") and leaf.name in tests:
            encode = key_bytes if leaf.name == KEY_PROPERTY else sortable
            values = leaf.value if leaf.op == "IN" else (leaf.value,)
            admitted = tuple(v for v in values if all(test(encode(v)) for test in tests[leaf.name]))
            if not admitted:
                return None
            leaf = PropertyFilter(leaf.name, "IN", admitted) if leaf.op == "IN" else leaf
        out.append(leaf)
    return out


def _compile(f: Filter) -> Callable[[Doc], bool]:
    """A predicate with Datastore's semantics: a filter matches an entity if
    some indexed value matches; inequalities on one property inside an AND
    must all be met by the same value (they are one index range scan)."""
    if isinstance(f, PropertyFilter):
        test = _value_test(f.op, filter_target(f))
        name = f.name
        return lambda doc: any(test(enc) for enc in doc.encodings(name))
    children = []
    ranges: dict[str, list[Callable[[bytes], bool]]] = defaultdict(list)
    for child in f.filters:
        if f.op == "AND" and isinstance(child, PropertyFilter) and child.op in RANGE_OPS:
            ranges[child.name].append(_value_test(child.op, filter_target(child)))
        else:
            children.append(_compile(child))
    for name, tests in ranges.items():
        children.append(
            functools.partial(
                lambda doc, name, tests: any(all(t(enc) for t in tests) for enc in doc.encodings(name)),
                name=name,
                tests=tests,
            )
        )
    combine = any if f.op == "OR" else all
    return lambda doc: combine(child(doc) for child in children)


#: One disjunction of a filter with an OR: whether an entity matches it, and
#: the inequality tests its rows' list elements must pass, by property.
Branch = tuple[Callable[[Doc], bool], dict[str, list[Callable[[bytes], bool]]]]


def branches_of(f: Filter | None) -> tuple[Branch, ...] | None:
    """For a filter with an OR and an inequality on a property: its
    disjunctions, each with its own element ranges. Datastore runs such a
    query as one index scan per disjunction and merges them, so an entity's
    rows on a sorted or projected list property are the elements that pass
    the ranges of a disjunction it matches (all of them, for a disjunction
    without an inequality on that property). None: ``top_level_ranges``
    says it all (no OR, no such inequality, or too many disjunctions)."""
    if f is None or not any(c.op == "OR" for c in composites(f)) or not inequality_names(f):
        return None
    groups = disjunctions(f)
    if groups is None:
        return None
    out = []
    for leaves in groups:
        match = compile_filter(leaves[0] if len(leaves) == 1 else CompositeFilter("AND", leaves))
        out.append((match, top_level_ranges(CompositeFilter("AND", leaves))))
    return tuple(out)


def top_level_ranges(f: Filter | None) -> dict[str, list[Callable[[bytes], bool]]]:
    """Inequalities that every result row must meet, by property: a row of a
    projection or a sort on that property uses only the list elements in range,
    as Datastore reads them from the index range. != and NOT_IN are index
    ranges too (the values on either side of the excluded ones), so
    ``tags != 'a'`` never projects or sorts by the element 'a'."""
    out: dict[str, list[Callable[[bytes], bool]]] = defaultdict(list)
    for child in conjuncts_of(f):
        if child.op in _INEQUALITY_OPS and child.name != KEY_PROPERTY:
            out[child.name].append(_value_test(child.op, filter_target(child)))
    return out



def inequality_names(f: Filter | None) -> set[str]:
    """Properties with an inequality anywhere in the filter (OR branches too):
    Datastore reads them from an index ordered by them, so a query without
    those sort orders still comes back in their order (by name), then key."""
    if isinstance(f, PropertyFilter):
        return {f.name} if f.op in _INEQUALITY_OPS and f.name != KEY_PROPERTY else set()
    if isinstance(f, CompositeFilter):
        return set().union(*(inequality_names(child) for child in f.filters))
    return set()


def key_filtered(f: Filter | None, projection: tuple[str, ...]) -> bool:
    """Whether the rows are ordered by ``__key__`` before the projected
    properties: a ``__key__`` inequality anywhere in the filter, or, for a
    projection, a ``__key__ =`` or ``IN`` too (the Firestore emulator reads
    such a projection in key order, and refuses to continue its cursor:
    "index data should not include primary key")."""
    ops = _INEQUALITY_OPS if not projection else (*_INEQUALITY_OPS, "=", "IN")
    return f is not None and any(leaf.name == KEY_PROPERTY and leaf.op in ops for leaf in leaves_of(f))
