"""``gds-counter serve`` as a process: it says where it listens, serves,
and on SIGTERM finishes the request under way, exits 0, and leaves every
acknowledged write in its SQLite file."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from gds_counter.gateway import open_gateway
from gds_counter.gateway.keys import Key

LISTENING = re.compile(r"export DATASTORE_EMULATOR_HOST=(\S+)")


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str, Path]]:
    path = tmp_path / "kept.sqlite3"
    process = subprocess.Popen(
        [sys.executable, "-m", "gds_counter", "-v", "serve", "--port", "0", "--url", f"sqlite:///{path}"],
        stderr=subprocess.PIPE, text=True, cwd=tmp_path, env={**os.environ, "GDS_URL": ""},
    )
    try:
        host = _wait_for_address(process)
        yield process, host, path
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(10)


def _wait_for_address(process: subprocess.Popen[str]) -> str:
    assert process.stderr is not None
    deadline = time.monotonic() + 30
    seen = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen.append(line)
        found = LISTENING.search(line)
        if found:
            return found.group(1)
    raise AssertionError(f"gds-counter serve said no address: {''.join(seen)}")


def test_sigterm_finishes_the_request_under_way_exits_0_and_keeps_every_write(started: Any) -> None:
    process, host, path = started
    from google.cloud import datastore

    os.environ["DATASTORE_EMULATOR_HOST"] = host
    try:
        client = datastore.Client(project="kept")
        for i in range(20):
            entity = datastore.Entity(client.key("Kept", i + 1))
            entity["i"] = i
            client.put(entity)
    finally:
        del os.environ["DATASTORE_EMULATOR_HOST"]

    # A REST commit whose body is still on its way when SIGTERM arrives.
    address, port = host.rsplit(":", 1)
    body = b'{"mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": {"key": {"path": [{"kind": "Kept", "name": "last"}]}}}]}'
    with socket.create_connection((address, int(port)), timeout=20) as late:
        late.sendall(b"POST /v1/projects/kept:commit HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
        time.sleep(0.3)  # the request line is read: the request is under way
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        late.sendall(body[10:])
        answer = late.makefile("rb").read()
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    assert process.wait(30) == 0
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{host}/", timeout=2)  # no longer listening

    with open_gateway(f"sqlite:///{path}") as gateway:
        found = gateway.lookup([Key.of("Kept", i + 1) for i in range(20)] + [Key.of("Kept", "last")])
    assert [e.properties.get("i") for e in found[:20] if e is not None] == list(range(20))
    assert found[20] is not None


def test_it_says_where_it_listens_and_logs_requests_at_v(started: Any) -> None:
    process, host, _ = started
    assert httpx.get(f"http://{host}/", timeout=5).text == "Ok"
    httpx.post(f"http://{host}/v1/projects/logged:lookup", json={"keys": []}, timeout=5)
    process.send_signal(signal.SIGINT)  # Ctrl-C
    assert process.wait(30) == 0
    assert process.stderr is not None
    rest = process.stderr.read()
    assert "http Lookup project='logged' OK" in rest


def test_it_refuses_to_serve_a_datastore_url(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "gds_counter", "serve", "--url", "datastore://p"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == 2 and "sqlite:/// or memory://" in done.stderr
