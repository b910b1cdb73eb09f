"""The embedded connection pool gives back what an interrupted call took.

A Ctrl-C or an exception sent to a thread can land at any line. If one
landed in the pool between taking a connection (or reserving the place to
open one) and lending it, the connection was gone for good: after 32 such
calls every later call waited for ever, and a stuck ``_opening`` made every
later ``fork()`` wait and refuse its child. These tests raise at every line
of ``ConnectionPool._acquire`` and ``_release`` in turn (a trace function
may raise in the frame it traces), then check the pool's books balance and
that it still lends every connection it has.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from types import FrameType
from typing import Any, Callable

import pytest

from gds_counter._process import deadlines
from gds_counter.errors import Contention
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.embedded._connections import ConnectionPool, Lease


class Injected(BaseException):
    """Stands for KeyboardInterrupt without touching pytest's own handling."""


def _lines_of(function: Callable[..., Any]) -> list[int]:
    code = function.__code__
    lines = {line for _, _, line in code.co_lines() if line is not None and line > code.co_firstlineno}
    return [0, *sorted(lines)]  # 0: on the way in (the call itself)


def _raise_at(function: Callable[..., Any], line: int) -> Callable[[FrameType, str, Any], Any]:
    """A trace function raising ``Injected`` the first time ``function``
    reaches ``line``."""
    fired = []

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_lineno == line and not fired:
            fired.append(line)
            raise Injected(f"{function.__name__}:{line}")
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code is not function.__code__:
            return None
        if line == 0 and not fired:
            fired.append(line)
            raise Injected(f"{function.__name__} called")
        return local

    return global_


def _balanced(pool: ConnectionPool) -> None:
    assert pool._opening == 0
    assert pool._count == len(pool._idle) + len(pool._lent) + len(pool._held), (
        pool._count, len(pool._idle), len(pool._lent), len(pool._held))


def _every_connection_lendable(pool: ConnectionPool) -> None:
    """``size`` threads hold a lease at once: none waits for ever."""
    barrier = threading.Barrier(pool._size, timeout=30)
    done: list[bool] = []

    def borrow() -> None:
        with pool.connection():
            barrier.wait()
        done.append(True)

    threads = [threading.Thread(target=borrow, daemon=True) for _ in range(pool._size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(done) == pool._size, "the pool no longer lends all its connections: one was lost"


@pytest.mark.parametrize("warm", [False, True], ids=["opening", "idle"])
@pytest.mark.parametrize("method", ["_acquire", "_release", "_put_back"])
def test_an_interrupt_at_any_line_of_the_pool_loses_no_connection(tmp_path: Any, method: str, warm: bool) -> None:
    gateway = EmbeddedGateway(str(tmp_path / "pool.sqlite3"))
    pool = gateway._pool
    pool._size = 3  # small, so a lost connection shows at once
    if warm:
        _every_connection_lendable(pool)  # every connection opened: the idle path
    owner, _, name = method.rpartition(".")
    function = getattr(Lease if owner == "Lease" else ConnectionPool, name)
    reached = 0
    for line in _lines_of(function):
        sys.settrace(_raise_at(function, line))
        try:
            with pool.connection():
                pass
        except Injected:
            reached += 1
        finally:
            sys.settrace(None)
        _balanced(pool)
    assert reached, f"no line of {method} was reached"
    _every_connection_lendable(pool)
    gateway.close()


class _Transaction:
    """Stands for the transaction a held connection belongs to (weakly referenced)."""


def test_a_transaction_interrupted_while_giving_its_connection_back_loses_none(tmp_path: Any) -> None:
    """A held connection (a transaction's) goes back through ``unhold``,
    which must survive an interrupt on the way into the release too."""
    gateway = EmbeddedGateway(str(tmp_path / "held.sqlite3"))
    pool = gateway._pool
    pool._size = 3
    function = ConnectionPool._put_back
    for line in _lines_of(function):
        owner = _Transaction()
        conn = pool.hold(owner)
        sys.settrace(_raise_at(function, line))
        try:
            pool.unhold(conn)
        except Injected:
            pass
        finally:
            sys.settrace(None)
        _balanced(pool)
    _every_connection_lendable(pool)
    gateway.close()


def _interrupted_in_exit(pool: ConnectionPool, line: int) -> bool:
    """One call whose ``Lease.__exit__`` is interrupted at ``line``; the
    interrupt is caught and dropped, but lives on in a reference cycle, as
    the plan drivers' do (their frames hold the error they carry). Whether
    it was raised."""
    sys.settrace(_raise_at(Lease.__exit__, line))
    try:
        with pool.connection():
            pass
    except Injected as exc:
        exc.cycle = [exc]  # type: ignore[attr-defined]
        return True
    finally:
        sys.settrace(None)
    return False


@pytest.mark.parametrize("line", range(len(_lines_of(Lease.__exit__))), ids=lambda n: f"exit-line-{n}")
def test_a_lease_kept_alive_by_its_interrupts_traceback_does_not_stall_its_threads_next_call(line: int) -> None:
    """An interrupt inside ``Lease.__exit__``, before the connection went
    back, leaves it lent to a lease that only a reference cycle keeps alive
    (the interrupt, its traceback's frames, the lease). ``_reclaim_lost``
    takes a connection back once its lease is gone, so on ``memory://`` (one
    connection) the thread's next call waited for the garbage collector,
    then raised ``Contention`` at its deadline (30 s; the fresh user's
    SIGALRM run: at the 472nd interrupt). Now that call collects garbage
    once and takes the connection back."""
    gateway = EmbeddedGateway(None)
    pool = gateway._pool
    gc_was = gc.isenabled()
    gc.disable()  # (so that only the pool's own collection can free the lease)
    try:
        _interrupted_in_exit(pool, _lines_of(Lease.__exit__)[line])
        started = time.monotonic()
        bound = deadlines.limit(started + 2.0)  # (the wait's bound: 30 s otherwise)
        try:
            with pool.connection() as conn:
                conn.execute("SELECT 1")
        finally:
            deadlines.restore(bound)
        assert time.monotonic() - started < 1.0
    finally:
        if gc_was:
            gc.enable()
    _balanced(pool)
    gateway.close()


def test_a_lease_still_in_use_is_never_taken_back_by_its_own_thread() -> None:
    """A lease its thread is still inside (a call made from a signal's
    handler while another call of the same thread holds the connection)
    stays that call's: the collection frees only what nothing uses, and the
    nested call waits, then raises ``Contention`` at its deadline, nothing
    written."""
    gateway = EmbeddedGateway(None)
    pool = gateway._pool
    with pool.connection() as outer:
        bound = deadlines.limit(time.monotonic() + 0.3)
        try:
            with pytest.raises(Contention, match="stayed in use"):
                with pool.connection():
                    pass
        finally:
            deadlines.restore(bound)
        outer.execute("SELECT 1")  # still its own
    _balanced(pool)
    gateway.close()
