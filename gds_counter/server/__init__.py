"""``gds-counter serve``: the Datastore v1 API on the embedded engine.

Any Datastore client (google-cloud-datastore, google-cloud-ndb, php-gds's
REST gateway, gds_counter's own Datastore gateway) can then use one local
store, without Java, by setting ``DATASTORE_EMULATOR_HOST`` to the server's
address. gRPC and REST JSON are served on one port, as the official emulator
serves them.

Split by idea:

* ``_service``: the API's eight methods on a gateway, protobuf in and out
  (and how projects map to the store: they do not, see there).
* ``_databases``: a store and a service per database id.
* ``_status``: which gRPC and HTTP status each error answers with.
* ``_grpc``: grpcio serving ``google.datastore.v1.Datastore``.
* ``_rest``: the JSON API and ``GET /`` over HTTP/1.1.
* ``_listener``: the public port, routing each connection by its first bytes.

``Server`` puts them together; the ``gds-counter serve`` command runs one
until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import tempfile
import threading
from typing import Any, Callable, Iterator

from gds_counter.errors import BadValueError
from gds_counter.gateway.base import Gateway
from gds_counter.server._databases import Databases, named_url
from gds_counter.server._expiry import IDLE_S
from gds_counter.server._grpc import grpc_server
from gds_counter.server._listener import IDLE_S as CONNECTION_IDLE_S
from gds_counter.server._listener import Listener
from gds_counter.server._rest import RestContext, RestHandler
from gds_counter.server._service import DatastoreService
from gds_counter.server._status import ServiceError

__all__ = ["DEFAULT_PORT", "DatastoreService", "Server", "ServiceError", "named_url", "serve_until_signalled", "serving"]

log = logging.getLogger("gds_counter.server")

#: The port the official Datastore emulator listens on by default.
DEFAULT_PORT = 8081
#: Requests served at once (gRPC worker threads; each HTTP/1.1 connection has its own thread).
DEFAULT_WORKERS = 8
#: Seconds ``stop`` lets requests under way finish.
DEFAULT_GRACE_S = 10.0


class Server:
    """The Datastore v1 API over ``gateway`` on ``host:port`` (port 0 picks
    a free one; ``port`` then tells which). The gateway stays its opener's
    to close, after ``stop``.

    ``start()`` returns once the port accepts connections; ``stop()`` stops
    taking new requests, lets those under way finish (up to ``grace``
    seconds), and returns when every connection is closed. Use it as a
    context manager to have both. A connection silent for
    ``connection_idle`` seconds is closed (``_listener``); a transaction
    unused for ``transaction_idle`` seconds is ended (``_expiry``)."""

    def __init__(
        self,
        gateway: Gateway,
        host: str = "127.0.0.1",
        port: int = DEFAULT_PORT,
        *,
        workers: int = DEFAULT_WORKERS,
        grace: float = DEFAULT_GRACE_S,
        transaction_idle: float = IDLE_S,
        connection_idle: float = CONNECTION_IDLE_S,
        databases: Callable[[str], Gateway] | None = None,
    ) -> None:
        if not isinstance(port, int) or not 0 <= port <= 65535:
            raise BadValueError(f"port must be a number from 0 to 65535, got {port!r}")
        if workers < 1:
            raise BadValueError(f"workers must be at least 1, got {workers!r}")
        if not connection_idle > 0:
            raise BadValueError(f"connection_idle must be a positive number of seconds, got {connection_idle!r}")
        #: The default database's service (``gateway`` is its storage).
        self.service = DatastoreService(gateway, transaction_idle=transaction_idle)
        #: Every database's service: ``databases(id)`` opens a named one's storage on first use.
        self.databases = Databases(self.service, databases, transaction_idle)
        self.host = host
        self.port = port
        self.workers = workers
        self.grace = grace
        #: Seconds a connection may stay silent before it is closed.
        self.connection_idle = connection_idle
        self._grpc: Any = None
        self._listener: Listener | None = None
        self._folder: str | None = None
        self._inner: tuple[int, Any] | None = None  # (address family, address) of the gRPC server
        self._stopped = threading.Event()

    @property
    def emulator_host(self) -> str:
        """What to set ``DATASTORE_EMULATOR_HOST`` to."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def start(self) -> "Server":
        sock = self._bind()
        try:
            self._start_grpc()
            context = RestContext(self.databases, self._is_stopping, self._busy, self.connection_idle)
            self._listener = Listener(
                sock, self._connect_grpc, lambda conn, address, first: RestHandler(conn, address, context, first),
                idle=self.connection_idle,
            )
            self._listener.start()
        except BaseException:
            sock.close()
            self._stop_grpc(0)
            raise
        log.info("serving the Datastore v1 API (gRPC and REST) on %s", self.emulator_host)
        return self

    def _bind(self) -> socket.socket:
        try:
            infos = socket.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as exc:
            raise BadValueError(f"cannot listen on host {self.host!r}: {exc}") from exc
        family, kind, proto, _, address = infos[0]
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
            sock.listen(128)
        except OSError as exc:
            sock.close()
            raise ServiceError("UNAVAILABLE", f"cannot listen on {self.host}:{self.port}: {exc.strerror or exc}") from exc
        self.port = sock.getsockname()[1]
        return sock

    def _start_grpc(self) -> None:
        """grpcio on an internal address: a Unix socket in a private folder
        where there are Unix sockets, else a free port on 127.0.0.1."""
        if hasattr(socket, "AF_UNIX"):
            self._folder = tempfile.mkdtemp(prefix="gds-serve-")
            path = os.path.join(self._folder, "grpc.sock")
            self._grpc, _ = grpc_server(self.databases, f"unix:{path}", workers=self.workers, idle=self.connection_idle)
            self._inner = (socket.AF_UNIX, path)
        else:  # pragma: no cover - platforms without Unix sockets
            self._grpc, port = grpc_server(self.databases, "127.0.0.1:0", workers=self.workers, idle=self.connection_idle)
            self._inner = (socket.AF_INET, ("127.0.0.1", port))

    def _connect_grpc(self) -> socket.socket:
        assert self._inner is not None
        family, address = self._inner
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.connect(address)
        except OSError:
            sock.close()
            raise
        return sock

    def _is_stopping(self) -> bool:
        return self._listener is not None and self._listener.stopping

    def _busy(self, sock: Any, busy: bool) -> None:
        if self._listener is not None:
            self._listener.busy(sock, busy)

    def stop(self, grace: float | None = None) -> None:
        """Stop taking requests; let those under way finish (``grace``
        seconds at most, default the server's); close every connection.
        Calling it again does nothing."""
        if self._stopped.is_set() or self._listener is None:
            return
        self._stopped.set()
        grace = self.grace if grace is None else grace
        log.info("stopping: finishing the requests under way (at most %.1f s)", grace)
        self._listener.stop_accepting()
        self._stop_grpc(grace)
        self._listener.close(grace)
        self.databases.close()
        log.info("stopped")

    def _stop_grpc(self, grace: float) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace).wait()
            self._grpc = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def __enter__(self) -> "Server":
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


