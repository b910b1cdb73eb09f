"""Acceptance: installing gds_counter changes nothing in other projects' test runs.

pytest loads the ``gds_counter`` pytest11 plugin into every project that has
gds_counter installed. A throwaway project outside this repository, whose
tests happen to be parametrized with "datastore" and "firestore" and one of
which skips, is run with ``--strict-markers`` and ``CI=true`` twice in a
subprocess: once as pytest starts it (the plugin autoloads through its entry
point) and once with ``-p no:gds_counter``. Exit code, outcome counts and
the outcome of every test must be the same; and the same again when the
project selects with ``-m "not emulator"`` (under CI=true, without
``--strict-markers``, which refuses a marker the project never registered).

The plugin that marked such tests ``emulator`` broke this twice over: with
``--strict-markers`` the run died with "'emulator' not found in `markers`",
and without it, under CI=true the skipped test became a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest

#: Extra arguments for the run with the plugin, and for the run without it.
WITH_PLUGIN: list[str] = []
WITHOUT_PLUGIN = ["-p", "no:gds_counter"]

THROWAWAY_TESTS = '''
import pytest


@pytest.mark.parametrize("backend", ["datastore", "firestore"])
def test_backend_name(backend):
    assert backend in ("datastore", "firestore")


@pytest.mark.parametrize("backend", ["datastore", "firestore"])
def test_backend_ready(backend):
    if backend == "firestore":
        pytest.skip("firestore support is not written yet")
'''

SUMMARY = re.compile(r"^=+ (?P<counts>.*?) in [\d.]+s(?: \([^)]*\))? =+$")
COUNT = re.compile(r"(\d+) (\w+)")
OUTCOME_LINE = re.compile(r"^(PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")


@attrs.frozen
class Run:
    exit_code: int
    counts: dict[str, int]
    outcomes: tuple[str, ...]
    plugins: str = attrs.field(eq=False)
    output: str = attrs.field(eq=False, repr=False)


def run_pytest(project: Path, *args: str) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["CI"] = "true"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", *args],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )
    lines = done.stdout.splitlines()
    summary = next((m for m in map(SUMMARY.match, reversed(lines)) if m), None)
    counts = {noun: int(n) for n, noun in COUNT.findall(summary["counts"])} if summary else {}
    counts.pop("warning", None), counts.pop("warnings", None)  # pytest's own deprecation notes may differ
    return Run(
        exit_code=done.returncode,
        counts=counts,
        outcomes=tuple(sorted(line for line in lines if OUTCOME_LINE.match(line))),
        plugins=next((line for line in lines if line.startswith("plugins:")), ""),
        output=done.stdout + done.stderr,
    )


@pytest.fixture
def throwaway_project(tmp_path: Path) -> Path:
    project = tmp_path / "someone-elses-project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")  # its own rootdir: nothing of ours is configured
    (project / "test_backends.py").write_text(THROWAWAY_TESTS)
    assert Path(__file__).resolve().parents[1] not in project.resolve().parents
    return project


@pytest.mark.parametrize(
    "options",
    [
        ["--strict-markers"],
        # a plugin that only added the marker, even a registered one, would
        # change what this selection runs (with --strict-markers pytest
        # refuses -m on a marker the project never registered)
        ["-m", "not emulator"],
    ],
    ids=["strict-markers", "not-emulator"],
)
def test_the_plugin_changes_nothing_in_another_project(throwaway_project, options):
    with_plugin = run_pytest(throwaway_project, *options, *WITH_PLUGIN)
    without = run_pytest(throwaway_project, *options, *WITHOUT_PLUGIN)
    # the comparison means something: the plugin was loaded in one run only,
    # and the project passes with one skip on its own
    assert "gds-counter" in with_plugin.plugins, with_plugin.output
    assert "gds-counter" not in without.plugins, without.output
    assert (without.exit_code, without.counts) == (0, {"passed": 3, "skipped": 1}), without.output
    assert with_plugin == without, f"with the plugin:\n{with_plugin.output}\nwithout it:\n{without.output}"
