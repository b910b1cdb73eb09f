"""Datastore's increment transform on every kind of stored value, with the
Firestore emulator as the oracle: the embedded engine must store and
return what the emulator does, type included.

Measured there: integers add and saturate at the 64-bit bounds (no error);
a double on either side makes a double (1.5 + 1 is 2.5); any other stored
value (none, null, a bool, a string, bytes, a list, a timestamp, a key, a
geopoint) is replaced by the amount. ``Store.increment`` returns the value
as stored (it returned ``int(2.5)``).
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from typing import Any

import pytest

from gds_counter import Store
from gds_counter.gateway import open_gateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Upsert
from gds_counter.gateway.values import Geopoint, RawEntity

MISSING = object()

STORED: list[Any] = [
    MISSING, None, True, False, "x", "", b"x", 0, 5, -7, 1.5, -0.0, math.inf, -math.inf, math.nan,
    2**63 - 2, -(2**63) + 2, 2**63 - 1, [1, 2], [], dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc),
    Key.of("K", "a"), Geopoint(1.0, 2.0), 1e308,
]
AMOUNTS: list[int | float] = [1, -1, 5, -5, 0, 0.25, -1.5, 2**62, 1e308]


def canon(value: Any) -> Any:
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else repr(value))
    return (type(value).__name__, value)


def increments(gateway: Any, namespace: str) -> list[Any]:
    """Each stored value incremented by each amount: (result, stored)."""
    out = []
    for i, stored in enumerate(STORED):
        for j, amount in enumerate(AMOUNTS):
            key = Key.of("Inc", f"s{i}-a{j}", namespace=namespace)
            gateway.commit([Upsert(RawEntity(key, {} if stored is MISSING else {"c": stored}))])
            result = gateway.commit([Upsert(RawEntity(key), property_mask=(), transforms=(Increment("c", amount),))])
            [found] = gateway.lookup([key])
            value = result.mutation_results[0].transform_results[0]
            out.append((repr(stored), amount, canon(value), canon(found.properties["c"])))
    return out


def on_both(firestore_emulator: Any, run: Any) -> tuple[list[Any], list[Any]]:
    """``run(gateway, namespace)`` on the emulator and on the embedded
    engine, each in a fresh namespace of the same name: (theirs, ours)."""
    namespace = f"inc-{uuid.uuid4().hex[:8]}"
    oracle = firestore_emulator.gateway(namespace=namespace)
    embedded = open_gateway("memory://")
    try:
        return run(oracle, namespace), run(embedded, namespace)
    finally:
        oracle.close()
        embedded.close()


def test_the_embedded_engine_increments_every_stored_value_as_the_firestore_emulator(firestore_emulator):
    theirs, ours = on_both(firestore_emulator, increments)
    differences = [f"{t[:2]}: emulator {t[2:]}, embedded {o[2:]}" for t, o in zip(theirs, ours) if t != o]
    assert not differences, "\n".join(differences)
    assert len(theirs) == len(STORED) * len(AMOUNTS)


def on_native(native: Any, run: Any) -> tuple[list[Any], list[Any]]:
    """``run`` on the Firestore gateway (native mode, no namespaces) and on
    the embedded engine, which the tests above hold to the Datastore-mode
    emulator: (Firestore native, embedded)."""
    embedded = open_gateway("memory://")
    try:
        return run(native, ""), run(embedded, "")
    finally:
        embedded.close()


#: The Firestore gateway, and ``AsyncFirestoreGateway`` (the asyncio face's,
#: on google-cloud-firestore's async client) behind the test bridge.
FIRESTORE_NATIVE = ("firestore-native", "firestore-native+aio")


@pytest.mark.parametrize("name", FIRESTORE_NATIVE)
def test_firestore_native_increments_every_stored_value_as_datastore_does(name, make_gateway):
    """Firestore's increment transform is Datastore's, value for value
    (saturating integers, doubles, any other value replaced)."""
    theirs, ours = on_native(make_gateway(name), increments)
    differences = [f"{t[:2]}: firestore native {t[2:]}, embedded {o[2:]}" for t, o in zip(theirs, ours) if t != o]
    assert not differences, "\n".join(differences)
    assert len(theirs) == len(STORED) * len(AMOUNTS)


@pytest.mark.parametrize("name", FIRESTORE_NATIVE)
def test_firestore_native_masks_and_increments_of_paths_as_datastore_does(name, make_gateway):
    theirs, ours = on_native(make_gateway(name), masked_writes)
    differences = [f"{t[:2]}: firestore native {t[2]}, embedded {o[2]}" for t, o in zip(theirs, ours) if t != o]
    assert not differences, "\n".join(differences)


@pytest.mark.parametrize("gateway_name", ["memory", "firestore", "serve", *FIRESTORE_NATIVE])
def test_store_increment_returns_the_value_stored_a_double_too(make_gateway, gateway_name):
    store = Store("Item", make_gateway(gateway_name))
    item = store.create_entity({"price": 1.5})
    item.set_key_name("i")
    store.upsert(item)
    assert store.increment(item, "price", 1) == 2.5
    assert store.fetch_by_name("i").price == 2.5
    assert store.increment(item, "price", 0.25) == 2.75


def masked_writes(gateway: Any, namespace: str) -> list[Any]:
    """Property masks and increments that name a path into an entity value
    (``e.x``), or a name in backticks, on a fresh entity each: what is stored."""
    E = RawEntity  # noqa: N806  (an embedded entity, as written)
    start = {"a": 1, "b": 2, "e": E(None, {"x": 1, "y": 2, "k": 5})}
    cases: list[tuple[dict[str, Any], tuple[str, ...], tuple[Increment, ...]]] = [
        ({"e": E(None, {"x": 9})}, ("e.x",), ()),  # sets e.x, keeps e.y
        ({}, ("e.x",), ()),  # removes e.x
        ({}, ("`a`",), ()),  # a backticked name is the name
        ({"e": E(None, {"z": 3})}, ("e.z",), ()),  # adds e.z
        ({}, (), (Increment("e.k", 1),)),  # adds to the nested value
        ({}, (), (Increment("e.new", 2),)),  # a nested value that was not there
        ({}, (), (Increment("f.g", 1),)),  # an entity value that was not there
        ({"a": 7}, ("a", "e.y"), (Increment("e.x", 0.5),)),
    ]
    out = []
    for i, (props, mask, transforms) in enumerate(cases):
        key = Key.of("Mask", f"m{i}", namespace=namespace)
        gateway.commit([Upsert(RawEntity(key, start))])
        gateway.commit([Upsert(RawEntity(key, props), property_mask=mask, transforms=transforms)])
        [found] = gateway.lookup([key])
        out.append((mask, transforms, canon_properties(found.properties)))
    return out


def canon_properties(properties: Any) -> Any:
    return sorted(
        (name, canon_properties(value.properties) if isinstance(value, RawEntity) else canon(value))
        for name, value in properties.items()
    )


def test_masks_and_increments_of_paths_into_entity_values_as_the_firestore_emulator(firestore_emulator):
    theirs, ours = on_both(firestore_emulator, masked_writes)
    assert len(theirs) == 8
    differences = [f"{t[:2]}: emulator {t[2]}, embedded {o[2]}" for t, o in zip(theirs, ours) if t != o]
    assert not differences, "\n".join(differences)


@pytest.mark.parametrize("gateway_name", ["memory", "firestore", "serve", *FIRESTORE_NATIVE])
def test_store_increment_of_a_field_whose_name_is_no_plain_path_member(make_gateway, gateway_name):
    """A field is a name, not a path: ``Store.increment`` quotes the names it
    puts in the mask and the transform (``mutations.path_of``). Bare, the
    emulator refused ``a-b`` (INVALID_ARGUMENT), and ``a.b`` named ``b``
    inside an entity value ``a`` rather than the field ``a.b``."""
    store = Store("Item", make_gateway(gateway_name))
    item = store.create_entity({"a-b": 1, "a.b": 10, "n": 0})
    item.set_key_name("i")
    store.upsert(item)
    assert store.increment(item, "a-b", 2) == 3
    assert store.increment(item, "a.b", 5) == 15
    assert store.increment(item, "n", 1) == 1
    assert store.fetch_by_name("i").get_data() == {"a-b": 3, "a.b": 15, "n": 1}
