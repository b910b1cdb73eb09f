"""What SECURITY.md promises, checked: credentials are never logged or shown,
the emulator is used only when asked for, and GQL carries user values only
as bindings."""

from __future__ import annotations

import logging
import socket

import pytest
from google.oauth2.credentials import Credentials

from gds_counter.errors import GatewayError
from gds_counter.gateway import open_gateway
from gds_counter.gateway.datastore import DatastoreGateway
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.keys import Key
from gds_counter.gds.gql import parse, to_gql

SECRET_TOKEN = "ya29.SECRET-ACCESS-TOKEN-do-not-log-0123456789"
SECRET_REFRESH = "1//SECRET-REFRESH-TOKEN-do-not-log"
SECRETS = (SECRET_TOKEN, SECRET_REFRESH, "client-secret-do-not-log")


def fake_credentials() -> Credentials:
    return Credentials(
        token=SECRET_TOKEN, refresh_token=SECRET_REFRESH, client_id="id.apps.googleusercontent.com",
        client_secret="client-secret-do-not-log", token_uri="https://oauth2.googleapis.com/token",
    )


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


def test_credentials_never_appear_in_logs_reprs_or_errors(monkeypatch, caplog, tally):
    monkeypatch.delenv("DATASTORE_EMULATOR_HOST", raising=False)
    caplog.set_level(logging.DEBUG)  # every logger, every level
    texts = []
    # production path: explicit credentials (no network needed to build the client)
    production = DatastoreGateway("my-project", credentials=fake_credentials())
    texts += [repr(production), str(production.__dict__.get("emulator_host"))]
    production.close()
    # emulator path: the credentials are ignored, with a warning that must not quote them
    emulator = DatastoreGateway("my-project", emulator_host=f"127.0.0.1:{_dead_port()}",
                                credentials=fake_credentials(), timeout=1.0)
    with pytest.raises(GatewayError) as info:
        emulator.lookup([Key.of("K", 1)])
    texts += [repr(emulator), str(info.value), repr(info.value)]
    emulator.close()
    texts += [record.getMessage() for record in caplog.records]
    texts += [caplog.text]
    assert any("credentials are ignored" in t for t in texts)
    for text in texts:
        assert_no_secret(text)
    tally.add("security: credentials in logs/reprs/errors", hostile_inputs=len(texts))


def test_the_emulator_variable_is_used_only_as_documented(monkeypatch, tmp_path):
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", "127.0.0.1:9")
    monkeypatch.delenv("GDS_URL", raising=False)
    # 1. nothing chosen: the emulator, never production
    chosen = open_gateway()
    assert isinstance(chosen, DatastoreGateway) and chosen.emulator_host == "127.0.0.1:9"
    chosen.close()
    # 2. an explicit URL or GDS_URL wins over it
    explicit = open_gateway(f"sqlite:///{tmp_path / 'x.db'}")
    assert isinstance(explicit, EmbeddedGateway)
    explicit.close()
    monkeypatch.setenv("GDS_URL", "memory://")
    assert isinstance(open_gateway(), EmbeddedGateway)
    # 3. a datastore:// URL with the variable set still goes to the emulator
    #    (as Google's own client does): production is only reached without it
    ds = open_gateway("datastore://prod-project")
    assert ds.emulator_host == "127.0.0.1:9"
    ds.close()
    monkeypatch.delenv("DATASTORE_EMULATOR_HOST")
    monkeypatch.delenv("GDS_URL")
    # 4. without the variable and without a URL: the embedded file, never production
    monkeypatch.chdir(tmp_path)
    default = open_gateway()
    assert isinstance(default, EmbeddedGateway)
    default.close()


def test_gql_text_never_contains_bound_user_values():
    evil = "x' OR '1'='1"
    query = parse("SELECT * FROM K WHERE name = @n AND tags IN @t", {"n": evil, "t": [evil, "b"]})
    assert evil not in query.gql.text
    text, bindings = to_gql(query)
    assert evil not in text and evil in repr(bindings)
