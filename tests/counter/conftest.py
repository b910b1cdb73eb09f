"""Counter tests run on real gateways only: embedded SQLite (memory and
file) by default, and the official emulators where the behaviour differs
(transforms, contention, the raw client's view of the data)."""

from __future__ import annotations

from typing import Iterator

import pytest

from gds_counter.counter.cache import DEFAULT_CACHE
from gds_counter.gateway import Gateway, open_gateway

LOCAL = ["memory", "sqlite"]
ALL = ["memory", "sqlite", "datastore", "firestore"]


def _open(request: pytest.FixtureRequest, tmp_path) -> Iterator[Gateway]:
    if request.param == "memory":
        gw = open_gateway("memory://")
    elif request.param == "sqlite":
        gw = open_gateway(f"sqlite:///{tmp_path / 'counter.sqlite3'}")
    else:
        yield request.getfixturevalue(f"{request.param}_gateway")  # the plugin closes it
        return
    yield gw
    gw.close()


@pytest.fixture(params=LOCAL)
def gateway(request, tmp_path) -> Iterator[Gateway]:
    """The embedded gateway, in memory and on a file."""
    yield from _open(request, tmp_path)


@pytest.fixture(params=ALL)
def any_gateway(request, tmp_path) -> Iterator[Gateway]:
    """Every gateway, emulators included."""
    yield from _open(request, tmp_path)


@pytest.fixture
def memory_gateway() -> Iterator[Gateway]:
    gw = open_gateway("memory://")
    yield gw
    gw.close()


@pytest.fixture(autouse=True)
def _fresh_shared_cache() -> Iterator[None]:
    DEFAULT_CACHE.clear()
    yield
    DEFAULT_CACHE.clear()
