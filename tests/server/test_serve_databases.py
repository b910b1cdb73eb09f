"""Named databases are stores of their own on ``gds-counter serve``, as on
the Firestore emulator in Datastore mode: the same calls through
google-cloud-datastore's client (``database=``) on both, the same outcomes."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import requests

from gds_counter.server import named_url, serving


def clients(target: tuple[str, str], monkeypatch: pytest.MonkeyPatch, *databases: str) -> list[Any]:
    from google.cloud import datastore

    host, project = target
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", host)
    namespace = f"t-{uuid.uuid4().hex[:12]}"
    return [datastore.Client(project=project, namespace=namespace, database=database) for database in databases]


def snapshot(client: Any) -> dict[str, Any]:
    """What one database holds of the test's entities, by key name."""
    return {entity.key.name: entity.get("v") for entity in client.query(kind="Row").fetch()}


def test_what_is_written_to_one_database_is_not_seen_in_another(
        target: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from google.cloud import datastore

    default, reports, archive = clients(target, monkeypatch, "", "reports-db", "archive_2")
    for client, value in ((default, "default"), (reports, "reports")):
        row = datastore.Entity(client.key("Row", "same-name"))
        row["v"] = value
        client.put(row)
    only = datastore.Entity(reports.key("Row", "only-in-reports"))
    only["v"] = 1
    reports.put(only)

    assert snapshot(default) == {"same-name": "default"}
    assert snapshot(reports) == {"same-name": "reports", "only-in-reports": 1}
    assert snapshot(archive) == {}
    assert default.get(default.key("Row", "only-in-reports")) is None
    found = reports.get(reports.key("Row", "only-in-reports"))
    assert found is not None and found.key.database == "reports-db"
    count = reports.aggregation_query(reports.query(kind="Row")).count(alias="n")
    assert [[r.value for r in results] for results in count.fetch()] == [[2]]

    with reports.transaction():  # a transaction of one database writes there only
        row = reports.get(reports.key("Row", "same-name"))
        row["v"] = "changed"
        reports.put(row)
    assert (snapshot(default)["same-name"], snapshot(reports)["same-name"]) == ("default", "changed")


def test_a_transaction_of_one_database_is_unknown_in_another(
        target: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    from google.api_core import exceptions

    default, reports = clients(target, monkeypatch, "", "reports-db")
    token = reports._datastore_api.begin_transaction(
        request={"project_id": reports.project, "database_id": "reports-db"}).transaction
    with pytest.raises(exceptions.InvalidArgument):
        default._datastore_api.commit(request={"project_id": default.project, "mode": 1, "transaction": token})


def test_the_default_database_by_name_is_refused(target: tuple[str, str]) -> None:
    host, project = target
    answer = requests.post(f"http://{host}/v1/projects/{project}:lookup", timeout=10,
                           json={"databaseId": "(default)", "keys": [{"path": [{"kind": "Row", "name": "x"}]}]})
    assert (answer.status_code, answer.json()["error"]["status"]) == (400, "INVALID_ARGUMENT")


def test_a_named_database_is_a_file_beside_the_served_one(tmp_path: Path) -> None:
    served = tmp_path / "served.sqlite3"
    assert named_url(f"sqlite:///{served}?project=p", "reports") == f"sqlite:///{tmp_path}/served@reports.sqlite3?project=p"
    assert named_url("memory://", "reports") == "memory://"
    with serving(f"sqlite:///{served}") as server:
        for database in ("reports", "../escape", "a/b", "x" * 64):
            requests.post(f"http://{server.emulator_host}/v1/projects/p:commit", timeout=10, json={
                "databaseId": database, "mode": "NON_TRANSACTIONAL",
                "mutations": [{"upsert": {"key": {"path": [{"kind": "Row", "name": "r"}]}}}]})
    # only the valid id was opened; the others were refused before any file was made
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [
        "served.sqlite3", "served@reports.sqlite3"]


@pytest.mark.parametrize("database, key_database", [("", "zzz"), ("reports-db", "zzz"), ("reports-db", ""),
                                                    ("reports-db", "reports-db")])
def test_a_key_of_another_database_is_refused_not_written_to_the_requests(
        target: tuple[str, str], database: str, key_database: str) -> None:
    """A key whose partition names another database than the request's
    ("mismatched databases within request" on the emulator; a key naming
    none is the default database's)."""
    host, project = target
    key = {"partitionId": {"projectId": project, "databaseId": key_database}, "path": [{"kind": "Row", "name": "k"}]}
    body = {"databaseId": database, "mode": "NON_TRANSACTIONAL", "mutations": [{"upsert": {"key": key}}]}
    answer = requests.post(f"http://{host}/v1/projects/{project}:commit", json=body, timeout=10)
    if key_database == database:
        assert answer.status_code == 200, answer.text
        return
    assert (answer.status_code, answer.json()["error"]["status"]) == (400, "INVALID_ARGUMENT")
    assert "mismatched databases" in answer.json()["error"]["message"]
    looked = requests.post(f"http://{host}/v1/projects/{project}:lookup", timeout=10, json={
        "databaseId": database, "keys": [{"path": [{"kind": "Row", "name": "k"}]}]}).json()
    assert "found" not in looked


@pytest.mark.parametrize("database", ["rep\n", "rep ", " rep", "r/p"])
def test_a_database_id_with_other_characters_is_refused(target: tuple[str, str], database: str) -> None:
    host, project = target
    answer = requests.post(f"http://{host}/v1/projects/{project}:lookup", timeout=10,
                           json={"databaseId": database, "keys": [{"path": [{"kind": "Row", "name": "x"}]}]})
    assert (answer.status_code, answer.json()["error"]["status"]) == (400, "INVALID_ARGUMENT")
