"""What Datastore refuses in a query, refused by the embedded engine before
it scans for one: the Firestore emulator's rules and messages (each measured
there), and the filter walks they need (also ``_filter_check``').

* one ancestor filter in every disjunction, the same in all;
* one ``!=`` or ``NOT IN``; ``NOT IN`` never with ``IN`` or ``OR``;
* at most 30 values in an ``IN``, 10 in a ``NOT IN``, and 30 distinct
  disjunctions once the filter is normalized;
* a kindless query filters and sorts only by ``__key__``, ascending;
* a key filter or ancestor in the query's namespace only;
* no property ordered twice.
"""

from __future__ import annotations

from typing import Any, Iterator

from gds_counter.errors import BadValueError
from gds_counter.gateway.keys import Key
from gds_counter.gateway.query import KEY_PROPERTY, CompositeFilter, Filter, PropertyFilter, Query, leaves_of

__all__ = [
    "MAX_DISJUNCTIONS", "MAX_IN_VALUES", "MAX_NOT_IN_VALUES", "MAX_QUERY_TERMS", "check_filter", "check_shape", "composites", "conjuncts",
    "disjunctions",
]


def conjuncts(f: Filter) -> list[Filter]:
    """The top-level AND's members, nested ANDs flattened."""
    if isinstance(f, CompositeFilter) and f.op == "AND":
        return [leaf for child in f.filters for leaf in conjuncts(child)]
    return [f]


#: Beyond this many disjunctions the ancestor rule is not worked out
#: (Datastore refuses far fewer; the query then fails elsewhere or scans).
_MAX_DISJUNCTIONS = 1000

#: Datastore's limits on a query's disjunctions (normalized) and IN and NOT IN values.
MAX_DISJUNCTIONS = 30
MAX_IN_VALUES = 30
MAX_NOT_IN_VALUES = 10
#: Filters (an IN or NOT IN counts its values), sort orders and an ancestor,
#: together: "The query may not have more than 100 filters + sort orders +
#: ancestor total." (the Firestore emulator).
MAX_QUERY_TERMS = 100


def disjunctions(f: Filter) -> list[list[PropertyFilter]] | None:
    """The filter in disjunctive normal form, each disjunction as its
    leaves (a filter repeated in one AND, nested ANDs flattened, counted
    once, as the emulator does), or None when there would be more than
    ``_MAX_DISJUNCTIONS``."""
    if isinstance(f, PropertyFilter):
        return [[f]]
    if f.op == "OR":
        out: list[list[PropertyFilter]] = []
        for child in f.filters:
            part = disjunctions(child)
            if part is None:
                return None
            out += part
        return out if len(out) <= _MAX_DISJUNCTIONS else None
    product: list[list[PropertyFilter]] = [[]]
    for child in dict.fromkeys(conjuncts(f)):  # nested ANDs flattened, repeats counted once
        part = disjunctions(child)
        if part is None or len(product) * len(part) > _MAX_DISJUNCTIONS:
            return None
        product = [a + b for a in product for b in part]
    return product


def _normal_form(f: Filter, cap: int) -> set[frozenset[tuple[Any, ...]]] | None:
    """The distinct disjunctions of the filter's normal form, each a set of
    conditions, an IN of n values making n (the emulator's count: ``(a = 1
    OR a = 2) AND b IN [16]`` has 32, and a condition or branch repeated
    counts once); None past ``cap`` disjunctions."""
    if isinstance(f, PropertyFilter):
        values = f.value if f.op == "IN" else [f.value]
        op = "=" if f.op == "IN" else f.op
        return {frozenset({(f.name, op, type(v).__name__, repr(v))}) for v in values} or {frozenset()}
    parts = [_normal_form(child, cap) for child in f.filters]
    if any(part is None for part in parts):
        return None
    if f.op == "OR":
        out = set().union(*parts)  # type: ignore[arg-type]
    else:
        out = {frozenset()}
        for part in parts:
            assert part is not None
            out = {a | b for a in out for b in part}
            if len(out) > cap:
                return None
    return out if len(out) <= cap else None


def _check_ancestors(f: Filter, ancestors: list[PropertyFilter]) -> None:
    """Every disjunction of the filter must have exactly one ancestor
    filter, the same in all (measured on the Firestore emulator: an OR whose
    branches each repeat ``HAS ANCESTOR k`` runs; a branch without it, another
    ancestor, or ``k`` twice in one disjunction is refused)."""
    if not ancestors:
        return
    groups = disjunctions(f)
    if groups is None:  # too many to work out: the top-level rule alone
        valid = len({a.value for a in ancestors}) == 1 and all(any(c is a for c in conjuncts(f)) for a in ancestors)
    else:
        found = [[leaf.value for leaf in group if leaf.op == "HAS_ANCESTOR"] for group in groups]
        valid = all(len(values) == 1 for values in found) and len({values[0] for values in found}) == 1
    if not valid:
        raise BadValueError("All disjunctions must have a common and unique ancestor constraint.")


