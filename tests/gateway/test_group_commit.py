"""Group commit on the embedded engine: commits that queue behind one
another in a process are written in one transaction, and each still means
what it meant alone (atomic, its own version, acknowledged only once
durable, its own error)."""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any, Callable

import pytest

from gds_counter.errors import BadValueError, Contention, GatewayError
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.embedded._encoding import key_bytes
from gds_counter.gateway.embedded._group_commit import GroupCommit, Request
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Upsert
from gds_counter.gateway.values import MAX_ENTITY_BYTES, RawEntity, entity_size


@pytest.fixture
def gw(tmp_path):
    gateway = EmbeddedGateway(str(tmp_path / "db.sqlite3"))
    yield gateway
    gateway.close()


def increment(name: str, amount: int = 1) -> Upsert:
    entity = RawEntity(Key.of("Shard", name), {"target": "T"}, frozenset({"count"}))
    return Upsert(entity, property_mask=("target",), transforms=(Increment("count", amount),))


def queued_together(gw: EmbeddedGateway, calls: list[Callable[[], Any]]) -> list[Any]:
    """Run ``calls`` in threads while this thread holds the write lock, so
    that they all queue; then let them go: one writes them all."""
    out: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            out[i] = calls[i]()
        except Exception as exc:  # collected: the test asserts on it
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    with gw._pool.write_lock:
        for thread in threads:
            thread.start()
        for _ in range(2000):  # white box: wait until every commit is queued
            if len(gw._group._queue) == len(calls):
                break
            time.sleep(0.005)
        assert len(gw._group._queue) == len(calls)
    for thread in threads:
        thread.join(60)
    return out


def versions(gw: EmbeddedGateway, names: list[str]) -> list[int]:
    assert gw.path is not None
    with sqlite3.connect(gw.path) as raw:
        return [raw.execute("SELECT version FROM entities WHERE key_bytes = ?", (key_bytes(Key.of("Shard", n)),)).fetchone()[0]
                for n in names]


def test_queued_commits_are_written_together_each_with_its_own_version(gw):
    names = [f"s{i}" for i in range(6)]
    out = queued_together(gw, [lambda n=n: gw.commit([increment(n)]) for n in names])
    assert [r.mutation_results[0].transform_results for r in out] == [(1,)] * 6
    assert gw.stats.snapshot()["grouped_commits"] == 6
    assert len(set(versions(gw, names))) == 6  # as if each had committed alone
    assert [e.properties["count"] for e in gw.lookup([Key.of("Shard", n) for n in names])] == [1] * 6


def test_commits_of_one_entity_in_a_group_apply_in_turn(gw):
    out = queued_together(gw, [lambda: gw.commit([increment("s")]) for _ in range(5)])
    assert sorted(r.mutation_results[0].transform_results[0] for r in out) == [1, 2, 3, 4, 5]
    assert gw.lookup([Key.of("Shard", "s")])[0].properties["count"] == 5


