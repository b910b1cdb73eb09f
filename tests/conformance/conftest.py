"""Every conformance test runs once per gateway: the same calls must give the
same results on embedded SQLite (memory and file) and on the two official
emulators, which the gds_counter pytest plugin starts once per session (each
test gets a fresh namespace); and through the asyncio face on memory and the
Firestore emulator (``AIO_GATEWAY_NAMES``). The quick run (``tests/sizes.py``)
takes the embedded engine (memory and file), the Firestore emulator (the
oracle) and serve; the full run adds the legacy Datastore emulator and the
asyncio face, whose own suites (tests/aio, tests/gateway) run in both."""

from __future__ import annotations

import pytest
from sizes import params

from gds_counter.testing import AIO_GATEWAY_NAMES, GATEWAY_NAMES


@pytest.fixture(params=params(GATEWAY_NAMES + AIO_GATEWAY_NAMES, quick=("memory", "sqlite", "firestore", "serve")))
def gateway(request, make_gateway):
    return make_gateway(request.param)


@pytest.fixture(params=params([name for name in GATEWAY_NAMES + AIO_GATEWAY_NAMES if not name.startswith("datastore")],
                                quick=("memory", "sqlite", "firestore", "serve")))
def transforming_gateway(request, make_gateway):
    """Every gateway whose server applies property transforms and masks:
    all but the legacy Datastore emulator, which ignores both (the Datastore
    gateway raises ``TransformsIgnored`` there: tests/conformance/test_increments.py)."""
    return make_gateway(request.param)


@pytest.fixture
def backend(request) -> str:
    """Which storage this test runs on, for the few places they must
    differ ("firestore+aio" is the Firestore emulator through the asyncio
    face: "firestore")."""
    return request.node.callspec.params["gateway"].partition("+")[0]
