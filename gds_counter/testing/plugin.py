"""The ``gds_counter`` pytest plugin: fixtures, and nothing else.

Registered as the ``gds_counter`` pytest11 entry point, so pytest loads it
into EVERY test run of EVERY project that has gds_counter installed. That
is why it defines fixtures only: no hooks, no markers, no report changes.
A fixture does nothing until a test asks for it by name, so a project that
does not use these fixtures runs exactly as it would without gds_counter
(``tests/test_plugin_isolation.py`` checks that). Rules such as "mark the
emulator tests" or "under CI an emulator test may not be skipped" belong in
the conftest.py of the project that wants them (see gds_counter's own
``tests/conftest.py`` and ``gds_counter.testing.uses_emulator``).

Fixtures:

* ``datastore_emulator`` / ``firestore_emulator`` (session): the official
  Cloud Datastore emulator (optimistic concurrency, ignores property
  transforms) and the Firestore emulator in Datastore mode (pessimistic
  locks, applies them). Each starts on first use only, so a run that needs
  no emulator pays nothing. When gcloud or the emulator is missing or does
  not start, the tests that need it are skipped with the reason.
* ``datastore_gateway`` / ``firestore_gateway`` (function): a fresh
  ``DatastoreGateway`` on that emulator in a fresh namespace, closed after
  the test.
* ``firestore_native_emulator`` (session): the Firestore emulator in
  native mode, started on first use, skipped the same way.
* ``firestore_native_gateway`` (function): a fresh ``FirestoreGateway``
  on it, every document of the emulator deleted before the test (native
  mode has no namespaces to keep tests apart), closed after it.
* ``serve_server`` (session): ``gds-counter serve`` (``gds_counter.server.
  Server``) on a free port over a SQLite file of the session, started on
  first use; ``make_gateway("serve")`` is the Datastore gateway on it, in a
  fresh namespace.
* ``make_gateway`` (function): ``make_gateway(name)`` for any of
  ``GATEWAY_NAMES``, so a suite can be parametrized over every gateway.
"""

from __future__ import annotations

import os
import uuid
from typing import TYPE_CHECKING, Any, Callable, Iterator

import pytest

from gds_counter.emulators import Emulator, EmulatorError, EmulatorKind, launch_emulator
from gds_counter.errors import BadValueError
from gds_counter.testing import EMULATED_GATEWAYS, GATEWAY_NAMES

if TYPE_CHECKING:
    from gds_counter.gateway.base import Gateway
    from gds_counter.gateway.datastore import DatastoreGateway
    from gds_counter.gateway.firestore import FirestoreGateway

__all__ = [
    "datastore_emulator",
    "datastore_gateway",
    "firestore_emulator",
    "firestore_gateway",
    "firestore_native_emulator",
    "firestore_native_gateway",
    "make_gateway",
    "serve_server",
]


def _session_emulator(kind: EmulatorKind) -> Iterator[Emulator]:
    try:
        emulator = launch_emulator(kind)
    except EmulatorError as exc:
        pytest.skip(f"{kind} emulator unavailable: {exc}")
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture(scope="session")
def datastore_emulator() -> Iterator[Emulator]:
    """The official Cloud Datastore emulator, started once per session."""
    yield from _session_emulator("datastore")


@pytest.fixture(scope="session")
def firestore_emulator() -> Iterator[Emulator]:
    """The official Firestore emulator in Datastore mode, started once per session."""
    yield from _session_emulator("firestore")


def _fresh_gateway(emulator: Emulator) -> Iterator["DatastoreGateway"]:
    gateway = emulator.gateway(namespace=f"t-{uuid.uuid4().hex}")
    try:
        yield gateway
    finally:
        gateway.close()


