"""Test tooling for projects that use gds_counter (and for gds_counter's own tests).

Nothing in the product imports this package; the product's own emulator
launcher is ``gds_counter.emulators``, re-exported here for convenience.

* ``gds_counter.testing.plugin``: the pytest plugin, registered as the
  ``gds_counter`` pytest11 entry point. It gives FIXTURES and nothing else
  (no hooks, no markers, no change to how other tests are collected or
  reported), because it is loaded into every pytest run of every project
  that installs gds_counter. Turn it off with ``-p no:gds_counter``.
* ``gds_counter.testing.faults``: gateways that fail on purpose, seeded;
  ``gds_counter.testing.async_faults``: the same for the asyncio face.
* ``uses_emulator(item)``: which collected tests reach an emulator. A
  project that wants emulator tests marked, or wants CI to fail rather
  than skip them, applies it in its own ``conftest.py`` (gds_counter's
  ``tests/conftest.py`` does both).
"""

from __future__ import annotations

from typing import Any

from gds_counter.emulators import (
    DEFAULT_PROJECT,
    Emulator,
    EmulatorError,
    launch_emulator,
    start_emulator,
)
from gds_counter.testing.async_faults import FaultyAsyncGateway
from gds_counter.testing.faults import FaultInjector, FaultyGateway, inject_rpc_faults, remove_rpc_faults

__all__ = [
    "AIO_GATEWAY_NAMES",
    "DEFAULT_PROJECT",
    "EMULATED_GATEWAYS",
    "EMULATOR_FIXTURES",
    "GATEWAY_NAMES",
    "Emulator",
    "EmulatorError",
    "FaultInjector",
    "FaultyAsyncGateway",
    "FaultyGateway",
    "inject_rpc_faults",
    "launch_emulator",
    "remove_rpc_faults",
    "start_emulator",
    "uses_emulator",
]

#: Every gateway a conformance test should run on, by name (``make_gateway``):
#: "serve" is the Datastore gateway on ``gds-counter serve``
#: (``gds_counter.server``) over a SQLite file.
GATEWAY_NAMES = ("memory", "sqlite", "datastore", "firestore", "serve")
#: The same storage through the asyncio face (``gds_counter.aio``), behind
#: a blocking bridge (``testing.bridge``) so blocking suites exercise it.
AIO_GATEWAY_NAMES = ("memory+aio", "firestore+aio")
#: The gateway names that start an official emulator ("firestore-native":
#: the Firestore gateway on the emulator in native mode, which is not in
#: ``GATEWAY_NAMES``: its documents have no namespaces and its queries are
#: Firestore's, so a suite names it where it applies).
EMULATED_GATEWAYS = ("datastore", "firestore", "firestore-native")
#: The plugin's fixtures that start an official emulator.
EMULATOR_FIXTURES = frozenset({
    "datastore_emulator", "firestore_emulator", "datastore_gateway", "firestore_gateway",
    "firestore_native_emulator", "firestore_native_gateway",
})


def uses_emulator(item: Any) -> bool:
    """True when a collected pytest item needs an official emulator: it uses
    one of ``EMULATOR_FIXTURES``, or it is parametrized with one of
    ``EMULATED_GATEWAYS`` (or its "+aio" twin; suites over ``GATEWAY_NAMES`` reach the
    emulators lazily, through ``make_gateway``)."""
    if EMULATOR_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return True
    params = getattr(getattr(item, "callspec", None), "params", {})
    return any(value.partition("+")[0] in EMULATED_GATEWAYS for value in params.values() if isinstance(value, str))