def check_filter(f: Filter | None) -> None:
    """Refuse what Datastore refuses (the Firestore emulator's rules and
    messages): one ancestor per disjunction, the same in all
    (``_check_ancestors``); one != or NOT_IN at most; NOT_IN never with IN
    or OR."""
    if f is None:
        return
    found = list(leaves_of(f))
    for leaf in found:
        if leaf.op == "IN" and len(leaf.value) > MAX_IN_VALUES:
            raise BadValueError(
                f"IN supports up to {MAX_IN_VALUES} values. There are {len(leaf.value)} values in the IN filter in your query."
            )
        if leaf.op == "NOT_IN" and len(leaf.value) > MAX_NOT_IN_VALUES:
            raise BadValueError(f"NOT_IN supports up to {MAX_NOT_IN_VALUES} values.")
    normal = _normal_form(f, 10 * MAX_DISJUNCTIONS)
    if normal is None or len(normal) > MAX_DISJUNCTIONS:
        count = f"{len(normal)}" if normal is not None else f"over {10 * MAX_DISJUNCTIONS}"
        raise BadValueError(
            f"Too many disjunctions after normalization. Result had {count} disjunctions which is more than the "
            f"maximum of {MAX_DISJUNCTIONS}"
        )
    _check_ancestors(f, [leaf for leaf in found if leaf.op == "HAS_ANCESTOR"])
    if sum(leaf.op in ("!=", "NOT_IN") for leaf in found) > 1:
        raise BadValueError("Only a single 'NOT_EQUAL' or 'NOT_IN' is allowed per query.")
    has_or = any(isinstance(c, CompositeFilter) and c.op == "OR" for c in composites(f))
    if any(leaf.op == "NOT_IN" for leaf in found) and (has_or or any(leaf.op == "IN" for leaf in found)):
        raise BadValueError("'NOT_IN' cannot be used in the same query with 'IN' or 'OR'.")


def composites(f: Filter) -> Iterator[CompositeFilter]:
    if isinstance(f, CompositeFilter):
        yield f
        for child in f.filters:
            yield from composites(child)


def check_shape(query: Query) -> None:
    """Refuse, as the Firestore emulator does, what the filter alone does
    not show: a kindless query filtered on anything but ``__key__`` or
    ordered by anything but ``__key__`` ascending (Datastore has no
    kindless index of other properties), a key filter or ancestor in
    another namespace than the query's, a property ordered twice, and more
    than ``MAX_QUERY_TERMS`` filters, sort orders and ancestor together."""
    if query.kind is None:
        for leaf in leaves_of(query.filter) if query.filter is not None else ():
            if leaf.name != KEY_PROPERTY:
                raise BadValueError(f"kind is required for filter: {leaf.name}")
        if any(o.name != KEY_PROPERTY or o.descending for o in query.order):
            raise BadValueError("kind is required for all orders except __key__ ascending")
    for leaf in leaves_of(query.filter) if query.filter is not None else ():
        if leaf.name != KEY_PROPERTY:
            continue
        what = "ancestor" if leaf.op == "HAS_ANCESTOR" else "__key__ filter"
        for value in leaf.value if isinstance(leaf.value, (list, tuple)) else (leaf.value,):
            if isinstance(value, Key) and value.namespace != query.namespace:
                raise BadValueError(
                    f"The query namespace is {query.namespace!r} but {what} namespace is {value.namespace!r}."
                )
    if KEY_PROPERTY in query.distinct_on:
        raise BadValueError(f"Group by is not supported for the property: {KEY_PROPERTY}")
    seen: set[str] = set()
    for order in query.order:
        if order.name in seen:
            raise BadValueError(f"order by clause cannot contain duplicate fields {order.name}")
        seen.add(order.name)
    filters = _terms(query.filter) if query.filter is not None else 0
    ancestor = query.filter is not None and any(leaf.op == "HAS_ANCESTOR" for leaf in leaves_of(query.filter))
    if filters + len(query.order) + ancestor > MAX_QUERY_TERMS:
        raise BadValueError(
            f"the query has {filters} filters (an IN or NOT IN counts its distinct values), {len(query.order)} sort "
            f"order(s) "
            f"and {'an' if ancestor else 'no'} ancestor filter: Datastore takes at most {MAX_QUERY_TERMS} in all"
        )


def _terms(f: Filter) -> int:
    """How many filters Datastore counts in ``f`` (a repeated one once)."""
    if isinstance(f, PropertyFilter):
        if f.op == "HAS_ANCESTOR":
            return 0
        if f.op in ("IN", "NOT_IN") and isinstance(f.value, (list, tuple)):
            return len(dict.fromkeys(map(repr, f.value)))  # a repeated value once, as the emulator counts
        return 1
    children = conjuncts(f) if f.op == "AND" else list(f.filters)
    return sum(_terms(child) for child in dict.fromkeys(children))
