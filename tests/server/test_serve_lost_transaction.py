"""A transaction ``gds-counter serve`` lost (issue 36, defect 5).

A real ``gds-counter serve`` process over a SQLite file: a client begins a
transaction and reads in it, the server is killed (SIGKILL) and started
again on the same file and port, and the client writes in the transaction.
The new server never heard of it. Nothing of that transaction was applied,
and redoing it in a new one is safe, so the error must say exactly that:
``TransactionLost``, a ``Contention`` (never ``BadValueError``, which tells
the caller to fix an input that was fine). The Store's
``run_in_transaction`` and the counter's transactional ``add()`` then
redo the transaction and count it exactly once.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from gds_counter.counter import CounterShardDS
from gds_counter.errors import BadValueError, Contention, GDSError, TransactionLost
from gds_counter.gateway.datastore import DatastoreGateway
from gds_counter.gds import RetryPolicy, Store

LISTENING = re.compile(r"export DATASTORE_EMULATOR_HOST=(\S+)")
PROJECT = "lost-transactions"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ServeProcess:
    """``gds-counter serve`` as its own process on a fixed port and SQLite
    file, so that it can be killed and started again in the same place."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.port = _free_port()
        self.host = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen[str] | None = None
        self.start()

    def start(self) -> None:
        process = subprocess.Popen(
            [sys.executable, "-m", "gds_counter", "serve", "--port", str(self.port), "--url", f"sqlite:///{self.path}"],
            stderr=subprocess.PIPE, text=True, cwd=self.path.parent, env={**os.environ, "GDS_URL": ""},
        )
        self.process = process
        assert process.stderr is not None
        seen = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            seen.append(line)
            if LISTENING.search(line):
                assert httpx.get(f"http://{self.host}/", timeout=5).text == "Ok"
                return
        raise AssertionError(f"gds-counter serve did not start on {self.host}: {''.join(seen)}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
        self.process = None

    def restart(self) -> None:
        """SIGKILL, then the same command on the same file and port."""
        self.kill()
        self.start()


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[ServeProcess]:
    server = ServeProcess(tmp_path / "lost.sqlite3")
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def gateway(serve: ServeProcess) -> Iterator[DatastoreGateway]:
    gw = DatastoreGateway(PROJECT, namespace=f"t-{uuid.uuid4().hex[:12]}", emulator_host=serve.host, timeout=10.0)
    try:
        yield gw
    finally:
        gw.close()


def test_a_write_in_a_transaction_the_server_lost_says_nothing_was_applied(serve: ServeProcess, gateway: Any) -> None:
    """Begin, fetch, SIGKILL + restart, upsert: ``TransactionLost`` (a
    ``Contention``: redo the transaction), not ``BadValueError``; and
    indeed nothing of the transaction was written."""
    notes = Store("Note", gateway)
    note = notes.create_entity({"n": 1})
    note.set_key_name("a")
    notes.upsert(note)

    notes.begin_transaction()
    fetched = notes.fetch_by_name("a")
    assert fetched is not None and fetched.n == 1
    serve.restart()
    fetched.n = 2
    with pytest.raises(GDSError) as raised:
        notes.upsert(fetched)
    assert isinstance(raised.value, TransactionLost), f"{type(raised.value).__name__}: {raised.value}"
    assert isinstance(raised.value, Contention) and not isinstance(raised.value, BadValueError)
    assert "nothing of it was applied" in str(raised.value)

    again = notes.fetch_by_name("a")
    assert again is not None and again.n == 1  # nothing of the lost transaction was written


def test_a_read_in_a_transaction_the_server_lost_says_so_too(serve: ServeProcess, gateway: Any) -> None:
    """The first read after the restart already learns it: the lookup in
    the forgotten transaction is ``TransactionLost`` as well."""
    notes = Store("Note", gateway)
    notes.begin_transaction()
    assert notes.fetch_by_name("a") is None
    serve.restart()
    with pytest.raises(TransactionLost):
        notes.fetch_by_name("b")


def test_run_in_transaction_redoes_a_transaction_the_server_lost(serve: ServeProcess, gateway: Any) -> None:
    """The server restarts in the middle of the first attempt: that attempt
    applied nothing, the second one commits, and the work's effect is
    stored once."""
    notes = Store("Note", gateway)
    attempts = []

    def work(store: Store) -> None:
        attempts.append(1)
        found = store.fetch_by_name("total")
        if len(attempts) == 1:
            serve.restart()
        entity = found or store.create_entity({"n": 0})
        entity.set_key_name("total")
        entity.n = entity.n + 5
        store.upsert(entity)

    notes.run_in_transaction(work, retry=RetryPolicy(attempts=3, initial=0.05, maximum=0.2))
    assert len(attempts) == 2
    total = notes.fetch_by_name("total")
    assert total is not None and total.n == 5


def test_when_every_attempt_is_lost_the_class_still_says_so(serve: ServeProcess, gateway: Any) -> None:
    """Retries run out (the server restarts in each attempt): the error is
    still ``TransactionLost``, with the attempts made, and nothing was
    written: a caller learns the truth from the class, not only the text."""
    notes = Store("Note", gateway)

    def work(store: Store) -> None:
        store.fetch_by_name("never")
        serve.restart()
        entity = store.create_entity({"n": 1})
        entity.set_key_name("never")
        store.upsert(entity)

    with pytest.raises(TransactionLost) as raised:
        notes.run_in_transaction(work, retry=RetryPolicy(attempts=2, initial=0.05, maximum=0.1))
    assert raised.value.attempts == 2
    assert notes.fetch_by_name("never") is None


class RestartingGateway(DatastoreGateway):
    """A real Datastore gateway that has the server restarted just before
    its first transactional commit: between the transaction's read and its
    commit, where a server restart loses it."""

    serve: ServeProcess
    restarts = 0

    def commit(self, mutations: Any, transaction: bytes | None = None) -> Any:
        if transaction is not None and not self.restarts:
            self.restarts += 1
            self.serve.restart()
        return super().commit(mutations, transaction=transaction)


def test_a_transactional_add_the_server_lost_is_retried_and_counted_once(serve: ServeProcess) -> None:
    gw = RestartingGateway(PROJECT, namespace=f"t-{uuid.uuid4().hex[:12]}", emulator_host=serve.host, timeout=10.0)
    gw.serve = serve
    try:
        counter = CounterShardDS("Lost", 1, gateway=gw, strategy="transactional",
                                 retry=RetryPolicy(attempts=4, initial=0.05, maximum=0.2))
        counter.add(3)
        assert gw.restarts == 1  # the first attempt's transaction was lost
        assert counter.get_count() == 3  # counted exactly once
    finally:
        gw.close()
