"""A parent process for test_grpc_fork: it counts through a gRPC gateway and
forks children that go on counting through the very gateway they inherited,
as a gunicorn ``--preload`` master or a ``multiprocessing`` parent (fork
start method) hands its workers a module-level counter.

    python grpc_fork_parent.py threads datastore|firestore HOST PROJECT NAME CHILDREN ADDS
    python grpc_fork_parent.py after-asyncio datastore HOST PROJECT NAME CHILDREN ADDS
    python grpc_fork_parent.py during-probe datastore HOST PROJECT NAME CHILDREN ADDS
    python grpc_fork_parent.py transaction datastore HOST PROJECT NAME CHILDREN ADDS

``NAME``: the counter's (``CounterShardDS("GrpcFork", NAME, 4)``, or
``DistributedCounter("GrpcFork/NAME", 4)`` on ``firestore``).

``threads``: three threads of the parent add without pause, and each child
is forked while they are inside gRPC calls (gRPC then skips its own fork
handlers). Each child makes ``ADDS`` adds through the inherited counter.
``after-asyncio``: the parent first counts ``ADDS`` through an asyncio
gateway, then forks; each child tries one add, half of them through the
inherited asyncio gateway, half through a new blocking one, then closes the
inherited gateway and collects its garbage.
``during-probe``: a thread of the parent is learning what the server can
do (the gateway's first call: a probe, whose commit is slowed to 2 s here)
while the children are forked; each child makes ``ADDS`` adds.
``transaction``: the parent reads entity ``GrpcForkTx``/``NAME`` (``n``: 0)
in a transaction, forks, and each child and then the parent tries to
commit ``n + 1`` in it (``acked``, or ``refused``); ``stored_n`` is what is
stored after them all.

It runs in a fresh interpreter, not in the test run's process, so that no
gRPC channel of the test run's own crosses these forks. A child still
running ``HANG_S`` after the forks is killed and reported hung. The last
line of stdout is JSON: what the parent and each child were told
(``acked``: returned; ``unknown``: ``CommitUnknown``; ``refused``: any other
``GDSError``, with its class and words).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import json
import os
import signal
import sys
import threading
import time
from typing import Any, Callable

from gds_counter import CounterShardDS, DistributedCounter, aio
from gds_counter.errors import CommitUnknown, GDSError
from gds_counter.gateway.datastore import AsyncDatastoreGateway, DatastoreGateway
from gds_counter.gateway.firestore import FirestoreGateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity

#: A child still running this long after the last fork is hung.
HANG_S = 60.0
#: Each add's deadline: a child's call must end within it, counted or raised.
TIMEOUT_S = 10.0


def counter(kind: str, name: str, gateway: Any) -> Any:
    if kind == "firestore":
        return DistributedCounter(f"GrpcFork/{name}", 4, gateway=gateway)
    return CounterShardDS("GrpcFork", name, 4, gateway=gateway)


def add(tally: dict[str, Any], call: Any) -> None:
    try:
        call()
        tally["acked"] += 1
    except CommitUnknown:
        tally["unknown"] += 1
    except GDSError as exc:
        tally["refused"].append(f"{type(exc).__name__}: {exc}")


def new_tally() -> dict[str, Any]:
    return {"acked": 0, "unknown": 0, "refused": []}


def in_child(report: int, work: Any) -> None:
    """Run ``work(tally)`` in a forked child, write its tally as one line to
    ``report`` and leave without running anything of the parent's."""
    code = 1
    tally = new_tally()
    try:
        work(tally)
        code = 0
    except BaseException as exc:  # reported, the child's exit code says it
        tally["crashed"] = f"{type(exc).__name__}: {exc}"
    finally:
        os.write(report, (json.dumps(tally) + "\n").encode())
        os._exit(code)


def reap(pids: list[int]) -> tuple[list[int | None], int]:
    """Each child's exit status (None: killed as hung) and how many hung."""
    deadline = time.monotonic() + HANG_S
    statuses: dict[int, int | None] = {}
    while len(statuses) < len(pids) and time.monotonic() < deadline:
        for pid in pids:
            if pid not in statuses:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    statuses[pid] = os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    hung = 0
    for pid in pids:
        if pid not in statuses:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            statuses[pid], hung = None, hung + 1
    return [statuses[pid] for pid in pids], hung


def read_reports(read_end: int) -> list[dict[str, Any]]:
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    return [json.loads(line) for line in data.decode().splitlines()]


def fork_children(children: int, work: Callable[[int, dict[str, Any]], None], pause: float = 0.0) -> dict[str, Any]:
    """Fork ``children`` children, ``pause`` s apart, child ``n`` running
    ``work(n, tally)``; what they reported, their exit statuses, how many hung."""
    read_end, write_end = os.pipe()
    pids = []
    for n in range(children):
        time.sleep(pause)
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            in_child(write_end, functools.partial(work, n))
        pids.append(pid)
    os.close(write_end)
    statuses, hung = reap(pids)
    return {"children": read_reports(read_end), "statuses": statuses, "hung": hung}


