"""Acceptance for issue 39 on the official Firestore emulator in native
mode: the page's algorithm, run by google-cloud-firestore itself
(``benchmarks/_firestore_page.py``: the one definition, which the
benchmark of goal 8 times too), and ``DistributedCounter`` count into one
counter at the same time, and each reader sees every acknowledged
increment of both."""

from __future__ import annotations

import random
import sys
import threading
from pathlib import Path

import pytest

from gds_counter import DistributedCounter
from gds_counter.aio import DistributedCounter as AsyncDistributedCounter

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from _firestore_page import PageClientCounter  # noqa: E402

pytestmark = pytest.mark.emulator

PATH = "counters/likes"


@pytest.fixture
def client(firestore_native_emulator, firestore_native_gateway, monkeypatch):
    """google-cloud-firestore's own client on the emulator (the gateway
    fixture cleared it), found as the page's code finds it: through
    ``FIRESTORE_EMULATOR_HOST``."""
    from google.cloud import firestore

    for name, value in firestore_native_emulator.env.items():
        monkeypatch.setenv(name, value)
    made = firestore.Client(project=firestore_native_emulator.project)
    yield made
    made.close()


@pytest.mark.parametrize("page_shards", [3, 10, 16])
def test_the_page_and_ours_at_once_on_one_counter(client, firestore_native_gateway, page_shards):
    rng = random.Random(page_shards)
    doc_ref = client.document(PATH)
    page = PageClientCounter(page_shards, rng)
    page.init_counter(doc_ref)
    ours = DistributedCounter(PATH, 10, gateway=firestore_native_gateway)
    acknowledged = {"page": 0, "ours": 0}
    lock = threading.Lock()

    def page_writer(seed: int) -> None:
        writer = PageClientCounter(page_shards, random.Random(seed))
        for _ in range(15):
            writer.increment_counter(doc_ref)
            with lock:
                acknowledged["page"] += 1

    def our_writer(seed: int) -> None:
        amounts = random.Random(seed)
        for _ in range(15):
            amount = amounts.randint(1, 4)
            ours.add(amount)
            with lock:
                acknowledged["ours"] += amount

    threads = [threading.Thread(target=page_writer, args=(i,)) for i in range(3)]
    threads += [threading.Thread(target=our_writer, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = acknowledged["page"] + acknowledged["ours"]
    assert page.get_count(doc_ref) == expected
    assert ours.get_count() == expected
    assert DistributedCounter(PATH, 2, gateway=firestore_native_gateway).get_count() == expected


def test_the_pages_update_never_meets_a_missing_shard_of_ours(client, firestore_native_gateway):
    ours = DistributedCounter(PATH, 4, gateway=firestore_native_gateway)
    ours.add(1)
    ours.increase_shards(12)
    page = PageClientCounter(12, random.Random(7))
    for _ in range(40):
        page.increment_counter(client.document(PATH))
    assert ours.get_count() == 41 == page.get_count(client.document(PATH))
    counter_doc = client.document(PATH).get().to_dict()
    assert counter_doc == {"num_shards": 12}


def test_the_apps_fields_on_the_counter_document_are_kept(client, firestore_native_gateway):
    client.document(PATH).set({"title": "Hello"})
    DistributedCounter(PATH, 3, gateway=firestore_native_gateway).add(2)
    assert client.document(PATH).get().to_dict() == {"title": "Hello", "num_shards": 3}


def test_the_asyncio_face_on_the_emulator(client, firestore_native_emulator):
    import asyncio

    from gds_counter.aio import open_gateway

    async def main() -> int:
        gateway = open_gateway(f"firestore://{firestore_native_emulator.project}")
        try:
            counter = AsyncDistributedCounter(PATH, 5, gateway=gateway)
            results = await asyncio.gather(*(counter.increment() for _ in range(20)))
            assert sorted(results)[-1] == 20
            return await counter.get_count()
        finally:
            await gateway.close()

    assert asyncio.run(main()) == 20 == PageClientCounter(5).get_count(client.document(PATH))


@pytest.mark.parametrize("target", [("a/b", 1), ("t", "x/y/z"), ("Counter Test", "1/..")])
def test_a_name_with_a_slash_is_refused_before_anything_is_sent(firestore_native_gateway, target):
    """A key name or kind holding ``/`` would name another document (more
    path segments: the PHP article's ``a/b_1_1`` would land in collection
    ``b``, where its query never looks, and the increment would be missing
    from the total): a ``BadKeyError`` naming it, made here (the server
    words its refusal otherwise), nothing written."""
    from gds_counter import BadKeyError, CounterShardDS

    counter = CounterShardDS(*target, gateway=firestore_native_gateway)
    with pytest.raises(BadKeyError, match="cannot name a Firestore document"):
        counter.increment()
    assert firestore_native_gateway.stats.snapshot()["entity_writes"] == 0
