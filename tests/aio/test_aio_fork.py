"""The asyncio face across ``fork()``: a child counts with the gateway it
inherited, and nothing the parent had queued runs twice (issue 23, item 5).

A gateway opened before ``fork()`` is what gunicorn ``--preload`` and
``multiprocessing`` (fork start method) hand each worker. ``ThreadedGateway``
runs the embedded engine in worker threads, and a child inherits none of
them: with a plain thread pool, a child's call waited for ever in the queue
(a gateway used once, then forked), or the child's event loop blocked inside
the pool's ``submit`` on a lock another thread held at the fork, where not
even ``asyncio.wait_for`` could fire. Each scenario runs in a process of its
own (``fork_scenarios.py``), whose children are killed when they outlive a
bound, so a regression fails here instead of hanging the suite. Totals are
exact: the stored count is what the parent and the child were told was
counted, so work run twice would show.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() (POSIX)")

SCRIPT = Path(__file__).with_name("fork_scenarios.py")


def scenario(name: str, tmp_path: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), name, str(tmp_path / "fork.sqlite3")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return result


def check_exact(result: dict[str, Any]) -> None:
    """The child ran (no hang, no raise), every add it and the parent were
    told was counted is stored once, and none of them raised."""
    parent, child = result["parent"], result["child"]
    assert not child["child_hung"], result
    assert "raised" not in child, result
    assert set(parent) == {"ok"} and set(child) == {"ok", "child_hung"}, result
    assert result["stored"] == parent["ok"] + child["ok"], result


def test_a_child_counts_with_a_gateway_its_parent_used_once(tmp_path):
    """The parent's pool has an idle worker at the fork; the child's call
    must not wait for that worker, which is not in the child."""
    result = scenario("used_once_then_fork", tmp_path)
    check_exact(result)
    assert result["child"]["ok"] == 20


def test_a_fork_while_the_loop_increments_leaves_the_child_a_working_pool(tmp_path):
    """Another thread forks while the parent's loop keeps twenty adds in
    flight; the child counts in a loop of its own, the parent goes on."""
    result = scenario("fork_while_a_loop_increments", tmp_path)
    check_exact(result)
    assert result["child"]["ok"] == 20


def test_a_fork_while_other_threads_hold_the_pools_locks(tmp_path):
    """Every lock of the gateway's thread pool is held by another thread
    at the fork, as one in the middle of a ``submit`` holds them: the child
    must not block on them (its own pool, its own locks), and the parent's
    pool keeps working once they are released."""
    result = scenario("fork_while_threads_hold_the_pools_locks", tmp_path)
    assert result["locks_held"] >= 1, result
    check_exact(result)
    assert result["child"]["ok"] == 20


def test_a_fork_while_other_threads_hold_the_per_process_registries_locks(tmp_path):
    """What the asyncio face keeps per process (the shared gateways of both
    faces, the in-flight slots, the shared count caches and a cache's own
    lock) is guarded by locks that another thread may hold at the fork: a
    child counting through a URL with ``cache=True`` must not block on any
    of them."""
    result = scenario("fork_while_threads_hold_the_registries_locks", tmp_path)
    assert result["locks_held"] >= 5, result
    check_exact(result)
    assert result["child"]["ok"] == 20
