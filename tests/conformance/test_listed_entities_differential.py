"""Filters and orders on a property of the entities inside a list value
(``le = [{k: 1}, {k: 2}]``, queried as ``le.k``), generated, against the
Firestore emulator.

The emulator indexes no property of an entity inside a list, so it answers
every such filter with nothing; production indexes them (docs/gql.md,
deliberate differences), and so does the embedded engine: ``le.k`` holds one
index value per element, as a list property holding those values would.
That is what is compared: the emulator is given the same entities with
``le`` written as that list property (``lk``: each element's indexed ``k``),
and answers the query with ``lk`` for ``le.k``; the embedded engine, and
``gds-counter serve`` over it, hold ``le`` itself and answer ``le.k``. The
keys must come back the same, in order, and the same queries be refused.

Each element holds ``k`` (any value type of the pool, null included), now
and then excluded from the indexes (no index value), and the whole list is
now and then excluded (none of its elements' values). A list property's
index read without projecting it (an inequality on it, or an order by it)
gives the emulator a row per element: ``first_rows`` keeps each entity
once, as the other list rows of ``test_differential.py`` are compared, and
such queries get no LIMIT, OFFSET or pages.
"""

from __future__ import annotations

import random
import uuid
from typing import Any, Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sizes import sized
from test_differential import first_rows, inequality_names, outcome, value_pool  # (this folder is on sys.path)

from gds_counter.errors import BadValueError, GatewayError
from gds_counter.gateway import open_gateway
from gds_counter.gateway.base import iterate_batches
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.query import CompositeFilter, Order, PropertyFilter, Query
from gds_counter.gateway.values import RawEntity

KIND = "LE"
ENTITIES = 40
QUERIES = sized("GDS_DIFFERENTIAL_LISTED_ENTITIES", 100, 300)
#: The property of the listed entities, and the list property the emulator
#: is given in its place.
LISTED, FLAT = "le.k", "lk"


def data_set(ns: str) -> tuple[list[RawEntity], list[RawEntity]]:
    """(as the engine stores them, as the emulator is given them)."""
    rng = random.Random(20261128)
    pool = [v for v in value_pool(ns)][:20] + [0, 1, 2, 3]
    engine, emulator = [], []
    for i in range(ENTITIES):
        key = Key.of(KIND, f"e{i:02d}", namespace=ns)
        props: dict[str, Any] = {"a": rng.choice((0, 1, 2))}
        flat_props = dict(props)
        unindexed: set[str] = set()
        if rng.random() < 0.85:
            elements, indexed = [], []
            for _ in range(rng.choice((0, 1, 2, 2, 3))):
                k = rng.choice(pool)
                excluded = rng.random() < 0.15
                elements.append(RawEntity(None, {"k": k}, frozenset({"k"}) if excluded else frozenset()))
                if not excluded:
                    indexed.append(k)
            props["le"] = elements
            if rng.random() < 0.1:
                unindexed.add("le")  # the list excluded: none of its elements' values is indexed
            elif indexed:
                flat_props[FLAT] = indexed
        engine.append(RawEntity(key, props, frozenset(unindexed)))
        emulator.append(RawEntity(key, flat_props))
    return engine, emulator


def on(name: str, flt: Any) -> Any:
    """``flt`` with ``le.k`` named ``name``."""
    if isinstance(flt, PropertyFilter):
        return PropertyFilter(name, flt.op, flt.value) if flt.name == LISTED else flt
    if isinstance(flt, CompositeFilter):
        return CompositeFilter(flt.op, tuple(on(name, child) for child in flt.filters))
    return flt


def for_emulator(query: Query) -> Query:
    return query.replace(
        filter=on(FLAT, query.filter),
        order=tuple(Order(FLAT, o.descending) if o.name == LISTED else o for o in query.order),
    )


