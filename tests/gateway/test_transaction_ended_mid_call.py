"""A transaction ended while one of its calls still runs leaves no
connection in a transaction.

The asyncio face runs the embedded engine's calls in worker threads. A task
cancelled while its transaction's read runs in a worker rolls the
transaction back at once (the plan's cleanup), and the read goes on in its
worker. The rollback gave the transaction's connection back to the pool
while the read was still using it: the read then began its snapshot on a
connection the pool had already lent to someone else, which later failed
every write on it with "cannot start a transaction within a transaction"
(seen as a GatewayError on 30 calls at once, cancelling asyncio tasks of
a transactional counter). Now the connection goes back when the read
gives it back.
"""

from __future__ import annotations

import asyncio
import inspect
import sys
import threading
from types import FrameType
from typing import Any

from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.embedded._engine import EmbeddedGateway as Engine
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity


def _line_of(function: Any, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    [offset] = [i for i, line in enumerate(lines) if text in line]
    return first + offset


#: The line where a transaction's first read begins its snapshot.
SNAPSHOT_BEGINS = _line_of(Engine._snapshot.__wrapped__, 'conn.execute("BEGIN")')  # type: ignore[attr-defined]


def _pausing_before_the_snapshot(reached: threading.Event, go_on: threading.Event, armed: threading.Event) -> Any:
    """A trace function: once ``armed``, the first thread to reach
    ``SNAPSHOT_BEGINS`` (its connection lent to it, its ``BEGIN`` not yet
    run) waits there until ``go_on``."""

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == SNAPSHOT_BEGINS and armed.is_set() and not reached.is_set():
            reached.set()
            assert go_on.wait(10)
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Any:
        return local if frame.f_code is Engine._snapshot.__wrapped__.__code__ else None  # type: ignore[attr-defined]

    return global_


def _no_connection_left_in_a_transaction(gateway: EmbeddedGateway) -> None:
    pool = gateway._pool
    assert not pool._lent and not pool._held
    assert [conn.in_transaction for conn in pool._idle] == [False] * len(pool._idle)


def test_a_rollback_while_the_transactions_read_runs_waits_for_the_read_to_give_the_connection_back(tmp_path):
    gateway = EmbeddedGateway(str(tmp_path / "c.sqlite3"))
    key = Key.of("C", 1)
    gateway.commit([Upsert(RawEntity(key, {"n": 1}))])
    txn = gateway.begin_transaction()
    reached, go_on = threading.Event(), threading.Event()
    read: list[Any] = []

    armed = threading.Event()
    armed.set()

    def read_in_the_transaction() -> None:
        sys.settrace(_pausing_before_the_snapshot(reached, go_on, armed))
        try:
            read.append(gateway.lookup([key], transaction=txn))
        except BaseException as exc:  # noqa: B902  (reported to the test)
            read.append(exc)
        finally:
            sys.settrace(None)

    worker = threading.Thread(target=read_in_the_transaction)
    worker.start()
    assert reached.wait(10)
    gateway.rollback(txn)  # as a cancelled task's cleanup does, while its read runs
    go_on.set()
    worker.join(10)
    assert not worker.is_alive()
    _no_connection_left_in_a_transaction(gateway)
    for n in range(2, 6):  # every connection the pool lends can write
        gateway.commit([Upsert(RawEntity(key, {"n": n}))])
    assert gateway.lookup([key])[0].properties["n"] == 5
    gateway.close()


def test_a_cancelled_transactional_increment_leaves_the_file_writable(tmp_path):
    """The same through the asyncio face: the task is cancelled while its
    transaction's read waits in a worker thread."""
    from gds_counter.aio import CounterShardDS

    async def scenario() -> int:
        reached, go_on, armed = threading.Event(), threading.Event(), threading.Event()
        threading.settrace(_pausing_before_the_snapshot(reached, go_on, armed))  # every worker thread, from its start
        try:
            counter = CounterShardDS("cancelled", 1, 1, gateway=f"sqlite:///{tmp_path / 'a.sqlite3'}",
                                     strategy="transactional")
            await counter.add(1)
            armed.set()
            task = asyncio.create_task(counter.add(1))
            for _ in range(5000):
                if reached.is_set():
                    break
                await asyncio.sleep(0.001)
            assert reached.is_set()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await asyncio.sleep(0.05)  # the cleanup's rollback runs in another worker
            go_on.set()
            await asyncio.sleep(0.05)
            for _ in range(5):
                await counter.add(1)
            return await counter.get_count()
        finally:
            threading.settrace(None)  # type: ignore[arg-type]
            go_on.set()

    total = asyncio.run(scenario())
    assert total in (6, 7)  # the cancelled one may or may not have been stored; the others were
