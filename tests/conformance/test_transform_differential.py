"""The Firestore emulator in Datastore mode is the oracle for property
transforms: the same generated commits through the embedded engine and
through the emulator must return the same transform results and leave the
same stored entities.

Each example is one commit of 1 to 3 upserts (in a transaction or not) on
entities written just before, each upsert with or without a property mask
and with 1 to 4 transforms drawn from all six (increment, maximum, minimum,
append_missing_elements, remove_all_from_array, REQUEST_TIME) on top-level
properties and on paths into entity values (``e.x``, and ``f.y`` where ``f``
is missing or not an entity), with operands and stored values from a pool
that mixes integers and doubles of equal value, NaN, -0.0, the 64-bit
bounds, strings, bytes, booleans, keys, timestamps, entity values and
arrays of them. Values are compared with their types (1 is not 1.0 here).

The Firestore gateway (native mode) is held to the same engine: its
``FieldTransform`` has the same six transforms.

Not compared: the time REQUEST_TIME gives (each side's own clock; it must
be one time per commit on each side), and index flags (the emulator indexes
what a transform wrote even where the entity said not to; the embedded
engine keeps the flag as sent: ``Capabilities.indexes_transformed``).
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sizes import sized

from gds_counter.gateway import open_gateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import (
    AppendMissingElements,
    Increment,
    Maximum,
    Minimum,
    RemoveAllFromArray,
    RequestTime,
    Upsert,
)
from gds_counter.gateway.values import Geopoint, RawEntity

EXAMPLES = sized("GDS_TRANSFORM_EXAMPLES", 50, 300)
UTC = dt.timezone.utc

NUMBERS: list[int | float] = [0, 1, -1, 2, 1.0, 0.0, -0.0, 1.5, -2.5, math.nan, math.inf, -math.inf, 2**53 + 1,
                              float(2**53), 2**63 - 1, -(2**63), 1e308]
SCALARS: list[Any] = [
    *NUMBERS, None, True, False, "a", "1", "", b"a", dt.datetime(2020, 1, 1, tzinfo=UTC),
    Key.of("K", 1), Key.of("K", "a"), Geopoint(1.0, 2.0),
    RawEntity(None, {"x": 1}), RawEntity(None, {"x": 1.0}), RawEntity(None, {"x": "a", "y": [1, 2]}),
]
#: Paths transforms name: top-level properties, a property of the entity
#: value "e", and one of "f" (stored as something else, or not at all).
PATHS = ("c", "d", "e.x", "f.y")

elements = st.lists(st.sampled_from(SCALARS), max_size=4)
stored_values = st.one_of(st.sampled_from(SCALARS), elements)
transforms = st.one_of(
    st.builds(Increment, st.sampled_from(PATHS), st.sampled_from(NUMBERS)),
    st.builds(Maximum, st.sampled_from(PATHS), st.sampled_from(NUMBERS)),
    st.builds(Minimum, st.sampled_from(PATHS), st.sampled_from(NUMBERS)),
    st.builds(AppendMissingElements, st.sampled_from(PATHS), elements),
    st.builds(RemoveAllFromArray, st.sampled_from(PATHS), elements),
    st.builds(RequestTime, st.sampled_from(PATHS)),
)


@st.composite
def stored_entities(draw: Any) -> dict[str, Any]:
    """What is stored before the transforms: any of c, d, e (an entity
    value, maybe holding x) and f (anything)."""
    properties = {name: draw(stored_values) for name in ("c", "d", "f") if draw(st.booleans())}
    if draw(st.booleans()):
        properties["e"] = RawEntity(None, {"x": draw(stored_values)} if draw(st.booleans()) else {"z": 1})
    return properties


@st.composite
def upserts(draw: Any) -> tuple[dict[str, Any], dict[str, Any], tuple[str, ...] | None, list[Any]]:
    """(stored before, the entity written, its mask, its transforms)."""
    written = {name: draw(stored_values) for name in ("c", "d") if draw(st.booleans())}
    mask = draw(st.sampled_from([None, (), ("c",), ("d", "e.x")]))
    return draw(stored_entities()), written, mask, draw(st.lists(transforms, min_size=1, max_size=4))


commits = st.tuples(st.booleans(), st.lists(upserts(), min_size=1, max_size=3))


def typed(value: Any, now: set[Any], start: dt.datetime) -> Any:
    """A value with its type, NaN comparable; a time from this test's run
    (only REQUEST_TIME writes one) is "NOW", and collected in ``now``."""
    if isinstance(value, list):
        return [typed(item, now, start) for item in value]
    if isinstance(value, RawEntity):
        return sorted((name, typed(item, now, start)) for name, item in value.properties.items())
    if isinstance(value, float) and math.isnan(value):
        return ("float", "NaN")
    if isinstance(value, dt.datetime) and value >= start:
        now.add(value)
        return "NOW"
    return (type(value).__name__, repr(value))


def run(gateway: Any, namespace: str, commit: Any, start: dt.datetime) -> Any:
    """``commit`` on ``gateway``: each upsert's results and the entity
    stored after it, typed; and how many request times the commit gave."""
    transactional, items = commit
    keys = [Key.of("Tx", uuid.uuid4().hex, namespace=namespace) for _ in items]
    gateway.commit([Upsert(RawEntity(key, stored)) for key, (stored, _, _, _) in zip(keys, items)])
    token = gateway.begin_transaction() if transactional else None
    result = gateway.commit(
        [Upsert(RawEntity(key, written), property_mask=mask, transforms=tuple(transforms))
         for key, (_, written, mask, transforms) in zip(keys, items)],
        transaction=token,
    )
    now: set[Any] = set()
    results = [typed(list(done.transform_results), now, start) for done in result.mutation_results]
    found = [typed(entity, now, start) for entity in gateway.lookup(keys)]
    return results, found, len(now)


@pytest.mark.parametrize("oracle_name", ["firestore", "firestore-native"])
def test_embedded_applies_generated_transforms_as_the_firestore_emulator(make_gateway, oracle_name) -> None:
    """On the Datastore-mode emulator through the Datastore gateway, and on
    the native-mode one through the Firestore gateway, whose FieldTransforms
    are the same six."""
    oracle = make_gateway(oracle_name)
    namespace = oracle.namespace if oracle_name == "firestore" else ""
    embedded = open_gateway("memory://")
    start = dt.datetime.now(UTC) - dt.timedelta(minutes=5)
    differences: list[str] = []
    cases = []

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(commits)
    def check(commit: Any) -> None:
        cases.append(commit)
        theirs, ours = run(oracle, namespace, commit, start), run(embedded, namespace, commit, start)
        assert theirs[2] <= 1 and ours[2] <= 1, "more than one REQUEST_TIME in one commit"
        if theirs != ours:
            differences.append(f"{commit}:\n  emulator {theirs[:2]}\n  embedded {ours[:2]}")

    try:
        check()
    finally:
        embedded.close()
    assert len(cases) >= EXAMPLES
    assert not differences, f"{len(differences)} of {len(cases)} commits differ:\n" + "\n".join(differences[:10])
