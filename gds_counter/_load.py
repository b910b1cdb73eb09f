"""One load runner: threads calling an operation, with an honest record.

The workshop (``gds_counter._demo``), the benchmarks and the reliability
tests all need the same thing: some writer threads calling a function N
times in all, or for T seconds, or at a steady rate until told to stop, and
a record of what happened. One implementation gives them one set of rules
for what counts, so a figure in the demo, the benchmark tables and the
reliability results mean the same thing:

* a call that returns is a success, and only successes are timed, so the
  latencies describe work that was done;
* a call that raises one of the ``counted`` exceptions is a failure,
  counted by exception type (the first few messages are kept); the run
  goes on, after ``pause_after_error`` seconds;
* any other exception is a bug in the operation, not load: the whole load
  stops and the exception is kept in ``Load.unexpected``; ``run_load``
  re-raises it, so it is never hidden in a tally.

``run_load()`` blocks until the work is done and returns a ``LoadResult``;
``start_load()`` returns a running ``Load`` to watch (``ok``, ``result()``)
and ``stop()``. Each writer gets its own operation from ``make_op()``, built
before the clock starts (so per-thread setup is not measured); with one
writer and ``run_load`` the calls run in the calling thread, one after the
other, so seeded fault injection falls the same way on every run.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from typing import Any, Callable

import attrs

from gds_counter.errors import BadValueError

__all__ = ["Load", "LoadResult", "percentile", "run_load", "start_load"]

Op = Callable[[], Any]

#: Error messages kept per run (the first ones), for reports.
ERROR_SAMPLES = 5


def percentile(ordered: list[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of an already sorted list, nearest rank."""
    if not ordered:
        return None
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


@attrs.define
class LoadResult:
    """What a load saw: successes, failures by exception type, latencies."""

    ok: int = 0
    failed: int = 0
    elapsed: float = 0.0
    #: Seconds per successful call.
    latencies: list[float] = attrs.field(factory=list, repr=False)
    #: Failed calls per exception type name (``"CommitUnknown"``, ...).
    errors: Counter[str] = attrs.field(factory=Counter)
    #: The first few failures as ``"TypeName: message"``.
    first_errors: list[str] = attrs.field(factory=list, repr=False)
    #: The longest a failed call took before it raised, in seconds.
    slowest_failure: float = 0.0
    #: Successful calls made before the clock started (not in ``ok``); the
    #: caller sets it when it warms up outside the run.
    warmup: int = 0

    @property
    def first_error(self) -> str | None:
        return self.first_errors[0] if self.first_errors else None

    @property
    def rate(self) -> float:
        """Successful calls per second."""
        return self.ok / self.elapsed if self.elapsed > 0 else 0.0

    def latency_ms(self, q: float) -> float | None:
        value = percentile(sorted(self.latencies), q)
        return None if value is None else value * 1000.0

    def merge(self, other: "LoadResult") -> None:
        """Fold in another writer's (or process's) result from the same run."""
        self.ok += other.ok
        self.failed += other.failed
        self.elapsed = max(self.elapsed, other.elapsed)
        self.latencies.extend(other.latencies)
        self.errors.update(other.errors)
        self.first_errors.extend(other.first_errors[: max(0, ERROR_SAMPLES - len(self.first_errors))])
        self.slowest_failure = max(self.slowest_failure, other.slowest_failure)
        self.warmup += other.warmup


class _Writer:
    """One writer's loop and its own tally (under its own lock, so a
    ``Load.result()`` from another thread reads it consistently)."""

    def __init__(self, load: "Load", op: Op) -> None:
        self.load = load
        self.op = op
        self.lock = threading.Lock()
        self.tally = LoadResult()

    def run(self) -> None:
        load = self.load
        load._started.wait()
        tally, lock, started = self.tally, self.lock, load._began
        calls = 0
        try:
            while load._take(started, calls):
                calls += 1
                began = time.perf_counter()
                try:
                    self.op()
                except load.counted as exc:
                    took = time.perf_counter() - began
                    with lock:
                        tally.failed += 1
                        tally.errors[type(exc).__name__] += 1
                        tally.slowest_failure = max(tally.slowest_failure, took)
                        if len(tally.first_errors) < ERROR_SAMPLES:
                            tally.first_errors.append(f"{type(exc).__name__}: {exc}")
                    if load.pause_after_error:
                        load._stop.wait(load.pause_after_error)
                    continue
                took = time.perf_counter() - began
                with lock:
                    tally.ok += 1
                    tally.latencies.append(took)
        except BaseException as exc:  # not load: a bug in the operation; kept and re-raised
            with load._lock:
                load.unexpected.append(exc)
            load.stop()

    def snapshot(self) -> LoadResult:
        with self.lock:
            t = self.tally
            return LoadResult(ok=t.ok, failed=t.failed, latencies=list(t.latencies), errors=Counter(t.errors),
                              first_errors=list(t.first_errors), slowest_failure=t.slowest_failure)


