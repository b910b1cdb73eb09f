"""What an interrupt can leave behind where the line-by-line tests cannot
reach: inside a ``with``'s entry, inside ``threading`` itself.

A fresh-eyes trial sent KeyboardInterrupt every 0 to 1.5 ms to a program
incrementing a counter, and the embedded gateway hung within a few hundred
calls, each time somewhere new: a round's ``threading.Event`` whose inner
lock an interrupt had left held (its next ``set()`` waited for ever), a
pool lock left held as a ``with`` was entered, a connection lent through a
``with`` that never exited, ``Condition.wait`` cut short before it took its
lock back ("cannot release un-acquired lock" in place of the interrupt).
None of those windows can be closed from Python, so each hand-over must
survive them: these tests put the machinery in the state such an interrupt
leaves, and check that the next caller is served.
``test_random_interrupts.py`` sends the real signals.
"""

from __future__ import annotations

import gc
import sqlite3
import threading
import time
from typing import Any, Callable

import pytest

from gds_counter._process import deadlines
from gds_counter.counter._rounds import Gate
from gds_counter.errors import Contention
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.embedded._connections import ConnectionPool, HeldLease
from gds_counter.gateway.embedded._group_commit import WRITE, GroupCommit, Request
from gds_counter.gateway.embedded._storage import write_transaction
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity


class Injected(BaseException):
    """Stands for KeyboardInterrupt without touching pytest's own handling."""


def finishes(work: Callable[[], Any], within: float = 10.0) -> bool:
    """Whether ``work()`` returns (in another thread) within ``within`` seconds."""
    done: list[bool] = []
    thread = threading.Thread(target=lambda: (work(), done.append(True)), daemon=True)
    thread.start()
    thread.join(within)
    return bool(done)


def borrow(pool: ConnectionPool) -> None:
    with pool.connection():
        pass


# -- a round's gate -----------------------------------------------------------


def test_a_gate_opens_for_waiters_and_shuts_again_when_cleared():
    gate = Gate()
    assert not gate.is_set() and not gate.wait(0.01)
    gate.set()
    gate.set()  # twice: still open, no error
    assert gate.is_set() and gate.wait(0.01) and gate.wait(0.01)
    gate.clear()
    assert not gate.is_set() and not gate.wait(0.01)


def test_a_gate_wakes_a_thread_waiting_on_it():
    gate = Gate()
    woke: list[bool] = []
    thread = threading.Thread(target=lambda: woke.append(gate.wait(10)), daemon=True)
    thread.start()
    time.sleep(0.05)
    gate.set()
    thread.join(10)
    assert woke == [True]


def test_setting_a_gate_never_waits_even_when_a_waiter_was_cut_short_holding_it():
    """A waiter interrupted between taking the gate's lock and letting it
    go leaves the lock held: ``set`` must still return (a
    ``threading.Event``'s set waited for ever on its inner lock), and the
    other waiters learn the flag within their slice."""
    gate = Gate()
    gate.set()
    gate._shut.acquire()  # the state a waiter cut short leaves
    assert finishes(gate.set, within=2)
    gate._shut.acquire(blocking=False)  # (set() released it: hold it again)
    assert gate.wait(0.05)  # the flag answers, the lock held


def test_a_gate_cleared_while_a_waiter_held_it_open_does_not_spin():
    """set, a waiter takes the lock, clear (the flag down; the lock is the
    waiter's), the waiter lets it go: the gate is open with its flag down.
    The next wait must shut it again and time out, not return at once for
    ever (a leader waiting for its turn would spin)."""
    gate = Gate()
    gate.set()
    gate._shut.acquire()
    gate.clear()
    gate._shut.release()
    assert not gate.wait(0.01)
    assert gate._shut.locked(), "the gate stayed open with its flag down"
    started = time.monotonic()
    assert not gate.wait(0.05)
    assert time.monotonic() - started >= 0.04


# -- the connection pool ------------------------------------------------------


@pytest.fixture(params=["memory", "file"])
def small_pool(request, tmp_path):
    """A pool of one connection (a memory database has only one)."""
    pool = ConnectionPool(None if request.param == "memory" else str(tmp_path / "one.db"), size=1)
    yield pool
    pool.close()


def test_a_connection_lent_through_a_lease_that_never_exited_is_taken_back(small_pool, caplog):
    """An interrupt as ``with pool.connection() as conn:`` is entered can
    skip the exit: the lease is dropped with its connection still lent.
    The next caller that finds no connection takes it back (its open
    transaction rolled back) instead of waiting for ever."""
    lease = small_pool.connection()
    conn = lease.__enter__()
    conn.execute("BEGIN IMMEDIATE")  # an unfinished write, never acknowledged
    del lease
    gc.collect()
    assert finishes(lambda: borrow(small_pool)), "the pool waited for a connection nobody can give back"
    assert not conn.in_transaction
    assert "taken back" in caplog.text
    assert small_pool._count == len(small_pool._idle) == 1 and not small_pool._lent


