"""Datastore's limits on one entity, refused before anything is written on
every gateway. The figures are the Firestore emulator's (the oracle): each
case below was sent to it and refused, its neighbour accepted."""

from __future__ import annotations

import pytest

from gds_counter.errors import BadValueError
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity

GATEWAYS = ["memory", "sqlite", "datastore", "firestore"]

CASES = {
    # name: (refused entity properties, unindexed, accepted neighbour, message)
    "property name over 1500 bytes": ({"p" * 1501: 1}, (), {"p" * 1500: 1}, "property name"),
    "a blob over 1,048,487 bytes": ({"b": b"x" * 1_048_488}, ("b",), {"b": b"x" * 1_048_000}, "value limit"),
    "over 5,000 indexed values": ({"l": list(range(5001))}, (), {"l": list(range(5000))}, "indexed values"),
    "two large values over the entity limit": (
        {"a": b"x" * 600_000, "b": b"y" * 600_000}, ("a", "b"), {"a": b"x" * 500_000, "b": b"y" * 500_000}, "entity limit",
    ),
}


# The legacy Datastore emulator has no limit on indexed values (it took
# 20,001); production runs Firestore in Datastore mode, which has one.
PAIRS = [(g, c) for g in GATEWAYS for c in CASES if (g, c) != ("datastore", "over 5,000 indexed values")]


@pytest.mark.parametrize("gateway_name, case", PAIRS)
def test_an_entity_over_a_limit_is_refused_and_its_neighbour_stored(make_gateway, gateway_name, case):
    gateway = make_gateway(gateway_name)
    refused, unindexed, accepted, message = CASES[case]
    key = Key.of("Limits", "one", namespace=gateway.namespace)
    with pytest.raises(BadValueError, match=message):
        gateway.commit([Upsert(RawEntity(key, refused, frozenset(unindexed)))])
    assert gateway.lookup([key]) == [None]
    gateway.commit([Upsert(RawEntity(key, accepted, frozenset(unindexed)))])
    assert gateway.lookup([key])[0] is not None


@pytest.mark.parametrize("storage", ["memory", "sqlite"])
def test_deep_filters_answer_or_are_refused_with_a_gds_error(make_gateway, storage):
    """Twenty levels of alternating AND and OR are answered (SQLite's parser
    overflowed on them); deeper than 64 is refused by name; an ancestor
    that is not a key is refused (it crashed with a TypeError)."""
    from gds_counter.errors import BadValueError
    from gds_counter.gateway.keys import Key
    from gds_counter.gateway.mutations import Upsert
    from gds_counter.gateway.query import CompositeFilter, PropertyFilter, Query
    from gds_counter.gateway.values import RawEntity

    gateway = make_gateway(storage)
    gateway.commit([Upsert(RawEntity(Key.of("K", i), {"a": i % 3, "b": i})) for i in range(1, 30)])

    def nested(depth: int):
        node = PropertyFilter("a", "=", 1)
        for i in range(depth):
            node = CompositeFilter("AND" if i % 2 else "OR", [node, PropertyFilter("b", "=", i)])
        return node

    def holds(props: dict, node) -> bool:  # scalar properties only: the plain meaning of the filter
        if isinstance(node, PropertyFilter):
            return props.get(node.name) == node.value
        combine = all if node.op == "AND" else any
        return combine(holds(props, child) for child in node.filters)

    stored = {i: {"a": i % 3, "b": i} for i in range(1, 30)}
    for depth in (4, 5, 20, 21):
        found = sorted(e.key.id for e in gateway.run_query(Query("K", filter=nested(depth))).entities)
        assert found == [i for i, props in stored.items() if holds(props, nested(depth))], depth
    with pytest.raises(BadValueError, match="nested more than 64"):
        gateway.run_query(Query("K", filter=nested(70)))
    for value in ([], {}, b"x", 5):
        with pytest.raises(BadValueError, match="HAS_ANCESTOR needs a Key"):
            gateway.run_query(Query("K", filter=PropertyFilter("__key__", "HAS_ANCESTOR", value)))
