"""The rollup (``counter.rollup``) under an interrupt, a cancellation, a
fork, a stall and a crash, each injected where it blocks: the lookup of the
rollup, the exact read, and the blind transaction that writes it.

What must hold after each: the call ends within its deadline or raises;
the stored rollup is either the one before or a whole new one (its total
true at its ``as_of``: every add acknowledged before ``as_of`` is in it,
and no more than every add made); later reads with ``max_age`` work and
return true totals; no shard was touched.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time

import attrs
import pytest
from sizes import size

from gds_counter import aio
from gds_counter.counter import CounterShardDS, TotalAsOf
from gds_counter.counter import rollup as rollup_module
from gds_counter.gateway import open_gateway, plan
from gds_counter.gateway.query import Query
from gds_counter.gds import RetryPolicy

POINTS = ("lookup", "exact", "write")


def _stored_rollup(gateway, counter) -> TotalAsOf | None:
    [raw] = gateway.lookup([counter.layout.rollup_key(counter.name, counter.namespace)])
    return None if raw is None else TotalAsOf(raw.properties["total"], raw.properties["as_of"], True)


def _shards(gateway, counter):
    return sorted((e.key.name, e.properties["count"]) for e in plan.run(plan.query_all(Query(counter.layout.shard_kind)), gateway))


def _at(point: str, monkeypatch, action) -> None:
    """Run ``action()`` when the rollup reaches ``point`` (it may raise)."""
    if point == "lookup":
        original = rollup_module.plan.lookup

        def lookup(keys, **kw):
            action()
            return (yield from original(keys, **kw))

        monkeypatch.setattr(rollup_module.plan, "lookup", lookup)
    elif point == "exact":
        original_exact = rollup_module.exact_plan

        def exact(counter, method):
            action()
            return (yield from original_exact(counter, method))

        monkeypatch.setattr(rollup_module, "exact_plan", exact)
    else:
        original_txn = rollup_module.plan.in_transaction

        def in_transaction(work):
            action()
            return (yield from original_txn(work))

        monkeypatch.setattr(rollup_module.plan, "in_transaction", in_transaction)


@pytest.fixture
def file_gateway(tmp_path):
    gateway = open_gateway(f"sqlite:///{tmp_path / 'rollup.sqlite3'}")
    yield gateway
    gateway.close()


@pytest.mark.parametrize("point", POINTS)
def test_an_interrupt_leaves_the_old_rollup_or_a_whole_new_one(point, file_gateway, monkeypatch):
    counter = CounterShardDS("Counter Test", 1, gateway=file_gateway)
    counter.add(3)
    counter.get_count(max_age=0)
    before = _stored_rollup(file_gateway, counter)
    counter.add(2)
    shards = _shards(file_gateway, counter)

    def interrupt() -> None:
        raise KeyboardInterrupt

    with monkeypatch.context() as patched:
        _at(point, patched, interrupt)
        with pytest.raises(KeyboardInterrupt):
            counter.get_count(max_age=0)
    assert _stored_rollup(file_gateway, counter) == before  # nothing half written
    assert _shards(file_gateway, counter) == shards
    assert counter.get_count(max_age=0) == 5 and counter.get_count_as_of(max_age=60).total == 5


#: How long the cancelled task's step stalls at most. (The plan's step runs on
#: the event loop's thread, so the loop cannot release it: it stalls this long.)
TASK_STALL = size(1.0, 10.0)


@pytest.mark.parametrize("point", POINTS)
def test_a_cancelled_task_leaves_the_rollup_whole(point, tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'cancel.sqlite3'}"
    started = threading.Event()
    release = threading.Event()

    def stall() -> None:
        started.set()
        release.wait(TASK_STALL)

    async def main() -> None:
        async with aio.open_gateway(url) as gateway:
            counter = aio.CounterShardDS("Counter Test", 1, gateway=gateway)
            await counter.add(4)
            before = attrs.evolve(await counter.get_count_as_of(max_age=0), from_rollup=True)
            await counter.add(1)
            with monkeypatch.context() as patched:
                _at(point, patched, stall)
                task = asyncio.ensure_future(counter.get_count(max_age=0))
                while not started.is_set():
                    await asyncio.sleep(0.01)
                task.cancel()
                release.set()
                with pytest.raises(asyncio.CancelledError):
                    await task
            stored = await counter.get_count_as_of(max_age=3600)
            assert stored == before or (stored.total == 5 and stored.as_of > before.as_of)
            assert await counter.get_count(max_age=0) == 5

    asyncio.run(main())


def test_a_stalled_write_lock_ends_the_read_at_its_deadline_with_a_true_total(tmp_path):
    """Another process holds the file's write lock: the rollup cannot be
    written, the read still returns its exact total by the deadline."""
    path = tmp_path / "stall.sqlite3"
    gateway = open_gateway(f"sqlite:///{path}")
    try:
        counter = CounterShardDS("Counter Test", 1, gateway=gateway, retry=RetryPolicy(deadline=1.0))
        counter.add(6)
        blocker = sqlite3.connect(path, isolation_level=None)
        blocker.execute("BEGIN IMMEDIATE")
        try:
            began = time.monotonic()
            found = counter.get_count_as_of(max_age=0)
            took = time.monotonic() - began
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()
        assert found.total == 6 and not found.from_rollup
        assert took < 1.0 + 2.0  # its deadline, and a margin for a loaded machine (a bound, not a speed)
        assert _stored_rollup(gateway, counter) is None  # not written: the next read writes it
        assert counter.get_count_as_of(max_age=60).total == 6
    finally:
        gateway.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
@pytest.mark.parametrize("point", POINTS)
def test_a_fork_during_a_rollup_leaves_parent_and_child_reading(point, file_gateway, monkeypatch):
    counter = CounterShardDS("Counter Test", 1, gateway=file_gateway)
    counter.add(2)
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        release.wait(10)

    results: list[int] = []
    with monkeypatch.context() as patched:
        _at(point, patched, hold)
        reader = threading.Thread(target=lambda: results.append(counter.get_count(max_age=0)))
        reader.start()
        assert inside.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: the reader thread is not here; its own reads must work
            code = 1
            try:
                patched.undo()
                child = CounterShardDS("Counter Test", 1, gateway=file_gateway)
                child.add(1)
                # (a total up to 60 s old may be the parent's, read before this add)
                code = 0 if child.get_count(max_age=0) == 3 and child.get_count(max_age=60) in (2, 3) else 2
            finally:
                os._exit(code)
        release.set()
        reader.join(30)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert results and results[0] in (2, 3)
    assert counter.get_count(max_age=0) == 3


CRASHER = textwrap.dedent("""
    import os, signal, sys
    from gds_counter.counter import CounterShardDS
    from gds_counter.counter import rollup
    from gds_counter.gateway import open_gateway

    gateway = open_gateway(sys.argv[1])
    point = sys.argv[2]
    original = {"lookup": rollup.plan.lookup, "write": rollup.plan.in_transaction}

    def die(*args, **kwargs):
        print("dying", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
        yield

    if point == "lookup":
        rollup.plan.lookup = die
    elif point == "exact":
        rollup.exact_plan = die
    else:
        rollup.plan.in_transaction = die
    CounterShardDS("Counter Test", 1, gateway=gateway).get_count(max_age=0)
""")


@pytest.mark.parametrize("point", POINTS)
def test_a_process_killed_during_a_rollup_leaves_it_whole(point, tmp_path):
    url = f"sqlite:///{tmp_path / 'crash.sqlite3'}"
    gateway = open_gateway(url)
    try:
        counter = CounterShardDS("Counter Test", 1, gateway=gateway)
        counter.add(7)
        counter.get_count(max_age=0)
        before = _stored_rollup(gateway, counter)
        counter.add(1)
        done = subprocess.run([sys.executable, "-c", CRASHER, url, point], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert done.returncode == -signal.SIGKILL and "dying" in done.stdout, done.stderr
        assert _stored_rollup(gateway, counter) == before
        assert counter.get_count(max_age=0) == 8 and counter.get_count(max_age=60) == 8
    finally:
        gateway.close()
