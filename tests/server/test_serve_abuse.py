"""``gds-counter serve`` against clients that misbehave: transactions begun
and never ended, slow or hostile HTTP requests, requests from web pages,
and odd values in what it logs. Each must leave the other clients served
at their usual pace, and nothing written that was not asked for."""

from __future__ import annotations

import socket
import time
from typing import Iterator

import pytest
from sizes import params

from gds_counter.errors import TransactionLost
from gds_counter.gateway.datastore import DatastoreGateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity
from gds_counter.server import Server, serving
from gds_counter.server._status import ServiceError


@pytest.fixture
def idle_server(tmp_path) -> Iterator[Server]:
    """A server over a file whose transactions end after 0.5 s unused."""
    with serving(f"sqlite:///{tmp_path / 'abuse.sqlite3'}", transaction_idle=0.5) as server:
        yield server


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
    with pytest.raises(TransactionLost):
        crashed.lookup([key], transaction=abandoned[0])  # ended: refused, as any unknown transaction: nothing applied, redo it


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


def _http(server: Server, raw: bytes, *, wait: float = 5.0) -> bytes:
    """Send ``raw`` on a new connection; all the server answers before it
    closes the connection or ``wait`` seconds pass."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait) as sock:
        sock.sendall(raw)
        got = b""
        try:
            while chunk := sock.recv(65536):
                got += chunk
        except (socket.timeout, ConnectionResetError):
            pass
        return got


def test_a_connection_stalled_half_way_through_a_request_is_closed(tmp_path):
    with serving(f"sqlite:///{tmp_path / 'stalled.sqlite3'}", connection_idle=0.5) as server:
        for stalled in (b"POST /v1/projects/p:lookup HTTP/1.1\r\nHost: x\r\n",
                        b"POST /v1/projects/p:lookup HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"):
            began = time.monotonic()
            assert _http(server, stalled, wait=10) == b""  # closed without an answer
            assert time.monotonic() - began < 5  # at the read timeout, not never (a bound, not a speed)


def _commit_body() -> bytes:
    return (b'{"mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": {"key": {"path": [{"kind": "Web", "name": "x"}]},'
            b' "properties": {"v": {"integerValue": "1"}}}}]}')


def _post(server: Server, origin: str | None, content_type: str = "text/plain") -> bytes:
    body = _commit_body()
    headers = f"POST /v1/projects/p1:commit HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {content_type}\r\n"
    headers += f"Origin: {origin}\r\n" if origin is not None else ""
    headers += f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    return _http(server, headers.encode() + body)


@pytest.mark.parametrize("origin", ["http://evil.example", "https://evil.example:8081", "null", "http://127.0.0.1.evil.example"])
def test_a_web_page_of_another_site_can_neither_write_nor_read(idle_server, origin):
    answer = _post(idle_server, origin)
    assert answer.startswith(b"HTTP/1.1 403"), answer[:200]
    assert b"PERMISSION_DENIED" in answer
    assert idle_server.service.gateway.lookup([Key.of("Web", "x")]) == [None]


@pytest.mark.parametrize("origin", [None, "http://localhost:3000", "http://127.0.0.1:8081", "http://[::1]:8081"])
def test_clients_and_pages_of_this_machine_are_served(idle_server, origin):
    answer = _post(idle_server, origin, content_type="application/json")
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert idle_server.service.gateway.lookup([Key.of("Web", "x")])[0] is not None


def test_what_clients_send_is_logged_escaped(idle_server, caplog):
    """A project id is the client's to send (gRPC takes any string): at
    ``-v`` it is logged as a quoted literal, never as lines or colours, even
    when it is refused."""
    import logging

    from google.cloud.datastore_v1.types import datastore as ds

    request = ds.LookupRequest.pb()(project_id="x\nINFO forged line\x1b[31m")
    request.keys.add().path.add(kind="K", name="a")
    with caplog.at_level(logging.INFO, logger="gds_counter.server"), pytest.raises(ServiceError, match="not a project id"):
        idle_server.service.call("Lookup", request, via="grpc")  # refused (issue 25), and logged all the same
    lines = [record.getMessage() for record in caplog.records]
    assert lines and not any("\n" in line or "\x1b" in line for line in lines), lines


@pytest.mark.parametrize("body, why", [
    (b'{"mutations": [{"upsert": {"key": {"path": [{"kind": "Web", "name": "x"}]}}}]}', b"mode"),
])
def test_a_commit_without_its_mode_is_refused_and_writes_nothing(idle_server, body, why):
    head = f"POST /v1/projects/p1:commit HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    answer = _http(idle_server, head.encode() + body)
    assert answer.startswith(b"HTTP/1.1 400") and why in answer, answer[:300]
    assert idle_server.service.gateway.lookup([Key.of("Web", "x")]) == [None]


def test_rolling_back_a_transaction_never_begun_here_is_refused(idle_server):
    """As the emulator answers ("Invalid transaction"); one that was begun
    here and has ended (committed, rolled back, expired) rolls back as a no-op."""
    def rollback(token: bytes) -> bytes:
        import base64

        body = ('{"transaction": "%s"}' % base64.b64encode(token).decode()).encode()
        head = f"POST /v1/projects/p1:rollback HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(body)}\r\n"
        return _http(idle_server, (head + "Connection: close\r\n\r\n").encode() + body)

    assert rollback(b"not-a-transaction").startswith(b"HTTP/1.1 400")
    client = _client(idle_server)
    token = client.begin_transaction()
    client.commit([Upsert(RawEntity(Key.of("TxK", "rb"), {"v": 1}))], transaction=token)
    client.rollback(token)  # after its commit: nothing to undo, nothing refused
    assert rollback(token).startswith(b"HTTP/1.1 200")
    other = client.begin_transaction()
    assert rollback(other).startswith(b"HTTP/1.1 200") and rollback(other).startswith(b"HTTP/1.1 200")
    assert client.lookup([Key.of("TxK", "rb")])[0] is not None


def test_a_transaction_whose_request_takes_longer_than_the_idle_limit_is_not_ended(idle_server, monkeypatch):
    """Idle means no request under way and none for ``transaction_idle``:
    a read slower than the limit, while other clients' requests come, ends
    nothing, and the commit after it lands."""
    import threading

    client = _client(idle_server)
    key = Key.of("TxK", "slow")
    token = client.begin_transaction()
    gateway = idle_server.service.gateway
    original = gateway.lookup

    def slow_lookup(keys, *, transaction=None):
        if transaction == token:
            time.sleep(1.2)  # longer than the 0.5 s idle limit
        return original(keys, transaction=transaction)

    monkeypatch.setattr(gateway, "lookup", slow_lookup)
    stop = threading.Event()

    def others() -> None:
        other = _client(idle_server)
        while not stop.is_set():
            other.lookup([Key.of("TxK", "other")])  # each request expires what is idle
            time.sleep(0.2)

    thread = threading.Thread(target=others)
    thread.start()
    try:
        assert client.lookup([key], transaction=token) == [None]
        time.sleep(0.3)  # less than the limit since the read ended
        client.commit([Upsert(RawEntity(key, {"v": 1}))], transaction=token)
    finally:
        stop.set()
        thread.join(10)
    assert client.lookup([key])[0] is not None


# --- stalled connections ---------------------------------------------------------

#: What every gRPC client opens its connection with (HTTP/2's preface).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


def _cpu_seconds() -> float:
    """CPU time of this whole process (the server's threads included) so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _stalled(server: Server, first: bytes, count: int) -> list[socket.socket]:
    socks = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        sock.sendall(first)
        socks.append(sock)
    return socks


def _seconds_until_closed(sock: socket.socket, began: float) -> float:
    """Read (and drop) what the server sends until it closes the connection."""
    try:
        while sock.recv(65536):
            pass
    except (socket.timeout, ConnectionResetError):
        pass
    return time.monotonic() - began


def _connection_threads() -> int:
    import threading

    return sum(1 for t in threading.enumerate() if t.name.startswith(("gds-serve-conn", "gds-serve-pump")))


def test_stalled_connections_cost_no_cpu(tmp_path):
    """A connection that sends one byte and then nothing waits in a blocking
    read, not a polling loop: 100 of them leave the server all but idle.
    (The bound is wide: a poll every millisecond burnt more than a core.)"""
    with serving("memory://") as server:
        socks = _stalled(server, b"P", 100)  # P: POST, PUT, PATCH or HTTP/2's PRI, not known yet
        try:
            time.sleep(0.5)  # every connection accepted and waiting
            before = _cpu_seconds()
            time.sleep(3)
            used = _cpu_seconds() - before
        finally:
            for sock in socks:
                sock.close()
    assert used < 0.5, f"the server used {used:.2f} s of CPU in 3 s with 100 stalled connections"


@pytest.mark.parametrize("first", params([
    b"P",                                            # not even a method yet
    b"POST /v1/projects/p:lookup HTTP/1.1\r\nHost",  # half a request
    _H2_PREFACE,                                     # a gRPC client's preface, and no SETTINGS after it
    _H2_PREFACE[:10],                                # half the preface
], quick=[_H2_PREFACE]))
def test_stalled_connections_close_at_the_limit_and_free_their_threads(first):
    """docs/serve.md: a connection silent for ``connection_idle`` seconds
    (30 by default) is closed, whichever protocol it began, so that slow or
    hostile clients cannot hold threads (a preface-only HTTP/2 connection
    held two threads for 61 s before)."""
    limit = 2.0
    with serving("memory://", connection_idle=limit) as server:
        threads_before = _connection_threads()
        began = time.monotonic()
        socks = _stalled(server, first, 5)
        try:
            closed_after = [_seconds_until_closed(sock, began) for sock in socks]
        finally:
            for sock in socks:
                sock.close()
        assert all(limit * 0.8 <= seconds < limit + 5 for seconds in closed_after), closed_after
        until = time.monotonic() + 5
        while _connection_threads() > threads_before and time.monotonic() < until:
            time.sleep(0.05)
        assert _connection_threads() == threads_before  # nothing left holding a thread


def test_a_grpc_client_is_served_across_the_idle_limit():
    """The limit is on silence, not on a connection's age: a gRPC client's
    one connection keeps serving calls made further apart than the limit
    (it reconnects if the server closed it idle), and a call in progress
    longer than the limit is not cut."""
    with serving("memory://", connection_idle=1.0) as server:
        client = DatastoreGateway("abuse", emulator_host=server.emulator_host, timeout=30)
        key = Key.of("Idle", "k")
        client.commit([Upsert(RawEntity(key, {"v": 1}))])
        time.sleep(1.5)  # idle past the limit
        assert client.lookup([key])[0] is not None
        gateway = server.service.gateway
        original = gateway.lookup

        def slow_lookup(keys, *, transaction=None):
            time.sleep(2.5)  # longer than the limit, the client waiting in silence
            return original(keys, transaction=transaction)

        gateway.lookup = slow_lookup
        try:
            assert client.lookup([key])[0] is not None
        finally:
            del gateway.lookup
        client.close()


def test_stopping_does_not_wait_for_a_connection_that_said_nothing_yet():
    """A connection still to send its first bytes has no request under
    way: stopping closes it at once, as it closes an idle HTTP/1.1
    connection, rather than waiting out its silence limit."""
    with serving("memory://", connection_idle=60.0, grace=20.0) as server:
        [sock] = _stalled(server, b"P", 1)
        time.sleep(0.3)  # accepted, and waiting for its next bytes
        began = time.monotonic()
        server.stop()
        stopped_in = time.monotonic() - began
        assert _seconds_until_closed(sock, began) < 5
        sock.close()
    assert stopped_in < 5  # not the 20 s grace, nor the 60 s limit (a bound, not a speed)


@pytest.mark.parametrize("size", [b"-1", b"+10", b"1_0", b"0x10"])
def test_a_chunk_size_that_is_not_hex_digits_is_refused_before_its_body_is_read(tmp_path, size):
    """``int(..., 16)`` takes "-1", and a read of -1 bytes reads until the
    client closes: a body with no bound. The connection is answered 400 at
    once, with the client still sending."""
    with serving(f"sqlite:///{tmp_path / 'chunks.sqlite3'}") as server:
        head = (b"POST /v1/projects/p:lookup HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + size + b"\r\n" + b"x" * 1000)
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(head)  # and no end: a server reading to EOF would never answer
            answer = b""
            while chunk := sock.recv(65536):  # until the server closes the connection
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
        assert b"malformed chunk size" in answer
