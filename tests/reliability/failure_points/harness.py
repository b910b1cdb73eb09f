"""One scenario: several callers add to one counter while a fault strikes
one of them at a named point; then every call is accounted for.

The faults (``FAULTS``), each made by the tracer's action in the thread
that reached the point:

* ``interrupt``: ``KeyboardInterrupt`` there (thread face), or an
  asynchronous exception, ``Interrupt``, for the asyncio face (a
  ``KeyboardInterrupt`` in a task ends the whole event loop by design);
* ``cancel``: the asyncio task whose call reached the point is cancelled
  (the asyncio face only);
* ``fork``: another thread calls ``os.fork()`` while this one is held at the
  point (at most ``FORK_PAUSE`` s: the product's own fork hooks may wait for
  it); the child then adds to the same counter object, which must not hang
  or double count, and the parent carries on;
* ``stall``: the thread sleeps ``STALL`` s, longer than the retry deadline
  and the asyncio callers' ``wait_for`` timeout;
* ``crash``: the process is killed (SIGKILL) there; it runs beside this one
  on the same SQLite file (``victim.py``), and this process carries on.

Then (``accounting``): no call may hang past its bound, every returned
increment must be stored exactly once, and every error's class must tell
the truth about whether it was stored. With ``cache=True`` the cached total
must also equal the stored one once every call of this process ended.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Optional

from failure_points.accounting import Call, classify, classify_forked, stored_times, tally
from failure_points.tracer import Point, Trap

__all__ = ["FAULTS", "Interrupt", "Outcome", "Scenario", "run_scenario"]

#: The callers' retry deadline (``RetryPolicy(deadline=...)``), seconds.
DEADLINE = 0.5
#: The asyncio callers' ``wait_for`` timeout, seconds.
TIMEOUT = 0.5
#: How long a stalled thread sleeps: past both of the above.
STALL = 1.5
#: Slack for a loaded machine (2 cores, other test runs): a call still
#: running ``STALL + DEADLINE + GRACE`` s after the scenario began is hung.
GRACE = 6.0
#: How long a thread is held at the point while another forks.
FORK_PAUSE = 0.5
#: A forked child's own call must end within this.
CHILD_BOUND = 8.0
#: How long after its deadline an asyncio call may end before it counts as late.
LATE = 2.0

FAULTS = ("interrupt", "cancel", "fork", "stall", "crash")


class Interrupt(BaseException):
    """An asynchronous exception (as ``PyThreadState_SetAsyncExc`` raises):
    not an ``Exception``, so no ``except Exception`` in the product catches it."""


#: The scenario call the running code serves (copied into asyncio tasks and
#: into the asyncio face's worker threads with the caller's context).
CURRENT: contextvars.ContextVar[Optional[Call]] = contextvars.ContextVar("failure_point_call", default=None)


@dataclass
class Scenario:
    point: Point
    fault: str
    face: str  # "threads" or "aio"
    backend: str  # "memory", "sqlite" or "firestore" (the emulator: ``url``)
    workers: int = 4
    per_worker: int = 3
    cache: bool = True
    nth: int = 2
    #: The storage's GDS URL when it is not embedded (backend ``"firestore"``:
    #: the native-mode emulator's), else made from ``backend``.
    url: Optional[str] = None

    @property
    def layout(self) -> str:
        """``"article"`` or ``"documents"``: the point's (``Point.layout``)."""
        return self.point.layout

    @property
    def label(self) -> str:
        return f"{self.point.name} / {self.fault} / {self.face} on {self.backend}"


@dataclass
class Outcome:
    """What one scenario found."""

    point: str
    fault: str
    face: str
    backend: str
    fired: bool = False
    hits: int = 0
    total: Optional[int] = None
    verdicts: dict[str, int] = field(default_factory=dict)
    late: int = 0
    notes: list[str] = field(default_factory=list)
    calls: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def failed(self) -> bool:
        bad = sum(self.verdicts.get(v, 0) for v in ("lost", "double", "untruthful", "stale", "hung"))
        return bool(bad) or any(note.startswith("FAIL") for note in self.notes)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# --- storage and counters -------------------------------------------------------------


