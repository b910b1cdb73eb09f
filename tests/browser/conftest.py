"""A real browser for the tests in this folder: Debian's Chromium, driven by
Playwright.

Playwright normally downloads a browser build of its own; that is not
possible here (and not wanted in CI), so it launches the system's Chromium
(``chromium``, installed by ``.ci/run``; ``GDS_CHROMIUM=/path`` picks
another). When the browser or Playwright is missing the tests are skipped
on a developer's machine, but FAIL under ``CI=true``: a green CI run must
mean the browser test really ran.
"""

from __future__ import annotations

import os
import shutil
from typing import Any, Iterator

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The browser to drive: ``GDS_CHROMIUM``, else the first Chromium on PATH."""
    chosen = os.environ.get("GDS_CHROMIUM")
    if chosen:
        return chosen
    return next((path for path in map(shutil.which, CANDIDATES) if path), None)


def _unavailable(reason: str) -> None:
    # the same CI=true test as tests/conftest.py's in_ci()
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"CI=true: the browser test cannot run: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """One headless Chromium for the session; each test opens its own page."""
    executable = find_chromium()
    if executable is None:
        _unavailable(f"no Chromium found (looked for {', '.join(CANDIDATES)} on PATH and GDS_CHROMIUM); "
                     "install Debian's chromium: apt-get install chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:
        _unavailable(f"Playwright is not installed ({exc}); pip install -e '.[dev]'")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page in a fresh browser context (no cookies or cache shared)."""
    context = browser.new_context()
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    try:
        yield opened
    finally:
        context.close()
