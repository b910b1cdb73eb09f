"""``DistributedCounter``: Firestore's "Distributed counters" page's
documents, written and read by this port and by the page's own algorithm
(``firestore_page.PageCounter``, written from the page's Python sample) at
once, on the embedded engine (document paths as key paths)."""

from __future__ import annotations

import os
import random
import threading

import pytest
from firestore_page import PageCounter

from gds_counter import BadKeyError, BadValueError, DistributedCounter, NotFound, get_counts, open_gateway
from gds_counter.counter import FIRESTORE_PAGE, counter_names_plan
from gds_counter.gateway import plan
from gds_counter.gateway.base import run_query_all
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.query import PropertyFilter, Query
from gds_counter.gateway.values import RawEntity

PATH = "counters/likes"


def documents(gateway, path=PATH) -> dict[str, dict]:
    """Every document under the counter's document, by path, as stored."""
    query = Query(None, filter=PropertyFilter("__key__", "HAS_ANCESTOR", Key.of(*path.split("/"))))
    return {"/".join(map(str, row.key.flat_path)): dict(row.properties) for row in run_query_all(gateway, query)}


def test_the_page_layout_exactly(gateway):
    """The counter is a document with ``num_shards``; its shards are the
    documents "0".."N-1" of its subcollection ``shards``, each an integer
    ``count``; the first write creates all N (the page's ``init_counter``)."""
    counter = DistributedCounter(PATH, 4, gateway=gateway)
    counter.add(3)
    stored = documents(gateway)
    assert stored[PATH] == {"num_shards": 4}
    shards = {path: fields for path, fields in stored.items() if path.startswith(PATH + "/shards/")}
    assert sorted(shards) == [f"{PATH}/shards/{n}" for n in range(4)]
    assert all(set(fields) == {"count"} and type(fields["count"]) is int for fields in shards.values())
    assert sum(fields["count"] for fields in shards.values()) == 3
    assert set(stored) == {PATH, *shards}  # nothing else of ours (no rollup unless asked for one)


def test_the_apps_fields_on_the_counter_document_are_kept(gateway):
    """The counter document is the app's too (a post, say): recording and
    growing the shard count writes ``num_shards`` alone."""
    gateway.commit([Upsert(RawEntity(Key.of("counters", "likes"), {"title": "Hello", "num_shards": 2}))])
    counter = DistributedCounter(PATH, 5, gateway=gateway)
    counter.add(1)
    counter.increase_shards(7)
    assert documents(gateway)[PATH] == {"title": "Hello", "num_shards": 7}


@pytest.mark.parametrize("page_shards", [1, 3, 10, 25])
def test_the_page_and_this_port_count_into_one_counter(gateway, page_shards):
    """Page writers (any ``num_shards``, more or fewer than ours) and ours
    at once: each reader sees every acknowledged increment of both."""
    rng = random.Random(page_shards)
    page = PageCounter(page_shards, rng)
    page.init_counter(gateway, PATH)
    ours = DistributedCounter(PATH, 10, gateway=gateway)
    acknowledged = 0
    for step in range(200):
        if rng.random() < 0.5:
            page.increment_counter(gateway, PATH)
            acknowledged += 1
        else:
            amount = rng.randint(-3, 5)
            ours.add(amount)
            acknowledged += amount
    assert page.get_count(gateway, PATH) == acknowledged
    assert ours.get_count() == acknowledged
    assert ours.get_count(method="lookup") == sum(count for _, count in ours.shards("lookup"))
    assert sum(count for _, count in ours.shards()) == acknowledged


def test_the_pages_writers_never_meet_a_missing_shard_of_ours(gateway):
    """The page's writers ``update`` (a missing shard is NOT_FOUND): every
    shard this port records, at its first write and when it grows, exists
    before that call returns."""
    ours = DistributedCounter(PATH, 3, gateway=gateway)
    with pytest.raises(NotFound):  # the page's update on a shard nobody created (the page's own contract)
        PageCounter(3).increment_counter(gateway, PATH)
    ours.add(1)
    ours.increase_shards(6)
    page = PageCounter(6, random.Random(1))
    for _ in range(60):
        page.increment_counter(gateway, PATH)
    assert ours.get_count() == 61 == page.get_count(gateway, PATH)


