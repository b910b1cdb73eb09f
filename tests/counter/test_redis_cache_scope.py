"""Whose counters a shared cache's keys are (``counter._storage_scope``): one
storage, however its address is spelled, is one key space, so a total one
process cached counts what another process added through the same storage
under another address; and a setup where the library cannot tell is
refused before anything is written."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from gds_counter.counter import CounterShardDS
from gds_counter.errors import BadValueError
from gds_counter.gateway import open_gateway
from gds_counter.gateway.datastore import DatastoreGateway

#: A process of its own: adds ``argv[3]`` to "Counter Test" 1 on the storage
#: ``argv[1]`` (its URL; a Datastore one reads ``DATASTORE_EMULATOR_HOST``)
#: through the cache ``argv[2]``.
_ADD = """
import sys
from gds_counter.counter import CounterShardDS
from gds_counter.gateway import open_gateway
gateway = open_gateway(sys.argv[1])
CounterShardDS("Counter Test", 1, gateway=gateway, cache=sys.argv[2]).add(int(sys.argv[3]))
gateway.close()
"""


def _add_in_another_process(storage_url: str, cache: str, amount: int, env: dict[str, str] | None = None) -> None:
    done = subprocess.run([sys.executable, "-c", _ADD, storage_url, cache, str(amount)], capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr


def test_an_emulator_reached_as_localhost_and_as_127_0_0_1_is_one_key_space(firestore_emulator, redis_server):
    """A reader with ``localhost:P`` cached a total; a writer in another
    process with ``127.0.0.1:P`` added 5 and returned: the reader's next
    read has the 5 (the emulator is one storage, however it is spelled)."""
    port = firestore_emulator.host.rpartition(":")[2]
    namespace = f"scope-{uuid.uuid4().hex[:8]}"
    reader_gateway = DatastoreGateway(firestore_emulator.project, namespace=namespace, emulator_host=f"localhost:{port}")
    try:
        reader = CounterShardDS("Counter Test", 1, gateway=reader_gateway, cache=redis_server.url)
        assert reader.get_count() == 0  # cached
        _add_in_another_process(f"datastore://{firestore_emulator.project}?namespace={namespace}", redis_server.url, 5,
                                {"DATASTORE_EMULATOR_HOST": f"127.0.0.1:{port}"})
        assert reader.get_count() == 5
    finally:
        reader_gateway.close()


def test_gds_counter_serve_and_the_sqlite_file_it_serves_are_one_key_space(redis_server, tmp_path):
    """Clients of ``gds-counter serve`` (of any project: the server's store
    is not divided by project) and a process opening the SQLite file it
    serves reach one storage: a total cached through the server has the
    adds made directly on the file, and the other way round."""
    from gds_counter.server import serving

    path = tmp_path / "served.sqlite3"
    namespace = f"scope-{uuid.uuid4().hex[:8]}"
    with serving(f"sqlite:///{path}") as server:
        clients = [DatastoreGateway(project, namespace=namespace, emulator_host=server.emulator_host)
                   for project in ("one-project", "another-project")]
        direct = open_gateway(f"sqlite:///{path}?namespace={namespace}")
        try:
            served = [CounterShardDS("Counter Test", 1, gateway=client, cache=redis_server.url) for client in clients]
            on_file = CounterShardDS("Counter Test", 1, gateway=direct, cache=redis_server.url)
            assert [counter.get_count() for counter in served] == [0, 0]  # cached
            _add_in_another_process(f"sqlite:///{path}?namespace={namespace}", redis_server.url, 5)
            assert [counter.get_count() for counter in served] == [5, 5]
            assert on_file.get_count() == 5  # cached
            served[1].add(2)
            assert on_file.get_count() == 7
            assert served[0].get_count() == 7
        finally:
            direct.close()
            for client in clients:
                client.close()


def test_each_database_gds_counter_serve_serves_is_a_key_space_of_its_own(redis_server, tmp_path):
    """A named database is a store of its own on the server: a total cached
    for one database is never another's, and a database's clients share
    one key space with a process opening its file (``served@NAME``)."""
    from gds_counter.server import serving

    path = tmp_path / "served.sqlite3"
    namespace = f"scope-{uuid.uuid4().hex[:8]}"
    with serving(f"sqlite:///{path}") as server:
        default, reports = (DatastoreGateway("p", namespace=namespace, database=database,
                                             emulator_host=server.emulator_host) for database in ("", "reports"))
        try:
            on_default, on_reports = (CounterShardDS("Counter Test", 1, gateway=gateway, cache=redis_server.url)
                                      for gateway in (default, reports))
            on_default.add(5)
            assert (on_default.get_count(), on_reports.get_count()) == (5, 0)
            on_reports.add(1)
            assert (on_default.get_count(), on_reports.get_count()) == (5, 1)
            _add_in_another_process(f"sqlite:///{tmp_path / 'served@reports.sqlite3'}?namespace={namespace}",
                                    redis_server.url, 3)
            assert (on_default.get_count(), on_reports.get_count()) == (5, 4)
        finally:
            default.close()
            reports.close()


@pytest.mark.skipif(not hasattr(os, "link"), reason="hard links")
def test_one_sqlite_file_under_two_names_is_one_key_space(redis_server, tmp_path):
    """A hard link is the same file under another name (so is a bind mount
    in a container): a total cached through one name has the adds made
    through the other."""
    first = tmp_path / "counts.sqlite3"
    gateway = open_gateway(f"sqlite:///{first}")
    try:
        reader = CounterShardDS("Counter Test", 1, gateway=gateway, cache=redis_server.url)
        assert reader.get_count() == 0  # cached
        (tmp_path / "elsewhere").mkdir()
        second = tmp_path / "elsewhere" / "same.sqlite3"
        os.link(first, second)
        _add_in_another_process(f"sqlite:///{second}", redis_server.url, 3)
        assert reader.get_count() == 3
    finally:
        gateway.close()


def test_an_emulator_on_another_machine_needs_the_storage_named(redis_server):
    """An emulator that is not on this machine may be reached by other
    processes under another address (a container's service name, a port
    mapped to localhost) that the library cannot tell is the same: such a
    cache is refused when the counter is made, unless the cache URL names
    the storage (``scope=``; every process the same)."""
    remote = DatastoreGateway("a-project", emulator_host="192.0.2.7:8081")  # TEST-NET-1: never this machine
    try:
        with pytest.raises(BadValueError, match=r"192\.0\.2\.7:8081.*scope="):
            CounterShardDS("Counter Test", 1, gateway=remote, cache=redis_server.url)
        named = CounterShardDS("Counter Test", 1, gateway=remote, cache=redis_server.url + "?scope=team-emulator")
        assert named._cache is not None and named._cache.scope == "named/team-emulator"
    finally:
        remote.close()


def test_the_default_database_spelled_empty_or_default_is_one_database_and_one_key_space(firestore_emulator,
                                                                                           redis_server, monkeypatch):
    """``database=(default)`` is how Firestore names the default database in
    its resource names; the Datastore API takes it only as ``""``. Both
    spellings reach the one default database (a write through either is
    counted, not refused at every call) and share its cached totals."""
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", firestore_emulator.host)
    namespace = f"scope-{uuid.uuid4().hex[:8]}"
    plain = open_gateway(f"datastore://{firestore_emulator.project}?namespace={namespace}")
    named = open_gateway(f"datastore://{firestore_emulator.project}?namespace={namespace}&database=(default)")
    try:
        reader = CounterShardDS("Counter Test", 1, gateway=plain, cache=redis_server.url)
        assert reader.get_count() == 0  # cached
        CounterShardDS("Counter Test", 1, gateway=named, cache=redis_server.url).add(5)
        assert reader.get_count() == 5  # the same key space: the writer added to the cached total
        assert CounterShardDS("Counter Test", 1, gateway=plain).get_count() == 5  # the same database
        assert named.database == plain.database == ""
    finally:
        plain.close()
        named.close()
