"""The gate a blocking gRPC gateway's calls pass through, so that no call is
inside gRPC when the process forks (``gateway._grpc_clients.RpcGate``).

It blocks in two places, and each is tested here with what can land there:
a call waiting while a fork is pending (the fork ends, the call's deadline
passes, an interrupt lands), and the fork waiting for the calls in flight
(they end, one outlasts ``FORK_DRAIN_S``, which bounds the whole fork
however many gateways wait, the forking thread's own call, a call
interrupted mid-flight, a fork made by a signal's handler inside a call).
A real fork's child starts with nothing in flight and nothing pending. A cancellation has no place here (the gate is
the blocking gateways'; asyncio gateways are refused in forked children),
and a crash ends the process that holds the gate; the forks themselves run
in ``tests/reliability/test_grpc_fork.py``.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from background import in_thread

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


def test_a_call_waits_while_a_fork_is_pending_and_is_sent_after_it():
    gate = RpcGate("gw")
    gate._before_fork()
    thread, box = in_thread(lambda: gate.run(lambda timeout: timeout, 5.0))
    thread.join(0.3)
    assert thread.is_alive() and not box  # held outside, not sent
    gate._after_fork_in_parent()
    thread.join(5)
    assert box and 0 < box[0] <= 5.0  # sent with what was left of its deadline


def test_a_call_whose_deadline_passes_while_a_fork_is_pending_is_sent_all_the_same_with_no_time_left():
    """Not refused: an error of the gate's own would skip the retry policy's
    word on the call's earlier attempts (one may have been applied); sent
    with no time left, it ends as any call past its deadline does."""
    gate = RpcGate("gw")
    gate._before_fork()
    began = time.monotonic()
    timeouts: list[float] = []
    gate.run(timeouts.append, 0.2)
    assert time.monotonic() - began >= 0.2 and timeouts and timeouts[0] <= 0.01
    gate._after_fork_in_parent()


def test_an_interrupt_while_waiting_for_a_fork_leaves_nothing_counted():
    gate = RpcGate("gw")
    gate._before_fork()
    thread, box = in_thread(lambda: gate.run(lambda timeout: "sent", 30.0))
    time.sleep(0.2)
    assert ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt)) == 1
    gate._after_fork_in_parent()  # (the wait wakes, and the interrupt lands)
    thread.join(5)
    assert box and isinstance(box[0], (KeyboardInterrupt, str))
    assert not gate._busy(threading.get_ident())


def test_a_fork_waits_for_the_calls_in_flight_and_new_ones_wait_for_the_fork():
    gate = RpcGate("gw")
    hold = Hold()
    caller, answer = in_thread(lambda: gate.run(hold, 5.0))
    assert hold.inside.wait(5)
    forker, _ = in_thread(gate._before_fork)
    forker.join(0.3)
    assert forker.is_alive()  # waiting for the call in flight
    late, late_answer = in_thread(lambda: gate.run(lambda timeout: "late", 5.0))
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
    caller, _ = in_thread(lambda: gate.run(hold, 5.0))
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

    assert gate.run(send, 5.0) < 5


def test_a_call_interrupted_in_flight_is_no_longer_counted(monkeypatch):
    monkeypatch.setattr(_grpc_clients, "FORK_DRAIN_S", 30.0)
    gate = RpcGate("gw")

    def interrupted(timeout: float) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        gate.run(interrupted, 5.0)
    began = time.monotonic()
    gate._before_fork()  # nothing to wait for
    gate._after_fork_in_parent()
    assert time.monotonic() - began < 5


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() (POSIX)")
def test_a_forked_child_starts_with_no_call_in_flight_and_no_fork_pending(monkeypatch):
    monkeypatch.setattr(_grpc_clients, "FORK_DRAIN_S", 0.2)  # the held call outlasts the fork's wait
    gate = RpcGate("gw")
    hold = Hold()
    caller, _ = in_thread(lambda: gate.run(hold, 5.0))
    assert hold.inside.wait(5)
    pid = os.fork()  # the gate's own fork hooks run (forks.register)
    if pid == 0:
        ok = not gate._busy(threading.get_ident()) and gate.run(lambda timeout: "sent", 1.0) == "sent"
        os._exit(0 if ok else 1)
    hold.release.set()
    caller.join(5)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert gate.run(lambda timeout: "sent", 1.0) == "sent"  # the parent's gate is open again


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() (POSIX)")
def test_one_fork_waits_at_most_the_drain_however_many_gateways_have_calls_in_flight(monkeypatch):
    monkeypatch.setattr(_grpc_clients, "FORK_DRAIN_S", 1.0)
    gates, holds, callers = [RpcGate(f"gw{n}") for n in range(3)], [Hold() for _ in range(3)], []
    for gate, hold in zip(gates, holds):
        callers.append(in_thread(lambda gate=gate, hold=hold: gate.run(hold, 10.0))[0])
        assert hold.inside.wait(5)
    began = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    took = time.monotonic() - began
    for hold in holds:
        hold.release.set()
    os.waitpid(pid, 0)
    assert 1.0 <= took < 2.5, took  # one drain for the fork (three, one per gateway, was 3 s)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() (POSIX)")
def test_a_fork_made_by_a_signals_handler_inside_a_call_neither_waits_for_it_nor_hangs(monkeypatch):
    monkeypatch.setattr(_grpc_clients, "FORK_DRAIN_S", 30.0)
    gate = RpcGate("gw")
    children: list[int] = []

    def fork_here(signum: int, frame: Any) -> None:
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        children.append(pid)

    previous = signal.signal(signal.SIGALRM, fork_here)
    faulthandler.dump_traceback_later(60, exit=True)  # a hang fails the run, not waits for ever
    try:
        def send(timeout: float) -> str:
            for _ in range(20):  # the handler runs between these lines, on this thread
                signal.setitimer(signal.ITIMER_REAL, 0.001)
                time.sleep(0.01)
            return "answered"

        began = time.monotonic()
        assert gate.run(send, 5.0) == "answered"
        assert time.monotonic() - began < 10
    finally:
        faulthandler.cancel_dump_traceback_later()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        for pid in children:
            os.waitpid(pid, 0)
    assert children


def test_a_thread_an_interrupt_left_counted_but_idle_does_not_make_a_fork_wait(monkeypatch):
    """An interrupt can land between a call's end and the ``finally`` that
    takes its thread out (seen: every later fork then waited the whole
    drain). The fork asks whether each thread is inside a call now."""
    monkeypatch.setattr(_grpc_clients, "FORK_DRAIN_S", 30.0)
    gate = RpcGate("gw")
    idle = threading.Event()
    thread, _ = in_thread(lambda: idle.wait(10))
    gate._in_flight.add(thread.ident)  # what such an interrupt leaves behind
    began = time.monotonic()
    gate._before_fork()
    gate._after_fork_in_parent()
    idle.set()
    assert time.monotonic() - began < 5
    assert thread.ident not in gate._in_flight


#: A process that forks while one of its fork-hook members forks again
#: from inside the hooks, as a signal's handler landing on the forking
#: thread (while it waits for a call in flight) would. In a fresh
#: interpreter: the test run's own at-fork hooks (its plugins') are not
#: this product's to make re-entrant.
NESTED_FORK = """
import os
from gds_counter._process import forks
from gds_counter.gateway._grpc_clients import RpcGate

gate = RpcGate("gw")

class ForksInsideTheHooks:
    children = []

    def _before_fork(self):
        if not self.children:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            self.children.append(pid)

member = ForksInsideTheHooks()
forks.register(member)
pid = os.fork()
if pid == 0:
    os._exit(0 if not gate._forking else 1)
codes = [os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]) for child in [pid, *member.children]]
print(codes, gate._forking, gate.run(lambda timeout: "sent", 1.0))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() (POSIX)")
def test_a_fork_made_inside_another_forks_hooks_neither_hangs_nor_leaves_a_gate_shut():
    """It used to wait for ever on the fork registry's own lock."""
    done = subprocess.run([sys.executable, "-c", NESTED_FORK], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["[0,", "0]", "False", "sent"], done.stdout
