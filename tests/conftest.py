"""gds_counter's own test rules, for this project's tests only.

The ``gds_counter`` pytest plugin gives fixtures and nothing else, because
pytest loads it into every project that installs gds_counter. The rules
below are this project's, so they live here and apply to this tree alone:

* every test that uses an emulator fixture, or is parametrized with the
  gateway name "datastore", "firestore" or "firestore-native", is marked ``emulator``, so that
  ``pytest -m "not emulator"`` runs without the emulators;
* under ``CI=true`` an emulator test that was skipped FAILS: a green CI run
  (``.ci/run``) must mean the emulator tests really ran;
* ``pytest`` is the quick run and ``pytest --full`` the full one
  (``tests/sizes.py``): the quick run deselects the tests marked ``full``;
* the quick run spreads its tests over two worker processes (``-n 2`` in
  setup.cfg, pytest-xdist: most of its time is spent waiting on emulators,
  servers and subprocesses); the full run is serial unless ``-n`` is given,
  so that its timing-bounded tests at full size run as CI runs them.
"""

from __future__ import annotations

import os
from typing import Any, Generator

import pytest

from gds_counter.testing import uses_emulator


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", default=False,
                     help="the full run: every test at its full size (tests/sizes.py); .ci/run runs it")


def _workers_asked(config: pytest.Config) -> bool:
    """Whether the command line itself (not setup.cfg's addopts) names ``-n``."""
    return any(arg == "-n" or arg.startswith(("-n", "--numprocesses")) for arg in config.invocation_params.args)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Size the run before any test module is imported. (Only ever set, never
    reset: a pytester run inside this one must not shrink it.) The full run
    is serial unless its command line asks for workers (before xdist's own
    configure, which starts them)."""
    if config.getoption("full", default=False):
        import sizes

        if getattr(config.option, "numprocesses", None) and not _workers_asked(config):
            config.option.numprocesses = 0
            config.option.dist = "no"

        sizes.FULL = True
        os.environ[sizes.ENVIRONMENT] = "1"  # and in every process a test starts


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that uses an emulator, so ``-m "not emulator"`` works;
    in the quick run, deselect the tests marked ``full``."""
    for item in items:
        if uses_emulator(item):
            item.add_marker(pytest.mark.emulator)
    if config.getoption("full", default=False):
        return
    slow = [item for item in items if item.get_closest_marker("full") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("full") is None]


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


class RedisServer:
    """A real ``redis-server`` on a free local port; ``stop()`` kills it (as
    an outage does: SIGKILL) and ``start()`` brings it back on the same port.
    No persistence, unless ``persistent``: then redis-server's default
    ``save`` settings, and a restart loads the last snapshot in ``directory``."""

    def __init__(self, directory: str, *, persistent: bool = False) -> None:
        import socket

        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.directory = directory
        self.persistent = persistent
        self.process: Any = None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import shutil
        import subprocess
        import time

        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (.ci/run installs Debian's redis-server package)")
        volatile = [] if self.persistent else ["--save", "", "--appendonly", "no"]
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", *volatile, "--dir", self.directory],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import redis

        deadline = time.monotonic() + 20
        while True:
            try:
                redis.Redis(port=self.port, socket_timeout=0.5).ping()
                return
            except redis.RedisError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def redis_server(tmp_path: Any) -> Generator[RedisServer, None, None]:
    """A real redis-server for the shared cache's tests, killed afterwards."""
    server = RedisServer(str(tmp_path))
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def persistent_redis_server(tmp_path: Any) -> Generator[RedisServer, None, None]:
    """A real redis-server with its default ``save`` settings, snapshotting
    into a folder of the test: killed and started again, it comes back with
    what its last snapshot held."""
    directory = tmp_path / "redis-data"
    directory.mkdir()
    server = RedisServer(str(directory), persistent=True)
    server.start()
    try:
        yield server
    finally:
        server.stop()