def full(name: str) -> RawEntity:
    """A shard at Datastore's entity size limit: a masked write that adds a
    property to it is refused as the stored entity and the write are
    merged, inside the write transaction."""
    pad = MAX_ENTITY_BYTES - entity_size(RawEntity(Key.of("Shard", name), {"target": "T", "p1": b"", "p2": b""}))
    halves = {"p1": b"x" * (pad // 2), "p2": b"x" * (pad - pad // 2)}  # (each under the value limit)
    return RawEntity(Key.of("Shard", name), {"target": "T", **halves}, frozenset(halves))


def test_a_commit_that_fails_in_a_group_is_raised_to_its_caller_alone(gw):
    gw.commit([Upsert(full("full"))])
    out = queued_together(gw, [
        lambda: gw.commit([increment("a")]),
        lambda: gw.commit([increment("b"), increment("full")]),  # atomic: "b" must not be written either
        lambda: gw.commit([increment("full")]),  # alone
        lambda: gw.commit([increment("c")]),
    ])
    assert isinstance(out[1], BadValueError) and "entity limit" in str(out[1])
    assert isinstance(out[2], BadValueError) and out[2] is not out[1]
    assert [r.mutation_results[0].transform_results for r in (out[0], out[3])] == [(1,), (1,)]
    found = gw.lookup([Key.of("Shard", n) for n in ("a", "b", "c", "full")])
    assert [e and e.properties.get("count") for e in found] == [1, None, 1, None]
    assert len(set(versions(gw, ["a", "c"]))) == 2


@pytest.mark.parametrize("failure", [Contention("the file stayed locked", attempts=1), GatewayError("the file was deleted")])
def test_when_the_group_transaction_fails_every_caller_raises_and_nothing_is_written(gw, monkeypatch, failure):
    def fail(conn: Any) -> None:
        raise failure

    monkeypatch.setattr(gw._pool, "check_file", fail)
    out = queued_together(gw, [lambda n=n: gw.commit([increment(n)]) for n in ("a", "b", "c")])
    assert [type(e) for e in out] == [type(failure)] * 3
    assert len({id(e) for e in out}) == 3  # each caller raises its own instance
    monkeypatch.undo()
    assert gw.lookup([Key.of("Shard", n) for n in ("a", "b", "c")]) == [None, None, None]


def test_a_failure_of_the_writers_own_says_not_written_by_its_class_to_the_others(gw, monkeypatch):
    """The writer's transaction failed before COMMIT with an error that is
    not a gds_counter one (a bug, an exception sent to its thread): the
    callers it took were not written, and their error's class must say so
    (``Unavailable``: not applied, safe to retry), not a bare GatewayError
    whose message alone says it."""
    def fail(conn: Any) -> None:
        raise RuntimeError("the writer's own failure")

    monkeypatch.setattr(gw._pool, "check_file", fail)
    out = queued_together(gw, [lambda n=n: gw.commit([increment(n)]) for n in ("a", "b", "c")])
    assert [type(e) for e in out].count(RuntimeError) == 1  # the writer's own
    assert sorted(type(e).__name__ for e in out if not isinstance(e, RuntimeError)) == ["Unavailable", "Unavailable"]
    monkeypatch.undo()
    assert gw.lookup([Key.of("Shard", n) for n in ("a", "b", "c")]) == [None, None, None]


def test_transactions_and_memory_commit_alone(tmp_path):
    memory = EmbeddedGateway(None)
    try:
        memory.commit([increment("m")])
        assert "grouped_commits" not in memory.stats.snapshot()
    finally:
        memory.close()
    gw = EmbeddedGateway(str(tmp_path / "db.sqlite3"))
    try:
        token = gw.begin_transaction()
        gw.lookup([Key.of("Shard", "t")], transaction=token)
        gw.commit([increment("t")], transaction=token)
        assert "grouped_commits" not in gw.stats.snapshot()
    finally:
        gw.close()


class TakenOnRelease:
    """A write lock that someone else (a transaction's commit, say) takes,
    and keeps, the moment its holder lets it go."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __enter__(self) -> None:
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        pass  # released and at once taken by the other holder

    def _is_owned(self) -> bool:
        return False  # the other holder's now, not the writer's (as an RLock would say)


def test_callers_a_writer_wrote_return_though_another_then_holds_the_write_lock():
    """Only the writer takes the write lock: the callers it wrote are
    answered when it is done, even while someone else holds the lock by
    then (they used to take it one by one just to see that they were done,
    each behind the next group's whole transaction)."""
    group = GroupCommit()
    write_lock = TakenOnRelease()
    write_lock.lock.acquire()  # someone holds the lock while the callers queue
    out: dict[str, object] = {}

    def write(take: Callable[[], list[Request]]) -> None:
        for request in take():
            request.results = f"wrote {request.mutations}"

    def commit(name: str) -> None:
        out[name] = group.commit(name, write_lock, write, lambda exc: exc)  # type: ignore[arg-type]

    threads = [threading.Thread(target=commit, args=(name,)) for name in ("a", "b", "c")]
    for thread in threads:
        thread.start()
    for _ in range(1000):  # white box: all three queued, one of them waits for the lock
        if len(group._queue) == 3:
            break
        time.sleep(0.005)
    write_lock.lock.release()  # the writer takes it, writes all three, and the lock is taken from it at once
    for thread in threads:
        thread.join(10)
    assert out == {name: f"wrote {name}" for name in ("a", "b", "c")}
    assert write_lock.lock.locked()  # held by the other holder throughout the answers


def test_a_commit_after_one_rolled_back_in_the_same_group_sees_the_entity_as_it_was(gw):
    """The group reads the rows it writes ahead, once; a commit rolled back
    to its savepoint takes its writes out of what the next one sees."""
    gw.commit([Upsert(full("full"))])
    out = queued_together(gw, [
        lambda: gw.commit([increment("b"), increment("full")]),  # writes "b", then fails: rolled back
        lambda: gw.commit([increment("b")]),
        lambda: gw.commit([increment("b", 5)]),
    ])
    assert isinstance(out[0], BadValueError)
    assert [r.mutation_results[0].transform_results for r in out[1:]] == [(1,), (6,)]
    assert gw.lookup([Key.of("Shard", "b")])[0].properties["count"] == 6
    assert gw.stats.snapshot()["group_transactions"] == 1


def test_commits_queued_while_another_process_holds_the_file_join_one_transaction(gw):
    """The writer takes its batch once it holds the file's write lock, so
    every commit that queued while another process held it is written in
    that one transaction."""
    assert gw.path is not None
    other = sqlite3.connect(gw.path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's write transaction
    names = [f"s{i}" for i in range(5)]
    out: list[Any] = [None] * len(names)

    def run(i: int) -> None:
        out[i] = gw.commit([increment(names[i])])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(names))]
    for thread in threads:
        thread.start()
    for _ in range(2000):  # white box: all queued, the first one waiting for the file
        if len(gw._group._queue) == len(names):
            break
        time.sleep(0.005)
    assert len(gw._group._queue) == len(names)
    other.execute("ROLLBACK")
    other.close()
    for thread in threads:
        thread.join(60)
    assert [r.mutation_results[0].transform_results for r in out] == [(1,)] * len(names)
    snapshot = gw.stats.snapshot()
    assert (snapshot["group_transactions"], snapshot["grouped_commits"]) == (1, len(names))