def test_an_interrupt_after_the_connection_was_lent_gives_it_back_though_its_traceback_lives_on(small_pool, monkeypatch):
    """An interrupt inside ``with pool.connection():`` once the connection
    was lent, before the block began: the exit never runs, and a REPL
    keeps the traceback (``sys.last_traceback``), so the lease lives on.
    The connection must still come back at once, not at the next caller's
    deadline (a memory gateway has one connection: every later call would
    fail)."""
    small_pool._reclaimed = 1  # the entry then logs, after the connection was lent

    def interrupted() -> None:
        raise Injected()

    monkeypatch.setattr(small_pool, "_log_reclaimed", interrupted)
    with pytest.raises(Injected) as kept:
        borrow(small_pool)
    monkeypatch.undo()
    assert kept.value.__traceback__ is not None  # (what a REPL keeps)
    assert not small_pool._lent
    token = deadlines.limit(time.monotonic() + 2.0)
    try:
        borrow(small_pool)  # Contention at the deadline if the connection stayed lent
    finally:
        deadlines.restore(token)


def test_a_transactions_call_interrupted_once_its_connection_was_lent_gives_it_back(tmp_path, monkeypatch):
    """The same window in a transaction's call (``HeldLease``): its next
    call on the same connection must not wait for the interrupted one."""
    pool = ConnectionPool(str(tmp_path / "held.db"), size=2)
    owner = Injected()  # (any object a weak reference can name: the transaction)
    conn = pool.hold(owner)
    lend = HeldLease._lend

    def lent_then_interrupted(self: HeldLease, *args: Any) -> Any:
        lend(self, *args)
        raise Injected()

    monkeypatch.setattr(HeldLease, "_lend", lent_then_interrupted)
    with pytest.raises(Injected) as kept:
        with HeldLease(pool, conn):
            pass
    monkeypatch.undo()
    assert kept.value.__traceback__ is not None

    def next_call() -> None:
        with HeldLease(pool, conn):
            pass

    assert finishes(next_call), "the transaction's next call waited for a connection lent to no one"
    pool.unhold(conn)
    pool.close()


def test_a_live_lease_keeps_its_connection(small_pool):
    """Only a lease that no longer exists loses its connection: one in use
    makes the next caller wait (here until its deadline)."""
    lease = small_pool.connection()
    lease.__enter__()
    token = deadlines.limit(time.monotonic() + 0.2)
    try:
        with pytest.raises(Contention, match="nothing was written"):
            borrow(small_pool)
    finally:
        deadlines.restore(token)
    lease.__exit__(None, None, None)
    assert finishes(lambda: borrow(small_pool))


def test_waiting_for_a_connection_ends_at_the_callers_deadline(small_pool):
    """No call waits past its deadline: with the only connection lent to a
    call that does not end, the next caller raises ``Contention`` (nothing
    was written) when its deadline passes."""
    holding, let_go = threading.Event(), threading.Event()

    def hold() -> None:
        with small_pool.connection():
            holding.set()
            let_go.wait(30)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert holding.wait(10)
    outcome: list[BaseException] = []

    def call() -> None:
        token = deadlines.limit(time.monotonic() + 0.3)
        try:
            borrow(small_pool)
        except Contention as exc:
            outcome.append(exc)
        finally:
            deadlines.restore(token)

    try:
        assert finishes(call, within=10), "the caller waited past its deadline"
        assert outcome and small_pool.where in str(outcome[0])
    finally:
        let_go.set()
        holder.join(10)


def test_a_pool_lock_left_held_by_an_interrupt_is_let_go_on_the_way_out(small_pool, monkeypatch):
    """An interrupt as ``with pool._lock`` is entered can leave the lock
    held by the interrupted thread. Nothing outside the pool holds it, so
    the lease lets it go as the interrupt leaves: other threads can still
    borrow."""
    real_check = small_pool._check_usable

    def interrupted_inside() -> None:
        small_pool._lock.acquire()  # the lock the interrupted ``with`` kept
        raise Injected("as the lock was taken")

    monkeypatch.setattr(small_pool, "_check_usable", interrupted_inside)
    small_pool._idle.clear()  # through the slow path, where _check_usable runs
    small_pool._count = 0
    with pytest.raises(Injected):
        borrow(small_pool)
    monkeypatch.setattr(small_pool, "_check_usable", real_check)
    assert not small_pool._lock._is_owned()
    assert finishes(lambda: borrow(small_pool)), "the pool lock stayed held"


