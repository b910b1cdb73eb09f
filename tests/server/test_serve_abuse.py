"""``gds-counter serve`` against clients that misbehave: transactions begun
and never ended, slow or hostile HTTP requests, requests from web pages,
and odd values in what it logs. Each must leave the other clients served
at their usual pace, and nothing written that was not asked for."""

from __future__ import annotations

import time
from typing import Iterator

import pytest

from gds_counter.errors import BadValueError
from gds_counter.gateway.datastore import DatastoreGateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity
from gds_counter.server import Server


@pytest.fixture
def idle_server(tmp_path) -> Iterator[Server]:
    """A server over a file whose transactions end after 0.5 s unused."""
    from gds_counter.gateway import open_gateway

    gateway = open_gateway(f"sqlite:///{tmp_path / 'abuse.sqlite3'}")
    try:
        with Server(gateway, "127.0.0.1", 0, transaction_idle=0.5) as server:
            yield server
    finally:
        gateway.close()


def _client(server: Server) -> DatastoreGateway:
    return DatastoreGateway("abuse", emulator_host=server.emulator_host, timeout=30)


def test_transactions_clients_abandon_end_when_idle_and_slow_no_one(idle_server):
    """On a file store every open transaction holds a connection: past the
    pool's share, a new transaction waits 2 s for one. Abandoned ones end
    after ``transaction_idle``, so later clients are not slowed."""
    crashed = _client(idle_server)
    key = Key.of("TxK", "x")
    crashed.commit([Upsert(RawEntity(key, {"v": 1}))])
    abandoned = []
    for _ in range(40):  # more than the pool's share for transactions (28)
        token = crashed.begin_transaction()
        crashed.lookup([key], transaction=token)
        abandoned.append(token)
    time.sleep(0.6)
    other = _client(idle_server)
    began = time.monotonic()
    for _ in range(5):
        token = other.begin_transaction()
        assert other.lookup([key], transaction=token)[0] is not None
        other.commit([Upsert(RawEntity(key, {"v": 2}))], transaction=token)
    assert time.monotonic() - began < 5  # five transactions; each waited 2 s before (a bound, not a speed)
    assert len(idle_server.service.transactions) == 0
    with pytest.raises(BadValueError):
        crashed.lookup([key], transaction=abandoned[0])  # ended: refused, as any unknown transaction


def test_a_transaction_in_use_is_not_ended(idle_server):
    client = _client(idle_server)
    key = Key.of("TxK", "busy")
    token = client.begin_transaction()
    for _ in range(4):
        client.lookup([key], transaction=token)
        time.sleep(0.3)  # never idle for 0.5 s
        _client(idle_server).lookup([key])  # other requests come (each one expires the idle)
    client.commit([Upsert(RawEntity(key, {"v": 1}))], transaction=token)
    assert client.lookup([key])[0] is not None
