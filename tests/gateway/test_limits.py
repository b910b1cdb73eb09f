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
