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

import sys
import threading
from types import FrameType
from typing import Any, Callable

import pytest

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
