"""Soak: increments at a steady rate against the Firestore emulator for a
while, with a reader watching; memory must stay flat and the count exact.

Duration: ``GDS_SOAK_SECONDS`` (default 10 s in the quick run, 120 s in the
full run that CI runs, ``pytest --full``); the long version is
``GDS_SOAK_SECONDS=1800 pytest -m soak -s``. Rate:
``GDS_SOAK_RATE`` increments per second per writer (default 10). RSS comes
from /proc/self/status (Linux).
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from collections import Counter

import pytest
from sizes import sized

from gds_counter._load import Load, start_load
from gds_counter.counter import CounterShardDS, GeneralCounter
from gds_counter.errors import Contention, GatewayError

pytestmark = [pytest.mark.soak, pytest.mark.slow, pytest.mark.emulator]

SECONDS = sized("GDS_SOAK_SECONDS", 5.0, 120.0)
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


def steady_writer(counter, rate: float, seconds: float) -> Load:
    """One writer adding 1 to ``counter`` ``rate`` times a second for ``seconds``."""
    return start_load(lambda: functools.partial(counter.add, 1), rate=rate, duration=seconds,
                      counted=(Contention, GatewayError))


def outcomes(load: Load) -> Counter[str]:
    """ok / unknown (CommitUnknown: it may have been applied) / failed."""
    result = load.result()
    unknown = result.errors["CommitUnknown"]
    return Counter(ok=result.ok, unknown=unknown, failed=result.failed - unknown)


def first_errors(load: Load) -> list[str]:
    return [error[:200] for error in load.result().first_errors[:3]]


def test_soak_memory_stays_flat_and_the_count_is_exact(firestore_emulator, tally):
    gateway = firestore_emulator.gateway(namespace=f"soak-{uuid.uuid4().hex[:8]}")
    name = uuid.uuid4().hex[:8]
    counters = [
        CounterShardDS("soak", name, gateway=gateway, strategy="auto"),
        GeneralCounter(f"soak-{name}", gateway=gateway, strategy="increment"),
    ]
    started = time.monotonic()
    writers = [steady_writer(c, RATE, SECONDS) for c in counters]
    until = started + SECONDS
    samples: list[tuple[float, float]] = []
    seen_totals: list[list[int]] = [[] for _ in counters]
    try:
        warm_up = min(10.0, SECONDS / 6)
        time.sleep(warm_up)
        base = rss_mb()
        samples.append((time.monotonic() - started, base))
        while time.monotonic() < until:
            time.sleep(min(5.0, max(0.1, until - time.monotonic())))
            samples.append((time.monotonic() - started, rss_mb()))
            for i, c in enumerate(counters):
                seen_totals[i].append(c.get_count())
        finished = [w.join(30) for w in writers]
        end = rss_mb()
        totals = [c.get_count() for c in counters]
    finally:
        for w in writers:
            w.stop()
            w.join(30)
        gateway.close()
    seen = [outcomes(w) for w in writers]
    total_outcomes = seen[0] + seen[1]
    print(
        f"\nsoak {SECONDS:.0f}s at {RATE:g}/s x {len(writers)} writers: {dict(total_outcomes)}, totals {totals}; "
        f"RSS {base:.1f} MB after {warm_up:.0f}s warm-up -> {end:.1f} MB at the end; "
        f"samples {[f'{t:.0f}s:{m:.1f}' for t, m in samples[:: max(1, len(samples) // 12)]]}"
    )
    tally.add(
        f"soak: Firestore emulator, {SECONDS:.0f} s",
        operations=sum(total_outcomes.values()),
        reported_unknown=total_outcomes["unknown"],
        increments_lost=sum(max(0, o["ok"] - t) for o, t in zip(seen, totals)),
        double_counts=sum(max(0, t - o["ok"] - o["unknown"]) for o, t in zip(seen, totals)),
    )
    assert all(finished), "a writer hung"
    for w, o in zip(writers, seen):
        assert not w.unexpected, w.unexpected  # only storage errors are load; anything else is a bug
        assert o["ok"] >= 0.8 * RATE * SECONDS, (o, first_errors(w))  # it kept up the rate
        assert o["failed"] <= max(1, o["ok"] // 100), first_errors(w)
    for o, total, read in zip(seen, totals, seen_totals):
        assert o["ok"] <= total <= o["ok"] + o["unknown"], (o, total)
        assert read == sorted(read), "a reader saw the total go down"
    assert end - base < RSS_BOUND_MB, samples
