"""Every conformance test runs once per gateway: the same calls must give the
same results on embedded SQLite (memory and file) and on the two official
emulators, which the gds_counter pytest plugin starts once per session (each
test gets a fresh namespace)."""

from __future__ import annotations

import pytest

from gds_counter.testing import GATEWAY_NAMES


@pytest.fixture(params=GATEWAY_NAMES)
def gateway(request, make_gateway):
    return make_gateway(request.param)


@pytest.fixture
def backend(request) -> str:
    """Which gateway this test runs on, for the few places they must differ."""
    return request.node.callspec.params["gateway"]
