"""Interrupts in the embedded group commit (issue 23, items 2 and 4).

A ``KeyboardInterrupt`` (or an asynchronous exception) can end a caller's
wait at any point of the group commit. Whatever the point, no later commit
to the file may hang, and what the interrupted caller learns must be true:
a commit still queued is never written afterwards (its interrupt says
"NOT written"); one a writer wrote says "WAS written"; the other callers of
an interrupted writer are not failed by its interruption, and are never
told "not written" about a commit that is stored.

Every wait is bounded (a thread joined with a timeout), so a regression
fails here instead of hanging the suite.
"""

from __future__ import annotations

import ctypes
import functools
import signal
import sqlite3
import threading
import time
from typing import Any, Callable, Iterator

import pytest

from gds_counter.counter import CounterShardDS
from gds_counter.errors import CommitUnknown
from gds_counter.gateway.embedded import EmbeddedGateway, _connections
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Upsert
from gds_counter.gateway.values import RawEntity

JOIN_S = 30.0  # generous: the machine is loaded; a hang is far longer


@pytest.fixture
def gw(tmp_path: Any) -> Iterator[EmbeddedGateway]:
    gateway = EmbeddedGateway(str(tmp_path / "db.sqlite3"))
    yield gateway
    gateway.close()


def increment(name: str) -> Upsert:
    entity = RawEntity(Key.of("Shard", name), {"target": "T"}, frozenset({"count"}))
    return Upsert(entity, property_mask=("target",), transforms=(Increment("count", 1),))


def commit_one(gw: EmbeddedGateway, name: str) -> Any:
    return gw.commit([increment(name)])


def count(gw: EmbeddedGateway, name: str) -> int | None:
    found = gw.lookup([Key.of("Shard", name)])[0]
    return None if found is None else found.properties["count"]


class Caller:
    """One commit in a daemon thread (so a hang cannot keep pytest alive),
    with its outcome: ``result`` or ``error``."""

    def __init__(self, call: Callable[[], Any]) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(call,), daemon=True)
        self.thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self.result = call()
        except BaseException as exc:  # collected: the test asserts on it
            self.error = exc

    def join(self) -> None:
        self.thread.join(JOIN_S)
        assert not self.thread.is_alive(), "the commit hung"


def interrupt(thread: threading.Thread) -> None:
    """An asynchronous KeyboardInterrupt, raised in ``thread`` when it next
    runs Python code (as a blocked lock acquire returns, say)."""
    assert thread.ident is not None
    set_async = ctypes.pythonapi.PyThreadState_SetAsyncExc
    assert set_async(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt)) == 1


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + JOIN_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.002)


def notes(exc: BaseException | None) -> str:
    return " ".join(getattr(exc, "__notes__", []))


def block_first_commit(
    gw: EmbeddedGateway, monkeypatch: Any, then: Callable[[Any], None] | None = None
) -> tuple[threading.Event, threading.Event]:
    """Hold the first writer inside its transaction (after it took its
    batch, before COMMIT) until ``release`` is set; ``inside`` is set once
    it is there. Later writers call ``then`` at that point."""
    inside, release = threading.Event(), threading.Event()
    real = gw._pool.check_file

    def check_file(conn: Any) -> None:
        if not inside.is_set():
            inside.set()
            assert release.wait(JOIN_S)
        elif then is not None:
            then(conn)
        real(conn)

    monkeypatch.setattr(gw._pool, "check_file", check_file)
    return inside, release


