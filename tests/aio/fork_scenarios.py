"""Forks of a process that counts through ``gds_counter.aio`` on a SQLite
file, for ``test_aio_fork.py``. Each scenario runs in a process of its own
(this script, started by the test), so a fork made while an event loop runs
never touches the test run's own process.

    python fork_scenarios.py SCENARIO DB

prints one JSON line: what the parent and the child were told (acknowledged
adds, errors by class), whether the child hung (it is killed after
``CHILD_BOUND_S``), and the stored total read afterwards. The child reports
through a pipe and leaves with ``os._exit``.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from typing import Any, Callable

from gds_counter import aio
from gds_counter.counter import CounterShardDS
from gds_counter.errors import GDSError
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gds import RetryPolicy

#: A child still running after this long is stuck (a hang guard, not a speed limit).
CHILD_BOUND_S = 60.0
#: Each of the child's calls is bounded too: a call that hangs past it is a fault.
CALL_BOUND_S = 30.0
PATIENT = RetryPolicy(attempts=50, initial=0.001, maximum=0.02)
CHILD_ADDS = 20


def counter(gateway: Any) -> aio.CounterShardDS:
    return aio.CounterShardDS("fork", 1, gateway=gateway, retry=PATIENT)


async def bounded_adds(gateway: Any, adds: int) -> dict[str, Any]:
    told: Counter[str] = Counter()
    for _ in range(adds):
        try:
            await asyncio.wait_for(counter(gateway).add(1), CALL_BOUND_S)
            told["ok"] += 1
        except GDSError as exc:
            told[type(exc).__name__] += 1
        except asyncio.TimeoutError:
            told["hung"] += 1
    return dict(told)


def fork_child(work: Callable[[], dict[str, Any]]) -> tuple[int, int]:
    """Fork; the child runs ``work`` and writes its JSON report to a pipe."""
    report_r, report_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        os.close(report_r)
        code = 1
        try:
            result = work()
            os.write(report_w, json.dumps(result).encode())
            code = 0
        except BaseException as exc:  # reported, never raised into the parent's code
            os.write(report_w, json.dumps({"raised": f"{type(exc).__name__}: {exc}"}).encode())
        finally:
            os._exit(code)
    os.close(report_w)
    return pid, report_r


def collect(pid: int, report_r: int) -> dict[str, Any]:
    deadline = time.monotonic() + CHILD_BOUND_S
    hung = False
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            hung = True
            break
        time.sleep(0.02)
    data = b""
    while chunk := os.read(report_r, 65536):
        data += chunk
    os.close(report_r)
    report: dict[str, Any] = json.loads(data) if data else {}
    report["child_hung"] = hung
    return report


def in_new_loop(gateway: Any) -> Callable[[], dict[str, Any]]:
    """The child's work: a loop of its own, ``CHILD_ADDS`` bounded adds."""
    return lambda: asyncio.run(bounded_adds(gateway, CHILD_ADDS))


def used_once_then_fork(db: str) -> dict[str, Any]:
    gateway = aio.open_gateway(f"sqlite:///{db}")
    parent = asyncio.run(bounded_adds(gateway, 1))
    child = collect(*fork_child(in_new_loop(gateway)))
    return {"parent": parent, "child": child}


def fork_while_a_loop_increments(db: str) -> dict[str, Any]:
    """Another thread forks while this thread's loop keeps 20 adds in flight."""
    gateway = aio.open_gateway(f"sqlite:///{db}")
    forked = threading.Event()
    child: dict[str, Any] = {}

    def forker() -> None:
        time.sleep(0.3)
        pid, report_r = fork_child(in_new_loop(gateway))
        forked.set()
        child.update(collect(pid, report_r))

    async def parent() -> dict[str, Any]:
        told: Counter[str] = Counter()
        thread = threading.Thread(target=forker)
        thread.start()
        rounds = 0
        while not forked.is_set() or rounds < 3:
            rounds += forked.is_set()
            outcomes = await asyncio.gather(*(counter(gateway).add(1) for _ in range(20)), return_exceptions=True)
            for outcome in outcomes:
                told["ok" if outcome is None else type(outcome).__name__] += 1
        await asyncio.to_thread(thread.join)
        return dict(told)

    return {"parent": asyncio.run(parent()), "child": child}