@pytest.fixture
def datastore_gateway(request: pytest.FixtureRequest) -> Iterator["Gateway"]:
    """A DatastoreGateway on the Datastore emulator, in a namespace of its own.

    With ``GDS_TEST_DATASTORE_URL=datastore://PROJECT[?database=DB]`` it is
    real Cloud Datastore instead (credentials from Application Default
    Credentials), still in a fresh namespace per test, so the same suites
    can be run against production before a release.
    """
    url = os.environ.get("GDS_TEST_DATASTORE_URL")
    if not url:
        yield from _fresh_gateway(request.getfixturevalue("datastore_emulator"))
        return
    from gds_counter.gateway import open_gateway

    gateway = open_gateway(f"{url}{'&' if '?' in url else '?'}namespace=t-{uuid.uuid4().hex}")
    try:
        yield gateway
    finally:
        gateway.close()


@pytest.fixture
def firestore_gateway(firestore_emulator: Emulator) -> Iterator["DatastoreGateway"]:
    """A DatastoreGateway on the Firestore emulator, in a namespace of its own."""
    yield from _fresh_gateway(firestore_emulator)


@pytest.fixture(scope="session")
def firestore_native_emulator() -> Iterator[Emulator]:
    """The official Firestore emulator in native mode, started once per session."""
    yield from _session_emulator("firestore-native")


@pytest.fixture
def firestore_native_gateway(firestore_native_emulator: Emulator) -> Iterator["FirestoreGateway"]:
    """A FirestoreGateway on the native-mode emulator, whose documents were
    all deleted first (one emulator per session and worker: a test sees only
    its own documents)."""
    firestore_native_emulator.clear()
    gateway = firestore_native_emulator.firestore_gateway()
    try:
        yield gateway
    finally:
        gateway.close()


@pytest.fixture(scope="session")
def serve_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``gds-counter serve`` on a free port of 127.0.0.1, over a SQLite file
    of the session, started once on first use and stopped at the end."""
    from gds_counter.server import serving

    with serving(f"sqlite:///{tmp_path_factory.mktemp('serve') / 'served.sqlite3'}") as server:
        yield server


@pytest.fixture
def make_gateway(request: pytest.FixtureRequest, tmp_path: Any) -> Callable[[str], Any]:
    """``make_gateway("memory"|"sqlite"|"datastore"|"firestore"|"firestore-native")``:
    a fresh gateway of that kind, closed after the test. Lets a suite parametrize
    over ``GATEWAY_NAMES`` and run the same tests on every gateway.
    ``"NAME+aio"`` (``AIO_GATEWAY_NAMES``): the same storage through the
    asyncio face, behind a blocking bridge (``testing.bridge``)."""
    from gds_counter.gateway import open_gateway

    def make(name: str) -> Any:
        base, plus, face = name.partition("+")
        if plus:
            if face != "aio":
                raise BadValueError(f"unknown gateway {name!r}; a twin is NAME+aio")
            from gds_counter.testing.bridge import bridge_to_async

            bridge = bridge_to_async(make(base))
            request.addfinalizer(bridge.close)  # runs before the base gateway's own finalizer
            return bridge
        if name in EMULATED_GATEWAYS:
            return request.getfixturevalue(f"{name.replace('-', '_')}_gateway")  # closed by its own fixture
        if name == "memory":
            gateway = open_gateway("memory://")
        elif name == "sqlite":
            gateway = open_gateway(f"sqlite:///{tmp_path / f'{name}-{uuid.uuid4().hex}.sqlite3'}")
        elif name == "serve":
            from gds_counter.gateway.datastore import DatastoreGateway

            server = request.getfixturevalue("serve_server")
            gateway = DatastoreGateway(
                "gds-counter-serve", namespace=f"t-{uuid.uuid4().hex}", emulator_host=server.emulator_host
            )
        else:
            raise BadValueError(f"unknown gateway {name!r}; expected one of {(*GATEWAY_NAMES, *EMULATED_GATEWAYS)}")
        request.addfinalizer(gateway.close)
        return gateway

    return make
