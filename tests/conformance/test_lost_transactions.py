"""A transaction the server no longer knows, on every server of the Datastore API.

A server forgets a transaction a client began when it expires (Firestore
ends one idle for 60 seconds), when the server restarts, or when it was
ended behind the client's back. Here a raw rollback ends it (the one way
the three servers share that takes no minute of waiting, nor a restart);
tests/server/test_serve_lost_transaction.py does it by killing and
restarting ``gds-counter serve``.

What each server answers is the evidence for the error class: the
Firestore emulator (Datastore mode), the legacy Datastore emulator and
``gds-counter serve`` all answer INVALID_ARGUMENT, with a message that
names the transaction (Cloud Datastore: "The referenced transaction has
expired or is no longer valid"). Nothing of that transaction was applied,
and the Datastore gateway, which sends only transactions it began and has
not ended, raises ``TransactionLost`` (a ``Contention``: redo it), not
``BadValueError``. serve must answer as the emulators do, so the same
client code decides the same way on either.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.api_core import exceptions as gexc
from google.cloud.datastore_v1.services.datastore import DatastoreClient
from google.cloud.datastore_v1.services.datastore.transports import DatastoreGrpcTransport

from gds_counter.errors import BadValueError, TransactionLost
from gds_counter.gateway.datastore._retry import translate_error
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity

#: The servers of the Datastore API: both official emulators, and gds-counter serve.
SERVERS = ("firestore", "datastore", "serve")
#: And the asyncio gateway (``AsyncDatastoreGateway``), behind its blocking bridge.
GATEWAYS = SERVERS + ("firestore+aio",)


def _raw_client(gateway: Any) -> DatastoreClient:
    """google-cloud-datastore's generated client on the gateway's server,
    below every gds_counter rule (it sends any token it is given)."""
    return DatastoreClient(transport=DatastoreGrpcTransport(channel=grpc.insecure_channel(_where(gateway).emulator_host)))


def _where(gateway: Any) -> Any:
    """The Datastore gateway that knows the server's address and project
    (behind a blocking bridge, its async gateway)."""
    return getattr(gateway, "async_gateway", gateway)


def _ended_behind_the_clients_back(gateway: Any) -> bytes:
    """A transaction ``gateway`` began and still holds open, which its
    server has ended (rolled back by another client)."""
    token = gateway.begin_transaction()
    _raw_client(gateway).rollback(request={"project_id": _where(gateway).project, "transaction": token})
    return token


def _answer(call: Any) -> tuple[str, str]:
    with pytest.raises(gexc.GoogleAPICallError) as raised:
        call()
    return raised.value.grpc_status_code.name, raised.value.message


@pytest.mark.parametrize("server", SERVERS)
def test_a_server_answers_invalid_argument_naming_the_transaction(make_gateway, server):
    """The raw answer to a lookup and a commit in a transaction the server
    ended: INVALID_ARGUMENT on every server, with a message the gateway
    knows for a lost transaction (and not a bad argument of another kind)."""
    gateway = make_gateway(server)
    token = _ended_behind_the_clients_back(gateway)
    raw = _raw_client(gateway)
    key = {"partition_id": {"namespace_id": gateway.namespace}, "path": [{"kind": "Lost", "name": "a"}]}
    answers = {
        "lookup": _answer(lambda: raw.lookup(
            request={"project_id": gateway.project, "keys": [key], "read_options": {"transaction": token}})),
        "commit": _answer(lambda: raw.commit(request={
            "project_id": gateway.project, "mode": "TRANSACTIONAL", "transaction": token,
            "mutations": [{"upsert": {"key": key}}]})),
    }
    for call, (status, message) in answers.items():
        assert status == "INVALID_ARGUMENT", (server, call, status, message)
        assert type(translate_error(gexc.InvalidArgument(message), call=call)) is TransactionLost, (server, call, message)
    # And the commit that was refused wrote nothing.
    found = raw.lookup(request={"project_id": gateway.project, "keys": [key]})
    assert not found.found


@pytest.mark.parametrize("server", GATEWAYS)
def test_the_gateway_raises_transaction_lost_and_nothing_is_written(make_gateway, server):
    gateway = make_gateway(server)
    token = _ended_behind_the_clients_back(gateway)
    key = Key.of("Lost", "b", namespace=gateway.namespace)
    with pytest.raises(TransactionLost) as read:
        gateway.lookup([key], transaction=token)
    with pytest.raises(TransactionLost) as written:
        gateway.commit([Upsert(RawEntity(key, {"n": 1}))], transaction=token)
    for raised in (read.value, written.value):
        assert not isinstance(raised, BadValueError)
        assert "nothing of it was applied" in str(raised)
    assert gateway.lookup([key]) == [None]
