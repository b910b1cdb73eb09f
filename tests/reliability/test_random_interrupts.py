"""A program counting while Ctrl-C lands at random moments, for real.

``test_lost_handovers.py`` puts the machinery in each state an interrupt
was seen to leave; this sends the interrupts themselves (SIGALRM raising
KeyboardInterrupt after 0 to 1.5 ms, once per call, while two threads
count beside) and checks the promise: no call hangs, and the total stored
lies between the calls acknowledged and those plus the ones whose outcome
was unknown. (A fresh-eyes trial of this kind hung the embedded gateway
within a few hundred calls.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sizes import params

SCRIPT = Path(__file__).with_name("interrupted_counter.py")


def counted_at_most_once(script: Path, args: list[str], faults: str, label: str, tally: Any) -> None:
    """Run ``script``; it must end (no hang) with a JSON line whose totals
    show the faults landed and each call counted at most once (the stored
    total between the calls acknowledged and those plus the ones whose
    outcome is unknown); the row goes to the reliability table."""
    run = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"the program hung or failed:\n{run.stderr[-6000:]}"
    counts = json.loads(run.stdout.strip().splitlines()[-1])
    assert counts[faults] > 100, counts  # (the faults did land)
    assert counts["acked"] <= counts["stored"] <= counts["acked"] + counts["maybe"], counts
    tally.add(
        label, operations=counts["acked"] + counts["maybe"],
        faults_injected=counts[faults], increments_lost=max(0, counts["acked"] - counts["stored"]),
        double_counts=max(0, counts["stored"] - counts["acked"] - counts["maybe"]), reported_unknown=counts["maybe"],
    )


@pytest.mark.parametrize("where", ["memory", "file"])
@pytest.mark.parametrize("seed", params([1, 2], quick=[1]))
def test_random_interrupts_hang_nothing_and_count_each_call_at_most_once(tmp_path, where, seed, tally):
    url = "memory://" if where == "memory" else f"sqlite:///{tmp_path / 'interrupted.db'}"
    counted_at_most_once(SCRIPT, [url, "1500", "2", "0.0015", str(seed)], "interrupts",
                         f"random Ctrl-C while counting ({where})", tally)


CANCELLING = Path(__file__).with_name("cancelled_tasks.py")


@pytest.mark.parametrize("where", ["memory", "file"])
def test_random_cancellations_hang_no_task_and_count_each_call_at_most_once(tmp_path, where, tally):
    """The asyncio face's Ctrl-C: ``asyncio.run`` delivers it as a
    cancellation, which lands here anywhere in 6 tasks' ``add()``, 0 to
    4 ms in, 800 times."""
    url = "memory://" if where == "memory" else f"sqlite:///{tmp_path / 'cancelled.db'}"
    counted_at_most_once(CANCELLING, [url, "800", "6", "0.004", "1"], "cancels",
                         f"random task cancellations while counting, asyncio face ({where})", tally)