def fork_while_threads_hold_the_pools_locks(db: str) -> dict[str, Any]:
    """Every lock of the gateway's pool (and of the executor inside it) is
    held by another thread at the fork, as a thread in the middle of a
    submit holds them."""
    gateway = aio.open_gateway(f"sqlite:///{db}")
    parent = asyncio.run(bounded_adds(gateway, 1))
    pool = gateway._pool  # type: ignore[attr-defined]
    owners = [pool, getattr(pool, "_executor", None)]
    lock_type = type(threading.Lock())
    locks = [value for owner in owners if owner is not None for value in vars(owner).values()
             if isinstance(value, lock_type)]
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in locks:
            lock.acquire()
        holding.set()
        release.wait()
        for lock in locks:
            lock.release()

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait()
    try:
        pid, report_r = fork_child(in_new_loop(gateway))
    finally:
        release.set()
        holder.join()
    child = collect(pid, report_r)
    parent_after = asyncio.run(bounded_adds(gateway, 1))  # the parent's pool is unharmed
    return {"parent": dict(Counter(parent) + Counter(parent_after)), "child": child, "locks_held": len(locks)}


def fork_while_threads_hold_the_registries_locks(db: str) -> dict[str, Any]:
    """The locks of what this process keeps for the counters of both faces
    are held by another thread at the fork: the shared gateways' registry,
    and the runtime of the shared gateway (its in-flight slots, its count
    cache, its shard chooser and its combined writes' lines). The child
    counts through all of them, ``cache=True``: half of its adds by the URL
    (the registry: a gateway of its own), half through the gateway it
    inherited (the runtime whose locks were held).

    Not held: the fork registry's own lock (``_process.forks._LOCK``), which
    the forking thread takes in ``os.fork``'s before-hook so that no object
    registers half way through a fork; held by another thread, it would
    block the fork itself."""
    from gds_counter import gateway as gateway_module
    from gds_counter._process import forks
    from gds_counter.counter.runtime import Runtime

    url = f"sqlite:///{db}"

    async def adds(count: int, gateway: Any = url) -> dict[str, Any]:
        told: Counter[str] = Counter()
        for _ in range(count):
            try:
                cached = aio.CounterShardDS("fork", 1, gateway=gateway, retry=PATIENT, cache=True)
                await asyncio.wait_for(cached.add(1), CALL_BOUND_S)
                told["ok"] += 1
            except GDSError as exc:
                told[type(exc).__name__] += 1
            except asyncio.TimeoutError:
                told["hung"] += 1
        return dict(told)

    parent = asyncio.run(adds(1))
    inherited = aio.shared_gateway(url)
    runtime = Runtime.of(inherited)
    lock_type = type(threading.Lock())
    owners = [
        gateway_module._SHARED,  # the shared gateways of both faces
        runtime,  # the in-flight slots (``_slots_lock``)
        runtime.cache,  # the count cache ``cache=True`` reads, which every write passes
        runtime.shards,  # the shard chooser (``AffinityShards``)
        runtime.combined.lines,  # the combined writes of threads
        runtime.async_combined.lines,  # and of each event loop's tasks
    ]
    locks = [value for owner in owners for value in vars(owner).values() if isinstance(value, lock_type)]
    assert all(lock is not forks._LOCK for lock in locks)  # held elsewhere, it would deadlock os.fork()
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        for lock in locks:
            lock.acquire()
        holding.set()
        release.wait()
        for lock in locks:
            lock.release()

    async def in_child() -> dict[str, Any]:
        by_url = await adds(CHILD_ADDS // 2)
        through_inherited = await adds(CHILD_ADDS - CHILD_ADDS // 2, inherited)
        return dict(Counter(by_url) + Counter(through_inherited))

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait()
    try:
        pid, report_r = fork_child(lambda: asyncio.run(in_child()))
    finally:
        release.set()
        holder.join()
    child = collect(pid, report_r)
    parent_after = asyncio.run(adds(1))
    return {"parent": dict(Counter(parent) + Counter(parent_after)), "child": child, "locks_held": len(locks)}


SCENARIOS: dict[str, Callable[[str], dict[str, Any]]] = {
    "used_once_then_fork": used_once_then_fork,
    "fork_while_a_loop_increments": fork_while_a_loop_increments,
    "fork_while_threads_hold_the_pools_locks": fork_while_threads_hold_the_pools_locks,
    "fork_while_threads_hold_the_registries_locks": fork_while_threads_hold_the_registries_locks,
}


def stored(db: str) -> int:
    gateway = EmbeddedGateway(db)
    try:
        return CounterShardDS("fork", 1, gateway=gateway).get_count()
    finally:
        gateway.close()


def main() -> None:
    scenario, db = sys.argv[1], sys.argv[2]
    result = SCENARIOS[scenario](db)
    result["stored"] = stored(db)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
