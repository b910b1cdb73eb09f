"""The pytest plugin gives fixtures only; this project's rules live in its conftest.

``tests/conftest.py`` promises CI an emulator test never passes by
skipping, and marks every test that reaches an emulator. These tests run
that conftest, copied verbatim into a pytester project registered like
this one (``--strict-markers``, the ``emulator`` marker). That another
project is untouched by the plugin is ``test_plugin_isolation.py``.
"""

from __future__ import annotations

import configparser
from pathlib import Path

import pytest

import gds_counter.testing.plugin

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent
PROJECT_CONFTEST = TESTS / "conftest.py"
SETUP_CFG = TESTS.parent / "setup.cfg"

SKIPPING_EMULATOR_TEST = """
import pytest

@pytest.mark.emulator
def test_needs_the_emulator():
    pytest.skip("pretend the emulator is missing")

def test_plain():
    pytest.skip("not an emulator test")
"""

REACHING_THE_EMULATORS = """
import pytest

def test_fixture(datastore_gateway):
    pass

def test_session_fixture(firestore_emulator):
    pass

@pytest.mark.parametrize("gateway", ["memory", "datastore", "firestore"])
def test_over_gateways(gateway):
    pass

def test_plain():
    pass
"""

USES_THE_EMULATOR_FIXTURE = """
def test_needs_the_emulator(datastore_emulator):
    pass
"""


@pytest.fixture
def project(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester project with this project's conftest and marker registration.
    It runs in one process (``-n 0``): its outcomes are counted in-process, and
    xdist's controller does not report deselected tests."""
    config = configparser.ConfigParser()
    config.read(SETUP_CFG)
    section = config["tool:pytest"]
    markers = "".join(f"\n    {line}" for line in section["markers"].strip().splitlines())
    pytester.makeini(f"[pytest]\naddopts = {section['addopts']} -n 0\nmarkers ={markers}\n")
    pytester.makeconftest(PROJECT_CONFTEST.read_text())
    return pytester


def test_a_skipped_emulator_test_fails_under_ci(project, monkeypatch):
    monkeypatch.setenv("CI", "true")
    project.makepyfile(SKIPPING_EMULATOR_TEST)
    result = project.runpytest()
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*CI=true: emulator test*was skipped*pretend the emulator is missing*"])


def test_a_skipped_emulator_test_is_only_skipped_outside_ci(project, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    project.makepyfile(SKIPPING_EMULATOR_TEST)
    result = project.runpytest()
    result.assert_outcomes(skipped=2)


def test_tests_that_reach_an_emulator_are_marked(project):
    project.makepyfile(REACHING_THE_EMULATORS)
    result = project.runpytest("--collect-only", "-q", "-m", "emulator")
    result.stdout.fnmatch_lines(
        [
            "*::test_fixture",
            "*::test_session_fixture",
            "*::test_over_gateways[[]datastore[]]",
            "*::test_over_gateways[[]firestore[]]",
            "*4/6 tests collected (2 deselected)*",
        ]
    )
    result = project.runpytest("-m", "not emulator")  # runs without starting any emulator
    result.assert_outcomes(passed=2, deselected=4)


@pytest.mark.parametrize("ci,outcome", [("true", "errors"), ("", "skipped")])
def test_a_missing_emulator_skips_and_fails_under_ci(project, monkeypatch, ci, outcome):
    """The plugin's fixture only skips when gcloud cannot run; this
    project's conftest turns that into a failure under CI=true (``.ci/run``),
    reported as an error because it happened while setting the test up."""
    monkeypatch.setenv("CI", ci)
    monkeypatch.setenv("GDS_GCLOUD", str(project.path / "no-such-gcloud"))
    project.makepyfile(USES_THE_EMULATOR_FIXTURE)
    result = project.runpytest("-rA")
    result.assert_outcomes(**{outcome: 1})
    result.stdout.fnmatch_lines(["*datastore emulator unavailable: cannot run*no-such-gcloud*"])


def test_without_the_project_rules_a_missing_emulator_is_a_plain_skip(pytester, monkeypatch):
    """Another project that uses the fixtures gets them, and no CI rule."""
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("GDS_GCLOUD", str(pytester.path / "no-such-gcloud"))
    pytester.makepyfile(USES_THE_EMULATOR_FIXTURE)
    result = pytester.runpytest("--strict-markers")
    result.assert_outcomes(skipped=1)


def test_the_entry_point_plugin_registers_fixtures_and_no_hooks(request, pytester):
    plugin = request.config.pluginmanager.get_plugin("gds_counter")
    assert plugin is gds_counter.testing.plugin
    assert not request.config.pluginmanager.get_hookcallers(plugin)
    assert not [name for name in vars(plugin) if name.startswith("pytest_") or name == "pytest_plugins"]
    result = pytester.runpytest("--fixtures")
    result.stdout.fnmatch_lines(["*fixtures defined from gds_counter.testing.plugin*"])
    result.stdout.fnmatch_lines_random([f"{name}*" for name in plugin.__all__])
