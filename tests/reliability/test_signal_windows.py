"""A Ctrl-C lands where a signal's handler runs: right after a call returns.

The line-by-line interrupt tests raise before a line begins. A real signal
(SIGINT's KeyboardInterrupt, or an exception sent to a thread) is raised
where the interpreter checks for one, which is just after a call returned,
in the middle of a line: after ``lock.acquire()`` took the lock but before
the ``with`` knew, after ``list.pop()`` took a connection but before it was
stored anywhere. These tests raise at every such point of the code that
must hand things back (the connection pool, ``_process.interrupts.locked``) and
check that nothing is lost and nobody waits for ever. (Fresh-eyes trial:
one Ctrl-C during an increment hung the embedded gateway for good.)
"""

from __future__ import annotations

import dis
import sys
import threading
from types import CodeType, FrameType
from typing import Any, Callable

import pytest

from gds_counter._process.interrupts import locked
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.embedded._connections import ConnectionPool, Lease


class Injected(BaseException):
    """Stands for KeyboardInterrupt without touching pytest's own handling."""


def after_calls(code: CodeType) -> list[int]:
    """The offsets of the instructions that follow a call in ``code``:
    where the interpreter raises a pending signal's exception."""
    instructions = list(dis.get_instructions(code))
    return [after.offset for call, after in zip(instructions, instructions[1:]) if call.opname.startswith("CALL")]


def raising_after(code: CodeType, offset: int, fired: list[int]) -> Callable[[FrameType, str, Any], Any]:
    """A trace function that raises ``Injected`` the first time ``code``
    is about to run the instruction at ``offset``."""

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "opcode" and frame.f_lasti == offset and not fired:
            fired.append(offset)
            raise Injected(f"{code.co_name}+{offset}")
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Any:
        if frame.f_code is not code:
            return None
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return local

    return global_


def interrupted_at(code: CodeType, offset: int, call: Callable[[], Any]) -> bool:
    """Run ``call`` with an interrupt after the call at ``offset`` of
    ``code``; True if it fired."""
    fired: list[int] = []
    sys.settrace(raising_after(code, offset, fired))
    try:
        call()
    except Injected:
        pass
    finally:
        sys.settrace(None)
    return bool(fired)


def _balanced(pool: ConnectionPool) -> None:
    assert pool._opening == 0
    assert len(set(map(id, pool._idle))) == len(pool._idle), "a connection is idle twice"
    assert pool._count == len(pool._idle) + len(pool._lent) + len(pool._held), (
        pool._count, len(pool._idle), len(pool._lent), len(pool._held))


def _still_lends(pool: ConnectionPool) -> None:
    done: list[bool] = []

    def borrow() -> None:
        with pool.connection():
            pass
        done.append(True)

    thread = threading.Thread(target=borrow, daemon=True)
    thread.start()
    thread.join(10)
    assert done, "the pool lends no connection any more: one was lost"


@pytest.mark.parametrize("where", ["memory", "file"])
@pytest.mark.parametrize("method", ["ConnectionPool._acquire", "ConnectionPool._release", "Lease.__enter__"])
def test_an_interrupt_after_any_call_of_the_pool_loses_no_connection(tmp_path, where, method):
    owner, name = method.split(".")
    code = getattr({"ConnectionPool": ConnectionPool, "Lease": Lease}[owner], name).__code__
    reached = 0
    for offset in after_calls(code):
        gateway = EmbeddedGateway(None if where == "memory" else str(tmp_path / f"{name}-{offset}.db"))
        pool = gateway._pool
        try:
            def use() -> None:
                with pool.connection():
                    pass

            if interrupted_at(code, offset, use):
                reached += 1
                _balanced(pool)
                _still_lends(pool)
                _balanced(pool)
        finally:
            gateway.close()
    assert reached, f"no interrupt reached ConnectionPool.{method}"


