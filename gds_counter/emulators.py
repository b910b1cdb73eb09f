"""Start the official Datastore emulators from Python, and always stop them.

This is product code: the workshop (``gds-counter demo --emulator ...``) and
the benchmarks count on a real emulator without a cloud account, and the
test fixtures in ``gds_counter.testing`` use the same launcher. It lives
here, not in the test tooling, because the product must never import test
tooling.

Two emulators, because they behave differently where a counter cares:

* ``"datastore"``: the legacy Cloud Datastore emulator (optimistic
  concurrency; silently ignores property transforms);
* ``"firestore"``: the Firestore emulator in Datastore mode (pessimistic
  locks; applies transforms), which is what production now runs;
* ``"firestore-native"``: the same Firestore emulator in native mode (no
  ``--database-mode``), for the Firestore gateway
  (``gateway.firestore``): ``Emulator.gateway`` is a ``FirestoreGateway``
  there, and ``Emulator.env`` sets ``FIRESTORE_EMULATOR_HOST``.

``gcloud`` is found on PATH, or named by ``GDS_GCLOUD``. Each emulator runs
in its own process group, which ``Emulator.stop()`` ends as a whole (gcloud
starts a Java child that would otherwise outlive us and keep the port), and
each emulator's ``weakref.finalize`` stops it when the interpreter exits (or
when the ``Emulator`` is dropped) if nobody did. ``DATASTORE_EMULATOR_HOST`` is never set in ``os.environ``: it would
change which storage unrelated code in the same process talks to; use
``Emulator.env`` for a child process instead.

Example::

    with start_emulator("firestore") as emu:
        gateway = emu.gateway(namespace="bench")
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal

import attrs

from gds_counter.errors import BadValueError, GatewayError

if TYPE_CHECKING:
    from gds_counter.gateway.datastore import DatastoreGateway
    from gds_counter.gateway.firestore import FirestoreGateway

__all__ = [
    "DEFAULT_PROJECT",
    "EMULATOR_KINDS",
    "Emulator",
    "EmulatorError",
    "EmulatorKind",
    "emulator_command",
    "find_gcloud",
    "launch_emulator",
    "start_emulator",
]

log = logging.getLogger(__name__)

EmulatorKind = Literal["datastore", "firestore", "firestore-native"]
EMULATOR_KINDS: tuple[EmulatorKind, ...] = ("datastore", "firestore", "firestore-native")
DEFAULT_PROJECT = "gds-counter-test"
STARTUP_TIMEOUT = 60.0
_STOP_GRACE = 10.0


class EmulatorError(GatewayError, RuntimeError):
    """An emulator could not be found or started; the message names the
    emulator, the command or address involved, and ends with the log tail.

    A ``GatewayError`` (so ``except GDSError`` catches it, like every error
    gds_counter raises) and still a ``RuntimeError``, which it was before.
    """


@attrs.define
class Emulator:
    """A running emulator: where it listens and how to reach it."""

    kind: str
    host: str
    project: str
    log_path: Path
    process: subprocess.Popen[bytes] | None = attrs.field(default=None, repr=False, eq=False)
    #: A temporary folder to remove on ``stop()``; None when the caller owns it.
    _data_dir: str | None = attrs.field(default=None, repr=False, eq=False)
    #: Stops the process group and removes the folder, once: at ``stop()``,
    #: or at exit or collection if nobody called it.
    _finalizer: weakref.finalize | None = attrs.field(default=None, init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        self._finalizer = weakref.finalize(self, _stop, self.process, self._data_dir)

    @property
    def env(self) -> dict[str, str]:
        """Environment for a child process that should use this emulator."""
        if self.kind == "firestore-native":
            return {"FIRESTORE_EMULATOR_HOST": self.host, "GOOGLE_CLOUD_PROJECT": self.project}
        return {"DATASTORE_EMULATOR_HOST": self.host, "DATASTORE_PROJECT_ID": self.project}

    def gateway(self, namespace: str = "", **kwargs: Any) -> "DatastoreGateway":
        """A ``DatastoreGateway`` on this emulator; ``kwargs`` go to its
        constructor. (The native-mode emulator's is ``firestore_gateway``.)"""
        if self.kind == "firestore-native":
            raise BadValueError(f"{self.host} is the Firestore emulator in native mode: use firestore_gateway()")
        from gds_counter.gateway.datastore import DatastoreGateway

        return DatastoreGateway(project=self.project, namespace=namespace, emulator_host=self.host, **kwargs)

    def firestore_gateway(self, **kwargs: Any) -> "FirestoreGateway":
        """A ``FirestoreGateway`` on this native-mode emulator; ``kwargs`` go
        to its constructor."""
        if self.kind != "firestore-native":
            raise BadValueError(f"{self.host} is the {self.kind} emulator, not Firestore in native mode")
        from gds_counter.gateway.firestore import FirestoreGateway

        return FirestoreGateway(self.project, emulator_host=self.host, **kwargs)

    def clear(self) -> None:
        """Delete every document of the native-mode emulator's default
        database (its ``DELETE .../documents`` endpoint)."""
        request = urllib.request.Request(
            f"http://{self.host}/emulator/v1/projects/{self.project}/databases/(default)/documents", method="DELETE"
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback only
                response.read()
        except (urllib.error.URLError, OSError) as exc:
            raise EmulatorError(f"could not clear the Firestore emulator at {self.host}: {exc}") from exc

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return f"(no emulator log at {self.log_path})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """End the emulator's whole process group (SIGTERM, then SIGKILL):
        gcloud starts a Java child that would otherwise outlive us and keep
        the port. On SIGTERM the Datastore emulator saves an on-disk store."""
        self.process, self._data_dir = None, None
        if self._finalizer is not None:
            self._finalizer()


def _stop(process: subprocess.Popen[bytes] | None, data_dir: str | None) -> None:
    """What ``Emulator.stop`` does, given only what it needs (a finalizer
    must not hold the emulator it finalizes)."""
    if process is not None:
        with contextlib.suppress(Exception):
            _kill_group(process)
    if data_dir:
        shutil.rmtree(data_dir, ignore_errors=True)


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


def find_gcloud() -> str:
    """The ``gcloud`` to run: ``GDS_GCLOUD`` if set, else the one on PATH."""
    gcloud = os.environ.get("GDS_GCLOUD") or shutil.which("gcloud")
    if not gcloud:
        raise EmulatorError(
            "gcloud is not on PATH and GDS_GCLOUD is not set (install the Google Cloud SDK with the "
            "datastore and firestore emulators)"
        )
    return gcloud


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def emulator_command(kind: EmulatorKind, host: str, project: str, data_dir: str, *, on_disk: bool = False,
                     gcloud: str | None = None) -> list[str]:
    """The command line that starts emulator ``kind`` on ``host`` (what
    ``launch_emulator`` runs; a benchmark that times the start-up runs it
    itself). ``gcloud``: found on the PATH when not given."""
    gcloud = gcloud if gcloud is not None else find_gcloud()
    if kind == "datastore":
        return [
            gcloud, "--quiet", "beta", "emulators", "datastore", "start",
            *([] if on_disk else ["--no-store-on-disk"]), "--consistency=1.0", f"--host-port={host}",
            f"--project={project}", f"--data-dir={data_dir}",
        ]
    mode = ["--database-mode=datastore-mode"] if kind == "firestore" else []  # native mode: the default
    return [gcloud, "--quiet", "emulators", "firestore", "start", *mode, f"--host-port={host}", f"--project={project}"]


def _ready(host: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{host}/", timeout=2) as response:  # noqa: S310 - loopback only
            return bool(response.read().strip() == b"Ok")
    except (urllib.error.URLError, OSError, ValueError):
        return False


def launch_emulator(
    kind: EmulatorKind,
    *,
    project: str = DEFAULT_PROJECT,
    timeout: float = STARTUP_TIMEOUT,
    host: str | None = None,
    data_dir: str | os.PathLike[str] | None = None,
) -> Emulator:
    """Start an emulator and wait until it answers; the caller must ``stop()`` it.

    ``host``: the ``HOST:PORT`` to listen on (default: a free loopback port);
    give the previous emulator's ``host`` to restart one in place.
    ``data_dir`` (Datastore emulator only): keep the data on disk in this
    folder, which the caller owns, so that it survives a restart; by
    default the data is in memory and a temporary folder holds the log.
    """
    if kind not in EMULATOR_KINDS:
        raise BadValueError(f"unknown emulator kind {kind!r}; expected one of {', '.join(EMULATOR_KINDS)}")
    if data_dir is not None and kind != "datastore":
        raise BadValueError(f"data_dir={os.fspath(data_dir)!r}: only the Datastore emulator stores data on disk")
    gcloud = find_gcloud()
    host = host or f"127.0.0.1:{_free_port()}"
    if data_dir is None:
        folder, owned = tempfile.mkdtemp(prefix=f"gds-{kind}-emulator-"), True
    else:
        folder, owned = os.fspath(data_dir), False
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise EmulatorError(f"cannot create the emulator's data_dir {folder!r}: {exc}") from exc
    log_path = Path(folder) / "emulator.log"
    env = dict(os.environ)
    env.update(CLOUDSDK_CORE_DISABLE_PROMPTS="1", CLOUDSDK_COMPONENT_MANAGER_DISABLE_UPDATE_CHECK="1")
    env.pop("DATASTORE_EMULATOR_HOST", None)
    env.pop("FIRESTORE_EMULATOR_HOST", None)
    command = emulator_command(kind, host, project, folder, on_disk=not owned, gcloud=gcloud)
    log.info("starting the %s emulator: %s", kind, " ".join(command))
    try:
        with open(log_path, "ab") as log_file:  # appended: a restart keeps the earlier log
            process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )
    except OSError as exc:
        if owned:
            shutil.rmtree(folder, ignore_errors=True)
        raise EmulatorError(f"cannot run {gcloud!r} to start the {kind} emulator: {exc}") from exc
    emulator = Emulator(kind, host, project, log_path, process, folder if owned else None)
    started = time.monotonic()
    try:
        while not _ready(host):
            if process.poll() is not None:
                raise EmulatorError(
                    f"the {kind} emulator ({gcloud} on {host}) exited with code {process.returncode} "
                    "before it was ready:\n" + emulator.log_tail()
                )
            if time.monotonic() - started > timeout:
                raise EmulatorError(
                    f"the {kind} emulator ({gcloud} on {host}) did not answer GET / with Ok within "
                    f"{timeout:.0f} s:\n" + emulator.log_tail()
                )
            time.sleep(0.2)
    except BaseException:
        emulator.stop()
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
