"""gRPC clients that stay in the process that made them.

A gRPC channel does not survive ``fork()``. gRPC skips its own fork handlers
while another thread is inside a call (it logs "Other threads are currently
calling into gRPC, skipping fork() handlers"), and a forked child that then
sends on its parent's channel can wait for ever, past any deadline: of 16
children forked while their parent's threads were incrementing through
``gds-counter serve``, 5 hung in their first call and one more failed with
"Wrong file descriptor generation"; of 40 that opened a channel of their
own, 39 counted and one first call ran out of its deadline (raised, not
hung). So a gateway records each client with the process that made it
(``Owned``), and a forked child makes its own on first use (``current``),
as the embedded engine opens its own SQLite connections there. The
parent's is abandoned (``forks.abandon``): it is the parent's to close.

That alone still left about one child in 12 to 24 hung in CI: gRPC runs
its own fork handlers (which stop its threads before the fork and start
them again on both sides) only when no thread is inside a gRPC call. So
each blocking gateway's calls pass through an ``RpcGate``: just before a
fork, new calls wait (at most until their deadline), and the fork waits
(at most ``FORK_DRAIN_S`` in all) for the calls in flight.

gRPC asyncio is worse: once a process has made a gRPC asyncio client, its
forked children cannot use gRPC at all (measured the same way: of 6 children
each making a fresh asyncio gateway, none counted, 3 hung past their
``wait_for``; of 6 making a fresh blocking one, 2 hung). Such a child is
refused, a ``GatewayError`` before anything is sent.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
import sys
import threading
import time
from typing import Any, Callable, Generic, TypeVar

from gds_counter._process import forks
from gds_counter._process.interrupts import surely
from gds_counter.errors import GatewayError

__all__ = ["FORK_DRAIN_S", "BlockingClient", "Owned", "RpcGate", "current", "gapic_client"]

log = logging.getLogger("gds_counter.gateway")

T = TypeVar("T")

#: The process that made the first gRPC asyncio client in this process or
#: an ancestor it was forked from (None: none did).
_ASYNCIO_SINCE: forks.Owner | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Owned(Generic[T]):
    """A client and the process that made it."""

    owner: forks.Owner
    client: T


def current(held: Owned[T] | None, make: Callable[[], T], where: object, *, asyncio: bool = False) -> Owned[T]:
    """``held`` when this process made it; else a new client from ``make()``
    (an ``asyncio`` one: gRPC asyncio's), the one ``held`` named abandoned.
    ``GatewayError`` in a child of a process that used gRPC asyncio."""
    global _ASYNCIO_SINCE
    if held is not None and forks.owned_here(held.owner):
        return held
    since = _ASYNCIO_SINCE
    if since is not None and not forks.owned_here(since):
        raise GatewayError(
            f"{where!r}: this process (pid {forks.here()}) was forked from one that had used gRPC asyncio "
            f"(pid {since}), and gRPC cannot be used in such a child (its calls hang past their deadlines). Start "
            "worker processes with multiprocessing's 'spawn' or 'forkserver' method, or fork before the first "
            "asyncio call. Nothing was sent"
        )
    if held is not None:
        forks.abandon(held.client)
        log.debug("%r: its gRPC client was made before a fork(); this process makes its own", where)
    made = Owned(forks.here(), make())
    if asyncio and since is None:
        _ASYNCIO_SINCE = made.owner
    return made


def gapic_client(client: Callable[..., T], transport: Callable[..., Any], insecure_channel: Callable[[str], Any], *,
                 emulator_host: str | None, credentials: Any, service: str, project: str, emulator_env: str) -> T:
    """A GAPIC ``client`` (blocking or async, with its gRPC ``transport``
    class): on an emulator over ``insecure_channel`` (plaintext; a given
    channel makes the transport skip the Application Default Credentials
    lookup), else with ``credentials``. None to be found is a
    ``GatewayError`` naming ``service``'s ``project`` and how to fix it."""
    if emulator_host:
        return client(transport=transport(channel=insecure_channel(emulator_host)))
    from google.auth.exceptions import DefaultCredentialsError

    try:
        return client(credentials=credentials)
    except DefaultCredentialsError as exc:
        raise GatewayError(
            f"cannot reach {service} project {project!r}: no credentials ({exc}). Pass credentials=, set "
            "GOOGLE_APPLICATION_CREDENTIALS or run 'gcloud auth application-default login'; for an emulator set "
            f"{emulator_env}. Nothing was sent"
        ) from exc


#: How often a call waiting for a fork, and a fork waiting for calls, look
#: again (both rare: only while a fork is pending).
WAIT_STEP_S = 0.001

#: How long a fork waits for the gateways' calls in flight (each is bounded
#: by its own deadline) before it goes on without gRPC's fork handlers.
FORK_DRAIN_S = 5.0


class RpcGate:
    """A blocking gateway's RPCs in flight, and a fork's wait for them
    (module docstring).

    No lock, nor anything that takes one (an ``Event``): a fork made by a
    signal's handler runs the hooks on a thread that may be anywhere in
    ``run``, and an interrupt may land on any line of it; the set of
    threads in flight and the flag are changed in single steps under the
    GIL, and each thread takes itself out in a ``finally``.
    A call that finds a fork pending waits for it, at most until its own
    deadline, and is then sent all the same: it never fails here (an error
    of its own would skip the retry policy's word on earlier attempts,
    which may have been applied), and the fork then waits for it as for any
    call in flight. A thread that forks from inside one of its own calls
    does not wait for itself. The fork's wait is bounded per fork
    (``forks.began``), however many gateways wait."""

    def __init__(self, where: object) -> None:
        self._where = repr(where)
        self._renew()
        forks.register(self)

    def _renew(self) -> None:
        #: The threads with a call in flight.
        self._in_flight: set[int] = set()
        #: Whether a fork is pending. A flag, not an ``Event``: an Event's
        #: own lock, held by a thread waiting on it when a signal's handler
        #: on that thread forks, would be taken again by ``_before_fork``.
        self._forking = False

    def run(self, send: Callable[[float], T], seconds: float) -> T:
        """``send(seconds left)``, once no fork is pending (or once the call's
        ``seconds`` have passed waiting for one). The thread is counted
        first and looks for a fork after: either the fork sees the call, or
        the call sees the fork."""
        thread = threading.get_ident()
        began = time.monotonic()
        try:
            self._in_flight.add(thread)
            while self._forking and time.monotonic() - began < seconds:
                self._in_flight.discard(thread)  # (waiting here, it is not in flight)
                time.sleep(WAIT_STEP_S)
                self._in_flight.add(thread)
            return send(max(0.001, seconds - (time.monotonic() - began)))
        finally:  # (a thread an interrupt leaves in the set here is taken out by ``_busy``)
            surely(lambda: self._in_flight.discard(thread))

    def _busy(self, me: int) -> bool:
        """Whether a thread other than ``me`` has a call in flight: is
        inside ``run`` now. A thread in the set that is not (an interrupt
        landed before its ``finally`` took it out, or it is gone) is taken
        out here, so that no fork waits for it."""
        others = [thread for thread in list(self._in_flight) if thread != me]
        if not others:
            return False
        frames = sys._current_frames()
        busy = False
        for thread in others:
            frame = frames.get(thread)
            while frame is not None and frame.f_code is not _RUN_CODE:
                frame = frame.f_back
            if frame is None:
                self._in_flight.discard(thread)
            else:
                busy = True
        return busy

    def _before_fork(self) -> None:
        self._forking = True
        me = threading.get_ident()
        end = forks.began() + FORK_DRAIN_S
        while self._busy(me) and time.monotonic() < end:
            time.sleep(WAIT_STEP_S)
        if self._busy(me):
            log.warning("%s: forking while gRPC calls are still in flight after %g s: gRPC skips its fork "
                        "handlers, and the child's calls may hang", self._where, FORK_DRAIN_S)

    def _after_fork_in_parent(self) -> None:
        self._forking = False

    def _after_fork_in_child(self) -> None:
        """The parent's threads, and their calls, are not in the child."""
        self._renew()


#: ``RpcGate.run``'s code: a thread whose stack holds it has a call in flight.
_RUN_CODE = RpcGate.run.__code__


class BlockingClient(abc.ABC):
    """The GAPIC client of a blocking gRPC gateway, one per process: made
    when the gateway is (so missing credentials fail there), and again in a
    forked child on first use (``current``: also when a fork ran no Python
    hooks)."""

    _held: Owned[Any] | None = None
    _gate: RpcGate

    def _open_client(self) -> None:
        """Make the gate and this process's client (called by ``__init__``:
        missing credentials fail there)."""
        self._gate = RpcGate(self)
        self._client()

    def _sent(self, send: Callable[[float], T], seconds: float) -> T:
        """One attempt of an RPC, ``send(timeout)``, through the gate
        (``RpcGate.run``)."""
        return self._gate.run(send, seconds)

    @abc.abstractmethod
    def _new_client(self) -> Any:
        """A new GAPIC client for this gateway."""

    def _abandon_clients(self) -> None:
        """(``GatewayRules._after_fork_in_child``) The parent's client,
        abandoned at once: were this gateway collected in the child, the
        client's channel would be finalized here."""
        held = self._held
        if held is not None and not forks.owned_here(held.owner):
            forks.abandon(held.client)
            self._held = None

    def _client(self) -> Any:
        """This process's client."""
        held = self._held = current(self._held, self._new_client, self)
        return held.client

    def close(self) -> None:
        """Close this process's channel (a forked child leaves its parent's
        alone)."""
        held = self._held
        if held is None or not forks.owned_here(held.owner):
            return
        try:
            held.client.transport.close()
        except Exception:  # closing twice or a dead channel is not worth failing over
            log.debug("closing the channel of %r failed", self, exc_info=True)