@st.composite
def queries(draw: Any, ns: str) -> tuple[Query, int | None]:
    pool = [v for v in value_pool(ns)][:20] + [0, 1, 2, 3]
    value = st.sampled_from(pool)
    listed = st.one_of(
        st.builds(PropertyFilter, st.just(LISTED), st.sampled_from(("=", "<", "<=", ">", ">=", "!=")), value),
        st.builds(PropertyFilter, st.just(LISTED), st.sampled_from(("IN", "NOT_IN")), st.lists(value, min_size=1, max_size=4).map(tuple)),
    )
    other = st.builds(PropertyFilter, st.just("a"), st.sampled_from(("=", "<", ">=")), st.sampled_from((0, 1, 2)))
    leaf = st.one_of(listed, listed, other)
    flt = draw(st.one_of(
        st.none(), listed, listed,
        st.builds(CompositeFilter, st.sampled_from(("AND", "OR")), st.lists(leaf, min_size=2, max_size=3).map(tuple)),
    ))
    orders = tuple(draw(st.lists(st.builds(Order, st.sampled_from((LISTED, "a", "__key__")), st.booleans()),
                                 max_size=2, unique_by=lambda o: o.name)))
    if flt is None and not any(o.name == LISTED for o in orders):
        flt = draw(listed)  # every query reads the listed entities' index
    keys_only = draw(st.booleans())
    limit = draw(st.one_of(st.none(), st.integers(1, 6)))
    offset = draw(st.sampled_from((0, 0, 2)))
    page = draw(st.one_of(st.none(), st.none(), st.integers(1, 4)))
    if any(o.name == LISTED for o in orders) or LISTED in inequality_names(flt):
        limit, offset, page = None, 0, None  # the emulator's rows per element would shift them
    return Query(KIND, ns, flt, orders, keys_only=keys_only, limit=limit, offset=offset), page


def keys(gateway: Any, query: Query, page: int | None) -> Any:
    """The keys in order (a row each), or ('refused', class)."""
    try:
        if page is None:
            entities = [e for batch in iterate_batches(gateway, query) for e in batch.entities]
        else:
            entities, current = [], query.replace(limit=page)
            for _ in range(200):
                result = gateway.run_query(current)
                entities.extend(result.entities)
                if not result.entities or result.end_cursor is None or not result.more_results:
                    break
                current = query.replace(limit=page, offset=0, start_cursor=result.end_cursor)
        return [(e.key.flat_path,) for e in entities]
    except (BadValueError, GatewayError) as exc:
        return ("refused", type(exc).__name__)


@pytest.fixture(scope="module")
def sides(firestore_emulator: Any, serve_server: Any) -> Iterator[tuple[Any, Any, Any, str]]:
    """(emulator, embedded engine, serve) holding the data set in one namespace."""
    from gds_counter.gateway.datastore import DatastoreGateway

    ns = f"listed-{uuid.uuid4().hex[:8]}"
    engine_entities, emulator_entities = data_set(ns)
    oracle = firestore_emulator.gateway(namespace=ns)
    embedded = open_gateway("memory://")
    served = DatastoreGateway("gds-counter-serve", namespace=ns, emulator_host=serve_server.emulator_host)
    oracle.commit([Upsert(e) for e in emulator_entities])
    for gateway in (embedded, served):
        gateway.commit([Upsert(e) for e in engine_entities])
    try:
        yield oracle, embedded, served, ns
    finally:
        for gateway in (oracle, embedded, served):
            gateway.close()


def test_listed_entities_properties_are_answered_as_a_list_property_on_the_emulator(sides: Any) -> None:
    """Generated filters (every operator, in AND and OR beside another
    property) and orders on ``le.k``: the engine's keys, and the server's,
    are the emulator's for ``lk``, entity for entity and in order."""
    oracle, embedded, served, ns = sides
    differences: list[str] = []
    counts = {"cases": 0, "rows": 0, "nonempty": 0, "refused": 0}

    @settings(max_examples=QUERIES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(queries(ns))
    def check(drawn: tuple[Query, int | None]) -> None:
        query, page = drawn
        counts["cases"] += 1
        theirs = keys(oracle, for_emulator(query), page)
        ours, through = keys(embedded, query, page), keys(served, query, page)
        if outcome(theirs) == "refused":
            counts["refused"] += 1
            same = outcome(ours) == outcome(through) == "refused"
        else:
            counts["rows"] += 1
            counts["nonempty"] += bool(theirs)
            theirs = first_rows(theirs)
            same = ours == theirs == through
        if not same:
            differences.append(f"{query!r} pages of {page}\n    emulator (lk): {theirs}\n    embedded: {ours}\n    served: {through}")

    check()
    print(f"listed entities: {counts}")
    assert counts["cases"] >= QUERIES and counts["nonempty"] > QUERIES // 3, counts
    distinct = list(dict.fromkeys(differences))
    assert not distinct, f"{len(distinct)} of {counts['cases']} differ:\n" + "\n".join(distinct[:20])


def test_the_emulator_indexes_no_property_of_a_listed_entity(sides: Any) -> None:
    """Why ``lk`` stands in for ``le.k`` on the emulator: asked for ``le.k``
    itself it finds nothing (docs/gql.md, deliberate differences), where the
    engine and the server find every entity whose list holds ``k = 1``."""
    oracle, embedded, served, ns = sides
    query = Query(KIND, ns, PropertyFilter(LISTED, "=", 1), keys_only=True)
    assert keys(oracle, query, None) == []
    found = keys(embedded, query, None)
    assert found and found == keys(served, query, None) == keys(oracle, for_emulator(query), None)
