"""Every conformance test runs once per gateway: the same calls must give the
same results on embedded SQLite (memory and file) and on the two official
emulators. Emulator gateways come from the gds_counter pytest plugin, which
starts each emulator once per session and gives each test a fresh namespace."""

from __future__ import annotations

import pytest

from gds_counter.gateway import open_gateway

GATEWAYS = ["memory", "sqlite", "datastore", "firestore"]


@pytest.fixture(params=GATEWAYS)
def gateway(request, tmp_path):
    if request.param == "memory":
        gw = open_gateway("memory://")
    elif request.param == "sqlite":
        gw = open_gateway(f"sqlite:///{tmp_path / 'conformance.sqlite3'}")
    else:
        # The plugin's fixture owns the emulator gateway's lifetime.
        yield request.getfixturevalue(f"{request.param}_gateway")
        return
    yield gw
    gw.close()


@pytest.fixture
def backend(request) -> str:
    """Which gateway this test runs on, for the few places they must differ."""
    return request.node.callspec.params["gateway"]
