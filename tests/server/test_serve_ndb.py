"""google-cloud-ndb, unchanged, running the Google article's general counter
against ``gds-counter serve``, while gds_counter's ``GeneralCounter`` counts
into the same counter on the engine behind it: one store, two libraries, no
increment lost."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from gds_counter.counter.general import GeneralCounter

ndb = pytest.importorskip("google.cloud.ndb", reason="google-cloud-ndb is in the dev extra")


class GeneralCounterShardConfig(ndb.Model):
    """The article's config entity: how many shards a named counter has."""

    num_shards = ndb.IntegerProperty(default=20)


class GeneralCounterShard(ndb.Model):
    """The article's shard: one part of a named counter's total."""

    count = ndb.IntegerProperty(default=0)


def get_count(name: str) -> int:
    config = GeneralCounterShardConfig.get_or_insert(name)
    keys = [ndb.Key(GeneralCounterShard, f"shard-{name}-{i}") for i in range(config.num_shards)]
    return sum(shard.count for shard in ndb.get_multi(keys) if shard is not None)


def increment(name: str) -> None:
    config = GeneralCounterShardConfig.get_or_insert(name)
    _add_one(name, config.num_shards)


@ndb.transactional(retries=50)
def _add_one(name: str, num_shards: int) -> None:
    shard_id = f"shard-{name}-{random.randrange(num_shards)}"
    shard = GeneralCounterShard.get_by_id(shard_id) or GeneralCounterShard(id=shard_id)
    shard.count += 1
    shard.put()


def test_ndbs_general_counter_and_gds_counters_count_into_one_counter(
    server: Any, served: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", server.emulator_host)
    client = ndb.Client(project="ndb-app")  # the default namespace, where GeneralCounter counts
    name = f"hits-{namespace}"  # the module's tests share the store
    _, gateway = served
    ours = GeneralCounter(name, gateway=gateway)
    errors: list[BaseException] = []

    def with_ndb(times: int) -> None:
        try:
            with client.context():
                for _ in range(times):
                    increment(name)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def with_gds_counter(times: int) -> None:
        try:
            for _ in range(times):
                ours.add()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [threading.Thread(target=with_ndb, args=(15,)) for _ in range(3)]
    threads += [threading.Thread(target=with_gds_counter, args=(10,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not errors, errors
    with client.context():
        assert get_count(name) == 3 * 15 + 2 * 10
        assert GeneralCounterShardConfig.get_by_id(name).num_shards == 20
    assert ours.get_count() == 65
