"""A request whose deadline passed before the server took it is answered
DEADLINE_EXCEEDED and applies nothing, as the emulator answers it: its
client has already been told DEADLINE_EXCEEDED, so a commit applied after
that would be a write its caller believes failed."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

import grpc
import httpx
import pytest
from google.cloud.datastore_v1.types import datastore as ds
from google.cloud.datastore_v1.types import entity as en

from gds_counter.gateway.keys import Key
from gds_counter.server import serving


def _commit(name: str) -> Any:
    key = en.Key(partition_id={"project_id": "deadline-test"}, path=[{"kind": "Row", "name": name}])
    return ds.CommitRequest.pb(ds.CommitRequest(
        project_id="deadline-test", mode=ds.CommitRequest.Mode.NON_TRANSACTIONAL,
        mutations=[{"upsert": {"key": key}}]))


@pytest.mark.parametrize("late_call", ["Commit", "Lookup"])
def test_a_call_queued_past_its_deadline_is_answered_deadline_exceeded(
        tmp_path: Any, late_call: str, caplog: pytest.LogCaptureFixture) -> None:
    """One worker; the first commit waits for the file's write lock (held by
    another process's connection), so the second call waits in the queue
    until after its 0.3 s deadline: once the lock is freed, it is answered
    DEADLINE_EXCEEDED without being run (a commit is not stored)."""
    caplog.set_level("INFO", logger="gds_counter.server")
    path = tmp_path / "deadline.sqlite3"
    with serving(f"sqlite:///{path}", workers=1) as server:
        channel = grpc.insecure_channel(server.emulator_host)
        commit = channel.unary_unary("/google.datastore.v1.Datastore/Commit",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=ds.CommitResponse.pb().FromString)
        commit(_commit("warm-up"), timeout=10)
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        first: list[Any] = []
        waiting = threading.Thread(target=lambda: first.append(commit(_commit("first"), timeout=20)))
        waiting.start()
        time.sleep(0.3)  # the one worker now waits for the lock
        late_key = en.Key(partition_id={"project_id": "deadline-test"}, path=[{"kind": "Row", "name": "late"}])
        lookup = channel.unary_unary("/google.datastore.v1.Datastore/Lookup",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=ds.LookupResponse.pb().FromString)
        with pytest.raises(grpc.RpcError) as late:
            if late_call == "Commit":
                commit(_commit("late"), timeout=0.3)
            else:
                lookup(ds.LookupRequest.pb(ds.LookupRequest(project_id="deadline-test", keys=[late_key])), timeout=0.3)
        assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        time.sleep(0.2)
        holder.execute("COMMIT")
        holder.close()
        waiting.join(20)
        assert first, "the first commit was answered"
        time.sleep(0.3)  # the late one has been taken from the queue by now
        # grpcio may drop a call that expired in its queue, or hand it over:
        # then it is answered DEADLINE_EXCEEDED, never run.
        gateway = server.service.gateway
        assert [e is not None for e in gateway.lookup([Key.of("Row", n) for n in ("first", "late")])] == [True, False]
        answered = [r.getMessage() for r in caplog.records if f"grpc {late_call} " in r.getMessage()]
        ok = [line for line in answered if " OK " in line]
        assert len(ok) == (2 if late_call == "Commit" else 0), answered  # the warm-up and the first commit only
        channel.close()


@pytest.mark.parametrize("method", ["Commit", "Lookup"])
def test_the_service_refuses_a_request_whose_deadline_has_passed(tmp_path: Any, method: str) -> None:
    """The rule itself, on the service both protocols share: checked before
    the request is looked at, so nothing of it runs."""
    from gds_counter.server._status import ServiceError

    key = en.Key(partition_id={"project_id": "deadline-test"}, path=[{"kind": "Row", "name": "gone"}])
    request = _commit("gone") if method == "Commit" else ds.LookupRequest.pb(
        ds.LookupRequest(project_id="deadline-test", keys=[key]))
    with serving(f"sqlite:///{tmp_path / 'service.sqlite3'}") as server:
        with pytest.raises(ServiceError) as refused:
            server.service.call(method, request, deadline=time.monotonic() - 0.001)
        assert refused.value.status == "DEADLINE_EXCEEDED"
        assert server.service.call(method, request, deadline=time.monotonic() + 10) is not None
        stored = server.service.gateway.lookup([Key.of("Row", "gone")])
        assert stored == [None] if method == "Lookup" else stored[0] is not None


def test_a_rest_request_past_its_server_timeout_is_refused_before_anything(tmp_path: Any) -> None:
    """Over REST the deadline is Google's ``X-Server-Timeout`` header (the
    Firestore emulator ignores it; serve keeps it as gRPC's)."""
    with serving(f"sqlite:///{tmp_path / 'rest.sqlite3'}") as server:
        body = {"mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": {"key": {"path": [{"kind": "Row", "name": "r"}]}}}]}
        answer = httpx.post(f"http://{server.emulator_host}/v1/projects/p:commit", json=body,
                            headers={"X-Server-Timeout": "0"}, timeout=10)
        assert (answer.status_code, answer.json()["error"]["status"]) == (504, "DEADLINE_EXCEEDED")
        assert server.service.gateway.lookup([Key.of("Row", "r")]) == [None]


@pytest.mark.parametrize("timeout", [1e-9, 1e-6])
def test_a_call_with_under_a_millisecond_left_is_refused_not_run(tmp_path: Any, timeout: float) -> None:
    """gRPC carries a deadline rounded up to the millisecond, and clients
    time out with that grain: an answer sent within it could reach a client
    that had given up (python-ndb's system test
    ``test_fetch_w_absurdly_short_timeout`` fetches with 1 ns and expects
    DeadlineExceeded). So the call is refused, and a commit not applied."""
    with serving(f"sqlite:///{tmp_path / 'grain.sqlite3'}") as server:
        channel = grpc.insecure_channel(server.emulator_host)
        commit = channel.unary_unary("/google.datastore.v1.Datastore/Commit",
                                     request_serializer=lambda m: m.SerializeToString(),
                                     response_deserializer=ds.CommitResponse.pb().FromString)
        commit(_commit("warm-up"), timeout=10)
        with pytest.raises(grpc.RpcError) as refused:
            commit(_commit("hasty"), timeout=timeout)
        assert refused.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert server.service.gateway.lookup([Key.of("Row", "hasty")]) == [None]
        channel.close()


def test_ndb_fetch_with_an_absurdly_short_timeout_raises_deadline_exceeded(
        server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from google.api_core import exceptions
    from google.cloud import ndb

    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", server.emulator_host)

    class Hasty(ndb.Model):
        foo = ndb.IntegerProperty()

    with ndb.Client(project="deadline-test").context():
        ndb.put_multi([Hasty(foo=i) for i in range(3)])
        for _ in range(3):
            with pytest.raises(exceptions.DeadlineExceeded):
                Hasty.query().fetch(timeout=1e-9)