@contextlib.contextmanager
def serving(url: str, **options: Any) -> Iterator[Server]:
    """A server on a free port of 127.0.0.1 over the storage ``url`` names
    (``sqlite:///file`` or ``memory://``), opened here and closed after the
    server has stopped: what tests and benchmarks need of ``gds-counter
    serve`` in their own process. ``options`` are ``Server``'s (``workers``,
    ``transaction_idle``...); ``server.service.gateway`` is the default
    database's storage, named databases are opened beside it (``named_url``)."""
    from gds_counter.gateway import open_gateway

    gateway = open_gateway(url)
    try:
        named = options.pop("databases", lambda database: open_gateway(named_url(url, database)))
        with Server(gateway, "127.0.0.1", 0, databases=named, **options) as server:
            yield server
    finally:
        gateway.close()


def serve_until_signalled(server: Server, on_ready: Callable[[Server], None] = lambda _: None) -> None:
    """Start ``server``, call ``on_ready`` with it, and serve until SIGTERM
    or SIGINT (Ctrl-C); then stop it as ``Server.stop`` does, so requests
    under way finish and every acknowledged write is in the store.

    Why handlers rather than KeyboardInterrupt: a SIGTERM (what ``docker
    stop``, systemd and CI send) would otherwise kill the process wherever it
    is. Installed only from the main thread, where Python runs signal
    handlers; elsewhere the caller stops the server itself."""
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for number in (signal.SIGTERM, signal.SIGINT):
            previous[number] = signal.signal(number, lambda signum, _frame: stop.set())
    try:
        server.start()
        try:
            on_ready(server)
            while not stop.wait(0.5):
                pass
            log.info("signalled: stopping")
        finally:
            server.stop()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