def _url(backend: str, directory: str) -> str:
    if backend == "memory":
        return "memory://"
    return f"sqlite:///{os.path.join(directory, 'counter.sqlite3')}"


def _retry(deadline: float = DEADLINE) -> Any:
    from gds_counter.gds import RetryPolicy

    return RetryPolicy(attempts=6, deadline=deadline)


#: The deadline of the reads that take the stored total after a scenario:
#: they are the check, not the thing checked, so a slow emulator on a loaded
#: machine (a query and two lookups per counter) must not fail them; a read
#: that hangs is still caught by the ``GRACE`` bound around it.
READ_DEADLINE = GRACE - 1


#: Two counters on one gateway, so that a process has more than one
#: counter's writes in flight (one counter's are combined into at most two
#: at once, and the group commit would seldom have more than one to group).
COUNTERS = 2


def _counter_of(call: Call) -> int:
    """Which counter a call adds to (calls alternate add and increment, so
    each counter gets both)."""
    return (call.index // 2) % COUNTERS


# Which counter a scenario's callers use is its point's ``layout``: the
# PHP article's ``CounterShardDS`` (entities), or Firestore's
# ``DistributedCounter`` (documents: at its first write a process records
# the shard count on the counter document and creates every shard document).
#: A documents counter's shards: more than a scenario's calls, so that a
#: shard document exists because it was created, not because an increment
#: happened to land on it (``_check_shard_documents``).
DOCUMENT_SHARDS = 16


def _blocking_counter(gateway: Any, cache: bool, which: int = 0, layout: str = "article",
                      deadline: float = DEADLINE) -> Any:
    from gds_counter import CounterShardDS, DistributedCounter

    retry = _retry(deadline)
    if layout == "documents":
        return DistributedCounter(f"FailurePoint/counter-{which}", DOCUMENT_SHARDS, gateway=gateway, retry=retry, cache=cache)
    return CounterShardDS("FailurePoint", f"counter-{which}", 4, gateway=gateway, retry=retry, cache=cache)


def _aio_counter(gateway: Any, cache: bool, which: int = 0, layout: str = "article") -> Any:
    from gds_counter import aio

    if layout == "documents":
        return aio.DistributedCounter(f"FailurePoint/counter-{which}", DOCUMENT_SHARDS, gateway=gateway, retry=_retry(), cache=cache)
    return aio.CounterShardDS("FailurePoint", f"counter-{which}", 4, gateway=gateway, retry=_retry(), cache=cache)


def _stored(gateway: Any, *, cache: bool = False, layout: str = "article") -> int:
    """The stored total of every counter of the scenario (a lookup, no
    shared read), or the cached total with ``cache``."""
    method = "lookup" if not cache else "auto"
    return sum(_blocking_counter(gateway, cache, n, layout, READ_DEADLINE).get_count(method) for n in range(COUNTERS))


async def _astored_cached(gateway: Any, layout: str) -> int:
    return sum([await _aio_counter(gateway, True, n, layout).get_count() for n in range(COUNTERS)])


def _missing_shards(gateway: Any) -> list[str]:
    """The shard documents the scenario's counter documents record
    (``num_shards``) that do not exist."""
    from gds_counter.counter import FIRESTORE_PAGE as layout

    missing = []
    for which in range(COUNTERS):
        path = f"FailurePoint/counter-{which}"
        [config] = gateway.lookup([layout.config_key(path)])
        numbers = layout.shard_numbers(layout.config_of(config) or 0)
        found = gateway.lookup([layout.shard_key(path, n) for n in numbers]) if numbers else []
        missing += [f"{path}/shards/{n}" for n, document in zip(numbers, found) if document is None]
    return missing


def _check_shard_documents(scenario: Scenario, reader: Any, outcome: Outcome) -> None:
    """Firestore's page's writers ``update`` a shard, which fails on a
    missing document: once every call ended, each shard its counter
    document records must exist (a creation that failed, or a recording
    whose end the process never saw, is made good at its next write).
    Not after a crash: a process killed between its recording and its
    creation leaves them to nobody (docs/reliability.md)."""
    done, missing = _bounded(lambda: _missing_shards(reader), GRACE)
    if not done or not isinstance(missing, list):
        outcome.notes.append(f"FAIL: the shard documents could not be read: {'hung' if not done else repr(missing)}")
    elif missing:
        outcome.notes.append(f"FAIL: recorded shard documents missing once every call ended: {missing}")


def _bounded(function: Callable[[], Any], seconds: float) -> tuple[bool, Any]:
    """``function()`` in a thread of its own: (finished, its result or error)."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(function())
        except BaseException as exc:  # reported, not raised here
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True, name="failure-point-bounded")
    thread.start()
    thread.join(seconds)
    return (not thread.is_alive(), box[0] if box else None)


def _outcome_name(exc: BaseException) -> str:
    if isinstance(exc, (KeyboardInterrupt, Interrupt)):
        return "Interrupted"
    if isinstance(exc, (asyncio.CancelledError, asyncio.TimeoutError)):
        return "Cancelled"
    return type(exc).__name__


# --- the faults ------------------------------------------------------------------------


class Fault:
    """The action the trap runs at the point, and what it needs around it."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.arrived = threading.Event()  # fork: a thread is held at the point
        self.forked = threading.Event()  # fork: the fork is done (in the parent)
        self.loop: Optional[asyncio.AbstractEventLoop] = None
        self.loop_thread: Optional[int] = None
        self.stalled_loop = False
        self.victim: Optional[Call] = None
        #: A fork made here (``Point.fork_here``), in the parent: the child's
        #: process id and the pipe it reports on.
        self.child: Optional[tuple[int, int]] = None

    def __call__(self, frame: FrameType) -> Optional[bool]:
        kind = self.scenario.fault
        call = CURRENT.get()
        if call is None and kind != "crash":
            return False  # not inside a scenario call (a final read, a worker's idle loop)
        if call is not None:
            call.victim = True
            self.victim = call
        if kind == "interrupt":
            raise KeyboardInterrupt("injected") if self.scenario.face == "threads" else Interrupt("injected")
        if kind == "cancel":
            task = getattr(call, "task", None)
            if task is None or self.loop is None:
                return False
            if threading.get_ident() == self.loop_thread:
                task.cancel()
            else:
                self.loop.call_soon_threadsafe(task.cancel)
            return None
        if kind == "stall":
            self.stalled_loop = threading.get_ident() == self.loop_thread
            time.sleep(STALL)
            return None
        if kind == "fork" and self.scenario.point.fork_here:
            assert call is not None
            self.fork_here(call)
            return None
        if kind == "fork":
            self.arrived.set()
            self.forked.wait(FORK_PAUSE)
            return None
        if kind == "crash":
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)  # pragma: no cover  (killed before)
        raise AssertionError(f"unknown fault {kind!r}")


    def fork_here(self, call: Call) -> None:
        """Fork in this thread, inside ``call``, as a signal's handler would.
        The child goes on with the call and reports its outcome when it
        ends (``_call_blocking``), then exits."""
        global _IN_CHILD
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            _IN_CHILD = write_end
            return
        os.close(write_end)
        self.child = (pid, read_end)
        self.forked.set()