def test_a_caller_interrupted_when_its_turn_to_write_came_hangs_no_later_commit(gw, monkeypatch):
    """The caller next in line is woken to write, and its interrupt fires
    then: it must hand the writing on (it used to keep it, so every later
    commit to the file waited for ever)."""
    inside, release = block_first_commit(gw, monkeypatch)
    first = Caller(lambda: gw.commit([increment("a")]))
    assert inside.wait(JOIN_S)
    queued = Caller(lambda: gw.commit([increment("b")]))
    wait_until(lambda: len(gw._group._queue) == 1, "the second commit is queued")
    interrupt(queued.thread)  # delivered when it is woken: to write next
    release.set()
    first.join()
    queued.join()
    later = Caller(lambda: gw.commit([increment("c")]))
    later.join()
    assert later.error is None
    assert (count(gw, "a"), count(gw, "b"), count(gw, "c")) == (1, None, 1)
    assert isinstance(queued.error, KeyboardInterrupt)
    assert "NOT written" in notes(queued.error)


def test_a_commit_whose_caller_left_the_queue_is_never_written_afterwards(gw, monkeypatch):
    """Ctrl-C while a commit waits behind another writer: the caller
    leaves, told its commit was NOT written, and the writer after it must
    not write it anyway (it used to, into a total no one acknowledged)."""
    inside, release = block_first_commit(gw, monkeypatch)
    first = Caller(lambda: gw.commit([increment("a")]))
    assert inside.wait(JOIN_S)
    second = Caller(lambda: gw.commit([increment("b")]))
    wait_until(lambda: len(gw._group._queue) == 1, "the second commit is queued")
    interrupted: list[BaseException] = []

    def on_sigint(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    main = threading.get_ident()

    def press_ctrl_c() -> None:
        wait_until(lambda: len(gw._group._queue) == 2, "this thread's commit is queued")
        signal.pthread_kill(main, signal.SIGINT)

    presser = threading.Thread(target=press_ctrl_c, daemon=True)
    presser.start()
    try:
        gw.commit([increment("mine")])
    except KeyboardInterrupt as exc:
        interrupted.append(exc)
    finally:
        signal.signal(signal.SIGINT, previous)
    presser.join(JOIN_S)
    release.set()
    first.join()
    second.join()
    assert len(interrupted) == 1
    assert second.error is None and first.error is None
    assert count(gw, "mine") is None
    assert (count(gw, "a"), count(gw, "b")) == (1, 1)
    assert "NOT written" in notes(interrupted[0])


def test_a_writer_interrupted_while_waiting_for_the_write_lock_hands_the_writing_on(gw):
    """Ctrl-C while the writer waits for this process's write lock: the
    commits queued behind it are written by the next caller (they used to
    wait for ever, since the writer handed the writing to itself)."""
    lock = gw._pool.write_lock
    holding, let_go = threading.Event(), threading.Event()

    def transaction_commit() -> None:  # say, a transaction's commit holds it, in a thread of its own
        with lock:
            holding.set()
            let_go.wait(JOIN_S)

    holder = threading.Thread(target=transaction_commit, daemon=True)
    holder.start()
    assert holding.wait(JOIN_S)
    callers: list[Caller] = []

    def on_sigint(*_: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, on_sigint)
    main = threading.get_ident()

    def others_then_ctrl_c() -> None:
        wait_until(lambda: len(gw._group._queue) == 1, "this thread is the writer")
        callers.extend(Caller(functools.partial(commit_one, gw, n)) for n in ("d", "e"))
        wait_until(lambda: len(gw._group._queue) == 3, "two commits queue behind it")
        signal.pthread_kill(main, signal.SIGINT)

    helper = threading.Thread(target=others_then_ctrl_c, daemon=True)
    helper.start()
    caught: list[BaseException] = []
    try:
        gw.commit([increment("mine")])
    except KeyboardInterrupt as exc:
        caught.append(exc)
    finally:
        signal.signal(signal.SIGINT, previous)
    helper.join(JOIN_S)
    let_go.set()
    holder.join(JOIN_S)
    for caller in callers:
        caller.join()
        assert caller.error is None
    assert (count(gw, "mine"), count(gw, "d"), count(gw, "e")) == (None, 1, 1)
    assert len(caught) == 1 and "NOT written" in notes(caught[0])


def queue_behind_a_blocked_writer(
    gw: EmbeddedGateway, monkeypatch: Any, names: list[str], then: Callable[[Any], None] | None = None
) -> list[Caller]:
    """The commits of ``names`` queued while a first writer (committing
    "first") is held inside its transaction; once it is released, the
    first of them writes them all in one transaction (calling ``then``
    before its COMMIT)."""
    inside, release = block_first_commit(gw, monkeypatch, then)
    first = Caller(lambda: gw.commit([increment("first")]))
    assert inside.wait(JOIN_S)
    callers = []
    for name in names:
        callers.append(Caller(functools.partial(commit_one, gw, name)))
        wait_until(lambda: len(gw._group._queue) == len(callers), f"{name} is queued")
    release.set()
    first.join()
    for caller in callers:
        caller.join()
    return callers


def test_when_the_writer_is_interrupted_after_commit_the_others_get_their_results(gw, monkeypatch):
    """The group's COMMIT returned, then the writer was interrupted: every
    commit in it is stored, so no caller may hear "not written" (they used
    to get GatewayError saying so). The writer's interrupt says WAS written."""
    real_bump = gw.stats.bump
    fired: list[int] = []

    def bump(name: str, n: int = 1) -> None:
        if name == "grouped_commits" and not fired:
            fired.append(n)
            raise KeyboardInterrupt  # right after the group's COMMIT
        real_bump(name, n)

    monkeypatch.setattr(gw.stats, "bump", bump)
    callers = queue_behind_a_blocked_writer(gw, monkeypatch, ["a", "b", "c"])
    assert fired == [3]
    interrupted = [c for c in callers if c.error is not None]
    assert [count(gw, n) for n in ("a", "b", "c")] == [1, 1, 1]
    assert len(interrupted) == 1 and isinstance(interrupted[0].error, KeyboardInterrupt)
    assert all(c.result is not None for c in callers if c.error is None)
    assert "WAS written" in notes(interrupted[0].error)


def test_when_the_writer_is_interrupted_before_commit_the_others_are_written_by_the_next(gw, monkeypatch):
    """An interrupt of the writer before COMMIT rolls its transaction back;
    that is not the others' failure (they used to get GatewayError): the
    next caller writes them. The writer's own commit is not written, and
    its interrupt says so."""
    fired: list[bool] = []

    def then(conn: Any) -> None:
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt  # in the group's transaction, just before COMMIT

    callers = queue_behind_a_blocked_writer(gw, monkeypatch, ["x", "y", "z"], then)
    assert fired
    interrupted = [c for c in callers if c.error is not None]
    assert len(interrupted) == 1 and isinstance(interrupted[0].error, KeyboardInterrupt)
    assert "NOT written" in notes(interrupted[0].error)
    assert sorted((count(gw, n) or 0) for n in ("x", "y", "z")) == [0, 1, 1]
    assert all(c.result is not None for c in callers if c.error is None)


def test_a_commit_that_reports_locked_after_it_was_applied_is_not_counted_twice(tmp_path, monkeypatch):
    """SQLite reporting "database is locked" (or any error) from COMMIT
    once the transaction has ended means the data may be durable: that is
    CommitUnknown, never Contention, which the counter answers by writing
    the amount again on another shard (a double count)."""
    gw = EmbeddedGateway(str(tmp_path / "db.sqlite3"))
    counter = CounterShardDS("twice", 4, gateway=gw)
    real = _connections.Connection.execute
    failed: list[bool] = []

    def execute(self: Any, sql: str, *args: Any) -> Any:
        out = real(self, sql, *args)
        if sql == "COMMIT" and not failed:
            failed.append(True)
            raise sqlite3.OperationalError("database is locked")
        return out

    monkeypatch.setattr(_connections.Connection, "execute", execute)
    with pytest.raises(CommitUnknown):
        counter.add(1)
    monkeypatch.undo()
    assert failed and counter.get_count() == 1
    gw.close()
