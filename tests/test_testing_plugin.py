"""The pytest plugin's promise to CI: an emulator test never passes by skipping."""

from __future__ import annotations

pytest_plugins = ["pytester"]

SKIPPING_EMULATOR_TEST = """
import pytest

@pytest.mark.emulator
def test_needs_the_emulator():
    pytest.skip("pretend the emulator is missing")

def test_plain():
    pytest.skip("not an emulator test")
"""


def test_a_skipped_emulator_test_fails_under_ci(pytester, monkeypatch):
    monkeypatch.setenv("CI", "true")
    pytester.makepyfile(SKIPPING_EMULATOR_TEST)
    result = pytester.runpytest()
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*CI=true: emulator test*was skipped*pretend the emulator is missing*"])


def test_a_skipped_emulator_test_is_only_skipped_outside_ci(pytester, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    pytester.makepyfile(SKIPPING_EMULATOR_TEST)
    result = pytester.runpytest()
    result.assert_outcomes(skipped=2)