#: In a child forked inside a call (``Fault.fork_here``): the pipe it reports that call's outcome on.
_IN_CHILD: Optional[int] = None


def _report_from_child(call: Call) -> None:
    """In a child forked inside ``call``: tell the parent how the call ended there, and exit."""
    try:
        report = {"outcome": call.outcome, "seconds": call.seconds}
        os.write(_IN_CHILD or 0, json.dumps(report).encode())
    finally:
        os._exit(0)


def _forked_here(fault: Fault) -> Optional[Call]:
    """The parent's side of a fork made inside a call: the child's outcome
    of that call, as a call of its own (``hung`` when it never reported)."""
    if fault.child is None or fault.victim is None:
        return None
    pid, read_end = fault.child
    ready, _, _ = select.select([read_end], [], [], CHILD_BOUND)
    data = os.read(read_end, 65536) if ready else b""
    os.close(read_end)
    if not data:
        os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    child = Call(fault.victim.index, outcome="hung", where="child")
    if data:
        report = json.loads(data)
        child.outcome, child.seconds = report["outcome"], report["seconds"]
    return child


# --- fork: the child's call ---------------------------------------------------------------


def _child_call(scenario: Scenario, counter: Any, call: Call) -> dict[str, Any]:
    """In a forked child: one call on the counter object the parent used,
    bounded; on memory the child's own copy of the data tells whether it
    was stored (the parent never sees it)."""
    started = time.monotonic()
    if scenario.face == "threads":
        done, result = _bounded(lambda: counter.add(call.amount), CHILD_BOUND)
    else:
        async def add() -> None:
            await asyncio.wait_for(counter.add(call.amount), TIMEOUT)

        done, result = _bounded(lambda: asyncio.run(add()), CHILD_BOUND)
    report: dict[str, Any] = {"seconds": time.monotonic() - started}
    if not done:
        report["outcome"] = "hung"
        return report
    report["outcome"] = "ok" if not isinstance(result, BaseException) else _outcome_name(result)
    if scenario.backend == "memory":
        gateway = getattr(counter.gateway, "blocking", counter.gateway)  # (the embedded engine's async face)
        read, total = _bounded(lambda: _stored(gateway, layout=scenario.layout), CHILD_BOUND)
        report["view_total"] = total if read and isinstance(total, int) else None
    return report


