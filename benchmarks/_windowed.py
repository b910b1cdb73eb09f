"""One worker process's share of a benchmark run, timed by a window: the
part both ``contention.py`` and ``firestore_counters.py`` run in each worker.

Storage is opened, one operation per writer is built and one call made
(the warm-up: channel, capability probe, config entity), all before the
clock starts. The rate counts the calls that return within the window
(``duration`` seconds from the start), not every call divided by the time
until the last one returned: a call stuck in a lock wait when the window
closes (on the Firestore emulator, up to a 2 s lock timeout and its
retries) would otherwise stretch the time by a random amount. Calls that
return later still count in the totals (acknowledged, stored, lost).
"""

from __future__ import annotations

import time
from typing import Any, Callable

import attrs
from _common import ReturnedTotals

from gds_counter._load import LoadResult, run_load
from gds_counter.gateway.stats import Stats

__all__ = ["PartResult", "WindowedPart", "ms", "stale_fields"]


@attrs.define
class PartResult:
    load: LoadResult
    stats: dict[str, int] | None
    #: Calls that returned within the measured window: the rate's numerator.
    in_window: int
    #: Totals returned by increment() that missed an increment this process
    #: had acknowledged before the call, and how many totals were checked.
    stale: int = 0
    checked: int = 0
    first_stale: str | None = None


class WindowedPart:
    """A subclass says what each writer calls (``_ops``), and may set
    ``stats`` (what the storage counted) and ``totals`` (the returned
    totals to check) while it builds them. ``job`` needs ``threads`` and
    ``duration``."""

    def __init__(self, job: Any) -> None:
        self.job = job
        self.closers: list[Callable[[], None]] = []
        self.totals: ReturnedTotals | None = None
        self.stats: Stats | None = None
        self.window_end = 0.0  # nothing counts before run()
        self.in_window = [0] * job.threads  # one slot per writer: no lock needed
        try:
            self.ops = [self._windowed(op, i) for i, op in enumerate(self._ops(job))]
            self.ops[0]()  # warm-up, off the clock
            if self.stats is not None:
                self.stats.reset()
        except BaseException:
            self.close()
            raise

    def _ops(self, job: Any) -> list[Callable[[], Any]]:
        raise NotImplementedError

    def _windowed(self, op: Callable[[], Any], slot: int) -> Callable[[], None]:
        counts = self.in_window

        def call() -> None:
            op()
            if time.perf_counter() <= self.window_end:
                counts[slot] += 1

        return call

    def run(self) -> PartResult:
        ops = iter(self.ops)
        self.window_end = time.perf_counter() + self.job.duration
        load = run_load(lambda: next(ops), writers=self.job.threads, duration=self.job.duration)
        load.warmup = 1
        stats = None if self.stats is None else self.stats.snapshot()
        totals = self.totals
        if totals is None:
            return PartResult(load, stats, sum(self.in_window))
        return PartResult(load, stats, sum(self.in_window), totals.stale, totals.checked - 1,  # not the warm-up
                          totals.first_stale)

    def close(self) -> None:
        while self.closers:
            self.closers.pop()()


def stale_fields(parts: list[PartResult]) -> dict[str, Any]:
    """A run's returned-totals check over its parts, for its row."""
    return {
        "stale_totals": sum(p.stale for p in parts),
        "totals_checked": sum(p.checked for p in parts),
        "first_stale": next((p.first_stale for p in parts if p.first_stale), None),
    }


def ms(value: float | None) -> float | None:
    """A latency in milliseconds for a row (None stays None)."""
    return None if value is None else round(value, 2)
