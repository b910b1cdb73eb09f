"""The quick run and the full run (``tests/sizes.py``).

The quick loop (``pytest``) must cover every area: every test file of the
full run (``pytest --full``) still runs at least one test in it. And nothing
leaves the full run: its tests are a superset of the quick run's, so a test
made quick is a smaller test, never a test that CI no longer runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import sizes

ROOT = Path(__file__).resolve().parents[1]


def collected(*options: str) -> set[str]:
    """The test ids ``pytest --collect-only`` lists for this project."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    env.pop(sizes.ENVIRONMENT, None)  # the options alone choose the run
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *options],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = {line.strip() for line in done.stdout.splitlines() if "::" in line}
    assert ids, done.stdout[-3000:]
    return ids


def files_left_empty(quick: set[str], full: set[str]) -> list[str]:
    """The test files of the full run with no test in the quick run."""
    return sorted({i.split("::")[0] for i in full} - {i.split("::")[0] for i in quick})


@pytest.mark.full  # two collections in subprocesses: the full run (CI) guards the quick one
def test_the_quick_run_is_part_of_the_full_run_and_leaves_no_file_out():
    quick, full = collected(), collected("--full")
    assert quick <= full, f"tests only the quick run has: {sorted(quick - full)[:20]}"
    assert not files_left_empty(quick, full), "test files the quick run does not run at all"


def test_a_file_whose_every_test_is_full_only_is_found():
    """The checker is not blind: a file with no quick test is named."""
    full = {"tests/a.py::test_x", "tests/b.py::test_y", "tests/b.py::test_z"}
    assert files_left_empty({"tests/a.py::test_x"}, full) == ["tests/b.py"]
    assert files_left_empty({"tests/a.py::test_x", "tests/b.py::test_z"}, full) == []


def test_a_quick_size_is_never_the_larger(monkeypatch):
    monkeypatch.setattr(sizes, "FULL", False)
    assert sizes.size(10, 100) == 10
    monkeypatch.setattr(sizes, "FULL", True)
    assert sizes.size(10, 100) == 100
    with pytest.raises(ValueError, match="quick size"):
        sizes.size(200, 100)


def test_an_environment_override_wins_over_both_sizes(monkeypatch):
    monkeypatch.setattr(sizes, "FULL", False)
    monkeypatch.setenv("GDS_TEST_SIZE", "1800")
    assert sizes.sized("GDS_TEST_SIZE", 10.0, 120.0) == 1800.0
    monkeypatch.setenv("GDS_TEST_SIZE", "")
    assert sizes.sized("GDS_TEST_SIZE", 10, 120) == 10


def test_params_mark_every_case_but_the_quick_ones_full():
    cases = sizes.params(["memory", "sqlite", "firestore"], quick=["sqlite"])
    assert cases[1] == "sqlite"
    assert [(c.values, [m.name for m in c.marks]) for c in (cases[0], cases[2])] == [
        (("memory",), ["full"]), (("firestore",), ["full"])]
    several = sizes.params([("a", 1), ("b", 2)], quick=[("a", 1)], several=True)
    assert several[0] == ("a", 1) and several[1].values == ("b", 2)
    with pytest.raises(ValueError, match="not among"):
        sizes.params(["memory"], quick=["sqlite"])


def test_a_process_a_test_starts_is_sized_as_the_test(tmp_path):
    """A test that spreads its work over processes (``spawn``, subprocess)
    sizes each process's share where that process runs: the child imports
    ``sizes`` afresh. In the full run it must see the full run too, or a
    test expecting 3 x 8 x 100 increments got 3 x 8 x 10 (it failed in CI)."""
    env = {k: v for k, v in os.environ.items() if k != sizes.ENVIRONMENT}
    probe = [sys.executable, "-c", "import sizes; print(sizes.size(1, 2))"]
    env["PYTHONPATH"] = str(Path(__file__).resolve().parent)
    assert subprocess.run(probe, env=env, capture_output=True, text=True).stdout.strip() == "1"
    env[sizes.ENVIRONMENT] = "1"
    assert subprocess.run(probe, env=env, capture_output=True, text=True).stdout.strip() == "2"


def run_header(*options: str) -> str:
    """What ``pytest`` says before its first test, for one quick test of this file."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    env.pop(sizes.ENVIRONMENT, None)
    test = "tests/test_sizes.py::test_a_quick_size_is_never_the_larger"
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *options, test],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_quick_run_has_two_workers_and_the_full_run_is_serial_unless_asked():
    """The quick loop waits on emulators, servers and subprocesses, so two
    workers halve it; the full run (CI) keeps its timing-bounded tests at
    full size alone on the machine, unless its command line says ``-n``."""
    assert "2 workers [1 item]" in run_header()
    assert "workers" not in run_header("--full")
    assert "2 workers [1 item]" in run_header("--full", "-n", "2")
