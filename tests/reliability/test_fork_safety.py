"""Counters on the embedded engine across ``fork()``: nothing acknowledged is lost.

A counter (or gateway) built before ``fork()`` is what gunicorn
``--preload`` and ``multiprocessing`` (fork start method) hand each worker.
SQLite's lock bookkeeping lives in process memory: a child that kept using
the parent's connections held no lock the parent could see, so when the
parent closed its gateway or exited, SQLite took itself for the last user,
checkpointed and deleted the ``-wal`` file, and the child went on committing
into the deleted log (measured before the fix: a child acknowledged 7 adds,
2 were stored). Here many children count while the parent closes its
gateway, or exits, and every total is checked exactly: the stored count is
what the parent and the children were told was counted.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from fork_parent import child
from sizes import size

from gds_counter.counter import CounterShardDS
from gds_counter.errors import GDSError
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Upsert
from gds_counter.gateway.values import RawEntity
from gds_counter.gds import RetryPolicy

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() (POSIX)")


@pytest.fixture(autouse=True)
def nothing_of_the_test_run_is_finalized_in_a_child():
    """The children here are forks of the test run's own process, which
    holds gRPC channels (the emulator fixtures', and garbage ones of earlier
    tests). gRPC skips its fork handlers while its threads are busy ("Other
    threads are currently calling into gRPC, skipping fork() handlers"),
    and a child whose garbage collector then finalizes an inherited channel
    can block inside gRPC forever, at any point, even while it holds the
    SQLite write lock: once in CI every child waited on it for 240 s. So,
    as the ``gc.freeze`` documentation advises for forking servers, the
    parent collects its garbage and freezes the rest before it forks; the
    engine's own fork handling is what these tests are about."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()

PARENT = Path(__file__).with_name("fork_parent.py")
CHILDREN = 6
ADDS = size(40, 150)
#: A child still running after this long is stuck (it never is after the fix).
HANG_S = 240.0
#: Many quick attempts: six processes on 20 shards conflict now and then.
PATIENT = RetryPolicy(attempts=50, initial=0.001, maximum=0.02)


def stored(db: Path) -> int:
    """The counter's stored total, once SQLite has found the file intact."""
    gateway = EmbeddedGateway(db)
    try:
        with gateway._db() as conn:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        return CounterShardDS("fork", 1, gateway=gateway).get_count()
    finally:
        gateway.close()


def reports(text: str) -> tuple[int, int]:
    """Acknowledged and raised adds, summed over the children's lines."""
    acknowledged = raised = 0
    lines = [line.split() for line in text.splitlines() if line.startswith("child ")]
    assert len(lines) == CHILDREN, text
    for _, ok, failed in lines:
        acknowledged += int(ok)
        raised += int(failed)
    return acknowledged, raised


def read_all(fd: int) -> str:
    out = b""
    while chunk := os.read(fd, 4096):
        out += chunk
    return out.decode()


def wait_or_kill(pid: int, deadline: float) -> int:
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


class Children:
    """``CHILDREN`` processes forked with ``os.fork()``, each running
    ``fork_parent.child``: a quarter of their adds, a pause until
    ``resume_and_wait()``, then the rest."""

    def __init__(self, counter: CounterShardDS) -> None:
        self._started_r, started_w = os.pipe()
        self._resume_r, self._resume_w = os.pipe()
        self._report_r, report_w = os.pipe()
        self.pids = []
        for _ in range(CHILDREN):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child's side
                for fd in (self._started_r, self._resume_w, self._report_r):
                    os.close(fd)
                child(counter, ADDS, started_w, self._resume_r, report_w)
            self.pids.append(pid)
        os.close(started_w)
        os.close(report_w)
        os.close(self._resume_r)

    def wait_until_started(self) -> None:
        seen = 0
        deadline = time.monotonic() + HANG_S
        while seen < CHILDREN:
            ready, _, _ = select.select([self._started_r], [], [], max(0.0, deadline - time.monotonic()))
            assert ready, f"only {seen} of {CHILDREN} children started counting in {HANG_S:.0f} s"
            chunk = os.read(self._started_r, CHILDREN)
            assert chunk, "a child ended before it started counting"
            seen += len(chunk)

    def resume_and_wait(self) -> tuple[list[int], str]:
        """Let the children count the rest; their exit codes and reports.
        A child still running after ``HANG_S`` is killed (exit code -9): a
        hang guard, not a speed limit."""
        os.close(self._resume_w)
        deadline = time.monotonic() + HANG_S
        codes = [wait_or_kill(pid, deadline) for pid in self.pids]
        text = read_all(self._report_r)
        os.close(self._started_r)
        os.close(self._report_r)
        return codes, text


def tally_fork(tally: Any, area: str, parent_adds: int, acknowledged: int, raised: int, total: int) -> None:
    told = parent_adds + acknowledged
    tally.add(area, operations=told + raised, faults_injected=1,
              increments_lost=max(0, told - total), double_counts=max(0, total - told))


@pytest.mark.parametrize("strategy", ["auto", "transactional"])
def test_children_of_os_fork_lose_nothing_when_the_parent_closes_its_gateway(tmp_path, strategy, tally):
    db = tmp_path / "fork.sqlite3"
    gateway = EmbeddedGateway(db)
    counter = CounterShardDS("fork", 1, gateway=gateway, strategy=strategy, retry=PATIENT)
    counter.add(1)  # the parent has used its gateway: connections are open at the fork
    children = Children(counter)
    try:
        children.wait_until_started()
        counter.add(1)  # the parent counts too, on connections of its own
        gateway.close()  # ... and closes it in the middle of every child's run
    finally:
        codes, text = children.resume_and_wait()
    assert codes == [0] * CHILDREN, text
    acknowledged, raised = reports(text)
    total = stored(db)
    tally_fork(tally, f"fork: os.fork children, parent closes its gateway ({strategy})", 2, acknowledged, raised, total)
    assert total == 2 + acknowledged
    assert acknowledged >= CHILDREN * ADDS * 9 // 10  # conflicts out of 50 attempts are rare


@pytest.mark.parametrize("mode", ["exit", "close"])
def test_children_lose_nothing_when_the_parent_process_exits(tmp_path, mode, tally):
    """A real parent process (``fork_parent.py``) forks the children, adds
    once more and then exits (Python finalises its open gateway), or closes
    its gateway and exits, while the children are counting."""
    db = tmp_path / "fork.sqlite3"
    proc = subprocess.run(
        [sys.executable, str(PARENT), str(db), str(CHILDREN), str(ADDS), mode],
        capture_output=True, text=True, timeout=300,
    )
    # run() returns once stdout is closed: by the parent and every child.
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("parent 1") == 2, proc.stdout + proc.stderr
    acknowledged, raised = reports(proc.stdout)
    total = stored(db)
    tally_fork(tally, f"fork: os.fork children, parent process {'exits' if mode == 'exit' else 'closes and exits'}",
               2, acknowledged, raised, total)
    assert total == 2 + acknowledged, proc.stderr
    assert acknowledged >= CHILDREN * ADDS * 9 // 10, proc.stderr


def _mp_worker(counter: CounterShardDS, adds: int, started: Any, resume: Any, results: Any, index: int) -> None:
    acknowledged = raised = 0
    for i in range(adds):
        try:
            counter.add(1)
            acknowledged += 1
        except GDSError:
            raised += 1
        if i == adds // 4:
            started.release()
            assert resume.wait(300)
    results[2 * index], results[2 * index + 1] = acknowledged, raised


def test_multiprocessing_fork_workers_lose_nothing_when_the_parent_closes(tmp_path, tally):
    db = tmp_path / "fork.sqlite3"
    gateway = EmbeddedGateway(db)
    counter = CounterShardDS("fork", 1, gateway=gateway, retry=PATIENT)
    counter.add(1)
    ctx = multiprocessing.get_context("fork")
    started, resume = ctx.Semaphore(0), ctx.Event()
    results = ctx.Array("q", 2 * CHILDREN)
    workers = [ctx.Process(target=_mp_worker, args=(counter, ADDS, started, resume, results, i)) for i in range(CHILDREN)]
    for worker in workers:
        worker.start()
    try:
        for _ in workers:
            assert started.acquire(timeout=120)
        counter.add(1)
        gateway.close()
    finally:
        resume.set()
        for worker in workers:
            worker.join(HANG_S)
            if worker.is_alive():  # a hang guard: it never is after the fix
                worker.kill()
                worker.join()
    assert [w.exitcode for w in workers] == [0] * CHILDREN
    acknowledged, raised = sum(results[0::2]), sum(results[1::2])
    total = stored(db)
    tally_fork(tally, "fork: multiprocessing (fork) workers, parent closes its gateway", 2, acknowledged, raised, total)
    assert total == 2 + acknowledged
    assert acknowledged >= CHILDREN * ADDS * 9 // 10


def test_a_fork_while_another_thread_is_writing_waits_for_its_call(tmp_path, tally):
    """Another thread of the parent commits to the same file through a
    second gateway the whole time: each fork waits for that thread's call in
    progress and closes that gateway's connections too, so no child inherits
    SQLite state for the file. (The thread's gateway is the parent's alone:
    a child never uses a gateway another thread may have been in.)"""
    db = tmp_path / "fork.sqlite3"
    gateway = EmbeddedGateway(db)
    counter = CounterShardDS("fork", 1, gateway=gateway, retry=PATIENT)
    counter.add(1)
    busy_gateway = EmbeddedGateway(db)
    busy = CounterShardDS("fork", 1, gateway=busy_gateway, retry=PATIENT)
    stop = threading.Event()
    busy_told = [0]

    def keep_writing() -> None:
        while not stop.is_set():
            busy.add(1)
            busy_told[0] += 1

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        children = Children(counter)  # each fork waits for the writer's call in progress
    except BaseException:
        stop.set()
        writer.join(60)
        raise
    try:
        children.wait_until_started()
        gateway.close()
    finally:
        stop.set()
        writer.join(60)
        busy_gateway.close()  # the parent holds no connection to the file now
        codes, text = children.resume_and_wait()
    assert codes == [0] * CHILDREN, text
    acknowledged, raised = reports(text)
    total = stored(db)
    tally_fork(tally, "fork: os.fork while another thread writes the file", 1 + busy_told[0], acknowledged, raised, total)
    assert total == 1 + busy_told[0] + acknowledged
    assert busy_told[0] > 0


def test_a_child_that_inherits_connections_without_the_fork_hooks_refuses_to_write(tmp_path):
    """A fork made in C (libc's ``fork()`` here) runs no Python at-fork
    hooks, so the child inherits the parent's open connections: it must raise,
    naming the file, rather than write through SQLite state that holds no
    lock, and it must not close them (that could drop the parent's locks)."""
    libc_fork = getattr(ctypes.CDLL(None), "fork", None)
    if libc_fork is None:
        pytest.skip("no libc fork() to call")
    db = tmp_path / "fork.sqlite3"
    gateway = EmbeddedGateway(db)
    counter = CounterShardDS("fork", 1, gateway=gateway)
    counter.add(1)
    report_r, report_w = os.pipe()
    pid = libc_fork()
    if pid == 0:  # pragma: no cover - the child's side
        code = 1
        try:
            try:
                counter.add(1)
                os.write(report_w, b"acknowledged")
            except GDSError as exc:
                os.write(report_w, f"{type(exc).__name__}: {exc}".encode())
            code = 0
        finally:
            os._exit(code)
    assert pid > 0
    os.close(report_w)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    message = read_all(report_r)
    os.close(report_r)
    assert message.startswith("GatewayError: ") and str(db) in message and "fork" in message, message
    counter.add(1)  # the parent's gateway is unharmed
    assert counter.get_count() == 2
    gateway.close()
    assert stored(db) == 2


def test_the_parent_keeps_counting_after_forks(tmp_path):
    """The fork hooks close the parent's idle connections; its next call
    opens new ones, with nothing lost or counted twice."""
    db = tmp_path / "fork.sqlite3"
    gateway = EmbeddedGateway(db)
    counter = CounterShardDS("fork", 1, gateway=gateway)
    for _ in range(5):
        counter.add(1)
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's side
            os._exit(0)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    assert counter.get_count() == 5
    gateway.close()



@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX")
def test_forking_beside_transactions_and_group_commits_never_stalls(tmp_path):
    """A fork waits for every lent connection. A transaction holding one
    waited for the write lock, whose holder (the group commit's writer)
    waited for a connection, which the forking pool refused it: the fork
    stalled for its whole drain bound (about 65 s), and adds failed. Found
    by a review with rollups (a blind transaction per stale read) beside
    adds; transactional adds meet it too."""
    import threading
    import time

    from gds_counter import CounterShardDS, open_gateway

    gateway = open_gateway(f"sqlite:///{tmp_path / 'fork-stall.sqlite3'}")
    try:
        counter = CounterShardDS("ForkStall", 1, gateway=gateway)
        stop = threading.Event()
        errors: list[str] = []
        added = [0]

        def add() -> None:
            while not stop.is_set():
                try:
                    counter.add(1)
                    added[0] += 1
                except Exception as exc:  # noqa: BLE001 - the failure is the finding
                    errors.append(type(exc).__name__)

        def roll_up() -> None:
            while not stop.is_set():
                counter.get_count_as_of(max_age=0)

        threads = [threading.Thread(target=add) for _ in range(3)] + [threading.Thread(target=roll_up) for _ in range(3)]
        for thread in threads:
            thread.start()
        slowest = 0.0
        began = time.monotonic()
        try:
            while time.monotonic() - began < 4.0:
                before = time.monotonic()
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                slowest = max(slowest, time.monotonic() - before)
                os.waitpid(pid, 0)
                time.sleep(0.02)
        finally:
            stop.set()
            for thread in threads:
                thread.join(120)
        assert slowest < 20.0, slowest  # a hang bound, far below the 65 s drain it used to wait out
        assert not errors, errors[:5]
        assert counter.get_count() == added[0]
    finally:
        gateway.close()


def test_a_call_arriving_while_a_fork_is_pending_waits_outside_the_locks(tmp_path):
    """A fork first says it is pending, then takes the pool's lock and
    waits for the calls in progress. Neither lock is fair: a thread that
    adds in a tight loop (a lone call goes straight through, with no pause
    between calls) took the pool's lock, or the write lock, back again and
    again before the forking thread woke, and a fork took minutes. So a
    call that arrives while a fork is pending waits outside both locks,
    and goes on, counted once, when the fork is done."""
    gateway = EmbeddedGateway(tmp_path / "pending.sqlite3")
    try:
        counter = CounterShardDS("pending", 1, gateway=gateway)
        counter.add(1)
        pool = gateway._pool
        pool._no_fork_pending.clear()  # the first step of the pool's _before_fork
        caller = threading.Thread(target=counter.add, args=(1,))
        caller.start()
        caller.join(0.5)
        assert caller.is_alive(), "the call went on while a fork was pending"
        # Both locks are free for the forking thread to take.
        assert pool._lock.acquire(blocking=False)
        pool._lock.release()
        assert pool.write_lock.acquire(blocking=False)
        pool.write_lock.release()
        pool._no_fork_pending.set()  # the fork is done (_after_fork_in_parent)
        caller.join(30)
        assert not caller.is_alive()
        assert counter.get_count() == 2
    finally:
        gateway.close()



class _ForkInsideACall:
    """A fork made where a signal's handler would make it: inside a call,
    in the thread making it. Both sides go on with the call; the child
    then exits with what the call did there (``exit_child``): 0 when it
    raised a GDSError, 3 for any other error, 4 when it went on as if
    nothing had happened."""

    def __init__(self) -> None:
        self.child: int | None = None
        self.took: float | None = None
        self.in_child = False

    def fork(self) -> None:
        if self.child is not None or self.in_child:
            return
        began = time.monotonic()
        pid = os.fork()
        if pid == 0:  # pragma: no cover  (the child)
            self.in_child = True
            return
        self.child, self.took = pid, time.monotonic() - began

    def call(self, function: Any) -> None:
        """Run ``function`` (a counter's call); in the child, exit with its outcome."""
        code = 4
        try:
            function()
        except GDSError:
            code = 0
        except BaseException:
            code = 3
            if not self.in_child:
                raise
        if self.in_child:  # pragma: no cover
            os._exit(code)

    def child_code(self) -> int:
        assert self.child is not None, "the fork never happened"
        _, status = os.waitpid(self.child, 0)
        return os.waitstatus_to_exitcode(status)


#: What a child's exit code from ``_ForkInsideACall.call`` means when it is not 0.
CHILD_CODES = {3: "the child's call raised an error that is not a GDSError",
               4: "the child's call went on as if nothing had happened (it wrote its copy)"}


def _one_count(gateway: EmbeddedGateway) -> tuple[Any, Any]:
    """``bump()``, one increment of one entity's count committed without a
    transaction (the group commit's writer), and ``count()``, that count."""
    key = Key.of("Shard", "one")

    def bump() -> None:
        entity = RawEntity(key, {"target": "T"}, frozenset({"count"}))
        gateway.commit([Upsert(entity, property_mask=("target",), transforms=(Increment("count", 1),))])

    def count() -> int:
        found = gateway.lookup([key])[0]
        return 0 if found is None else int(found.properties["count"])

    return bump, count


@contextlib.contextmanager
def _forking_as_it_opens(pool: Any, forking: _ForkInsideACall, monkeypatch: Any, *, before: bool) -> Iterator[None]:
    """Another thread holds the pool's idle connection, so the next call
    opens one, and forks there (``forking.fork()``) in its own thread, as a
    signal's handler would: just ``before`` SQLite opens it, or just after."""
    real_connect = pool._connect

    def connect(*args: Any, **kwargs: Any) -> Any:
        if before:
            forking.fork()
        conn = real_connect(*args, **kwargs)
        if not before:
            forking.fork()
        return conn

    lent, done = threading.Event(), threading.Event()

    def hold_the_idle_one() -> None:
        with pool.connection():
            lent.set()
            done.wait(30)

    holder = threading.Thread(target=hold_the_idle_one)
    holder.start()
    try:
        assert lent.wait(30)
        monkeypatch.setattr(pool, "_connect", connect)
        yield
    finally:
        monkeypatch.undo()
        done.set()
        holder.join(30)


def test_a_fork_made_inside_a_call_that_is_opening_a_connection_does_not_wait_for_itself(tmp_path, monkeypatch):
    """A signal's handler that forks runs in the thread it interrupts, here
    one opening a new connection (outside the pool's lock). The fork used to
    wait for that opening, which only this thread could finish: 65 s with
    the pool's lock held, every other call of the process stalled as long.
    Now the fork goes at once and the parent's call counts once; in the
    child (its copy of SQLite's state is mid-call) the call is refused with
    a GDSError."""
    gateway = EmbeddedGateway(tmp_path / "opening.sqlite3")
    try:
        counter = CounterShardDS("opening", 1, gateway=gateway)
        counter.add(1)
        forking = _ForkInsideACall()
        with _forking_as_it_opens(gateway._pool, forking, monkeypatch, before=False):
            forking.call(lambda: counter.add(1))  # no idle connection: it opens one, and forks there
        assert forking.took is not None and forking.took < 5.0, f"the fork waited {forking.took} s for its own thread"
        assert forking.child_code() == 0, "the child's call did not raise a GDSError"
        assert counter.get_count() == 2
    finally:
        gateway.close()


def test_a_fork_made_while_a_commit_opens_its_connection_leaves_the_child_unwritten(tmp_path, monkeypatch):
    """The same fork, but in a commit opening the connection it writes
    through (the group commit's writer, no transaction before it to be
    refused at), just before it opens it. The child's copy of the call
    opened a connection of its own, which no check looked at, and committed: the increment was
    stored twice, once by each side of the fork (the failure-point
    harness found it, ``pool.fork_while_opening``). Now the connection the
    child opened is refused like the rest of the file: its call raises a
    GDSError (before it opens anything: another of the parent's threads
    may have held SQLite's own locks at the fork, and the child hung in
    ``sqlite3.connect``), the increment is stored once, by the parent, and
    the child's pool counts no opening of the parent's."""
    gateway = EmbeddedGateway(tmp_path / "opening-commit.sqlite3")
    try:
        bump, count = _one_count(gateway)
        bump()
        pool = gateway._pool
        forking = _ForkInsideACall()

        def bump_then_check_the_child() -> None:
            try:
                bump()
            finally:
                # The parent's opening is not the child's to undo: a count below
                # zero would make the child's own next fork wait 65 s for it.
                if forking.in_child and (pool._opening, pool._count) != (0, 0):  # pragma: no cover
                    os._exit(5)

        with _forking_as_it_opens(pool, forking, monkeypatch, before=True):  # the child opens one of its own
            forking.call(bump_then_check_the_child)
        code = forking.child_code()
        assert code == 0, {**CHILD_CODES, 5: "the child's pool counts an opening of the parent's"}.get(code, code)
        assert count() == 2, "the increment was not stored exactly once"
    finally:
        gateway.close()


def test_a_fork_made_inside_a_write_transaction_never_commits_the_childs_copy(tmp_path, monkeypatch):
    """A signal's handler can fork in the thread that is writing, between
    its last write and ``COMMIT``. The child then committed its copy of
    the transaction into the same write-ahead log, at the same place as
    the parent's: the parent's commit, acknowledged, was gone (the
    failure-point harness lost three increments of one group so). Now the
    child's copy is refused with a GDSError, and the parent's commit is
    stored, once."""
    gateway = EmbeddedGateway(tmp_path / "in-commit.sqlite3")
    try:
        bump, count = _one_count(gateway)
        bump()
        pool = gateway._pool
        real_check = pool.check_file
        forking = _ForkInsideACall()

        def check_then_fork(conn: Any) -> None:
            real_check(conn)
            forking.fork()  # the last step before COMMIT

        monkeypatch.setattr(pool, "check_file", check_then_fork)
        forking.call(bump)
        monkeypatch.undo()
        code = forking.child_code()
        assert code == 0, CHILD_CODES.get(code, code)
        bump()
        assert count() == 3, "an increment was lost or stored twice"
    finally:
        gateway.close()


def test_a_fork_made_inside_the_pools_own_code_leaves_its_state_alone(tmp_path, monkeypatch):
    """The handler's fork can land inside the pool's own code, its lock held
    and its lists half way through a change (between the check that an idle
    connection is there and taking it). The fork hook closed the idle
    connections all the same: the parent's call then raised a bare
    IndexError. Now a fork from inside the pool touches none of its state:
    the parent's call goes on and counts once, and in the child the call is
    refused with a GDSError."""
    import gds_counter.gateway.embedded._connections as connections

    gateway = EmbeddedGateway(tmp_path / "inside.sqlite3")
    try:
        counter = CounterShardDS("inside", 1, gateway=gateway)
        counter.add(1)
        real = connections.forks
        forking = _ForkInsideACall()

        class ForkOnCheck:
            here = staticmethod(real.here)

            @staticmethod
            def owned_here(owner: Any) -> bool:
                mine = real.owned_here(owner)
                forking.fork()
                return mine

        monkeypatch.setattr(connections, "forks", ForkOnCheck)
        forking.call(lambda: counter.add(1))
        monkeypatch.undo()
        assert forking.child_code() == 0, "the child's call did not raise a GDSError"
        assert counter.get_count() == 2
    finally:
        gateway.close()


def test_ctrl_c_ends_a_forks_wait_for_a_call_stuck_behind_another_processs_lock(tmp_path):
    """``fork()`` waits for the other threads' calls on a file, so that no
    child inherits SQLite state mid-call; a call stuck behind another
    process's write lock keeps it waiting up to that call's deadline (30 s).
    A Ctrl-C ends the wait: the parent gets its KeyboardInterrupt right after
    the fork (Python ignores what an at-fork hook raises: the Ctrl-C was lost
    and the fork went on), the child is refused the file, and the stuck call
    still ends as its outcome says."""
    import sqlite3

    from gds_counter.errors import GatewayError

    db = tmp_path / "fork.sqlite3"
    counter = CounterShardDS("fork", 1, gateway=EmbeddedGateway(db))
    counter.add(1)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's writer, as far as the pool can tell
    outcome: dict[str, Any] = {}

    def add() -> None:
        try:
            counter.add(1)
            outcome["ok"] = True
        except GDSError as exc:
            outcome["error"] = exc

    writer = threading.Thread(target=add)
    writer.start()
    time.sleep(0.5)  # the add is in its call, waiting for the lock
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    main = threading.main_thread().ident
    assert main is not None
    ctrl_c = threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT))
    started = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.start()
            if os.fork() == 0:  # the child: the file is refused, nothing is written
                code = 3
                try:
                    counter.add(1)
                except GatewayError:
                    code = 0
                except BaseException:  # noqa: B902
                    code = 4
                os._exit(code)
            time.sleep(20)  # the parent: the interrupt lands here at the latest
        took = time.monotonic() - started
    finally:
        ctrl_c.cancel()
        signal.signal(signal.SIGINT, previous)
        _, status = os.waitpid(-1, 0)
        holder.rollback()
        holder.close()
        writer.join(60)
    assert took < 5.0, f"fork() waited {took:.1f} s for the stuck call despite the Ctrl-C"
    assert os.waitstatus_to_exitcode(status) == 0, "the child was not refused the file"
    assert outcome == {"ok": True}
    assert counter.get_count() == 2