def adds_through(shared: Any, adds: int) -> Callable[[int, dict[str, Any]], None]:
    """A child's work: ``adds`` adds through ``shared``, the counter it inherited."""

    def work(_: int, tally: dict[str, Any]) -> None:
        for _ in range(adds):
            add(tally, lambda: shared.add(1))

    return work


def threads_face(kind: str, host: str, project: str, name: str, children: int, adds: int) -> dict[str, Any]:
    if kind == "firestore":
        gateway: Any = FirestoreGateway(project, emulator_host=host, timeout=TIMEOUT_S)
    else:
        gateway = DatastoreGateway(project, emulator_host=host, timeout=TIMEOUT_S)
    shared = counter(kind, name, gateway)
    parent = new_tally()
    lock = threading.Lock()
    stop = threading.Event()

    def busy() -> None:
        while not stop.is_set():
            mine = new_tally()
            add(mine, lambda: shared.add(1))
            with lock:
                for name in ("acked", "unknown"):
                    parent[name] += mine[name]
                parent["refused"] += mine["refused"]

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(3)]
    for thread in threads:
        thread.start()
    # 0.1 s apart: the threads are inside gRPC calls most of the time
    result = fork_children(children, adds_through(shared, adds), pause=0.1)
    stop.set()
    for thread in threads:
        thread.join(TIMEOUT_S * 3)
    gateway.close()
    return {"parent": parent, **result}


def after_asyncio_face(host: str, project: str, name: str, children: int, adds: int) -> dict[str, Any]:
    gateway = AsyncDatastoreGateway(project, emulator_host=host, timeout=TIMEOUT_S)
    shared = aio.CounterShardDS("GrpcFork", name, 4, gateway=gateway)
    parent = new_tally()

    async def count() -> None:
        for _ in range(adds):
            try:
                await shared.add(1)
                parent["acked"] += 1
            except CommitUnknown:
                parent["unknown"] += 1

    asyncio.run(count())

    def work(n: int, tally: dict[str, Any]) -> None:
        if n % 2 == 0:  # through the asyncio gateway it inherited
            add(tally, lambda: asyncio.run(asyncio.wait_for(shared.add(1), TIMEOUT_S)))
        else:  # through a blocking gateway of its own
            add(tally, lambda: counter("datastore", name, DatastoreGateway(
                project, emulator_host=host, timeout=TIMEOUT_S)).add(1))
        asyncio.run(asyncio.wait_for(gateway.close(), TIMEOUT_S))  # the parent's channel is not this child's to close
        gc.collect()

    return {"parent": parent, **fork_children(children, work)}


class SlowProbe(DatastoreGateway):
    """A Datastore gateway whose first commit (its capability probe's) takes
    2 s longer in the process that made it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.maker, self.slowed = os.getpid(), threading.Event()

    def _send(self, call: str, request: Any, **kwargs: Any) -> Any:
        if call == "commit" and os.getpid() == self.maker and not self.slowed.is_set():
            self.slowed.set()
            time.sleep(2.0)
        return super()._send(call, request, **kwargs)


def during_probe_face(host: str, project: str, name: str, children: int, adds: int) -> dict[str, Any]:
    gateway = SlowProbe(project, emulator_host=host, timeout=TIMEOUT_S)
    shared = counter("datastore", name, gateway)
    prober = threading.Thread(target=lambda: gateway.capabilities, daemon=True)
    prober.start()
    if not gateway.slowed.wait(TIMEOUT_S):
        raise SystemExit("the probe never committed")
    result = fork_children(children, adds_through(shared, adds))
    prober.join(TIMEOUT_S)
    return {"parent": new_tally(), **result}


def transaction_face(host: str, project: str, name: str, children: int) -> dict[str, Any]:
    gateway = DatastoreGateway(project, emulator_host=host, timeout=TIMEOUT_S)
    key = Key.of("GrpcForkTx", name)
    gateway.commit([Upsert(RawEntity(key, {"n": 0}))])
    token = gateway.begin_transaction()
    [seen] = gateway.lookup([key], transaction=token)
    assert seen is not None

    def commit_it(_: int, tally: dict[str, Any]) -> None:
        add(tally, lambda: gateway.commit([Upsert(RawEntity(key, {"n": seen.properties["n"] + 1}))],
                                          transaction=token))
        if tally["refused"]:
            gateway.rollback(token)

    result = fork_children(children, commit_it)
    parent = new_tally()
    commit_it(0, parent)
    [stored] = gateway.lookup([key])
    assert stored is not None
    return {"parent": parent, **result, "stored_n": stored.properties["n"]}


def main(argv: list[str]) -> None:
    face, kind, host, project, name, children, adds = argv[1:]
    if face == "threads":
        result = threads_face(kind, host, project, name, int(children), int(adds))
    elif face == "during-probe":
        result = during_probe_face(host, project, name, int(children), int(adds))
    elif face == "transaction":
        result = transaction_face(host, project, name, int(children))
    else:
        result = after_asyncio_face(host, project, name, int(children), int(adds))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv)
