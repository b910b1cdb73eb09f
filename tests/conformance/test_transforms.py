"""Datastore's property transforms other than increment, on every gateway:
``Maximum``, ``Minimum``, ``AppendMissingElements``, ``RemoveAllFromArray``
and ``RequestTime`` (``set_to_server_value: REQUEST_TIME``).

The expected values were measured on the Firestore emulator in Datastore
mode (the oracle; test_transform_differential.py compares the embedded
engine with it on generated sequences): maximum and minimum compare
integers and doubles as numbers, a tie keeps the stored value, NaN on either
side makes NaN, a stored non-number is replaced; the array transforms
compare numbers by value (1 is 1.0), entity values by their properties,
other types never equal each other, and turn a stored non-array into an
array; their result is null. Every REQUEST_TIME of one commit is the same
time. Transforms of one mutation run in order, each on what the previous
left. The legacy Datastore emulator ignores transforms
(``capabilities.applies_transforms`` is False): those tests do not run there.
"""

from __future__ import annotations

import datetime as dt
import math
import uuid
from typing import Any

import pytest

from gds_counter.errors import BadValueError
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
from gds_counter.gateway.values import RawEntity


def transform(gateway: Any, stored: dict[str, Any], *transforms: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Store ``stored`` on a fresh key, then apply ``transforms`` to it
    (keeping every stored property): (their results, what is stored)."""
    key = Key.of("Tr", uuid.uuid4().hex, namespace=gateway.namespace)
    gateway.commit([Upsert(RawEntity(key, stored))])
    result = gateway.commit([Upsert(RawEntity(key), property_mask=(), transforms=transforms)])
    [found] = gateway.lookup([key])
    return result.mutation_results[0].transform_results, dict(found.properties)


def typed(value: Any) -> Any:
    """A value with its type, NaN comparable (1 and 1.0 differ here)."""
    if isinstance(value, list):
        return [typed(item) for item in value]
    if isinstance(value, RawEntity):
        return {name: typed(item) for name, item in value.properties.items()}
    if isinstance(value, float) and math.isnan(value):
        return "NaN"
    return (type(value).__name__, value)


@pytest.mark.parametrize(
    ("stored", "which", "value", "expected"),
    [
        (1, Maximum, 2.0, 2.0),  # the operand wins, as a double
        (3, Maximum, 2.0, 3),
        (1.5, Minimum, 1, 1),  # an integer beats a double
        (1, Maximum, 1.0, 1),  # a tie keeps what is stored, type included
        (-0.0, Maximum, 0, -0.0),  # -0.0 ties 0
        (2**53 + 1, Maximum, float(2**53), 2**53 + 1),  # compared exactly, not as doubles
        (math.nan, Minimum, 1, math.nan),
        (1, Maximum, math.nan, math.nan),
        ("s", Minimum, 5, 5),  # not a number: replaced
        ([1], Maximum, 5, 5),
        (None, Minimum, 0.5, 0.5),
    ],
)
def test_maximum_and_minimum_compare_numbers(transforming_gateway, stored, which, value, expected):
    results, found = transform(transforming_gateway, {"c": stored}, which("c", value))
    assert typed(results[0]) == typed(expected) and typed(found["c"]) == typed(expected)


def test_maximum_of_a_missing_property_sets_it(transforming_gateway):
    assert transform(transforming_gateway, {}, Maximum("c", 7)) == ((7,), {"c": 7})


@pytest.mark.parametrize(
    ("stored", "which", "elements", "expected"),
    [
        ([1, 2, 2, 3], AppendMissingElements, [2, 4, 4], [1, 2, 2, 3, 4]),  # duplicates held stay; given ones once
        ([1], AppendMissingElements, [1.0, 0.0], [1, 0.0]),  # 1.0 is 1
        (["1", True, b"1"], AppendMissingElements, [1, "1"], ["1", True, b"1", 1]),  # True and "1" are not 1
        ([math.nan], AppendMissingElements, [math.nan], [math.nan]),  # NaN is NaN
        (5, AppendMissingElements, [3, 1], [3, 1]),  # not an array: replaced
        (None, RemoveAllFromArray, [1], []),
        ([1, 1.0, "1", 2], RemoveAllFromArray, [1.0], ["1", 2]),
        ([0, -0.0, None], RemoveAllFromArray, [0.0, None], []),
        ([RawEntity(None, {"x": 1})], RemoveAllFromArray, [RawEntity(None, {"x": 1.0})], []),
        ([RawEntity(None, {"x": 1})], AppendMissingElements, [RawEntity(None, {"x": 2})],
         [RawEntity(None, {"x": 1}), RawEntity(None, {"x": 2})]),
    ],
)
def test_array_transforms_compare_elements_as_datastore_does(transforming_gateway, stored, which, elements, expected):
    results, found = transform(transforming_gateway, {"c": stored}, which("c", elements))
    assert results == (None,)
    assert typed(found["c"]) == typed(expected)


def test_array_transforms_on_a_missing_property_make_an_array(transforming_gateway):
    results, found = transform(transforming_gateway, {}, AppendMissingElements("a", [1, 1]), RemoveAllFromArray("r", [1]))
    assert results == (None, None) and found == {"a": [1], "r": []}


def test_every_request_time_of_a_commit_is_the_same_time_and_its_result(transforming_gateway):
    """Two properties of each of two entities set to the request time in one
    commit: one time, returned as each transform's result, and stored."""
    gateway = transforming_gateway
    keys = [Key.of("Tr", f"t{i}-{uuid.uuid4().hex}", namespace=gateway.namespace) for i in range(2)]
    before = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=5)
    result = gateway.commit([Upsert(RawEntity(key), transforms=(RequestTime("t"), RequestTime("u"))) for key in keys])
    after = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=5)
    times = {value for done in result.mutation_results for value in done.transform_results}
    assert len(times) == 1
    [when] = times
    assert isinstance(when, dt.datetime) and before < when < after  # (a clock of the server's; seconds apart at most)
    assert [found.properties for found in gateway.lookup(keys)] == [{"t": when, "u": when}] * 2