class Forker:
    """The thread that forks while a caller is held at the point."""

    def __init__(self, scenario: Scenario, fault: Fault, counter: Any, call: Call, bound: float) -> None:
        self.scenario, self.fault, self.counter, self.call = scenario, fault, counter, call
        self.bound = bound
        self.note: Optional[str] = None
        self.thread = threading.Thread(target=self._run, daemon=True, name="failure-point-forker")

    def _run(self) -> None:
        if not self.fault.arrived.wait(self.bound):
            return
        read_end, write_end = os.pipe()
        self.call.outcome = "hung"
        pid = os.fork()
        if pid == 0:  # the child: one call, a report, and out (never back into the parent's frames)
            try:
                os.close(read_end)
                report = _child_call(self.scenario, self.counter, self.call)
                os.write(write_end, json.dumps(report).encode())
            finally:
                os._exit(0)
        os.close(write_end)
        self.fault.forked.set()
        ready, _, _ = select.select([read_end], [], [], 2 * CHILD_BOUND + 3)
        data = os.read(read_end, 65536) if ready else b""
        os.close(read_end)
        if not data:
            os.kill(pid, signal.SIGKILL)
            self.note = "the forked child did not report: killed"
        os.waitpid(pid, 0)
        if data:
            report = json.loads(data)
            self.call.outcome = report["outcome"]
            self.call.seconds = report["seconds"]
            self.call.view_total = report.get("view_total")  # type: ignore[attr-defined]