def test_a_failed_creation_of_the_shard_documents_is_made_again_at_the_next_write():
    """Both creation commits of the first write fail (the one before the
    recording and the one tried again after it): logged, not raised (the
    increment is written on its own). The counter's next write must create
    the shards then, as ``_create_shards`` promises. Its recording
    transaction finds ``num_shards`` recorded already, by this very
    counter: that is no sign that another writer recorded and created
    them. (Before the fix it was read as one: the shards were never made,
    and the page's writers met missing ones for good. The failure-point
    harness found it: a stall or an interrupt at ``documents.creates``.)"""
    from gds_counter.testing.faults import UNAVAILABLE, FaultyGateway

    # Commits of the first write: the creation, the recording transaction's, the creation again, the increment.
    gateway = FaultyGateway(open_gateway("memory://"), script={"commit": [UNAVAILABLE, None, UNAVAILABLE]})
    ours = DistributedCounter(PATH, 8, gateway=gateway)
    ours.add(1)
    assert gateway.injector.injected == {("commit", UNAVAILABLE): 2}
    shards = [f"{PATH}/shards/{n}" for n in range(8)]
    assert sorted(p for p in documents(gateway) if "/shards/" in p) != shards  # the creation failed
    ours.add(1)
    assert sorted(p for p in documents(gateway) if "/shards/" in p) == shards
    page = PageCounter(8, random.Random(3))
    for _ in range(40):  # each an update of a random shard: a missing one is NOT_FOUND
        page.increment_counter(gateway, PATH)
    assert ours.get_count() == 42 == page.get_count(gateway, PATH)


@pytest.mark.parametrize("first_creation", ["made", "failed"])
def test_a_recording_whose_answer_was_lost_still_has_its_shard_documents_made(first_creation):
    """The recording transaction's commit is applied but its answer is lost
    (``CommitUnknown``; as an interrupt or a cancellation right after the
    commit): this process cannot know it recorded ``num_shards``. Its next
    write finds them recorded and must still create the shards, not take
    the record for another writer's, who created them. (Before the fix no
    process ever made them. The failure-point harness found it: an
    interrupt or a cancellation at ``documents.recorded``.)"""
    from gds_counter import CommitUnknown
    from gds_counter.testing.faults import DEADLINE_EXCEEDED, UNAVAILABLE, FaultyGateway

    # Commits of the first write: the creation, then the recording transaction's (its answer lost).
    creation = None if first_creation == "made" else UNAVAILABLE
    gateway = FaultyGateway(open_gateway("memory://"), script={"commit": [creation, DEADLINE_EXCEEDED]})
    ours = DistributedCounter(PATH, 8, gateway=gateway)
    with pytest.raises(CommitUnknown):
        ours.add(1)
    assert documents(gateway)[PATH] == {"num_shards": 8}  # the recording was applied
    ours.add(1)
    shards = [f"{PATH}/shards/{n}" for n in range(8)]
    assert sorted(p for p in documents(gateway) if "/shards/" in p) == shards
    page = PageCounter(8, random.Random(4))
    for _ in range(40):  # each an update of a random shard: a missing one is NOT_FOUND
        page.increment_counter(gateway, PATH)
    assert ours.get_count() == 41 == page.get_count(gateway, PATH)


def test_reset_keeps_the_shard_documents(gateway):
    """A reset writes 0 to every shard: the page's writers still find them."""
    ours = DistributedCounter(PATH, 4, gateway=gateway)
    PageCounter(9).init_counter(gateway, PATH)
    for _ in range(10):
        ours.add(2)
    ours.reset()
    assert ours.get_count() == 0
    page = PageCounter(9, random.Random(2))
    for _ in range(9):
        page.increment_counter(gateway, PATH)
    assert ours.get_count() == 9


def test_a_rollup_lives_beside_the_shards_where_the_pages_reader_never_looks(gateway):
    ours = DistributedCounter(PATH, 4, gateway=gateway)
    ours.add(5)
    assert ours.get_count(max_age=60) == 5
    stored = documents(gateway)
    assert f"{PATH}/rollup/total" in stored
    assert PageCounter(4).get_count(gateway, PATH) == 5  # the page sums ``shards`` only


