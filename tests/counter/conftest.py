"""Counter tests run on real gateways only: embedded SQLite (memory and
file) by default, and the official emulators where the behaviour differs
(transforms, contention, the raw client's view of the data)."""

from __future__ import annotations

from typing import Iterator

import pytest

from gds_counter.gateway import Gateway, open_gateway
from gds_counter.testing import AIO_GATEWAY_NAMES, GATEWAY_NAMES

LOCAL = ["memory", "sqlite"]


@pytest.fixture(params=[*LOCAL, "memory+aio"])
def gateway(request, make_gateway) -> Gateway:
    """The embedded gateway, in memory and on a file, and in memory
    through the asyncio face (``AIO_GATEWAY_NAMES``)."""
    return make_gateway(request.param)


@pytest.fixture(params=GATEWAY_NAMES + AIO_GATEWAY_NAMES)
def any_gateway(request, make_gateway) -> Gateway:
    """Every gateway, emulators included, and the asyncio face's."""
    return make_gateway(request.param)


@pytest.fixture
def memory_gateway() -> Iterator[Gateway]:
    gw = open_gateway("memory://")
    yield gw
    gw.close()
