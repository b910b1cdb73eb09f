"""A real browser and a real server for the tests in this folder: Debian's
Chromium, driven by Playwright, and the like-button example served by uvicorn.

Playwright normally downloads a browser build of its own; that is not
possible here (and not wanted in CI), so it launches the system's Chromium
(``chromium``, installed by ``.ci/run``; ``GDS_CHROMIUM=/path`` picks
another). When the browser or Playwright is missing the tests are skipped
on a developer's machine, but FAIL under ``CI=true``: a green CI run must
mean the browser test really ran.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
APP_PATH = Path(__file__).resolve().parents[2] / "examples" / "like_app" / "app.py"
STARTUP_TIMEOUT = 60.0


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


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium per test module; each test opens its own page.

    Not per session: Playwright's sync API keeps an asyncio loop marked as
    running in the main thread until it stops, so a session-wide browser
    made every later test's ``asyncio.run`` fail."""
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


class RunningApp:
    """The like-button example started as a user starts it,
    ``python examples/like_app/app.py --port 0 --url URL``, in a process of
    its own; uvicorn picks a free port and prints it."""

    def __init__(self, url: str, env: dict[str, str] | None = None) -> None:
        self.url = url
        self.process = subprocess.Popen(
            [sys.executable, str(APP_PATH), "--host", "127.0.0.1", "--port", "0", "--url", url],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})},
        )
        self.output: list[str] = []
        self._started: queue.Queue[str] = queue.Queue()
        # Drained by a thread: the server's log must never fill the pipe and stall it.
        threading.Thread(target=self._drain, daemon=True).start()
        try:
            self.base_url = self._started.get(timeout=STARTUP_TIMEOUT)
        except queue.Empty:
            self.stop()
            raise AssertionError(f"the like app did not start in {STARTUP_TIMEOUT} s:\n{self.log}") from None

    def _drain(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            match = re.search(r"Uvicorn running on (http://\S+)", line)
            if match:
                self._started.put(match.group(1))

    @property
    def log(self) -> str:
        return "".join(self.output)

    def stop(self) -> None:
        """SIGTERM, uvicorn's graceful shutdown (the app closes its gateway), then SIGKILL."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def serve_like_app() -> Iterator[Callable[..., RunningApp]]:
    """``serve_like_app(url, env)``: the example serving on a free port,
    stopped after the test."""
    started: list[RunningApp] = []

    def serve(url: str, env: dict[str, str] | None = None) -> RunningApp:
        app = RunningApp(url, env)
        started.append(app)
        return app

    yield serve
    for app in started:
        app.stop()