def test_counters_at_nested_paths_stay_apart(gateway):
    """A counter whose document is itself inside another counter's
    subcollections counts alone: its shards are not its ancestor's."""
    outer = DistributedCounter("a/b", 2, gateway=gateway)
    inner = DistributedCounter("a/b/shards/x", 2, gateway=gateway)
    deeper = DistributedCounter("a/b/posts/p/comments/c", 2, gateway=gateway)
    outer.add(1)
    inner.add(10)
    deeper.add(100)
    assert get_counts([outer, inner, deeper]) == [1, 10, 100]
    assert [outer.get_count(), inner.get_count(), deeper.get_count()] == [1, 10, 100]
    names = plan.run(counter_names_plan(FIRESTORE_PAGE, ""), gateway)
    assert names == ["a/b", "a/b/posts/p/comments/c", "a/b/shards/x"]


def test_threads_count_exactly(gateway):
    counter = DistributedCounter(PATH, 4, gateway=gateway)
    per_thread = 50

    def work():
        for _ in range(per_thread):
            counter.add(1)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert counter.get_count() == 6 * per_thread == PageCounter(4).get_count(gateway, PATH)


@pytest.mark.parametrize(
    "path, why",
    [
        ("counters", "names a collection"),
        ("counters/likes/shards", "names a collection"),
        ("/counters/likes", "empty segment"),
        ("counters//likes/x", "empty segment"),
        ("counters/likes/", "empty segment"),
        ("counters/__likes__", "reserved"),
        ("__c__/likes", "reserved"),
        ("counters/..", "not allowed"),
        ("counters/" + "x" * 1501, "over 1500 bytes"),
        ("counters/" + "é" * 751, "over 1500 bytes"),
        ("counters/" + "b" * 1500, "at most 1,499"),  # a legal id, but its shards' range could not be read
        ("/".join(["c", "d" * 1499] * 4 + ["e", "x" * 40]), "leaves no room"),  # 6,050 bytes
    ],
)
def test_bad_paths_are_refused_before_anything_is_written(tmp_path, path, why):
    """A ``BadKeyError`` naming the path; the database file is not even made."""
    target = tmp_path / "never.db"
    with pytest.raises(BadKeyError, match=why) as raised:
        DistributedCounter(path, gateway=f"sqlite:///{target}")
    assert repr(path[:30])[:-1] in str(raised.value)
    assert not os.path.exists(target)


@pytest.mark.parametrize("num_shards", [0, -1, 10_001, 2.5, "3", True])
def test_shard_counts_out_of_bounds_are_refused(tmp_path, num_shards):
    target = tmp_path / "never.db"
    with pytest.raises(BadValueError):
        DistributedCounter(PATH, num_shards, gateway=f"sqlite:///{target}")
    assert not os.path.exists(target)


def test_the_default_is_the_pages_ten_shards():
    gateway = open_gateway("memory://")
    counter = DistributedCounter(PATH, gateway=gateway)
    assert counter.increment() == 1
    assert counter.num_shards == 10
    assert counter.path == PATH
    gateway.close()


