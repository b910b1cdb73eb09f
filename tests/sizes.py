"""How big this test run is: the quick run (``pytest``) or the full one (``pytest --full``).

The one place a test asks. ``tests/conftest.py`` registers ``--full`` and
sets ``FULL`` before any test module is collected, so a module may size its
parametrize lists and hypothesis settings when it is imported.

* The quick run, the default, covers every area at small sizes: fewer
  generated examples, shorter soaks, fewer failure points, fewer
  increments. Tests marked ``full`` (too slow to have a small size) are
  deselected, and every test file still runs something
  (``tests/test_sizes.py`` checks both).
* The full run runs every test at its full size; ``.ci/run`` runs it. Its
  tests are a superset of the quick run's: a size only ever shrinks a
  number, never drops a test of its own.

An environment override (``GDS_SOAK_SECONDS=1800``, ``GDS_MODEL_EXAMPLES``,
...) wins over both sizes: ``sized(name, quick, full)``. A parametrized test
runs some of its cases in the quick run and all in the full run:
``params(values, quick)``.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Collection, Iterable, TypeVar

import pytest

__all__ = ["FULL", "full", "params", "size", "sized"]

#: Says "full run" to the processes a test starts (``spawn``, subprocesses):
#: they import this module afresh, and must size their share of a test as
#: the test sized the whole (3 processes x 8 threads x 100 increments, not x 10).
ENVIRONMENT = "GDS_TEST_FULL"

#: True in the full run (``pytest --full``); set once by ``tests/conftest.py``,
#: and in the processes its tests start, by ``ENVIRONMENT``.
FULL = os.environ.get(ENVIRONMENT) == "1"

T = TypeVar("T", int, float)


def full() -> bool:
    """Whether this is the full run."""
    return FULL


def size(quick: T, full: T) -> T:
    """``quick`` in the quick run, ``full`` (today's size) in the full run.
    The quick size is never the larger: a quick run is a smaller full run."""
    if quick > full:
        raise ValueError(f"a quick size ({quick}) larger than the full one ({full})")
    return full if FULL else quick


def sized(name: str, quick: T, full: T, kind: Callable[[str], T] | None = None) -> T:
    """The environment variable ``name`` when it is set (an override for a
    long or replayed run), else ``size(quick, full)``."""
    chosen = size(quick, full)
    value = os.environ.get(name, "").strip()
    if not value:
        return chosen
    return (kind or type(chosen))(value)


def params(values: Iterable[Any], quick: Collection[Any], *, several: bool = False) -> list[Any]:
    """``values`` for ``pytest.mark.parametrize``: those in ``quick`` run in
    both runs, the others only in the full run (marked ``full``). With
    ``several``, each value is a tuple of several arguments' values."""
    values = list(values)
    missing = [value for value in quick if value not in values]
    if missing:
        raise ValueError(f"quick cases {missing} are not among the values")
    return [value if value in quick else
            pytest.param(*(value if several else (value,)), marks=pytest.mark.full)
            for value in values]
