"""Soak: increments at a steady rate against the Firestore emulator for a
while, with a reader watching; memory must stay flat and the count exact.

Duration: ``GDS_SOAK_SECONDS`` (default 120, the version the default CI run
has); the long version is ``GDS_SOAK_SECONDS=1800 pytest -m soak -s``. Rate:
``GDS_SOAK_RATE`` increments per second per writer (default 10). RSS comes
from /proc/self/status (Linux).
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from collections import Counter

import pytest

from gds_counter.counter import CounterShardDS, GeneralCounter
from gds_counter.errors import CommitUnknown, Contention, GatewayError

pytestmark = [pytest.mark.soak, pytest.mark.slow, pytest.mark.emulator]

SECONDS = float(os.environ.get("GDS_SOAK_SECONDS", "120"))
RATE = float(os.environ.get("GDS_SOAK_RATE", "10"))
#: RSS may grow this much after warm-up (gRPC and the JIT-less Python heap
#: settle early; a leak of one object per increment would exceed it in the
#: long run, and shows as a steady climb in the printed samples).
RSS_BOUND_MB = 60.0


def rss_mb() -> float:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    pytest.skip("no /proc/self/status: RSS cannot be measured here")


class SteadyWriter(threading.Thread):
    def __init__(self, counter, rate: float, until: float) -> None:
        super().__init__(daemon=True)
        self.counter, self.interval, self.until = counter, 1.0 / rate, until
        self.outcomes: Counter[str] = Counter()
        self.errors: list[str] = []

    def run(self) -> None:
        next_at = time.monotonic()
        while next_at < self.until:
            try:
                self.counter.add(1)
            except CommitUnknown:
                self.outcomes["unknown"] += 1
            except (Contention, GatewayError) as exc:
                self.outcomes["failed"] += 1
                self.errors.append(f"{type(exc).__name__}: {exc}"[:200])
            else:
                self.outcomes["ok"] += 1
            next_at += self.interval
            time.sleep(max(0.0, next_at - time.monotonic()))


def test_soak_memory_stays_flat_and_the_count_is_exact(firestore_emulator, tally):
    gateway = firestore_emulator.gateway(namespace=f"soak-{uuid.uuid4().hex[:8]}")
    name = uuid.uuid4().hex[:8]
    counters = [
        CounterShardDS("soak", name, gateway=gateway, strategy="auto"),
        GeneralCounter(f"soak-{name}", gateway=gateway, strategy="increment"),
    ]
    started = time.monotonic()
    until = started + SECONDS
    writers = [SteadyWriter(c, RATE, until) for c in counters]
    samples: list[tuple[float, float]] = []
    seen_totals: list[list[int]] = [[] for _ in counters]
    try:
        for w in writers:
            w.start()
        warm_up = min(10.0, SECONDS / 6)
        time.sleep(warm_up)
        base = rss_mb()
        samples.append((time.monotonic() - started, base))
        while time.monotonic() < until:
            time.sleep(min(5.0, max(0.1, until - time.monotonic())))
            samples.append((time.monotonic() - started, rss_mb()))
            for i, c in enumerate(counters):
                seen_totals[i].append(c.get_count())
        for w in writers:
            w.join(30)
        end = rss_mb()
        totals = [c.get_count() for c in counters]
    finally:
        gateway.close()
    outcomes = writers[0].outcomes + writers[1].outcomes
    print(
        f"\nsoak {SECONDS:.0f}s at {RATE:g}/s x {len(writers)} writers: {dict(outcomes)}, totals {totals}; "
        f"RSS {base:.1f} MB after {warm_up:.0f}s warm-up -> {end:.1f} MB at the end; "
        f"samples {[f'{t:.0f}s:{m:.1f}' for t, m in samples[:: max(1, len(samples) // 12)]]}"
    )
    tally.add(
        f"soak: Firestore emulator, {SECONDS:.0f} s",
        operations=sum(outcomes.values()),
        reported_unknown=outcomes["unknown"],
        increments_lost=sum(max(0, w.outcomes["ok"] - t) for w, t in zip(writers, totals)),
        double_counts=sum(max(0, t - w.outcomes["ok"] - w.outcomes["unknown"]) for w, t in zip(writers, totals)),
    )
    for w in writers:
        assert not w.is_alive(), "a writer hung"
        assert w.outcomes["ok"] >= 0.8 * RATE * SECONDS, (w.outcomes, w.errors[:3])  # it kept up the rate
        assert w.outcomes["failed"] <= max(1, w.outcomes["ok"] // 100), w.errors[:3]
    for w, total, seen in zip(writers, totals, seen_totals):
        assert w.outcomes["ok"] <= total <= w.outcomes["ok"] + w.outcomes["unknown"], (w.outcomes, total)
        assert seen == sorted(seen), "a reader saw the total go down"
    assert end - base < RSS_BOUND_MB, samples