class ForksBeside:
    """A thread that forks again and again while the callers run, each
    child exiting at once (``Point.forks_beside``): so a fork is often
    pending, which is when some points are reached at all."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.forks = 0
        self.thread = threading.Thread(target=self._run, daemon=True, name="failure-point-forks-beside")

    def _run(self) -> None:
        while not self.stop.is_set():
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
            self.forks += 1
            self.stop.wait(0.005)


# --- the callers -----------------------------------------------------------------------------


Report = Callable[[str, Call], None]


def _call_blocking(counter: Any, call: Call, report: Optional[Report]) -> None:
    call.outcome = "hung"
    if report:
        report("start", call)
    token = CURRENT.set(call)
    started = time.monotonic()
    try:
        if call.index % 2:
            call.returned_total = counter.increment(call.amount)
        else:
            counter.add(call.amount)
        call.outcome = "ok"
    except BaseException as exc:  # every outcome is recorded, none is raised here
        call.outcome = _outcome_name(exc)
    finally:
        call.seconds = time.monotonic() - started
        CURRENT.reset(token)
    if _IN_CHILD is not None:  # forked inside this call: the child's part ends here
        _report_from_child(call)
    if report:
        report("done", call)


def _run_threads(scenario: Scenario, gateway: Any, calls: list[Call], trap: Trap, fault: Fault,
                 report: Optional[Report], deadline: float) -> list[threading.Thread]:
    barrier = threading.Barrier(scenario.workers)

    def worker(first: int) -> None:
        # Objects of its own per caller, as a web app makes one per request.
        counters = [_blocking_counter(gateway, scenario.cache, n, scenario.layout) for n in range(COUNTERS)]
        barrier.wait()
        for call in calls[first::scenario.workers]:
            _call_blocking(counters[_counter_of(call)], call, report)

    threads = [
        threading.Thread(target=worker, args=(n,), daemon=True, name=f"failure-point-caller-{n}")
        for n in range(scenario.workers)
    ]
    trap.install()
    try:
        for thread in threads:
            thread.start()
    finally:
        trap.uninstall()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return threads


def _run_aio(scenario: Scenario, gateway: Any, calls: list[Call], trap: Trap, fault: Fault,
             report: Optional[Report], deadline: float) -> tuple[threading.Thread, dict[str, Any]]:
    extra: dict[str, Any] = {}

    async def one(counter: Any, call: Call) -> None:
        call.outcome = "hung"
        if report:
            report("start", call)

        async def body() -> None:
            if call.index % 2:
                call.returned_total = await counter.increment(call.amount)
            else:
                await counter.add(call.amount)

        token = CURRENT.set(call)
        task = asyncio.ensure_future(body())  # the task copies the context: CURRENT is this call
        CURRENT.reset(token)
        call.task = task  # type: ignore[attr-defined]
        started = time.monotonic()
        try:
            await asyncio.wait_for(task, TIMEOUT)
            call.outcome = "ok"
        except BaseException as exc:  # every outcome is recorded, none is raised here
            call.outcome = _outcome_name(exc)
        finally:
            call.seconds = time.monotonic() - started
        if report:
            report("done", call)

    async def caller(first: int) -> None:
        counters = [_aio_counter(gateway, scenario.cache, n, scenario.layout) for n in range(COUNTERS)]
        for call in calls[first::scenario.workers]:
            await one(counters[_counter_of(call)], call)

    async def main() -> None:
        fault.loop = asyncio.get_running_loop()
        fault.loop_thread = threading.get_ident()
        trap.install_here()
        try:
            await asyncio.gather(*(caller(n) for n in range(scenario.workers)))
        finally:
            trap.uninstall()
        if scenario.cache:
            # A cancelled call's commit may still be running in a worker:
            # wait for it before the cache is asked for every committed amount.
            await asyncio.sleep(STALL + 0.5 if scenario.fault == "stall" else 0.3)
            try:
                extra["cached"] = await asyncio.wait_for(_astored_cached(gateway, scenario.layout), TIMEOUT * 3)
            except BaseException as exc:  # reported by the caller
                extra["cached"] = exc

    def loop_thread() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # the scenario reports it
            extra["loop_error"] = exc

    # The loop's thread is traced (on the emulator the asyncio Firestore
    # gateway sends its RPCs from it), and any thread started meanwhile
    # (a gateway that runs its calls in worker threads starts them then).
    workers_traced = scenario.backend == "firestore"
    trap.install()
    try:
        thread = threading.Thread(target=loop_thread, daemon=True, name="failure-point-loop")
        thread.start()
        if workers_traced:
            thread.join(max(0.0, deadline - time.monotonic()))
    finally:
        trap.uninstall()
    thread.join(max(0.0, deadline - time.monotonic()))
    return thread, extra


# --- one scenario --------------------------------------------------------------------------------


def run_scenario(scenario: Scenario, *, directory: Optional[str] = None, first_index: int = 0,
                 report: Optional[Report] = None, calls_out: Optional[list[Call]] = None) -> Outcome:
    """Run ``scenario`` and account for every call (see the module docstring).
    ``report`` streams each call's start and end (the crash victim's way of
    telling its parent before it is killed)."""
    if scenario.fault == "crash" and report is None:
        return _run_crash(scenario)
    from gds_counter import aio
    from gds_counter.gateway import open_gateway

    started = time.monotonic()
    outcome = Outcome(scenario.point.name, scenario.fault, scenario.face, scenario.backend)
    own_dir = None
    if directory is None:
        own_dir = tempfile.TemporaryDirectory(prefix="failure-point-")
        directory = own_dir.name
    url = scenario.url or _url(scenario.backend, directory)
    count = scenario.workers * scenario.per_worker
    calls = [Call(first_index + i, outcome="pending", where="task" if scenario.face == "aio" else "thread")
             for i in range(count)]
    if calls_out is not None:
        calls_out[:] = calls
    fault = Fault(scenario)
    trap = Trap(scenario.point, fault, nth=scenario.nth)
    bound = started + STALL + DEADLINE + GRACE
    forker: Optional[Forker] = None
    child_call = Call(first_index + count, outcome="pending", where="child")

    gateway: Any = aio.open_gateway(url) if scenario.face == "aio" else open_gateway(url)
    blocking = getattr(gateway, "blocking", gateway)  # (the embedded engine's async face runs a blocking one)
    if scenario.fault == "fork" and not scenario.point.fork_here:  # (else the thread at the point forks)
        which = _counter_of(child_call)
        shared = (_aio_counter(gateway, scenario.cache, which, scenario.layout) if scenario.face == "aio"
                  else _blocking_counter(gateway, scenario.cache, which, scenario.layout))
        forker = Forker(scenario, fault, shared, child_call, bound - time.monotonic())
        forker.thread.start()
    extra: dict[str, Any] = {}
    beside = ForksBeside() if scenario.point.forks_beside else None
    if beside is not None:
        beside.thread.start()
    try:
        if scenario.face == "threads":
            threads = _run_threads(scenario, gateway, calls, trap, fault, report, bound)
            alive = any(thread.is_alive() for thread in threads)
        else:
            loop_thread, extra = _run_aio(scenario, gateway, calls, trap, fault, report, bound)
            alive = loop_thread.is_alive()
    finally:
        if beside is not None:
            beside.stop.set()
            beside.thread.join(FORK_PAUSE + GRACE)
    forked_here = _forked_here(fault)
    if forker is not None:
        forker.thread.join(2 * CHILD_BOUND + 5)
        if forker.note:
            outcome.notes.append(forker.note)
    outcome.fired, outcome.hits = trap.fired, trap.hits
    if alive:
        outcome.notes.append("FAIL: callers still running at the bound: " + ", ".join(
            f"call {c.index} ({c.outcome})" for c in calls if c.outcome in ("hung", "pending")))
    if "loop_error" in extra:
        outcome.notes.append(f"FAIL: the event loop ended in {extra['loop_error']!r}")

    # The stored total: on a file through a fresh gateway (none of this
    # process's state), in memory through the one that holds the data.
    reader = open_gateway(url) if scenario.backend != "memory" else blocking
    read, total = _bounded(lambda: _stored(reader, layout=scenario.layout), GRACE)
    if scenario.layout == "documents" and not alive:
        _check_shard_documents(scenario, reader, outcome)
    if scenario.backend != "memory":
        _bounded(reader.close, 5)
    if not read or not isinstance(total, int):
        outcome.notes.append(f"FAIL: the stored total could not be read: {'hung' if not read else repr(total)}")
        outcome.verdicts = {"hung": 1}
        return _finish(outcome, calls, gateway, scenario, started, own_dir)
    outcome.total = total

    if report is None:  # the crash victim's parent does the accounting
        checked = [c for c in calls if c.outcome != "pending" and not (forked_here is not None and c is fault.victim)]
        if forked_here is not None and fault.victim is not None:  # one call, gone on with on both sides of the fork
            verdict = classify_forked(fault.victim, forked_here, total)
            outcome.verdicts[verdict] = outcome.verdicts.get(verdict, 0) + 1
            calls = calls + [forked_here]
        for call in calls:
            if call.outcome == "pending" and stored_times(total, call.index):
                outcome.notes.append(f"FAIL: call {call.index} never started but is stored")
                outcome.verdicts["double"] = outcome.verdicts.get("double", 0) + 1
        for verdict, n in tally(checked, total).items():
            outcome.verdicts[verdict] = outcome.verdicts.get(verdict, 0) + n
        if child_call.outcome != "pending":
            view = getattr(child_call, "view_total", None)
            child_total = total if scenario.backend == "sqlite" else view
            if child_total is None:  # the child could not read its own copy: it hung there
                outcome.notes.append("FAIL: the forked child could not read the total after its call")
                verdict = "hung"
            else:
                verdict = classify(child_call, child_total)
            outcome.verdicts[verdict] = outcome.verdicts.get(verdict, 0) + 1
            calls = calls + [child_call]
        elif stored_times(total, child_call.index):
            outcome.notes.append("FAIL: the fork child's call is stored but it never reported")
        for call in calls:
            if scenario.face == "aio" and call.outcome not in ("pending", "hung") and call.where == "task":
                if not fault.stalled_loop and call.seconds > TIMEOUT + LATE:
                    outcome.late += 1
        cached = extra.get("cached")
        if scenario.cache and scenario.face == "threads" and not alive:
            done, cached = _bounded(lambda: _stored(gateway, cache=True, layout=scenario.layout), GRACE)
            if not done:
                cached = "hung"
        if scenario.cache and not alive and not (scenario.fault == "fork" and scenario.backend == "sqlite"):
            # Every call of this process has ended: the cache must show every committed amount.
            if cached != total:
                outcome.notes.append(f"FAIL: the cached total {cached!r} is not the stored total {total}")
                outcome.verdicts["stale"] = outcome.verdicts.get("stale", 0) + 1
    return _finish(outcome, calls, gateway, scenario, started, own_dir)


def _finish(outcome: Outcome, calls: list[Call], gateway: Any, scenario: Scenario, started: float,
            own_dir: Optional[tempfile.TemporaryDirectory[str]]) -> Outcome:
    total = outcome.total
    for call in calls:
        row = {"index": call.index, "outcome": call.outcome, "where": call.where, "victim": call.victim,
               "seconds": round(call.seconds, 3)}
        if total is not None and call.outcome != "pending":
            row["stored"] = stored_times(total, call.index)
        outcome.calls.append(row)
    # Close without waiting on anything a hung caller may hold.
    if scenario.face == "aio":
        _bounded(lambda: (gateway._pool.shutdown(wait=False), gateway.blocking.close()), 5)
    else:
        _bounded(gateway.close, 5)
    if own_dir is not None:
        _bounded(own_dir.cleanup, 5)
    outcome.seconds = round(time.monotonic() - started, 2)
    return outcome


# --- crash: another process is killed at the point ------------------------------------------------


VICTIM = Path(__file__).with_name("victim.py")


def _run_crash(scenario: Scenario) -> Outcome:
    """A victim process (``victim.py``) runs the scenario on a file and is
    SIGKILLed at the point; this process adds to the same file with its own
    threads while it runs and after it died. Then every call of both is
    accounted for."""
    from gds_counter.gateway import open_gateway

    started = time.monotonic()
    outcome = Outcome(scenario.point.name, scenario.fault, scenario.face, scenario.backend)
    with tempfile.TemporaryDirectory(prefix="failure-point-crash-") as directory:
        url = _url("sqlite", directory)
        victim_calls = scenario.workers * scenario.per_worker
        spec = {"point": scenario.point.name, "face": scenario.face, "workers": scenario.workers,
                "per_worker": scenario.per_worker, "cache": scenario.cache, "nth": scenario.nth,
                "directory": directory}
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH", "")]))
        victim = subprocess.Popen([sys.executable, str(VICTIM), json.dumps(spec)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, env=env, text=True)
        assert victim.stdout is not None
        lines: list[str] = []
        ready = threading.Event()
        victim_wrote = threading.Event()  # a call of the victim ended

        def read_victim() -> None:
            assert victim.stdout is not None
            for line in victim.stdout:
                lines.append(line.strip())
                if line.startswith("ready"):
                    ready.set()
                elif line.startswith("done"):
                    victim_wrote.set()

        reader = threading.Thread(target=read_victim, daemon=True)
        reader.start()
        ready.wait(30)
        # This process's own callers: while the victim lives, then a few after it died.
        gateway = open_gateway(url)
        own: list[Call] = []
        next_index = [victim_calls]
        lock = threading.Lock()

        def take() -> Optional[Call]:
            with lock:
                if next_index[0] >= 29:
                    return None
                call = Call(next_index[0], outcome="pending", where="process")
                next_index[0] += 1
                own.append(call)
                return call

        def bystander(after: threading.Event) -> None:
            counters = [_blocking_counter(gateway, False, n, scenario.layout) for n in range(COUNTERS)]
            # A documents counter's shards are created by the process whose
            # recording wrote: a bystander first would make them itself, and
            # the victim would never reach the creation's points.
            while scenario.layout == "documents" and not victim_wrote.wait(0.01) and victim.poll() is None:
                pass
            while victim.poll() is None and len(own) < 12:
                call = take()
                if call is None:
                    return
                _call_blocking(counters[_counter_of(call)], call, None)
                time.sleep(0.01)
            after.wait()
            call = take()
            if call is not None:
                _call_blocking(counters[_counter_of(call)], call, None)

        after = threading.Event()
        threads = [threading.Thread(target=bystander, args=(after,), daemon=True) for _ in range(2)]
        for thread in threads:
            thread.start()
        bound = STALL + DEADLINE + GRACE + 20
        try:
            victim.wait(bound)
        except subprocess.TimeoutExpired:
            victim.kill()
            victim.wait()
            outcome.notes.append("FAIL: the victim process neither died nor finished: killed")
        after.set()
        for thread in threads:
            thread.join(STALL + DEADLINE + GRACE)
        reader.join(5)
        stderr = victim.stderr.read() if victim.stderr else ""
        outcome.fired = victim.returncode == -signal.SIGKILL and not any(text.startswith("end") for text in lines)
        victims = [Call(i, outcome="pending", where="process") for i in range(victim_calls)]
        for line in lines:
            kind, _, rest = line.partition(" ")
            if kind in ("start", "done"):
                data = json.loads(rest)
                call = victims[data["index"]]
                call.outcome = "Killed" if kind == "start" else data["outcome"]
                call.returned_total = data.get("returned_total")
                call.seconds = data.get("seconds", 0.0)
            elif kind == "end":
                outcome.hits = json.loads(rest)["hits"]
        if outcome.fired:
            outcome.hits = max(outcome.hits, scenario.nth)
        if victim.returncode not in (0, -signal.SIGKILL):
            outcome.notes.append(f"victim exited {victim.returncode}: {stderr[-500:]}")
        read, total = _bounded(lambda: _stored(open_gateway(url), layout=scenario.layout), GRACE)
        if any(t.is_alive() for t in threads):
            outcome.notes.append("FAIL: this process's callers still ran after the victim was killed")
        if not read or not isinstance(total, int):
            outcome.notes.append(f"FAIL: the stored total could not be read: {total!r}")
            outcome.verdicts = {"hung": 1}
        else:
            outcome.total = total
            every = [c for c in victims + own if c.outcome != "pending"]
            outcome.verdicts = tally(every, total)
            for call in victims + own:
                if call.outcome == "pending" and stored_times(total, call.index):
                    outcome.notes.append(f"FAIL: call {call.index} never started but is stored")
                    outcome.verdicts["double"] = outcome.verdicts.get("double", 0) + 1
        for call in victims + own:
            row = {"index": call.index, "outcome": call.outcome, "where": call.where, "seconds": round(call.seconds, 3)}
            if outcome.total is not None and call.outcome != "pending":
                row["stored"] = stored_times(outcome.total, call.index)
            outcome.calls.append(row)
        _bounded(gateway.close, 5)
    outcome.seconds = round(time.monotonic() - started, 2)
    return outcome