def test_locked_takes_its_lock_once_when_an_interrupt_lands_just_after_it_was_taken():
    """The interrupt lands after ``acquire()`` returned: the lock is this
    thread's, so ``locked`` must not wait for it again (on a plain lock,
    for ever), and the interrupt is raised once the block ran."""
    code = locked.__enter__.__code__
    offsets = after_calls(code)
    assert offsets
    for offset in offsets:
        lock = threading.RLock()
        ran: list[bool] = []
        outcome: list[BaseException] = []

        def block() -> None:
            try:
                with locked(lock):
                    ran.append(True)
            except BaseException as exc:  # noqa: B902  (the injected interrupt, raised at the exit)
                outcome.append(exc)

        def traced() -> None:
            fired: list[int] = []
            sys.settrace(raising_after(code, offset, fired))
            try:
                block()
            finally:
                sys.settrace(None)

        thread = threading.Thread(target=traced, daemon=True)
        thread.start()
        thread.join(5)
        assert not thread.is_alive(), f"locked() waited for ever after an interrupt at offset {offset}"
        assert ran == [True]
        assert not lock._is_owned() and lock.acquire(blocking=False)  # released, and free for others
        lock.release()


@pytest.mark.parametrize("method", ["commit", "_write"])
def test_an_interrupt_after_any_call_of_the_group_commit_leaves_no_later_commit_waiting(tmp_path, method):
    """The file's group commit: an interrupt after any call of a commit
    (as its queueing ``with`` exits, as the writer gives the write lock
    back) must not leave the queue marked as having a writer that no one
    is: the next commit would wait its whole deadline, and so every one
    after it."""
    from gds_counter.gateway.embedded._group_commit import GroupCommit
    from gds_counter.gateway.keys import Key
    from gds_counter.gateway.mutations import Upsert
    from gds_counter.gateway.values import RawEntity

    code = getattr(GroupCommit, method).__code__
    reached = 0
    for offset in after_calls(code):
        gateway = EmbeddedGateway(str(tmp_path / f"{method}-{offset}.db"))
        try:
            def commit(name: str) -> None:
                gateway.commit([Upsert(RawEntity(Key.of("K", name), {"n": 1}))])

            if not interrupted_at(code, offset, lambda: commit("first")):
                continue
            reached += 1
            done: list[bool] = []
            later = threading.Thread(target=lambda: (commit("next"), done.append(True)), daemon=True)
            later.start()
            later.join(10)
            assert done, f"the next commit waited after an interrupt at {method}+{offset}"
        finally:
            gateway.close()
    assert reached


def test_an_interrupt_inside_a_lookup_leaves_no_read_open_that_refuses_later_writes(tmp_path):
    """A lookup read its rows in a loop over SQLite's statement; an interrupt
    landing in that loop left the statement part-read on the pooled
    connection whenever the traceback kept the frame (a REPL, a caller that
    stores its errors). The statement held its read snapshot, so once
    another connection had committed, every later write on that connection
    was refused "database is locked" at the end of its deadline, for good:
    a fresh user's threads stopped writing after a Ctrl-C. Now the rows are
    read whole, in one call."""
    from gds_counter.errors import GDSError
    from gds_counter.gateway.keys import Key
    from gds_counter.gateway.mutations import Upsert
    from gds_counter.gateway.values import RawEntity

    db = tmp_path / "lookup.sqlite3"
    gateway, other = EmbeddedGateway(db), EmbeddedGateway(db)
    keys = [Key.of("K", f"k{i}") for i in range(50)]
    gateway.commit([Upsert(RawEntity(key, {"n": 1})) for key in keys])
    lookup_code = type(gateway)._lookup.__code__
    fired: list[BaseException] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        if code is lookup_code or (code.co_name == "<dictcomp>" and frame.f_back is not None
                                   and frame.f_back.f_code is lookup_code):
            return local
        return None

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        if event == "line" and frame.f_code.co_name == "<dictcomp>" and not fired:
            fired.append(KeyboardInterrupt("as the lookup reads its rows"))
            raise fired[0]
        return local

    kept: list[BaseException] = []
    sys.settrace(tracer)
    try:
        gateway.lookup(keys)
    except KeyboardInterrupt as exc:
        kept.append(exc)  # its traceback keeps the lookup's frame, as a REPL's last traceback does
    finally:
        sys.settrace(None)
    other.commit([Upsert(RawEntity(keys[0], {"n": 2}))])
    try:
        gateway.commit([Upsert(RawEntity(keys[1], {"n": 3}))])
    except GDSError as exc:
        pytest.fail(f"a write after the interrupted lookup was refused: {exc!r}")
    finally:
        gateway.close()
        other.close()
    check = EmbeddedGateway(db)
    assert [e.properties["n"] for e in check.lookup(keys[:2])] == [2, 3]
    check.close()
