"""examples/counter_test.py runs with no arguments on the embedded default."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "counter_test.py"


def test_counter_test_example_counts_up(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("GDS_URL", "DATASTORE_EMULATOR_HOST")}
    outputs = [
        subprocess.run([sys.executable, str(EXAMPLE)], cwd=tmp_path, env=env, capture_output=True, text=True,
                       timeout=120).stdout
        for _ in range(2)
    ]
    assert outputs == ["Count: 1\n", "Count: 2\n"]
