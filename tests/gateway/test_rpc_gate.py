"""The gate a blocking gRPC gateway's calls pass through, so that no call is
inside gRPC when the process forks (``gateway._grpc_clients.RpcGate``).

It blocks in two places, and each is tested here with what can land there:
a call waiting while a fork is pending (the fork ends, the call's deadline
passes, an interrupt lands), and the fork waiting for the calls in flight
(they end, one outlasts ``FORK_DRAIN_S``, the forking thread's own call,
a call interrupted mid-flight). A real fork's child starts with nothing in
flight and nothing pending. A cancellation has no place here (the gate is
the blocking gateways'; asyncio gateways are refused in forked children),
and a crash ends the process that holds the gate; the forks themselves run
in ``tests/reliability/test_grpc_fork.py``.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from typing import Any

import pytest

from gds_counter.errors import Unavailable
from gds_counter.gateway import _grpc_clients
from gds_counter.gateway._grpc_clients import RpcGate


class Hold:
    """A call's ``send`` that stays in flight until released."""

    def __init__(self) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.timeouts: list[float] = []

    def __call__(self, timeout: float) -> str:
        self.timeouts.append(timeout)
        self.inside.set()
        assert self.release.wait(10)
        return "answered"


def in_thread(function: Any) -> tuple[threading.Thread, list[Any]]:
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(function())
        except BaseException as exc:  # reported to the test
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def test_a_call_waits_while_a_fork_is_pending_and_is_sent_after_it():
    gate = RpcGate("gw")
    gate._before_fork()
    thread, box = in_thread(lambda: gate.run(lambda timeout: timeout, 5.0, "commit"))
    thread.join(0.3)
    assert thread.is_alive() and not box  # held outside, not sent
    gate._after_fork_in_parent()
    thread.join(5)
    assert box and 0 < box[0] <= 5.0  # sent with what was left of its deadline


def test_a_call_whose_deadline_passes_while_a_fork_is_pending_is_unavailable_and_not_sent():
    gate = RpcGate("gw")
    gate._before_fork()
    sent: list[float] = []
    with pytest.raises(Unavailable, match=r"commit: not sent to 'gw': the process was forking.*nothing was written"):
        gate.run(sent.append, 0.2, "commit")
    assert sent == []
    gate._after_fork_in_parent()
    assert gate.run(lambda timeout: "sent", 1.0, "commit") == "sent"


def test_an_interrupt_while_waiting_for_a_fork_leaves_nothing_counted():
    gate = RpcGate("gw")
    gate._before_fork()
    thread, box = in_thread(lambda: gate.run(lambda timeout: "sent", 30.0, "commit"))
    time.sleep(0.2)
    assert ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt)) == 1
    gate._after_fork_in_parent()  # (the wait wakes, and the interrupt lands)
    thread.join(5)
    assert box and isinstance(box[0], (KeyboardInterrupt, str))
    assert not gate._busy(threading.get_ident())


def test_a_fork_waits_for_the_calls_in_flight_and_new_ones_wait_for_the_fork():
    gate = RpcGate("gw")
    hold = Hold()
    caller, answer = in_thread(lambda: gate.run(hold, 5.0, "lookup"))
    assert hold.inside.wait(5)
    forker, _ = in_thread(gate._before_fork)
    forker.join(0.3)
    assert forker.is_alive()  # waiting for the call in flight
    late, late_answer = in_thread(lambda: gate.run(lambda timeout: "late", 5.0, "lookup"))
    late.join(0.2)
    assert late.is_alive() and not late_answer  # a new call waits for the fork
    hold.release.set()
    forker.join(5)
    caller.join(5)
    assert not forker.is_alive() and answer == ["answered"]
    assert late.is_alive()  # still: the fork is not done
    gate._after_fork_in_parent()
    late.join(5)
    assert late_answer == ["late"]


def test_a_call_that_outlasts_the_drain_lets_the_fork_go_on_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(_grpc_clients, "FORK_DRAIN_S", 0.3)
    gate = RpcGate("gw")
    hold = Hold()
    caller, _ = in_thread(lambda: gate.run(hold, 5.0, "run_query"))
    assert hold.inside.wait(5)
    began = time.monotonic()
    gate._before_fork()
    assert time.monotonic() - began < 3  # bounded
    assert "still in flight" in caplog.text and "'gw'" in caplog.text
    gate._after_fork_in_parent()
    hold.release.set()
    caller.join(5)


def test_the_forking_threads_own_call_does_not_make_the_fork_wait_for_it(monkeypatch):
    monkeypatch.setattr(_grpc_clients, "FORK_DRAIN_S", 30.0)
    gate = RpcGate("gw")

    def send(timeout: float) -> float:  # a signal's handler forking from inside this thread's own call
        began = time.monotonic()
        gate._before_fork()
        gate._after_fork_in_parent()
        return time.monotonic() - began

    assert gate.run(send, 5.0, "commit") < 5


def test_a_call_interrupted_in_flight_is_no_longer_counted(monkeypatch):
    monkeypatch.setattr(_grpc_clients, "FORK_DRAIN_S", 30.0)
    gate = RpcGate("gw")

    def interrupted(timeout: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gate.run(interrupted, 5.0, "commit")
    began = time.monotonic()
    gate._before_fork()  # nothing to wait for
    gate._after_fork_in_parent()
    assert time.monotonic() - began < 5


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() (POSIX)")
def test_a_forked_child_starts_with_no_call_in_flight_and_no_fork_pending(monkeypatch):
    monkeypatch.setattr(_grpc_clients, "FORK_DRAIN_S", 0.2)  # the held call outlasts the fork's wait
    gate = RpcGate("gw")
    hold = Hold()
    caller, _ = in_thread(lambda: gate.run(hold, 5.0, "commit"))
    assert hold.inside.wait(5)
    pid = os.fork()  # the gate's own fork hooks run (forks.register)
    if pid == 0:
        ok = not gate._busy(threading.get_ident()) and gate.run(lambda timeout: "sent", 1.0, "commit") == "sent"
        os._exit(0 if ok else 1)
    hold.release.set()
    caller.join(5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert gate.run(lambda timeout: "sent", 1.0, "commit") == "sent"  # the parent's gate is open again
