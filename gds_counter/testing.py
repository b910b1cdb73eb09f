"""pytest plugin: starts the official Datastore emulators and gives fixtures.

Registered as the ``gds_counter`` pytest11 entry point, so every project that
installs gds_counter gets these fixtures:

* ``datastore_emulator`` / ``firestore_emulator`` (session): the official Cloud
  Datastore emulator (optimistic concurrency, ignores property transforms) and
  the Firestore emulator in Datastore mode (pessimistic locks, applies them).
  Each starts on first use only, so test runs that need no emulator pay nothing.
* ``datastore_gateway`` / ``firestore_gateway`` (function): a fresh
  ``DatastoreGateway`` on that emulator in a fresh namespace, closed after the test.

``gcloud`` is found on PATH, or named by ``GDS_GCLOUD``. When it or an emulator is missing or does not start, the tests that need it
are skipped with the reason; with ``CI=true`` they fail instead, so CI can
never pass by silently skipping them.

``DATASTORE_EMULATOR_HOST`` is deliberately not set in ``os.environ``: it
would change which gateway ``open_gateway()`` picks in unrelated tests.

Benchmarks and scripts use the same machinery without pytest::

    with start_emulator("firestore") as emu:
        gateway = emu.gateway(namespace="bench")
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal

import attrs

if TYPE_CHECKING:
    from gds_counter.gateway.datastore import DatastoreGateway

__all__ = ["Emulator", "EmulatorError", "start_emulator", "stop_all_emulators", "DEFAULT_PROJECT"]

log = logging.getLogger(__name__)

EmulatorKind = Literal["datastore", "firestore"]
DEFAULT_PROJECT = "gds-counter-test"
STARTUP_TIMEOUT = 60.0
_STOP_GRACE = 10.0


class EmulatorError(RuntimeError):
    """An emulator could not be found or started; the message says why."""


@attrs.define
class Emulator:
    """A running emulator: where it listens and how to reach it."""

    kind: str
    host: str
    project: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = attrs.field(default=None, repr=False, eq=False)
    _data_dir: str | None = attrs.field(default=None, repr=False, eq=False)

    @property
    def env(self) -> dict[str, str]:
        """Environment for a child process that should use this emulator."""
        return {"DATASTORE_EMULATOR_HOST": self.host, "DATASTORE_PROJECT_ID": self.project}

    @property
    def supports_transforms(self) -> bool:
        # Known per emulator: the legacy Datastore emulator silently drops
        # increments (and property masks); the Firestore one applies them.
        return self.kind == "firestore"

    def gateway(self, namespace: str = "", **kwargs: Any) -> "DatastoreGateway":
        from gds_counter.gateway.datastore import DatastoreGateway

        kwargs.setdefault("supports_transforms", self.supports_transforms)
        return DatastoreGateway(project=self.project, namespace=namespace, emulator_host=self.host, **kwargs)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no emulator log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """End the emulator's whole process group: gcloud starts a Java child
        that would otherwise outlive us and keep the port."""
        process, self.process = self.process, None
        with _running_lock:
            _running.pop(id(self), None)
        if process is not None:
            _kill_group(process)
        if self._data_dir:
            shutil.rmtree(self._data_dir, ignore_errors=True)
            self._data_dir = None


_running_lock = threading.Lock()
_running: dict[int, Emulator] = {}


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    if hasattr(os, "killpg"):
        try:
            pgid = os.getpgid(process.pid)
        except ProcessLookupError:
            pgid = process.pid  # leader gone; its group (same id) may still hold the Java child
        for sig, wait in ((signal.SIGTERM, _STOP_GRACE), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                break
            if _group_gone(pgid, wait):
                break
    else:  # pragma: no cover - Windows has no process groups of this kind
        process.terminate()
        try:
            process.wait(_STOP_GRACE)
        except subprocess.TimeoutExpired:
            process.kill()
    with contextlib.suppress(Exception):
        process.wait(1.0)


def _group_gone(pgid: int, wait: float) -> bool:
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        # reap our direct child so it does not linger as a zombie in the group
        with contextlib.suppress(ChildProcessError):
            os.waitpid(-pgid, os.WNOHANG)
        time.sleep(0.1)
    return False


def stop_all_emulators() -> None:
    """The atexit safety net: no emulator outlives the interpreter that started it."""
    with _running_lock:
        emulators = list(_running.values())
    for emulator in emulators:
        with contextlib.suppress(Exception):
            emulator.stop()


atexit.register(stop_all_emulators)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _command(kind: EmulatorKind, gcloud: str, host: str, project: str, data_dir: str) -> list[str]:
    if kind == "datastore":
        return [
            gcloud, "--quiet", "beta", "emulators", "datastore", "start",
            "--no-store-on-disk", "--consistency=1.0", f"--host-port={host}",
            f"--project={project}", f"--data-dir={data_dir}",
        ]
    if kind == "firestore":
        return [
            gcloud, "--quiet", "emulators", "firestore", "start",
            "--database-mode=datastore-mode", f"--host-port={host}", f"--project={project}",
        ]
    raise ValueError(f"unknown emulator kind {kind!r}; expected 'datastore' or 'firestore'")


def _ready(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}/", timeout=2) as response:  # noqa: S310 - loopback only
            return bool(response.read().strip() == b"Ok")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def launch_emulator(
    kind: EmulatorKind, *, project: str = DEFAULT_PROJECT, timeout: float = STARTUP_TIMEOUT
) -> Emulator:
    """Start an emulator and wait until it answers; the caller must ``stop()`` it."""
    gcloud = os.environ.get("GDS_GCLOUD") or shutil.which("gcloud")
    if not gcloud:
        raise EmulatorError("gcloud is not on PATH (install the Google Cloud SDK with the emulators)")
    host = f"127.0.0.1:{_free_port()}"
    data_dir = tempfile.mkdtemp(prefix=f"gds-{kind}-emulator-")
    log_path = Path(data_dir) / "emulator.log"
    env = dict(os.environ)
    env.update(CLOUDSDK_CORE_DISABLE_PROMPTS="1", CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="1")
    env.pop("DATASTORE_EMULATOR_HOST", None)
    command = _command(kind, gcloud, host, project, data_dir)
    log.info("starting the %s emulator: %s", kind, " ".join(command))
    try:
        with open(log_path, "wb") as log_file:
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )
    except OSError as exc:
        shutil.rmtree(data_dir, ignore_errors=True)
        raise EmulatorError(f"cannot run {gcloud!r}: {exc}") from exc
    emulator = Emulator(kind, host, project, log_path, process, data_dir)
    with _running_lock:
        _running[id(emulator)] = emulator
    started = time.monotonic()
    try:
        while not _ready(host):
            if process.poll() is not None:
                raise EmulatorError(
                    f"the {kind} emulator exited with code {process.returncode} before it was ready:\n"
                    + emulator.log_tail()
                )
            if time.monotonic() - started > timeout:
                raise EmulatorError(
                    f"the {kind} emulator did not answer GET / with Ok within {timeout:.0f} s:\n"
                    + emulator.log_tail()
                )
            time.sleep(0.2)
    except BaseException:
        tail = emulator.log_tail()
        emulator.stop()
        log.debug("emulator log tail:\n%s", tail)
        raise
    log.info("%s emulator ready at %s after %.1f s", kind, host, time.monotonic() - started)
    return emulator


@contextlib.contextmanager
def start_emulator(
    kind: EmulatorKind, *, project: str = DEFAULT_PROJECT, timeout: float = STARTUP_TIMEOUT
) -> Iterator[Emulator]:
    """Run an official emulator for the duration of a ``with`` block."""
    emulator = launch_emulator(kind, project=project, timeout=timeout)
    try:
        yield emulator
    finally:
        emulator.stop()


# --- pytest integration -------------------------------------------------------
# pytest is a dev dependency only; benchmarks import this module without it.

try:
    import pytest
except ImportError:  # pragma: no cover
    pytest = None  # type: ignore[assignment]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


#: Every gateway a conformance test should run on, by name.
GATEWAY_NAMES = ("memory", "sqlite", "datastore", "firestore")

_EMULATOR_FIXTURES = frozenset({"datastore_emulator", "firestore_emulator", "datastore_gateway", "firestore_gateway"})

if pytest is not None:

    def _uses_emulator(item: Any) -> bool:
        if _EMULATOR_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            return True
        # Suites parametrized over gateway names reach the emulators lazily.
        params = getattr(getattr(item, "callspec", None), "params", {})
        return any(value in ("datastore", "firestore") for value in params.values() if isinstance(value, str))

    def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
        """Mark every test that uses an emulator, so ``-m "not emulator"`` works."""
        for item in items:
            if _uses_emulator(item):
                item.add_marker(pytest.mark.emulator)

    def _session_emulator(kind: EmulatorKind) -> Iterator[Emulator]:
        try:
            emulator = launch_emulator(kind)
        except EmulatorError as exc:
            reason = f"{kind} emulator unavailable: {exc}"
            if _in_ci():
                pytest.fail(f"{reason} (CI=true: emulator tests may not be skipped)", pytrace=False)
            pytest.skip(reason)
        try:
            yield emulator
        finally:
            emulator.stop()

    @pytest.fixture(scope="session")
    def datastore_emulator() -> Iterator[Emulator]:
        """The official Cloud Datastore emulator, started once per session."""
        yield from _session_emulator("datastore")

    @pytest.fixture(scope="session")
    def firestore_emulator() -> Iterator[Emulator]:
        """The official Firestore emulator in Datastore mode, started once per session."""
        yield from _session_emulator("firestore")

    def _fresh_gateway(emulator: Emulator) -> Iterator["DatastoreGateway"]:
        gateway = emulator.gateway(namespace=f"t-{uuid.uuid4().hex}")
        try:
            yield gateway
        finally:
            gateway.close()

    @pytest.fixture
    def datastore_gateway(request: Any) -> Iterator["DatastoreGateway"]:
        """A DatastoreGateway on the Datastore emulator, in a namespace of its own.

        With ``GDS_TEST_DATASTORE_URL=datastore://PROJECT[?database=DB]`` it is
        real Cloud Datastore instead (credentials from Application Default
        Credentials), still in a fresh namespace per test, so the same suites
        can be run against production before a release.
        """
        url = os.environ.get("GDS_TEST_DATASTORE_URL")
        if not url:
            yield from _fresh_gateway(request.getfixturevalue("datastore_emulator"))
            return
        from gds_counter.gateway import open_gateway

        gateway = open_gateway(f"{url}{'&' if '?' in url else '?'}namespace=t-{uuid.uuid4().hex}")
        try:
            yield gateway  # type: ignore[misc]
        finally:
            gateway.close()

    @pytest.fixture
    def firestore_gateway(firestore_emulator: Emulator) -> Iterator["DatastoreGateway"]:
        """A DatastoreGateway on the Firestore emulator, in a namespace of its own."""
        yield from _fresh_gateway(firestore_emulator)

    @pytest.fixture
    def make_gateway(request: Any, tmp_path: Any) -> Callable[[str], Any]:
        """``make_gateway("memory"|"sqlite"|"datastore"|"firestore")``: a fresh
        gateway of that kind, closed after the test. Lets a suite parametrize
        over ``GATEWAY_NAMES`` and run the same tests on every gateway."""
        from gds_counter.gateway import open_gateway

        def make(name: str) -> Any:
            if name in ("datastore", "firestore"):
                return request.getfixturevalue(f"{name}_gateway")  # closed by its own fixture
            if name == "memory":
                gateway = open_gateway("memory://")
            elif name == "sqlite":
                gateway = open_gateway(f"sqlite:///{tmp_path / f'{name}-{uuid.uuid4().hex}.sqlite3'}")
            else:
                raise ValueError(f"unknown gateway {name!r}; expected one of {GATEWAY_NAMES}")
            request.addfinalizer(gateway.close)
            return gateway

        return make

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(item: Any, call: Any) -> Iterator[None]:
        """Under CI=true an emulator test that skips is a failure: a green CI
        run must mean the emulator tests really ran."""
        outcome = yield
        report = outcome.get_result()
        if report.skipped and _in_ci() and item.get_closest_marker("emulator") is not None:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            report.outcome = "failed"
            report.longrepr = f"CI=true: emulator test {item.nodeid} was skipped ({reason})"
