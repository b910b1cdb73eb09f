"""The shared cache (``counter.redis_cache``) under an interrupt, a task
cancellation, a fork, a stall and a crash, each injected at every point
where it hands work to Redis: ``begin`` and ``end`` around a write's
commit, ``get``, ``ticket`` and ``store`` around a read.

What must hold after each: every total a cached reader sees lies between
the adds that returned and the adds begun (a cache never shows an untrue
total), and once the fault has passed a cached read equals the exact total
in storage; the call that met the fault ends within its bounds.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Callable

import pytest

from gds_counter import aio
from gds_counter.counter import CounterShardDS
from gds_counter.counter.redis_cache import RedisCountCache
from gds_counter.gateway import open_gateway, plan

WRITE_POINTS = ("begin", "end")
READ_POINTS = ("get", "ticket", "store")
POINTS = WRITE_POINTS + READ_POINTS


@pytest.fixture
def storage(tmp_path):
    url = f"sqlite:///{tmp_path / 'cache.sqlite3'}"
    gateway = open_gateway(url)
    yield url, gateway
    gateway.close()


def _exact(gateway) -> int:
    return CounterShardDS("Counter Test", 1, gateway=gateway).get_count()


def _prepared(gateway, cache: str, point: str) -> CounterShardDS:
    """A counter at 2 whose total is cached (a write point) or not cached,
    so that a read takes a ticket and stores (a read point)."""
    counter = CounterShardDS("Counter Test", 1, gateway=gateway, cache=cache)
    counter.add(2)
    assert counter.get_count() == 2
    if point in READ_POINTS and point != "get":
        counter._cache.invalidate(counter._identity())
    return counter


def _operate(counter: CounterShardDS, point: str) -> None:
    """What reaches ``point``: an add of 3 for a write point, a read otherwise."""
    if point in WRITE_POINTS:
        counter.add(3)
    else:
        assert counter.get_count() == 2


def _settled(counter: CounterShardDS, gateway) -> None:
    """Once the fault has passed: cached reads are the exact total, and a
    new add is seen through the cache at once."""
    for _ in range(2):
        assert counter.get_count() == _exact(gateway)
    counter.add(1)
    for _ in range(2):
        assert counter.get_count() == _exact(gateway)


def _at(point: str, monkeypatch, before=None, after=None) -> None:
    """Run ``before()`` as the cache's first call of script ``point`` begins,
    and ``after()`` once Redis has answered it (either may raise)."""
    original = RedisCountCache._call
    fired = threading.Event()

    def call(self, script, key, *args):
        if script != point or fired.is_set():
            return original(self, script, key, *args)
        fired.set()
        if before is not None:
            before()
        found = original(self, script, key, *args)
        if after is not None:
            after()
        return found

    monkeypatch.setattr(RedisCountCache, "_call", call)


def _interrupt() -> None:
    raise KeyboardInterrupt


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("point", POINTS)
def test_an_interrupt_at_each_redis_call_leaves_no_untrue_total(point, when, storage, redis_server, monkeypatch):
    """``after``: Redis ran the script, and its answer was lost to the interrupt."""
    _, gateway = storage
    counter = _prepared(gateway, redis_server.url, point)
    with monkeypatch.context() as patched:
        _at(point, patched, **{when: _interrupt})
        with pytest.raises(KeyboardInterrupt):
            _operate(counter, point)
    assert _exact(gateway) in ((2, 5) if point in WRITE_POINTS else (2,))
    _settled(counter, gateway)


@pytest.mark.parametrize("point", POINTS)
def test_a_stalled_redis_at_each_call_ends_at_its_timeout_and_leaves_no_untrue_total(point, storage, redis_server,
                                                                                     monkeypatch):
    """Redis is paused (SIGSTOP) as the call is sent, past the cache's
    timeout, then resumes and runs what was sent late."""
    _, gateway = storage
    counter = _prepared(gateway, redis_server.url + "?timeout=0.2", point)

    def pause() -> None:
        redis_server.process.send_signal(signal.SIGSTOP)
        threading.Timer(0.6, redis_server.process.send_signal, (signal.SIGCONT,)).start()

    with monkeypatch.context() as patched:
        _at(point, patched, before=pause)
        began = time.monotonic()
        _operate(counter, point)
        assert time.monotonic() - began < 5  # the call gave up on Redis at its timeout (a bound, not a speed)
    time.sleep(0.7)
    _settled(counter, gateway)


def _forked(body: Callable[[], bool]) -> int:
    """Fork, and run ``body`` in the child: it exits 0 when ``body`` returns
    true, 2 when false, 1 when it raises, and dies of SIGALRM after 20 s (a
    child stuck on a lock a thread of the parent held). The child's pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            signal.alarm(20)
            code = 0 if body() else 2
        finally:
            os._exit(code)
    return pid


