"""examples/counter_test.py does what the article's counter_test.php does:
read the total, increment, and write both values to stderr (PHP's
error_log), with nothing on stdout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "counter_test.py"
#: Variables that would choose other storage, or add a warning to stderr.
CHOOSERS = ("GDS_URL", "DATASTORE_EMULATOR_HOST", "GOOGLE_CLOUD_PROJECT")


def _run(cwd: Path, **env_overrides: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in CHOOSERS}
    env.update(env_overrides)
    return subprocess.run([sys.executable, str(EXAMPLE)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_counter_test_logs_current_then_next_value_to_stderr(tmp_path):
    url = f"sqlite:///{tmp_path}/x.db"  # tmp_path is absolute: four slashes
    runs = [_run(tmp_path, GDS_URL=url) for _ in range(2)]
    assert [run.returncode for run in runs] == [0, 0], [run.stderr for run in runs]
    assert [run.stdout for run in runs] == ["", ""]
    assert runs[0].stderr.splitlines() == ["Current counter value: 0", "Next counter value: 1"]
    assert runs[1].stderr.splitlines() == ["Current counter value: 1", "Next counter value: 2"]
    assert (tmp_path / "x.db").exists()


def test_counter_test_runs_with_no_setup_on_the_embedded_default(tmp_path):
    run = _run(tmp_path)
    assert (run.returncode, run.stdout) == (0, "")
    assert run.stderr.splitlines() == ["Current counter value: 0", "Next counter value: 1"]
    assert (tmp_path / "gds_counter.sqlite3").exists()
