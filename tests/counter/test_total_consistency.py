"""What ``increment()`` returns under load: the total after its own write,
including every increment that was acknowledged before the call began.

Writers that finish together share one query of the shards
(``gateway/_shared_reads.py``). Sharing may
only ever hand a caller a read that began after it asked; a read that began
earlier could miss an increment acknowledged in between, which is what
this test looks for, with many writer threads at once, on the embedded
engine and on the Firestore emulator (tests/aio/test_aio_concurrency.py
does the same from one event loop).
"""

from __future__ import annotations

import threading
import uuid

import pytest

from gds_counter import CounterShardDS

THREADS, PER_THREAD = 16, 25


@pytest.mark.parametrize("name", ["memory", "sqlite", "firestore", "sqlite+aio"])
def test_every_total_from_threads_includes_each_increment_acknowledged_before_the_call(make_gateway, name):
    gateway = make_gateway(name)
    counter = CounterShardDS("Consistency", uuid.uuid4().hex[:8], gateway=gateway)
    lock = threading.Lock()
    acknowledged = 0
    seen: list[tuple[int, int]] = []  # (acknowledged when the call began, total it returned)

    own: list[list[int]] = []  # each thread's totals, in order

    def writer() -> None:
        nonlocal acknowledged
        mine: list[int] = []
        own.append(mine)
        for _ in range(PER_THREAD):
            with lock:
                before = acknowledged
            total = counter.increment()
            mine.append(total)
            with lock:
                acknowledged += 1
                seen.append((before, total))

    threads = [threading.Thread(target=writer) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    expected = THREADS * PER_THREAD
    assert len(seen) == expected
    stale = [(before, total) for before, total in seen if total < before + 1]
    assert stale == []
    # A thread's next total holds its previous increments and its new one.
    assert [totals for totals in own if any(b <= a for a, b in zip(totals, totals[1:]))] == []
    assert max(total for _, total in seen) == expected == counter.get_count()
