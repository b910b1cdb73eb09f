"""gds_counter's own test rules, for this project's tests only.

The ``gds_counter`` pytest plugin gives fixtures and nothing else, because
pytest loads it into every project that installs gds_counter. The rules
below are this project's, so they live here and apply to this tree alone:

* every test that uses an emulator fixture, or is parametrized with the
  gateway name "datastore" or "firestore", is marked ``emulator``, so that
  ``pytest -m "not emulator"`` runs without the emulators;
* under ``CI=true`` an emulator test that was skipped FAILS: a green CI run
  (``.ci/run``) must mean the emulator tests really ran.
"""

from __future__ import annotations

import os
from typing import Any, Generator

import pytest

from gds_counter.testing import uses_emulator


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses an emulator, so ``-m "not emulator"`` works."""
    for item in items:
        if uses_emulator(item):
            item.add_marker(pytest.mark.emulator)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, Any]:
    """Under CI=true a skipped emulator test is a failure, with the skip's
    reason. (An expected failure, ``xfail``, ran: it is left alone.)"""
    report = yield
    skipped = report.skipped and not hasattr(report, "wasxfail")
    if skipped and in_ci() and item.get_closest_marker("emulator") is not None:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"CI=true: emulator test {item.nodeid} was skipped ({reason}); emulator tests may not be skipped"
    return report
