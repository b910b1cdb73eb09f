"""The Firestore emulator in Datastore mode is the oracle: the same data and
the same queries through the embedded engine and through the emulator must
give the same results, order included.

Shape (an emulator round trip per data set would be too slow per example):

* ``DATA_SETS`` seeded random data sets of ``ENTITIES`` entities each, written
  once to a fresh namespace on the emulator and once to an embedded gateway.
  Every value type is there: null, integers, booleans, text and byte strings
  (valid UTF-8 and not), doubles with NaN, -0.0 and the infinities,
  timestamps, geopoints, keys with ancestors, lists (mixed types, empty),
  unindexed values and missing properties; entity keys mix ids and names,
  roots and children.
* ``GDS_DIFFERENTIAL_QUERIES`` (1,000 in the full run, 100 in the quick run) random valid queries drawn by
  hypothesis with a fixed seed (``derandomize``): filters (every operator,
  AND/OR nests, HAS_ANCESTOR, __key__), several inequality properties, sort
  orders, projections, DISTINCT, DISTINCT ON (with ``*`` too), keys only,
  limits, offsets, and pages followed through cursors.

Each query runs to the end on both sides; the rows are compared key by key,
in order, with the projected values (by type: ``-0.0`` is not ``0.0``, NaN
is NaN). A query the emulator refuses must be refused by the embedded engine
and the other way round (the outcome class is compared). Every difference is
collected, so a failing run lists them all, not the first shrunk one.

The deliberate differences (docs/gql.md, "Deliberate differences from
Datastore"): a query that reads a list property's index (an inequality on
it anywhere in the filter, or an ORDER BY on it) without projecting it makes
the emulator return an entity once per list element; the embedded engine
returns it once. ``deliberate()`` removes the emulator's repeats for exactly
those queries, and such queries get no LIMIT, OFFSET or pages (the repeats
would shift them). An OR with a branch that is only HAS_ANCESTOR makes the
emulator drop that branch or fail (``bare_ancestor_branch()``): the embedded
engine must run it, and its rows are not compared. The last tests show each
difference on both sides.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import re
import uuid
from typing import Any, Iterator

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sizes import sized

from gds_counter.errors import BadValueError, GatewayError, GQLError
from gds_counter.gateway import open_gateway
from gds_counter.gateway.base import iterate_batches
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.query import CompositeFilter, Order, PropertyFilter, Query
from gds_counter.gateway.values import Geopoint, RawEntity

UTC = dt.timezone.utc
KIND = "D"
DATA_SETS = 5
ENTITIES = 30
QUERIES = sized("GDS_DIFFERENTIAL_QUERIES", 100, 1000)

#: Indexed properties that queries name; "u" is stored unindexed, "m" is
#: missing from most entities, "l" holds lists.
SCALARS = ("a", "b", "n")
PROPERTIES = (*SCALARS, "l", "u", "m", "e.k")
LIST_PROPERTY = "l"


def value_pool(ns: str) -> list[Any]:
    """Values that data and filters draw from (small, so that filters hit)."""
    return [
        None, 0, 1, 2, -1, 10**12, True, False, "", "a", "b", "ab", "é",
        b"a", b"b", b"\xff", 0.0, -0.0, 1.5, -2.5, math.nan, math.inf, -math.inf,
        dt.datetime(2020, 1, 1, tzinfo=UTC), dt.datetime(1970, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
        Geopoint(1.0, 2.0), Geopoint(-3.0, 4.0),
        Key.of("U", "x", namespace=ns), Key.of("U", -4, namespace=ns), Key.of("P", "p1", "U", 3, namespace=ns),
    ]


NUMBERS = [0, 1, 2, -1, 1.5, 0.0, -0.0, math.nan, -math.inf]


def parents(ns: str) -> list[Key | None]:
    return [None, None, Key.of("P", "p1", namespace=ns), Key.of("P", "p2", namespace=ns),
            Key.of("P", "p1", "Q", 3, namespace=ns)]


def make_data_set(seed: int, ns: str) -> list[RawEntity]:
    rng = random.Random(seed)
    pool = value_pool(ns)
    out = []
    for i in range(ENTITIES):
        parent = rng.choice(parents(ns))
        # ids negative and positive (Datastore stores both), names otherwise
        ident: tuple[Any, ...] = (KIND, (i + 1) * 7 * (-1) ** (i // 3)) if i % 3 == 0 else (KIND, f"e{i:02d}")
        key = Key.of(*(parent.flat_path if parent is not None else ()), *ident, namespace=ns)
        props: dict[str, Any] = {}
        for name in SCALARS:
            if rng.random() < 0.85:
                props[name] = rng.choice(NUMBERS) if name == "n" else rng.choice(pool)
        if rng.random() < 0.8:
            props["l"] = [rng.choice(pool) for _ in range(rng.choice((0, 1, 2, 2, 3)))]
        if rng.random() < 0.5:
            props["u"] = rng.choice(pool)
        if rng.random() < 0.15:
            props["m"] = rng.choice(pool)
        unindexed = {"u"}
        if rng.random() < 0.6:  # an embedded entity: itself excluded now and then, or its k
            props["e"] = RawEntity(None, {"k": rng.choice(NUMBERS)}, frozenset({"k"}) if rng.random() < 0.2 else frozenset())
            if rng.random() < 0.4:
                unindexed.add("e")
        out.append(RawEntity(key, props, frozenset(unindexed)))
    return out


# --- comparing values --------------------------------------------------------


def canon(value: Any) -> Any:
    """A value as a comparable, type-exact tuple (-0.0 is not 0.0; NaN is NaN)."""
    if isinstance(value, list):
        return ("list", tuple(canon(v) for v in value))
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int):
        return ("int", value)
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, dt.datetime):
        return ("time", value.astimezone(UTC).isoformat())
    if isinstance(value, Key):
        return ("key", value.namespace, value.flat_path)
    if isinstance(value, Geopoint):
        return ("geo", repr(value.latitude), repr(value.longitude))
    if isinstance(value, RawEntity):
        return ("entity", canon_entity(value, True))
    return (type(value).__name__, value)


def canon_entity(entity: RawEntity, with_properties: bool) -> Any:
    key = entity.key.flat_path if entity.key is not None else None
    if not with_properties:
        return key
    return (key, tuple(sorted((name, canon(v)) for name, v in entity.properties.items())))


# --- the queries ----------------------------------------------------------------


@attrs.frozen
class Spec:
    data_set: int
    query: Query
    page: int | None  # follow cursors in pages of this size

    def describe(self) -> str:
        q = self.query
        parts = [f"set {self.data_set}", f"filter={q.filter!r}"]
        for name in ("order", "projection", "distinct_on", "keys_only", "limit", "offset"):
            value = getattr(q, name)
            if value not in ((), False, None, 0):
                parts.append(f"{name}={value!r}")
        if self.page:
            parts.append(f"pages of {self.page}")
        return ", ".join(parts)


def filter_values(ns: str) -> list[Any]:
    return value_pool(ns)


def key_pool(ns: str) -> list[Key]:
    """Keys filters compare with: some stored, some not, one of another kind."""
    keys = [Key.of(*(p.flat_path if p else ()), KIND, name, namespace=ns) for p in parents(ns) for name in ("e05", "e10")]
    return keys + [Key.of(KIND, 7, namespace=ns), Key.of(KIND, -28, namespace=ns), Key.of(KIND, -1, namespace=ns),
                   Key.of("P", "p1", namespace=ns)]


def leaves(ns: str) -> st.SearchStrategy[PropertyFilter]:
    pool = filter_values(ns)
    keys = key_pool(ns)
    value = st.sampled_from(pool)
    # Mostly a few values; now and then about Datastore's limits (IN takes
    # at most 30, NOT IN 10, and an IN of n counts n disjunctions).
    values = st.one_of(
        st.lists(value, min_size=1, max_size=4), st.lists(st.integers(-5, 40), min_size=9, max_size=34, unique=True),
    ).map(tuple)
    prop = st.builds(PropertyFilter, st.sampled_from(PROPERTIES), st.sampled_from(("=", "<", "<=", ">", ">=", "!=")), value)
    member = st.builds(PropertyFilter, st.sampled_from(PROPERTIES), st.sampled_from(("IN", "NOT_IN")), values)
    key_value = st.sampled_from(keys)
    on_key = st.builds(PropertyFilter, st.just("__key__"), st.sampled_from(("=", "<", ">=", "!=")), key_value)
    key_in = st.builds(PropertyFilter, st.just("__key__"), st.sampled_from(("IN", "NOT_IN")),
                       st.lists(key_value, min_size=1, max_size=3).map(tuple))
    ancestor = st.builds(PropertyFilter, st.just("__key__"), st.just("HAS_ANCESTOR"),
                         st.sampled_from([p for p in parents(ns) if p is not None] + keys[:2]))
    return st.one_of(prop, prop, prop, member, on_key, key_in, ancestor)


def filters(ns: str) -> st.SearchStrategy[Any]:
    leaf = leaves(ns)
    return st.recursive(
        leaf,
        lambda inner: st.builds(CompositeFilter, st.sampled_from(("AND", "AND", "OR")), st.lists(inner, min_size=2, max_size=3)),
        max_leaves=4,
    )


@st.composite
def specs(draw: Any, namespaces: list[str]) -> Spec:
    index = draw(st.integers(0, len(namespaces) - 1))
    ns = namespaces[index]
    flt = draw(st.one_of(st.none(), filters(ns)))
    kind = draw(st.sampled_from((KIND,) * 7 + (None,)))  # kindless: only __key__ filters and ascending key order run
    sortable = ("a", "b", "n", "l", "m", "e.k", "__key__")
    order = st.builds(Order, st.sampled_from(sortable), st.booleans())
    orders = draw(st.one_of(
        st.lists(order, max_size=2, unique_by=lambda o: o.name), st.lists(order, max_size=3),  # (a property twice is refused)
    ))
    mode = draw(st.sampled_from(
        ("entity", "entity", "keys", "projection", "distinct", "distinct_on", "distinct_on_star", "distinct_on_other")
    ))
    projection: tuple[str, ...] = ()
    distinct_on: tuple[str, ...] = ()
    keys_only = mode == "keys"
    if mode in ("projection", "distinct", "distinct_on"):
        projection = tuple(draw(st.lists(st.sampled_from(("a", "b", "n", "l")), min_size=1, max_size=2, unique=True)))
        if mode == "distinct":
            distinct_on = projection
        elif mode == "distinct_on":
            distinct_on = tuple(draw(st.lists(st.sampled_from(projection), min_size=1, max_size=len(projection), unique=True)))
    elif mode == "distinct_on_star":
        distinct_on = tuple(draw(st.lists(st.sampled_from(("a", "b", "n")), min_size=1, max_size=2, unique=True)))
    elif mode == "distinct_on_other":  # DISTINCT ON properties that are not projected
        projection = tuple(draw(st.lists(st.sampled_from(("a", "b", "n")), min_size=1, max_size=2, unique=True)))
        distinct_on = tuple(draw(st.lists(st.sampled_from(("a", "b", "n")), min_size=1, max_size=2, unique=True)))
    limit = draw(st.one_of(st.none(), st.none(), st.integers(1, 8), st.sampled_from((2**31 - 1, 2**31, 3_000_000_000))))
    offset = draw(st.sampled_from((0, 0, 0, 1, 3, 2**31)))
    page = draw(st.one_of(st.none(), st.none(), st.integers(1, 4)))
    if repeats_per_element(orders, projection, flt):
        limit, offset, page = None, 0, None  # the emulator's repeats would shift them (deliberate())
    query = Query(kind, ns, flt, tuple(orders), projection, distinct_on, keys_only, limit, offset)
    return Spec(index, query, page)


INEQUALITIES = ("<", "<=", ">", ">=", "!=", "NOT_IN")


def inequality_names(f: Any) -> set[str]:
    """Properties with an inequality anywhere in the filter (OR branches too)."""
    if isinstance(f, PropertyFilter):
        return {f.name} if f.op in INEQUALITIES else set()
    if isinstance(f, CompositeFilter):
        return set().union(*(inequality_names(child) for child in f.filters))
    return set()


def repeats_per_element(orders: Any, projection: Any, flt: Any) -> bool:
    """Where the emulator returns an entity once per list element and the
    embedded engine once: a query that reads the list property's index
    (an explicit ORDER BY on it, or an inequality, !=, or NOT IN on it
    anywhere in the filter, OR branches included) and does not project it."""
    reads_list_index = any(o.name == LIST_PROPERTY for o in orders) or LIST_PROPERTY in inequality_names(flt)
    return reads_list_index and LIST_PROPERTY not in projection


def bare_ancestor_branch(f: Any) -> bool:
    """An OR with a branch that is only ``HAS_ANCESTOR k`` (every branch
    then names k): the emulator drops that branch's entities, or fails
    with UNKNOWN when every branch is only that (docs/gql.md, deliberate
    differences); the embedded engine runs it and returns the union."""
    if not isinstance(f, CompositeFilter):
        return False
    if f.op == "OR" and any(isinstance(c, PropertyFilter) and c.op == "HAS_ANCESTOR" for c in f.filters):
        return True
    return any(bare_ancestor_branch(c) for c in f.filters)


def deliberate(spec: Spec, rows: list[Any]) -> list[Any]:
    """The emulator's rows with docs/gql.md's deliberate difference undone:
    each entity kept once, at its first row."""
    if not repeats_per_element(spec.query.order, spec.query.projection, spec.query.filter):
        return rows
    return first_rows(rows)


def first_rows(rows: list[Any]) -> list[Any]:
    """Each entity once (``row[0]`` is its key), at its first row."""
    seen = set()
    out = []
    for row in rows:
        if row[0] not in seen:
            seen.add(row[0])
            out.append(row)
    return out


# --- running ------------------------------------------------------------------------


def run(gateway: Any, spec: Spec) -> Any:
    """The rows, or ('refused', error class) when the query is refused."""
    query = spec.query
    whole = not query.projection and not query.keys_only
    try:
        rows: list[Any] = []
        if spec.page is None:
            entities = [e for batch in iterate_batches(gateway, query) for e in batch.entities]
        else:
            entities, current = [], query.replace(limit=spec.page)
            for _ in range(200):
                result = gateway.run_query(current)
                entities.extend(result.entities)
                if not result.entities or result.end_cursor is None or not result.more_results:
                    break
                current = query.replace(limit=spec.page, offset=0, start_cursor=result.end_cursor)
        for entity in entities:
            rows.append((canon_entity(entity, False), canon_entity(entity, True)[1] if (whole or query.projection) else None))
        return rows
    except (BadValueError, GatewayError) as exc:  # refused
        return ("refused", type(exc).__name__, str(exc)[:160])


def show(result: Any) -> str:
    if isinstance(result, tuple):
        return repr(result)
    return "[" + ", ".join("/".join(map(str, key)) + (f" {dict(props)}" if props else "") for key, props in result) + "]"


def difference(spec: Spec, theirs: Any, ours: Any) -> str:
    if not isinstance(theirs, tuple) and not isinstance(ours, tuple):
        at = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
        theirs, ours = theirs[max(0, at - 2) : at + 4], ours[max(0, at - 2) : at + 4]
        where = f" (from row {max(0, at - 2)})"
    else:
        where = ""
    return f"{spec.describe()}{where}\n    emulator: {show(theirs)}\n    embedded: {show(ours)}"


def outcome(result: Any) -> Any:
    return "refused" if isinstance(result, tuple) and result[:1] == ("refused",) else result


@pytest.fixture(scope="module")
def data_sets(firestore_emulator: Any) -> Iterator[tuple[Any, Any, list[str]]]:
    """Both sides hold the same data sets, one namespace each."""
    run_id = uuid.uuid4().hex[:8]
    namespaces = [f"diff-{run_id}-{i}" for i in range(DATA_SETS)]
    oracle = firestore_emulator.gateway(namespace=namespaces[0])
    embedded = open_gateway("memory://")
    for seed, ns in enumerate(namespaces):
        entities = make_data_set(seed, ns)
        for gateway in (oracle, embedded):
            gateway.commit([Upsert(e) for e in entities])
    try:
        yield oracle, embedded, namespaces
    finally:
        oracle.close()
        embedded.close()


def test_embedded_answers_every_query_as_the_firestore_emulator(data_sets: Any) -> None:
    oracle, embedded, namespaces = data_sets
    differences: list[str] = []
    counts = {"cases": 0, "rows": 0, "refused": 0, "not_compared": 0}

    @settings(max_examples=QUERIES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(specs(namespaces))
    def check(spec: Spec) -> None:
        counts["cases"] += 1
        theirs = run(oracle, spec)
        ours = run(embedded, spec)
        failed = outcome(theirs) == "refused" and theirs[1] == "GatewayError"
        if bare_ancestor_branch(spec.query.filter) and (failed or outcome(theirs) != "refused"):
            # the emulator drops that branch (README): the embedded engine must run it too; or
            # the emulator fails (UNKNOWN) before its other checks, and there is nothing to compare
            counts["not_compared"] += 1
            if not failed and outcome(ours) == "refused":
                differences.append(difference(spec, theirs, ours))
            return
        if outcome(theirs) == "refused":
            counts["refused"] += 1
            if outcome(ours) != "refused":
                differences.append(difference(spec, theirs, ours))
            return
        counts["rows"] += 1
        theirs = deliberate(spec, theirs)
        if outcome(ours) == "refused" or ours != theirs:
            differences.append(difference(spec, theirs, ours))

    check()
    print(f"differential: {counts}")
    assert counts["cases"] >= QUERIES
    distinct = list(dict.fromkeys(differences))  # hypothesis may draw one query more than once
    assert not distinct, f"{len(distinct)} distinct queries of {counts['cases']} differ:\n" + "\n".join(distinct[:40])


@pytest.fixture(scope="module")
def served(data_sets: Any, serve_server: Any) -> Iterator[Any]:
    """``gds-counter serve`` (a ``Server`` over its own SQLite file) holding
    the same data sets, through gds_counter's Datastore gateway: its answers
    must be the embedded engine's, case by case (issue 27)."""
    from gds_counter.gateway.datastore import DatastoreGateway

    _, _, namespaces = data_sets
    gateway = DatastoreGateway("gds-counter-serve", namespace=namespaces[0], emulator_host=serve_server.emulator_host)
    for seed, ns in enumerate(namespaces):
        gateway.commit([Upsert(e) for e in make_data_set(seed, ns)])
    try:
        yield gateway
    finally:
        gateway.close()


