"""A real ``gds-counter serve`` for each test module: the ``Server`` in this
process on a free port over a SQLite file, and clients that reach it by
``DATASTORE_EMULATOR_HOST`` as any Datastore client would."""

from __future__ import annotations

import uuid
from typing import Any, Iterator

import pytest

from gds_counter.server import Server, serving


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Server, Any]]:
    """The server, and the gateway it serves (to look behind it)."""
    with serving(f"sqlite:///{tmp_path_factory.mktemp('served') / 'served.sqlite3'}") as server:
        yield server, server.service.gateway


@pytest.fixture
def server(served: tuple[Server, Any]) -> Server:
    return served[0]


@pytest.fixture
def namespace() -> str:
    """A namespace of the test's own: the module's tests share one store."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def client(server: Server, namespace: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """google-cloud-datastore's own client, pointed at the server the way
    its users do it: ``DATASTORE_EMULATOR_HOST``."""
    from google.cloud import datastore

    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", server.emulator_host)
    return datastore.Client(project="serve-test", namespace=namespace)


@pytest.fixture(params=["serve", "firestore-emulator"])
def target(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(host, project) of the module's server, then of the Firestore
    emulator in Datastore mode: a test taking it runs the same calls on
    both, the emulator being the oracle."""
    if request.param == "serve":
        return request.getfixturevalue("server").emulator_host, "serve-test"
    emulator = request.getfixturevalue("firestore_emulator")
    return emulator.host, emulator.project
