"""Datastore's property transforms, as the Firestore emulator in Datastore
mode applies them (tests/conformance/test_transforms.py holds the engine to
it): each takes the value stored at its path (``MISSING`` if none) and gives
the value to store there and the transform's result."""

from __future__ import annotations

import datetime as _dt
import math
from typing import Any

from gds_counter._checks import INT64_MAX, INT64_MIN
from gds_counter.gateway import _paths as paths
from gds_counter.gateway.mutations import (
    AppendMissingElements,
    Increment,
    Maximum,
    Minimum,
    RemoveAllFromArray,
    RequestTime,
    Transform,
)
from gds_counter.gateway.values import RawEntity

__all__ = ["incremented", "request_time", "same", "transformed"]


def incremented(current: Any, amount: int | float) -> int | float:
    """Datastore's increment transform, as the Firestore emulator applies
    it: integers add and saturate at the 64-bit bounds (never an error, so
    a result at a bound may have been cut short); a double on either side
    makes a double (1.5 + 1 is 2.5); anything else stored (nothing, null, a
    string, a bool, a list, a timestamp) is replaced by the amount."""
    if not _is_number(current):
        return amount
    if isinstance(current, float) or isinstance(amount, float):
        return float(current) + float(amount)
    return min(max(current + amount, INT64_MIN), INT64_MAX)


def request_time(now: float) -> _dt.datetime:
    """The value of a commit's REQUEST_TIME transforms: the engine's commit
    clock, to the microsecond Datastore keeps (the emulator's clock has
    milliseconds)."""
    return _dt.datetime.fromtimestamp(now, _dt.timezone.utc)


def transformed(transform: Transform, current: Any, when: _dt.datetime) -> tuple[Any, Any]:
    """(the value to store, the transform's result) for ``transform`` on
    ``current`` (``paths.MISSING`` when nothing is stored); ``when``: the
    commit's request time."""
    if current is paths.MISSING:
        current = None
    if isinstance(transform, Increment):
        total = incremented(current, transform.amount)
        return total, total
    if isinstance(transform, (Maximum, Minimum)):
        chosen = _extreme(current, transform.value, larger=isinstance(transform, Maximum))
        return chosen, chosen
    if isinstance(transform, RequestTime):
        return when, when
    elements = list(current) if isinstance(current, list) else []
    if isinstance(transform, AppendMissingElements):
        for element in transform.elements:
            if not any(same(element, held) for held in elements):
                elements.append(element)
    else:
        assert isinstance(transform, RemoveAllFromArray)
        elements = [held for held in elements if not any(same(held, gone) for gone in transform.elements)]
    return elements, None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _extreme(current: Any, value: int | float, *, larger: bool) -> int | float:
    """Maximum's (``larger``) or minimum's choice: NaN on either side wins,
    a tie keeps the stored value, a stored non-number gives way."""
    if not _is_number(current):
        return value
    if isinstance(current, float) and math.isnan(current):
        return current
    if isinstance(value, float) and math.isnan(value):
        return value
    if current == value:
        return current
    beats = value > current if larger else value < current
    return value if beats else current


def same(a: Any, b: Any) -> bool:
    """The array transforms' equality: numbers by value whatever their type
    (NaN equals NaN), entity values by their properties (not their index
    flags), arrays element by element; otherwise same type and equal."""
    if _is_number(a) and _is_number(b):
        return bool(a == b) or (a != a and b != b)  # (NaN is the one value unequal to itself)
    if type(a) is not type(b):
        return False
    if isinstance(a, RawEntity):
        return (
            a.key == b.key and a.properties.keys() == b.properties.keys()
            and all(same(value, b.properties[name]) for name, value in a.properties.items())
        )
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return bool(a == b)
