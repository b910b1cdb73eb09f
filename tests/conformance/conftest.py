"""Every conformance test runs once per gateway: the same calls must give the
same results on embedded SQLite (memory and file) and on the two official
emulators, which the gds_counter pytest plugin starts once per session (each
test gets a fresh namespace); and through the asyncio face on memory and the
Firestore emulator (``AIO_GATEWAY_NAMES``)."""

from __future__ import annotations

import pytest

from gds_counter.testing import AIO_GATEWAY_NAMES, GATEWAY_NAMES


@pytest.fixture(params=GATEWAY_NAMES + AIO_GATEWAY_NAMES)
def gateway(request, make_gateway):
    return make_gateway(request.param)


@pytest.fixture
def backend(request) -> str:
    """Which storage this test runs on, for the few places they must
    differ ("firestore+aio" is the Firestore emulator through the asyncio
    face: "firestore")."""
    return request.node.callspec.params["gateway"].partition("+")[0]