def _exit_code(pid: int) -> int:
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
@pytest.mark.parametrize("point", POINTS)
def test_a_fork_at_each_redis_call_leaves_parent_and_child_counting(point, storage, redis_server, monkeypatch):
    """Another thread is inside the call when the process forks: in the
    child that thread is gone; the child's own adds and reads work, and
    every total it sees lies between what returned and what began."""
    _, gateway = storage
    counter = _prepared(gateway, redis_server.url, point)
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        release.wait(10)

    with monkeypatch.context() as patched:
        _at(point, patched, before=hold)
        worker = threading.Thread(target=_operate, args=(counter, point))
        worker.start()
        assert inside.wait(10)

        def in_the_child() -> bool:
            patched.undo()
            child = CounterShardDS("Counter Test", 1, gateway=gateway, cache=redis_server.url)
            low, high = 2, 5 if point in WRITE_POINTS else 2  # the parent's add has not returned
            seen = child.get_count()
            child.add(1)
            again = child.get_count()
            return low <= seen <= high and low + 1 <= again <= high + 1

        pid = _forked(in_the_child)
        release.set()
        worker.join(30)
    assert _exit_code(pid) == 0
    assert _exact(gateway) == (6 if point in WRITE_POINTS else 3)
    _settled(counter, gateway)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_a_fork_while_another_thread_holds_the_caches_lock_leaves_the_child_counting(storage, redis_server):
    _, gateway = storage
    counter = _prepared(gateway, redis_server.url, "get")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with counter._cache._lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)

    def in_the_child() -> bool:
        counter.add(1)
        return counter.get_count() == 3

    pid = _forked(in_the_child)
    release.set()
    holder.join(10)
    assert _exit_code(pid) == 0
    _settled(counter, gateway)


CRASHER = textwrap.dedent("""
    import os, signal, sys
    from gds_counter.counter import CounterShardDS
    from gds_counter.counter.redis_cache import RedisCountCache
    from gds_counter.gateway import open_gateway

    url, cache, point = sys.argv[1:4]
    original = RedisCountCache._call

    def call(self, script, key, *args):
        if script == point:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, script, key, *args)

    counter = CounterShardDS("Counter Test", 1, gateway=open_gateway(url), cache=cache)
    RedisCountCache._call = call
    if point in ("begin", "end"):
        counter.add(3)
    else:
        counter.get_count()
""")


@pytest.mark.parametrize("point", POINTS)
def test_a_process_killed_at_each_redis_call_leaves_no_untrue_total_once_its_lease_ends(point, storage, redis_server):
    url, gateway = storage
    cache = redis_server.url + "?lease=0.5"
    counter = _prepared(gateway, cache, point)
    crashed = subprocess.run([sys.executable, "-c", CRASHER, url, cache, point], capture_output=True, timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr.decode()
    assert _exact(gateway) == (5 if point == "end" else 2)  # killed after its commit only at "end"
    time.sleep(0.7)
    _settled(counter, gateway)


def _stalled(original, stage: str, reached: asyncio.Event):
    """``original`` (a gateway call of the plan) with a long sleep, which a
    cancellation ends, before it or, ``after the commit``, after it."""

    def stalled(*args, **kwargs):
        if stage != "after the commit":
            yield from plan.call(reached.set)
            yield from plan.sleep(30)
        found = yield from original(*args, **kwargs)
        if stage == "after the commit":
            yield from plan.call(reached.set)
            yield from plan.sleep(30)
        return found

    return stalled


@pytest.mark.parametrize("stage", ["before the commit", "after the commit", "during the read"])
def test_a_task_cancelled_between_redis_calls_leaves_no_untrue_total(stage, storage, redis_server, monkeypatch):
    """On the asyncio face the Redis calls are short blocking ones, so a
    cancellation lands at the awaits between them: around the commit, or in
    the read of the shards between the ticket and the store."""
    url, gateway = storage

    async def main() -> None:
        async with aio.open_gateway(url) as agw:
            counter = aio.CounterShardDS("Counter Test", 1, gateway=agw, cache=redis_server.url)
            await counter.add(2)
            assert await counter.get_count() == 2
            if stage == "during the read":
                counter._cache.invalidate(counter._identity())
            reached = asyncio.Event()
            with monkeypatch.context() as patched:
                for name in ("lookup", "run_query") if stage == "during the read" else ("commit",):
                    patched.setattr(plan, name, _stalled(getattr(plan, name), stage, reached))
                task = asyncio.ensure_future(counter.get_count() if stage == "during the read" else counter.add(3))
                await asyncio.wait_for(reached.wait(), 30)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            assert _exact(gateway) == (5 if stage == "after the commit" else 2)
            for _ in range(2):
                assert await counter.get_count() == _exact(gateway)
            await counter.add(1)
            assert await counter.get_count() == _exact(gateway)

    asyncio.run(main())
