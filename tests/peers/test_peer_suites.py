"""googleapis/python-datastore's own system tests on ``gds-counter serve``,
over gRPC and over REST (binary protobuf), as its repository runs them
against an emulator: every test that passed on the Firestore emulator in
Datastore mode, in every run recorded in ``docs/peer_suites.json``
(``python tests/peers/peer_suites.py --target emulator --record ...``), must
pass on serve. The suite comes from the source distribution of the
google-cloud-datastore installed here; python-ndb's suite, which its
distribution does not ship, is recorded there from its repository."""

from __future__ import annotations

import json
import sys
from importlib import metadata
from pathlib import Path

import pytest
from sizes import params

sys.path.insert(0, str(Path(__file__).parent))
import peer_suites  # noqa: E402

RECORD = Path(__file__).parents[2] / "docs" / "peer_suites.json"


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return peer_suites.datastore_suite(tmp_path_factory.mktemp("peer"))


@pytest.mark.parametrize("transport", params(peer_suites.TRANSPORTS, quick=["rest"]))
def test_python_datastore_system_tests_pass_on_serve_where_they_pass_on_the_emulator(
        suite: Path, transport: str, tmp_path: Path) -> None:
    runs = json.loads(RECORD.read_text())["datastore"][transport]["emulator"]
    recorded = [run["outcomes"] for run in runs]
    assert recorded, "the record holds the emulator's runs"
    installed = metadata.version("google-cloud-datastore")
    assert {run["client"] for run in runs} == {installed}, (
        f"the record is of another google-cloud-datastore's suite than {installed}: record the emulator's runs "
        "again (python tests/peers/peer_suites.py --target emulator --record ...)")
    with peer_suites._Serve() as host:
        served = peer_suites.run_suite(sys.executable, suite, host, transport, tmp_path / "junit.xml")
    passed_on_emulator = {name for name in recorded[0] if all(run.get(name) == "passed" for run in recorded)}
    assert len(served) > 100 and passed_on_emulator & set(served), "the suite ran the recorded tests"
    assert peer_suites.regressions(recorded, served) == []
