"""8 threads in each of 3 processes, 100 increments each: exactly 2,400,
for every strategy, on the embedded file and on both emulators (the quick
run: 10 increments each, exactly 240; ``tests/sizes.py``).

Processes are started with ``spawn`` (no inherited connections) and get the
storage as a URL plus, for the emulators, the emulator's host in their
environment, as any other app would.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import traceback
import uuid

import pytest
from sizes import params, size

from gds_counter.counter import CounterShardDS
from gds_counter.gds import RetryPolicy

PROCESSES, THREADS, PER_THREAD = 3, 8, size(10, 100)
EXPECTED = PROCESSES * THREADS * PER_THREAD
#: 24 writers on 20 shards do collide; a counter in production under this
#: load would be given this patience (or auto-grow).
RETRY = RetryPolicy(attempts=12, initial=0.01, maximum=0.5)


def _worker(url: str, env: dict[str, str], strategy: str, target_id: str) -> None:
    os.environ.update(env)
    from gds_counter.gateway import open_gateway

    gateway = open_gateway(url)
    counter = CounterShardDS("Concurrency", target_id, gateway=gateway, strategy=strategy, retry=RETRY)
    failures: list[str] = []

    def run() -> None:
        try:
            for _ in range(PER_THREAD):
                counter.add()
        except Exception:  # noqa: BLE001 - reported through the exit code
            failures.append(traceback.format_exc())

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gateway.close()
    if failures:
        print(failures[0], flush=True)
        raise SystemExit(1)


def _run(url: str, env: dict[str, str], strategy: str, reader) -> None:
    target_id = uuid.uuid4().hex[:8]
    ctx = multiprocessing.get_context("spawn")
    workers = [ctx.Process(target=_worker, args=(url, env, strategy, target_id)) for _ in range(PROCESSES)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(300)
    assert [worker.exitcode for worker in workers] == [0] * PROCESSES
    counter = CounterShardDS("Concurrency", target_id, gateway=reader)
    assert counter.get_count() == EXPECTED
    assert counter.get_count(method="query") == EXPECTED


STRATEGIES = ["transactional", "increment", "auto", "auto-grow"]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_sqlite_file(strategy, tmp_path):
    from gds_counter.gateway import open_gateway

    url = f"sqlite:///{tmp_path / 'concurrency.sqlite3'}"
    reader = open_gateway(url)
    try:
        _run(url, {}, strategy, reader)
    finally:
        reader.close()


# The legacy Datastore emulator ignores transforms, so "increment" cannot
# count there at all; test_strategies shows it refusing instead of losing.
EMULATOR_CASES = [(e, s) for e in ("datastore", "firestore") for s in STRATEGIES if (e, s) != ("datastore", "increment")]


@pytest.mark.slow
@pytest.mark.parametrize("emulator, strategy", params(EMULATOR_CASES, quick=[("datastore", "transactional"), ("firestore", "auto")],
                                                     several=True))
def test_emulators(emulator, strategy, request):
    reader = request.getfixturevalue(f"{emulator}_gateway")
    emu = request.getfixturevalue(f"{emulator}_emulator")
    url = f"datastore://{emu.project}?namespace={reader.namespace}"
    _run(url, emu.env, strategy, reader)


def test_writers_of_one_process_never_take_a_shard_another_of_them_holds(gateway):
    """Shard affinity: with fewer writers than shards, no two threads of one
    process ever write the same shard at once, even through separate
    counter objects (one per request) for the same counter."""
    import threading
    import time

    from gds_counter.counter import Shard
    from gds_counter.counter.strategy import STRATEGIES

    lock = threading.Lock()
    in_use: set[int] = set()
    clashes: list[int] = []
    writes: list[int] = []

    class Watching:
        name = "watching"

        def add(self, shard: Shard, amount: int) -> None:
            with lock:
                if shard.number in in_use:
                    clashes.append(shard.number)
                in_use.add(shard.number)
            try:
                time.sleep(0.002)  # hold it a while, as a slow commit would
                STRATEGIES["transactional"].add(shard, amount)
            finally:
                with lock:
                    in_use.discard(shard.number)
                    writes.append(shard.number)

    def writer() -> None:
        for _ in range(25):
            CounterShardDS("Counter Test", 1, gateway=gateway, strategy=Watching()).add()

    threads = [threading.Thread(target=writer) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert clashes == []
    assert len(writes) == 200 and len(set(writes)) > 8  # spread over the shards, not pinned
    assert CounterShardDS("Counter Test", 1, gateway=gateway).get_count() == 200