def through_the_server(result: Any) -> Any:
    """A result as the server's side is compared with the embedded engine's:
    rows as they are; a refusal by its error class and message, without the
    status name the server puts before the engine's message."""
    if isinstance(result, tuple) and result[:1] == ("refused",):
        return ("refused", result[1], re.sub(r"^(\w+: rejected by Datastore: )?([A-Z_]+: )?", "", result[2])[:120])
    return result


def test_the_server_answers_every_query_as_the_embedded_engine(data_sets: Any, served: Any) -> None:
    """The differential through ``gds-counter serve``: the same generated
    queries (the same seed and count as the emulator's differential above),
    answered by the Datastore gateway pointed at the server, give exactly
    the embedded engine's rows, in order, and its refusals, with its
    message; so the differential through the server is the differential
    on the engine."""
    _, embedded, namespaces = data_sets
    differences: list[str] = []
    counts = {"cases": 0, "rows": 0, "refused": 0}

    @settings(max_examples=QUERIES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(specs(namespaces))
    def check(spec: Spec) -> None:
        counts["cases"] += 1
        ours = through_the_server(run(embedded, spec))
        theirs = through_the_server(run(served, spec))
        counts["refused" if outcome(ours) == "refused" else "rows"] += 1
        if theirs != ours:
            differences.append(difference(spec, theirs, ours).replace("emulator:", "server:  "))

    check()
    print(f"differential through the server: {counts}")
    assert counts["cases"] >= QUERIES and counts["rows"] > QUERIES // 4 and counts["refused"] > QUERIES // 20, counts
    distinct = list(dict.fromkeys(differences))
    assert not distinct, f"{len(distinct)} distinct queries of {counts['cases']} differ:\n" + "\n".join(distinct[:40])


def test_the_oracle_answers_and_refuses(data_sets: Any) -> None:
    """The comparison means something only if the emulator runs the queries:
    a plain one returns rows and an invalid one is refused."""
    oracle, _, namespaces = data_sets
    plain = Spec(0, Query(KIND, namespaces[0]), None)
    assert len(run(oracle, plain)) == ENTITIES
    bad = Spec(0, Query(KIND, namespaces[0], PropertyFilter("a", "IN", tuple(range(40)))), None)
    assert outcome(run(oracle, bad)) == "refused"


# --- the deliberate differences, shown on both sides ----------------------------------------


@pytest.fixture(scope="module")
def groups(firestore_emulator: Any) -> Iterator[tuple[Any, Any, str]]:
    """Six entities under P:x, each with a two-element list ``l = [i, i+1]``,
    and three root entities."""
    ns = f"groups-{uuid.uuid4().hex[:8]}"
    oracle = firestore_emulator.gateway(namespace=ns)
    embedded = open_gateway("memory://")
    entities = [RawEntity(Key.of("P", "x", KIND, i, namespace=ns), {"a": i % 3, "b": i % 2, "l": [i, i + 1]}) for i in range(1, 7)]
    entities.append(RawEntity(Key.of(KIND, 99, namespace=ns), {"a": 1, "b": 1, "l": [1]}))
    entities.append(RawEntity(Key.of(KIND, "wide", namespace=ns), {"a": 1, "b": 0, "l": [1, 9]}))
    entities.append(RawEntity(Key.of(KIND, "narrow", namespace=ns), {"a": 0, "b": 0, "l": [5]}))
    for gateway in (oracle, embedded):
        gateway.commit([Upsert(e) for e in entities])
    try:
        yield oracle, embedded, ns
    finally:
        oracle.close()
        embedded.close()


def ids(gateway: Any, ns: str, flt: Any) -> Any:
    try:
        return [e.key.flat_path[-1] for e in gateway.run_query(Query(KIND, ns, flt)).entities]
    except (BadValueError, GatewayError) as exc:
        return type(exc).__name__


def test_an_inequality_on_a_list_property_repeats_entities_on_the_emulator_only(groups: Any) -> None:
    """docs/gql.md, deliberate differences: the emulator returns an entity once
    per list element that passes the inequality (ordered by that element);
    the embedded engine once, at its first such row."""
    oracle, embedded, ns = groups
    for flt in (PropertyFilter("l", ">", 2), PropertyFilter("l", "!=", 3), PropertyFilter("l", "NOT_IN", (3,))):
        theirs, ours = ids(oracle, ns, flt), ids(embedded, ns, flt)
        assert len(theirs) > len(set(theirs)), (flt, theirs)  # the repeats
        assert ours == list(dict.fromkeys(theirs)), flt  # each entity once, where it first appears


def test_an_or_places_an_entity_by_the_elements_of_the_branch_it_matches(groups: Any) -> None:
    """Datastore runs each disjunction as its own index scan: an entity
    matched by ``l >= 8`` sorts by its element 9, not by its smallest (1);
    one matched by ``a = 0`` by all its elements."""
    oracle, embedded, ns = groups
    flt = CompositeFilter("OR", [PropertyFilter("l", ">=", 8), PropertyFilter("a", "=", 0)])
    theirs, ours = ids(oracle, ns, flt), ids(embedded, ns, flt)
    assert ours == list(dict.fromkeys(theirs)) == [3, "narrow", 6, "wide"]


def test_an_or_whose_branches_repeat_one_ancestor(groups: Any) -> None:
    """Every disjunction needs the same single ancestor filter: then the
    emulator runs an OR of ancestor queries, as the embedded engine does;
    otherwise both refuse. Where a branch is the ancestor filter alone, the
    emulator drops that branch (or fails, UNKNOWN, when all are): README,
    deliberate differences; the embedded engine returns the union."""
    oracle, embedded, ns = groups
    ax = PropertyFilter("__key__", "HAS_ANCESTOR", Key.of("P", "x", namespace=ns))
    a1, b1 = PropertyFilter("a", "=", 1), PropertyFilter("b", "=", 1)
    both = CompositeFilter("OR", [CompositeFilter("AND", [ax, a1]), CompositeFilter("AND", [ax, b1])])
    assert ids(oracle, ns, both) == ids(embedded, ns, both) == [1, 3, 4, 5]
    nested = CompositeFilter("OR", [CompositeFilter("AND", [ax, a1]), CompositeFilter("AND", [b1, CompositeFilter("OR", [
        CompositeFilter("AND", [ax, PropertyFilter("a", "=", 0)]), CompositeFilter("AND", [ax, PropertyFilter("a", "=", 2)])])])])
    assert ids(oracle, ns, nested) == ids(embedded, ns, nested) == [1, 3, 4, 5]
    flattened = CompositeFilter("AND", [CompositeFilter("AND", [ax, a1]), CompositeFilter("AND", [ax, b1])])
    assert ids(oracle, ns, flattened) == ids(embedded, ns, flattened) == [1]
    for refused in (
        CompositeFilter("OR", [ax, a1]),  # a disjunction without it
        CompositeFilter("OR", [CompositeFilter("AND", [ax, a1]), CompositeFilter("AND", [PropertyFilter(
            "__key__", "HAS_ANCESTOR", Key.of("P", "y", namespace=ns)), b1])]),  # another ancestor
        CompositeFilter("AND", [ax, CompositeFilter("OR", [a1, CompositeFilter("AND", [ax, b1])])]),  # twice in one
    ):
        assert ids(oracle, ns, refused) == ids(embedded, ns, refused) == "BadValueError", refused
    bare = CompositeFilter("OR", [ax, CompositeFilter("AND", [ax, a1])])
    assert ids(oracle, ns, bare) == [1, 4]  # the emulator drops the bare branch
    assert ids(embedded, ns, bare) == [1, 2, 3, 4, 5, 6]
    assert ids(oracle, ns, CompositeFilter("OR", [ax, ax])) == "GatewayError"
    assert ids(embedded, ns, CompositeFilter("OR", [ax, ax])) == [1, 2, 3, 4, 5, 6]


#: Lists of mixed types: Datastore orders integers before strings and
#: doubles after them, so a value can pass one filter and not another.
MIXED_LISTS = [[1.5, "y"], [11], ["a", 1.5, 30], [1.5, 11], [5, "x"], []]
MIXED_VALUES = [1.5, 11, 5, 30, "a", "x", "y", 20.0]


@st.composite
def same_property_filters(draw: Any) -> Any:
    """An equality (``=`` or ``IN``) and inequalities on one list property,
    in one AND, or split across an OR's branches and its parent."""
    equality = draw(st.one_of(
        st.builds(PropertyFilter, st.just("l"), st.just("="), st.sampled_from(MIXED_VALUES)),
        st.builds(PropertyFilter, st.just("l"), st.just("IN"),
                  st.lists(st.sampled_from(MIXED_VALUES), min_size=1, max_size=3, unique=True).map(tuple)),
    ))
    op = st.sampled_from(("<", "<=", ">", ">=", "!=", "NOT_IN"))
    inequalities = draw(st.lists(st.builds(lambda o, v: PropertyFilter("l", o, (v,) if o == "NOT_IN" else v),
                                           op, st.sampled_from(MIXED_VALUES)), min_size=1, max_size=2))
    if any(f.op in ("!=", "NOT_IN") for f in inequalities):
        inequalities = [f for f in inequalities if f.op not in ("!=", "NOT_IN")][:1] or inequalities[:1]
    other = PropertyFilter("a", "=", draw(st.integers(0, 2)))
    shape = draw(st.sampled_from(("and", "or inside", "or outside")))
    if shape == "and":
        return CompositeFilter("AND", [equality, *inequalities])
    if shape == "or inside":
        return CompositeFilter("AND", [*inequalities, CompositeFilter("OR", [equality, other])])
    return CompositeFilter("OR", [CompositeFilter("AND", [equality, *inequalities]), other])


def test_an_equality_outside_an_inequality_on_the_same_property_matches_nothing(firestore_emulator: Any) -> None:
    """An equality and an inequality on one property in one disjunction are
    one index range: a value the inequality excludes matches nothing, even
    where a list holds another value that meets the inequality (``l < 'x'
    AND l = 1.5`` finds nothing; ``[1.5, 'a']`` meets each filter apart).
    Generated, compared with the emulator as sets of keys (its repeated
    rows per element are a deliberate difference)."""
    ns = f"same-{uuid.uuid4().hex[:8]}"
    oracle = firestore_emulator.gateway(namespace=ns)
    embedded = open_gateway("memory://")
    entities = [RawEntity(Key.of(KIND, f"m{i}", namespace=ns), {"l": values, "a": i % 3}) for i, values in enumerate(MIXED_LISTS)]
    differences: list[str] = []
    seen = {"cases": 0, "hits": 0}

    @settings(max_examples=sized("GDS_DIFFERENTIAL_SAME_PROPERTY", 20, 150), derandomize=True,
              deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(same_property_filters())
    def check(flt: Any) -> None:
        theirs, ours = ids(oracle, ns, flt), ids(embedded, ns, flt)
        seen["cases"] += 1
        seen["hits"] += bool(ours) and not isinstance(ours, str)
        if (sorted(set(theirs), key=str) if isinstance(theirs, list) else theirs) != (
                sorted(set(ours), key=str) if isinstance(ours, list) else ours):
            differences.append(f"{flt}: emulator {theirs}, embedded {ours}")

    try:
        for gateway in (oracle, embedded):
            gateway.commit([Upsert(e) for e in entities])
        check()
    finally:
        oracle.close()
        embedded.close()
    assert seen["hits"] > seen["cases"] // 4, seen  # filters that find something were reached
    assert not differences, f"{len(differences)} of {seen['cases']} differ:\n" + "\n".join(differences[:20])


def test_a_key_inequality_orders_a_projection_by_key(groups: Any) -> None:
    """A ``__key__`` inequality is an inequality: the rows come in key order
    before the projected properties' implied order."""
    oracle, embedded, ns = groups
    query = Query(KIND, ns, PropertyFilter("__key__", ">", Key.of("P", "x", KIND, 1, namespace=ns)), projection=("b",))
    theirs, ours = (tuple(e.key.flat_path[-1] for e in gw.run_query(query).entities) for gw in (oracle, embedded))
    assert theirs == ours == (2, 3, 4, 5, 6)  # by b it would be 2, 4, 6, 3, 5


def test_properties_of_entities_in_a_list_are_indexed_on_the_embedded_engine_only(firestore_emulator: Any) -> None:
    """``le = [{k: 2}, {k: 3}]``: the emulator answers ``le.k = 2`` with
    nothing; the embedded engine finds the entity (docs/gql.md, deliberate
    differences: production indexes them, as its 1,500-byte limit on their
    strings shows). An entity value excluded from the indexes keeps its own
    properties indexed on both."""
    ns = f"embedded-{uuid.uuid4().hex[:8]}"
    oracle = firestore_emulator.gateway(namespace=ns)
    embedded = open_gateway("memory://")
    entities = [
        RawEntity(Key.of(KIND, "listed", namespace=ns), {"le": [RawEntity(None, {"k": 2}), RawEntity(None, {"k": 3})]}),
        RawEntity(Key.of(KIND, "excluded", namespace=ns), {"e": RawEntity(None, {"k": 2})}, frozenset({"e"})),
    ]
    try:
        for gateway in (oracle, embedded):
            gateway.commit([Upsert(e) for e in entities])

        def names(gateway: Any, name: str) -> list[str]:
            return [e.key.name for e in gateway.run_query(Query(KIND, ns, PropertyFilter(name, "=", 2))).entities]

        assert names(oracle, "le.k") == [] and names(embedded, "le.k") == ["listed"]
        assert names(oracle, "e.k") == names(embedded, "e.k") == ["excluded"]
    finally:
        oracle.close()
        embedded.close()


# --- edge cases a fresh-eyes differential found, each compared with the emulator -------------

EDGE_GQL = [
    "SELECT * FROM K WHERE __key__ = KEY('K', 'a')",  # a quoted kind in KEY(): refused by the emulator
    "SELECT * FROM K WHERE __key__ = KEY(K, 'a')",
    "SELECT DISTINCT __key__ FROM K",
    "SELECT DISTINCT ON (__key__) * FROM K",
    "SELECT * FROM K WHERE t = DATETIME('2020-01-01T00:00:00-13:00')",
    "SELECT * FROM K WHERE t = DATETIME('2020-01-01T00:00:00-13:01')",
    "SELECT * FROM K WHERE t = DATETIME('2020-01-01T00:00:00+14:00')",
    "SELECT * FROM K WHERE t = DATETIME('2020-01-01T00:00:00+14:01')",
]


def edge_queries(ns: str) -> list[Query]:
    return [
        Query("K", ns, PropertyFilter("n", "IN", ())),
        Query("K", ns, CompositeFilter("AND", ())),
        Query("K", ns, CompositeFilter("OR", ())),
        Query("K", ns, PropertyFilter("__key__", "=", Key.of("K", namespace=ns))),
        Query("K", ns, order=(Order(""),)),
        Query("K", ns, projection=("n", "n")),
        Query("", ns),  # kindless, as the emulator reads an empty kind
        Query("K", ns, projection=("n",), keys_only=True),
        Query("K", ns, PropertyFilter("n", "=", 2**64)),
        Query("K", ns, PropertyFilter("n", "IN", 1)),
    ]


def test_edge_cases_answer_as_the_firestore_emulator(firestore_emulator: Any) -> None:
    from gds_counter import Store

    ns = f"edges-{uuid.uuid4().hex[:8]}"
    oracle = firestore_emulator.gateway(namespace=ns)
    embedded = open_gateway("memory://")
    entities = [RawEntity(Key.of("K", name, namespace=ns), {"n": i, "t": dt.datetime(2020, 1, 1, tzinfo=UTC)})
                for i, name in enumerate(("a", "b", "____"))]

    def answer(call: Any) -> Any:
        try:
            return sorted(e.key.flat_path for e in call())
        except (BadValueError, GatewayError, GQLError) as exc:
            return ("refused", type(exc).__name__)

    try:
        for gateway in (oracle, embedded):
            gateway.commit([Upsert(e) for e in entities])  # "____" is no reserved name: nothing between
        differences = []
        for gql in EDGE_GQL:
            theirs = answer(lambda: [e.get_key() and RawEntity(e.get_key()) for e in Store("K", oracle, namespace=ns).fetch_all(gql)])
            ours = answer(lambda: [e.get_key() and RawEntity(e.get_key()) for e in Store("K", embedded, namespace=ns).fetch_all(gql)])
            if outcome(theirs) != outcome(ours) or (outcome(theirs) != "refused" and theirs != ours):
                differences.append(f"{gql}: emulator {theirs}, embedded {ours}")
        for query in edge_queries(ns):
            theirs = answer(lambda: oracle.run_query(query).entities)
            ours = answer(lambda: embedded.run_query(query).entities)
            if outcome(theirs) != outcome(ours) or (outcome(theirs) != "refused" and theirs != ours):
                differences.append(f"{query}: emulator {theirs}, embedded {ours}")
        assert not differences, "\n".join(differences)
    finally:
        oracle.close()
        embedded.close()


def continued_from(gateway: Any, issuing: Query, other: Query) -> Any:
    """The key names ``other`` gives from ``issuing``'s end cursor, or "refused"."""
    cursor = gateway.run_query(issuing).end_cursor
    try:
        return [e.key.name for e in gateway.run_query(other.replace(start_cursor=cursor)).entities]
    except BadValueError:
        return "refused"


def test_a_cursor_used_on_another_query(firestore_emulator: Any) -> None:
    """From another kind or namespace, both refuse it. From the same kind
    in another order or projection, both continue from it as from a point
    (an ASC cursor on DESC used to give the first page again)."""
    ns = f"cursors-{uuid.uuid4().hex[:8]}"
    oracle = firestore_emulator.gateway(namespace=ns)
    embedded = open_gateway("memory://")
    entities = [RawEntity(Key.of(kind, f"k{i}", namespace=space), {"n": i})
                for kind in ("K", "J") for space in (ns, ns + "-b") for i in range(5)]
    ascending = Query("K", ns, order=(Order("n"),), limit=2)
    others = {
        "kind": Query("J", ns, order=(Order("n"),)),
        "namespace": Query("K", ns + "-b", order=(Order("n"),)),
        "descending": Query("K", ns, order=(Order("n", True),)),
        "projection": Query("K", ns, order=(Order("n"),), projection=("n",)),
    }

    def after(gateway: Any, query: Query) -> Any:
        return continued_from(gateway, ascending, query)

    try:
        for gateway in (oracle, embedded):
            gateway.commit([Upsert(e) for e in entities])
        assert after(oracle, others["kind"]) == after(embedded, others["kind"]) == "refused"
        assert after(oracle, others["namespace"]) == after(embedded, others["namespace"]) == "refused"
        assert after(oracle, others["descending"]) == after(embedded, others["descending"]) == ["k1", "k0"]
        assert after(oracle, others["projection"]) == after(embedded, others["projection"]) == ["k2", "k3", "k4"]
        same = ascending.replace(limit=None)  # the query that issued it: continues
        assert after(oracle, same) == after(embedded, same) == ["k2", "k3", "k4"]
    finally:
        oracle.close()
        embedded.close()


def test_a_distinct_cursor_continues_any_kind_or_namespace(firestore_emulator: Any) -> None:
    """A DISTINCT query's cursor holds its values and no key, so another
    kind or namespace continues from it as from any point (the emulator's
    answer, compared)."""
    ns = f"distinct-{uuid.uuid4().hex[:8]}"
    oracle = firestore_emulator.gateway(namespace=ns)
    embedded = open_gateway("memory://")
    entities = [RawEntity(Key.of(kind, f"k{i}", namespace=space), {"n": i % 3})
                for kind in ("K", "J") for space in (ns, ns + "-b") for i in range(6)]
    distinct = Query("K", ns, order=(Order("n"),), projection=("n",), distinct_on=("n",), limit=1)
    others = [Query("J", ns, order=(Order("n"),)), Query("K", ns + "-b", order=(Order("n"),)),
              Query("J", ns, order=(Order("n", True),))]

    def after(gateway: Any, query: Query) -> Any:
        return continued_from(gateway, distinct, query)

    try:
        for gateway in (oracle, embedded):
            gateway.commit([Upsert(e) for e in entities])
        for other in others:
            theirs = after(oracle, other)
            assert theirs != "refused" and after(embedded, other) == theirs, other
    finally:
        oracle.close()
        embedded.close()


#: How many (issuing query, other query) pairs the cursor differential draws.
CURSOR_PAIRS = sized("GDS_DIFFERENTIAL_CURSOR_PAIRS", 30, 300)


@st.composite
def cursor_queries(draw: Any, ns: str) -> Query:
    """A query of the data sets' kind that a cursor can be read by: sort
    orders (directions mixed, by key too), a filter on a scalar or on
    ``__key__`` now and then, whole entities, keys, a projection, DISTINCT
    or DISTINCT ON. (Not a list property's order: the emulator then repeats
    entities, docs/gql.md.)"""
    order = st.builds(Order, st.sampled_from(("a", "b", "n", "m", "__key__")), st.booleans())
    orders = tuple(draw(st.lists(order, max_size=3, unique_by=lambda o: o.name)))
    keys = key_pool(ns)
    flt = draw(st.one_of(st.none(), st.none(), st.builds(
        PropertyFilter, st.sampled_from(SCALARS), st.sampled_from(("=", "<", ">=")), st.sampled_from(value_pool(ns)),
    ), st.builds(PropertyFilter, st.just("__key__"), st.just("="), st.sampled_from(keys)), st.builds(
        PropertyFilter, st.just("__key__"), st.just("IN"), st.lists(st.sampled_from(keys), min_size=1, max_size=4, unique=True).map(tuple),
    )))
    mode = draw(st.sampled_from(("entity", "entity", "keys", "projection", "distinct", "distinct_on")))
    projection = tuple(draw(st.lists(st.sampled_from(SCALARS), min_size=1, max_size=2, unique=True))) if mode != "entity" and mode != "keys" else ()
    distinct_on = projection if mode == "distinct" else projection[:1] if mode == "distinct_on" else ()
    if distinct_on:  # DISTINCT ON's properties are sorted first
        orders = tuple(Order(n, False) for n in distinct_on if all(o.name != n for o in orders)) + orders
    return Query(KIND, ns, flt, orders, projection, distinct_on, keys_only=mode == "keys")


def test_a_cursor_continues_another_query_as_the_firestore_emulator(data_sets: Any, served: Any) -> None:
    """A cursor is a point: the end cursor of one query (after 1 to 6 rows),
    given as the start or the end cursor of another query of the same kind
    (another order, direction, filter or projection), gives the rows the
    emulator gives, or is refused where the emulator refuses it. Through
    ``gds-counter serve`` (``served``, its own cursors) every pair gives
    exactly the embedded engine's rows or refusal."""
    oracle, embedded, namespaces = data_sets
    differences: list[str] = []
    counts = {"pairs": 0, "rows": 0, "refused": 0, "emulator_failed": 0, "server_differs": 0}

    def continued(gateway: Any, issuing: Query, other: Query, as_end: bool) -> Any:
        try:
            cursor = gateway.run_query(issuing).end_cursor
            given = other.replace(end_cursor=cursor) if as_end else other.replace(start_cursor=cursor)
            return [(canon_entity(e, False), canon_entity(e, True)[1]) for e in gateway.run_query(given).entities]
        except (BadValueError, GatewayError) as exc:
            return ("refused", type(exc).__name__, str(exc)[:160])

    @settings(max_examples=CURSOR_PAIRS, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def check(data: Any) -> None:
        index = data.draw(st.integers(0, len(namespaces) - 1))
        ns = namespaces[index]
        issuing = data.draw(cursor_queries(ns)).replace(limit=data.draw(st.integers(1, 6)))
        other = data.draw(cursor_queries(ns))
        as_end = data.draw(st.booleans())
        counts["pairs"] += 1
        theirs = continued(oracle, issuing, other, as_end)
        ours = continued(embedded, issuing, other, as_end)
        through = continued(served, issuing, other, as_end)
        if through_the_server(through) != through_the_server(ours):
            counts["server_differs"] += 1
            differences.append(
                f"through the server: cursor of [{Spec(index, issuing, None).describe()}] as {'end' if as_end else 'start'}"
                f" of [{Spec(index, other, None).describe()}]\n    server:   {show(through)}\n    embedded: {show(ours)}"
            )
        if isinstance(theirs, tuple) and theirs[1] == "GatewayError":
            counts["emulator_failed"] += 1  # (UNKNOWN from the emulator itself: nothing to compare)
            return
        counts["refused" if isinstance(theirs, tuple) else "rows"] += 1
        if outcome(theirs) != outcome(ours):
            label = Spec(index, other, None).describe()
            differences.append(
                f"cursor of [{Spec(index, issuing, None).describe()}] as {'end' if as_end else 'start'} of [{label}]"
                f"\n    emulator: {show(theirs)}\n    embedded: {show(ours)}"
            )

    check()
    print(f"cursor differential: {counts}")
    assert counts["rows"] > CURSOR_PAIRS // 3 and counts["refused"] > 0, counts  # (both kinds of answer were reached)
    distinct = list(dict.fromkeys(differences))
    assert not distinct, f"{len(distinct)} of {counts['pairs']} pairs differ:\n" + "\n".join(distinct[:30])