def test_auto_grow_records_and_creates_the_new_shard_documents(tmp_path):
    """Under a model of Firestore's per-document write limit, a counter that
    grows records its new shard count on its document and creates every
    new shard there, for the page's writers; nothing is lost."""
    from gds_counter import AutoGrow, RetryPolicy
    from gds_counter.gateway.embedded import EmbeddedGateway

    gateway = EmbeddedGateway(str(tmp_path / "slow.sqlite3"), entity_writes_per_second=20)
    try:
        counter = DistributedCounter(
            PATH, 1, gateway=gateway, strategy="transactional",
            auto_grow=AutoGrow(after_attempts=2, factor=8, max_shards=8),
            retry=RetryPolicy(attempts=30, initial=0.001, maximum=0.01),
        )
        threads = [threading.Thread(target=lambda: [counter.add(1) for _ in range(10)]) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert counter.num_shards == 8 and gateway.stats["counter.grown"] >= 1
        stored = documents(gateway)
        assert stored[PATH] == {"num_shards": 8}
        assert sorted(p for p in stored if "/shards/" in p) == [f"{PATH}/shards/{n}" for n in range(8)]
        assert counter.get_count() == 40 == PageCounter(8).get_count(gateway, PATH)
    finally:
        gateway.close()


@pytest.mark.parametrize("cache", ["local", "redis"])
def test_the_caches_see_every_write_of_the_page_layout(gateway, cache, request):
    """``cache=True`` (this process's) and a Redis cache shared by processes
    keep a distributed counter's total as they keep the articles'."""
    setting = True if cache == "local" else request.getfixturevalue("redis_server").url
    writer = DistributedCounter(PATH, 4, gateway=gateway, cache=setting)
    reader = DistributedCounter(PATH, 4, gateway=gateway, cache=setting)
    assert reader.get_count() == 0
    writer.add(3)
    assert reader.get_count() == 3
    writer.increment(2)
    assert reader.get_count() == 5 == PageCounter(4).get_count(gateway, PATH)


def test_shard_documents_are_made_before_the_count_that_needs_them_is_recorded(tmp_path):
    """A process that dies right after recording ``num_shards`` must leave
    no shard of that count missing for the page's writers: the shards are
    committed first, the count on the counter document after."""
    gateway = open_gateway(f"sqlite:///{tmp_path / 'order.db'}")
    commits: list[set[str]] = []
    hook = gateway._commit

    def watched(mutations, txn):
        commits.append({"/".join(map(str, m.entity.key.flat_path)) for m in mutations if hasattr(m, "entity")})
        return hook(mutations, txn)

    gateway._commit = watched
    try:
        counter = DistributedCounter(PATH, 3, gateway=gateway)
        counter.add(1)
        counter.increase_shards(5)
    finally:
        gateway.close()
    recordings = [i for i, keys in enumerate(commits) if PATH in keys]
    assert len(recordings) == 2
    for recording, upto in zip(recordings, (3, 5)):
        made = set().union(*commits[:recording])
        assert {f"{PATH}/shards/{n}" for n in range(upto)} <= made


def test_get_counts_sees_the_page_writers_shards_beyond_ours(gateway):
    """``get_counts`` reads a distributed counter as its ``get_count`` does:
    every document in ``shards``, also those of page writers with more
    shards than this port recorded (a lookup of its own keys missed them)."""
    PageCounter(16).init_counter(gateway, PATH)
    page = PageCounter(16, random.Random(5))
    for _ in range(100):
        page.increment_counter(gateway, PATH)
    ours = DistributedCounter(PATH, 4, gateway=gateway)
    ours.add(1)
    assert get_counts([ours]) == [101] == [ours.get_count()]
    assert get_counts([ours], use_cache=False) == [101]


def test_a_refused_shrink_writes_nothing_and_names_the_recorded_count():
    """``increase_shards`` below the count another writer recorded is a
    ``BadValueError`` naming that count, raised before anything is
    committed (the shard documents are made only for a count that will be
    recorded)."""
    gateway = open_gateway("memory://")
    DistributedCounter(PATH, 40, gateway=gateway).add(1)
    late = DistributedCounter(PATH, 10, gateway=gateway)  # has not read the counter document yet
    commits = []
    hook = gateway._commit
    gateway._commit = lambda mutations, txn: (commits.append(mutations), hook(mutations, txn))[1]
    with pytest.raises(BadValueError, match="has 40 shards"):
        late.increase_shards(20)
    assert commits == []
    gateway.close()


def test_increase_shards_ends_at_the_policys_deadline_behind_a_stalled_lock(tmp_path):
    """Another process holds the file's write lock: ``increase_shards``
    gives up at its policy's deadline (the shard creation and the recording
    both wait for that lock), not 30 s later."""
    import sqlite3
    import time

    from gds_counter import Contention, GDSError, RetryPolicy

    path = tmp_path / "stalled.db"
    counter = DistributedCounter(PATH, 2, gateway=f"sqlite:///{path}", retry=RetryPolicy(deadline=1.0))
    counter.add(1)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        began = time.monotonic()
        with pytest.raises(GDSError) as raised:
            counter.increase_shards(20)
        took = time.monotonic() - began
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert isinstance(raised.value, Contention), raised.value
    assert took < 3.0