def test_transforms_of_one_property_run_in_order_each_on_the_last_result(transforming_gateway):
    results, found = transform(
        transforming_gateway, {"c": 1},
        Increment("c", 5), Maximum("c", 3), Minimum("c", 4.5), AppendMissingElements("c", [2]),
        RemoveAllFromArray("c", [7]), Increment("c", 1),
    )
    assert results == (6, 6, 4.5, None, None, 1) and found == {"c": 1}


def test_transforms_in_a_transaction_apply_at_its_commit(transforming_gateway):
    gateway = transforming_gateway
    key = Key.of("Tr", uuid.uuid4().hex, namespace=gateway.namespace)
    gateway.commit([Upsert(RawEntity(key, {"c": [1], "n": 5}))])
    txn = gateway.begin_transaction()
    [read] = gateway.lookup([key], transaction=txn)
    assert read is not None
    result = gateway.commit(
        [Upsert(RawEntity(key), property_mask=(), transforms=(AppendMissingElements("c", [1, 2]), Minimum("n", 2)))],
        transaction=txn,
    )
    assert result.mutation_results[0].transform_results == (None, 2)
    assert gateway.lookup([key])[0].properties == {"c": [1, 2], "n": 2}


def test_a_transform_of_a_path_reaches_into_an_entity_value_and_makes_one_where_none_is(transforming_gateway):
    nested = RawEntity(None, {"b": 1, "z": "q"})
    results, found = transform(
        transforming_gateway, {"a": nested, "s": 3}, Maximum("a.b", 5), AppendMissingElements("n.m", [1]), Minimum("s.t", 2)
    )
    assert results == (5, None, 2)
    assert typed(found) == typed({"a": RawEntity(None, {"b": 5, "z": "q"}), "n": RawEntity(None, {"m": [1]}),
                                  "s": RawEntity(None, {"t": 2})})


def test_the_entity_written_comes_first_then_its_transforms(transforming_gateway):
    """Without a mask the entity replaces what was stored, then the
    transforms run on it; with one, on the stored entity with the mask's
    properties written."""
    gateway = transforming_gateway
    key = Key.of("Tr", uuid.uuid4().hex, namespace=gateway.namespace)
    gateway.commit([Upsert(RawEntity(key, {"c": 10, "d": [1]}))])
    done = gateway.commit([Upsert(RawEntity(key, {"c": 3}), transforms=(Maximum("c", 5), AppendMissingElements("d", [2])))])
    assert done.mutation_results[0].transform_results == (5, None)
    assert gateway.lookup([key])[0].properties == {"c": 5, "d": [2]}
    gateway.commit([Upsert(RawEntity(key, {"c": 20}), property_mask=("c",), transforms=(Maximum("c", 9),))])
    assert gateway.lookup([key])[0].properties == {"c": 20, "d": [2]}


@pytest.mark.parametrize(
    ("transforms", "message"),
    [
        ((Maximum("a.b", 1), Maximum("a", 2)), r"cannot transform 'a.b' and 'a', a property and one inside it"),
        ((Minimum("c", "s"),), r"the minimum of 'c' needs an integer or a double, got 's'"),
        ((Maximum("c", True),), r"the maximum of 'c' needs an integer or a double, got True"),
        ((AppendMissingElements("c", [[1]]),), r"property 'c': an array transform's element may not be an array"),
        ((RemoveAllFromArray("c", [dt.datetime(2020, 1, 1)]),), r"property 'c': naive datetime"),
        ((RequestTime("__key__"),), r"member '__key__' is reserved"),
        ((RequestTime(""),), r"an empty property path member"),
    ],
)
def test_bad_transforms_are_refused_before_anything_is_sent(gateway, transforms, message):
    key = Key.of("Tr", uuid.uuid4().hex, namespace=gateway.namespace)
    with pytest.raises(BadValueError, match=message):
        gateway.commit([Upsert(RawEntity(key, {"keep": 1}), transforms=transforms)])
    assert gateway.lookup([key]) == [None]