def test_a_wait_cut_short_before_it_took_its_lock_back_raises_the_interrupt(small_pool, monkeypatch):
    """``Condition.wait`` takes its lock back in a ``finally``; a second
    interrupt there leaves the waiter without it, and the ``with`` around
    the wait then failed with "cannot release un-acquired lock" in place of
    the interrupt. The pool takes the lock back first."""

    class CutShort:
        def wait(self, timeout: float | None = None) -> None:
            small_pool._lock.release()  # released for the wait, never taken back
            raise Injected("in Condition.wait's finally")

    monkeypatch.setattr(small_pool, "_cond", CutShort())
    with pytest.raises(Injected):
        with small_pool._lock:
            small_pool._wait(0.01)
    assert not small_pool._lock._is_owned()
    assert small_pool._waiting == 0


# -- the group commit ---------------------------------------------------------


def test_a_group_commit_lock_left_held_by_an_interrupt_is_let_go_on_the_way_out(tmp_path, monkeypatch):
    """The same for the file's group commit: the caller leaving on the
    interrupt must not wait for ever on the lock its own ``with`` kept, and
    the next commit is written."""
    gateway = EmbeddedGateway(str(tmp_path / "group.db"))
    group = gateway._group
    real_take = group._take

    def interrupted_take() -> Any:
        group._lock.acquire()
        raise Injected("as the queue's lock was taken")

    def commit(name: str) -> None:
        gateway.commit([Upsert(RawEntity(Key.of("K", name), {"n": 1}))])

    try:
        monkeypatch.setattr(group, "_take", interrupted_take)
        assert finishes(lambda: pytest.raises(Injected, commit, "first")), "the interrupted caller waited for ever"
        monkeypatch.setattr(group, "_take", real_take)
        assert finishes(lambda: commit("next")), "the next commit waited for a lock nobody holds"
    finally:
        gateway.close()


def test_a_counter_read_ends_at_the_counters_deadline_when_no_connection_comes_back():
    """A fresh-eyes trial: after an interrupt left the memory database's one
    connection lent to a lease still referenced, ``get_count()`` with a
    5 s deadline waited 75 s. Reads (and ``increment()``'s read of the new
    total) are bounded by the policy's deadline too."""
    from gds_counter import CounterShardDS, RetryPolicy, open_gateway

    gateway = open_gateway("memory://")
    counter = CounterShardDS("held", 1, gateway=gateway, retry=RetryPolicy(deadline=0.5))
    counter.add(2)
    lease = gateway._pool.connection()
    lease.__enter__()  # lent, and its lease alive: nothing may take it back
    outcome: list[BaseException] = []

    def read() -> None:
        try:
            counter.get_count(method="query")
        except Contention as exc:
            outcome.append(exc)

    try:
        assert finishes(read, within=10), "the read waited past its deadline"
        assert outcome and "memory" in str(outcome[0])
    finally:
        lease.__exit__(None, None, None)
        gateway.close()


# -- a write transaction's start, and the group commit's hand-over (fresh-eyes findings) ----------


def test_an_interrupt_as_a_write_transaction_begins_leaves_no_transaction_behind(tmp_path):
    """An interrupt as ``BEGIN IMMEDIATE`` returns (a signal's handler runs
    as a call returns): the ``contextlib`` generator this was kept its
    transaction open and was left suspended holding the connection, whose
    cleanup later rolled back another caller's transaction on it (half of a
    batch written, a fresh-eyes finding). The start undoes its ``BEGIN``."""

    class InterruptedAtBegin(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> Any:  # type: ignore[override]
            result = super().execute(sql, *args)
            if sql == "BEGIN IMMEDIATE":
                raise Injected()
            return result

    conn = sqlite3.connect(tmp_path / "w.db", isolation_level=None, factory=InterruptedAtBegin)
    with pytest.raises(Injected):
        with write_transaction(conn, 1.0):
            pass
    assert not conn.in_transaction
    assert conn.execute("PRAGMA busy_timeout").fetchone()[0] == 1000
    conn.close()


def test_a_hand_over_run_again_wakes_the_next_writer_it_marked():
    """An interrupt as the hand-over's wake was entered left the next
    commit marked to write and asleep; the hand-over, run again, skipped
    it (marked already), and every caller waited 75 s."""
    group = GroupCommit()
    nxt = Request([])
    group._queue.append(nxt)
    nxt.state = WRITE  # marked by the interrupted hand-over, never woken
    with group._lock:
        group._hand_over()
    assert nxt.signalled and nxt.woken.acquire(timeout=1)