class Load:
    """A running load; made by ``start_load()`` (or ``run_load()``)."""

    def __init__(
        self,
        make_op: Callable[[], Op],
        *,
        writers: int = 1,
        duration: float | None = None,
        count: int | None = None,
        rate: float | None = None,
        counted: tuple[type[BaseException], ...] = (Exception,),
        pause_after_error: float = 0.0,
    ) -> None:
        if isinstance(writers, bool) or not isinstance(writers, int) or writers < 1:
            raise BadValueError(f"writers must be a whole number of at least 1, got {writers!r}")
        if duration is not None and not duration > 0:
            raise BadValueError(f"duration must be positive seconds, got {duration!r}")
        if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
            raise BadValueError(f"count must be a whole number of calls (0 or more), got {count!r}")
        if rate is not None and not rate > 0:
            raise BadValueError(f"rate must be positive calls per second per writer, got {rate!r}")
        if not pause_after_error >= 0:
            raise BadValueError(f"pause_after_error must be 0 or more seconds, got {pause_after_error!r}")
        self.duration, self.count, self.interval = duration, count, (1.0 / rate if rate else None)
        self.counted = counted
        self.pause_after_error = pause_after_error
        #: Exceptions outside ``counted`` (each stopped the load).
        self.unexpected: list[BaseException] = []
        self._lock = threading.Lock()
        self._budget = count
        self._stop = threading.Event()
        self._started = threading.Event()
        self._began = 0.0
        self._ended: float | None = None
        self._threads: list[threading.Thread] = []
        # Every operation is built before the clock starts.
        self._writers = [_Writer(self, make_op()) for _ in range(writers)]

    def _start(self, *, threads: bool) -> None:
        if threads:
            self._threads = [threading.Thread(target=w.run, daemon=True, name=f"load-writer-{i}")
                             for i, w in enumerate(self._writers)]
            for thread in self._threads:
                thread.start()
        self._began = time.perf_counter()
        self._started.set()

    def _take(self, started: float, calls: int) -> bool:
        """May this writer make its next call (its ``calls``-th so far)?
        Waits for a paced writer's next slot."""
        if self._stop.is_set():
            return False
        deadline = None if self.duration is None else started + self.duration
        if self.interval is not None:
            due = started + calls * self.interval
            if deadline is not None and due >= deadline:
                return False
            wait = due - time.perf_counter()
            if wait > 0 and self._stop.wait(wait):
                return False
        elif deadline is not None and time.perf_counter() >= deadline:
            return False
        if self._budget is not None:
            with self._lock:
                if self._budget <= 0:
                    return False
                self._budget -= 1
        return True

    def stop(self) -> None:
        """Ask every writer to stop once its current call returns."""
        self._stop.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the writers; True when every one has finished."""
        end = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if end is None else max(0.0, end - time.monotonic()))
        done = not self.running
        if done and self._ended is None:
            self._ended = time.perf_counter()
        return done

    @property
    def running(self) -> bool:
        return any(thread.is_alive() for thread in self._threads)

    @property
    def ok(self) -> int:
        """Successful calls so far (live)."""
        return sum(w.tally.ok for w in self._writers)

    def result(self) -> LoadResult:
        """What the writers did so far: a copy, final once ``join()`` returned True."""
        out = LoadResult()
        for writer in self._writers:
            out.merge(writer.snapshot())
        out.elapsed = (self._ended or time.perf_counter()) - self._began
        return out


def start_load(
    make_op: Callable[[], Op],
    *,
    writers: int = 1,
    duration: float | None = None,
    count: int | None = None,
    rate: float | None = None,
    counted: tuple[type[BaseException], ...] = (Exception,),
    pause_after_error: float = 0.0,
) -> Load:
    """Start ``writers`` threads, each calling its own ``make_op()()``, and
    return at once.

    They stop when ``duration`` seconds have passed, when ``count`` calls
    were made in all, or when ``Load.stop()`` is called, whichever comes
    first. ``rate``: each writer makes that many calls per second on a
    fixed schedule (catching up after slow calls) instead of calling as
    fast as it can. See the module docstring for what is counted.
    """
    load = Load(make_op, writers=writers, duration=duration, count=count, rate=rate, counted=counted,
                pause_after_error=pause_after_error)
    load._start(threads=True)
    return load


def run_load(
    make_op: Callable[[], Op],
    *,
    writers: int = 1,
    duration: float | None = None,
    count: int | None = None,
    rate: float | None = None,
    counted: tuple[type[BaseException], ...] = (Exception,),
    pause_after_error: float = 0.0,
) -> LoadResult:
    """``start_load()`` and wait for it; give a ``duration`` or a ``count``
    (or both: whichever ends first). Re-raises the first exception outside
    ``counted``, once every writer has stopped."""
    if duration is None and count is None:
        raise BadValueError("give run_load() a duration or a count, or it would never end")
    load = Load(make_op, writers=writers, duration=duration, count=count, rate=rate, counted=counted,
                pause_after_error=pause_after_error)
    if writers == 1:  # in the calling thread: ordered calls, plain tracebacks
        load._start(threads=False)
        load._writers[0].run()
    else:
        load._start(threads=True)
    load.join()
    if load.unexpected:
        raise load.unexpected[0]
    return load.result()
