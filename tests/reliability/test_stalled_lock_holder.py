"""A stalled, then killed, lock holder (issue 23, item 2).

Three writer processes add 1 to one counter in a loop on one SQLite file
while a fourth process holds the file's write lock inside its write
transaction, frozen (SIGSTOP) for longer than the busy timeout, then killed
(SIGKILL) mid-transaction, which leaves its uncommitted frames in the log.
The writers' callers give up on calls that outlast their deadline (an
interrupt, as a caller's timeout or a Ctrl-C does), which is exactly when
commits are queued behind a stalled writer.

The promise, checked on the stored total: every acknowledged increment is
stored once, nothing a caller was told is "not stored" is stored, and no
writer hangs. So ``acked <= stored <= acked + maybe``, where ``maybe`` are
the calls whose error says they may be stored. (This whole scenario kept
its counts before the group commit was made interrupt-safe, too: it
guards the combination; the defects it can meet are pinned down one by
one in tests/gateway/test_group_commit_interrupts.py.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gds_counter.counter import CounterShardDS
from gds_counter.gateway.embedded import EmbeddedGateway

HERE = Path(__file__).parent
WRITERS = 3
THREADS = 6
RUN_S = 8.0
BUSY_S = 1.0  # SQLite's busy timeout in the writers, so the stall outlasts it quickly
DEADLINE_S = 0.3  # a caller gives up on a call after this long
STALL_S = 3.0
JOIN_S = 90.0

HOLDER = """
import os, signal, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("UPDATE meta SET value = value + 1 WHERE name = 'commit_seq'")
print("holding", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)  # frozen inside its write transaction
conn.execute("COMMIT")
"""


@pytest.mark.skipif(not hasattr(signal, "SIGSTOP"), reason="POSIX signals")
def test_a_stalled_then_killed_lock_holder_double_counts_nothing_and_hangs_no_writer(tmp_path):
    path = str(tmp_path / "stalled.sqlite3")
    EmbeddedGateway(path).close()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    writers = [
        subprocess.Popen(
            [sys.executable, str(HERE / "stalled_writer.py"), path, str(RUN_S), str(THREADS), str(DEADLINE_S), str(BUSY_S)],
            stdout=subprocess.PIPE, text=True, env=env,
        )
        for _ in range(WRITERS)
    ]
    try:
        for writer in writers:
            assert writer.stdout is not None and writer.stdout.readline().strip() == "ready"
        time.sleep(1.0)
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, path], stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        time.sleep(STALL_S)  # frozen past the writers' busy timeout and their callers' deadline
        holder.kill()  # SIGKILL, mid-transaction
        holder.wait(JOIN_S)
        tallies = []
        for writer in writers:
            out, _ = writer.communicate(timeout=JOIN_S)  # a hung writer fails here
            tallies.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for writer in writers:
            if writer.poll() is None:
                writer.kill()
    acked = sum(t["acked"] for t in tallies)
    maybe = sum(t["maybe"] for t in tallies)
    gateway = EmbeddedGateway(path)
    try:
        stored = CounterShardDS("stalled", 4, gateway=gateway).get_count()
    finally:
        gateway.close()
    assert sum(t["not_stored"] + t["maybe"] for t in tallies) > 0  # the stall did reach the callers
    assert acked <= stored <= acked + maybe, (tallies, stored)
