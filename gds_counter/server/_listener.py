"""One public port for both protocols: each connection goes where its first bytes say.

A gRPC client opens its connection with HTTP/2's preface, which starts with
``PRI``; no HTTP/1.1 method does. So the listener reads the first three bytes
of each accepted connection (a blocking read with a timeout: a client may
send them one at a time, and waiting for them must not poll) and hands them
on with the connection: HTTP/2 goes to grpcio, everything else to the
HTTP/1.1 handler (``_rest``), which reads the request from those bytes on.

**Stalled connections.** A connection that sends nothing for ``idle``
seconds is closed, whatever it began: the first bytes must come within it,
an HTTP/1.1 connection's every read has it (``_rest``), and an HTTP/2
client that goes silent for it is closed by the pump (grpcio's own limits,
set in ``_grpc``, end idle and half-open HTTP/2 connections gracefully at
the same limit; its keepalive pings during a call keep a waiting client
from being silent).

Why a byte pump to grpcio rather than one server for both: grpcio owns its
listening sockets and cannot be handed a connection accepted elsewhere, and
writing gRPC over HTTP/2 ourselves would be a second protocol stack to get
right. So grpcio listens on an internal address (a Unix socket in a private
temporary folder where there are Unix sockets, else an ephemeral port on
127.0.0.1), and an HTTP/2 connection of the public port is joined to a new
connection to it, byte for byte, by two threads. gRPC clients keep one
connection open and send every call over it, so the pump costs a thread pair
per client, not per call.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from typing import Any, Callable

__all__ = ["IDLE_S", "Listener"]

log = logging.getLogger("gds_counter.server")

#: What an HTTP/2 connection starts with (its preface is ``PRI * HTTP/2.0...``).
_HTTP2 = b"PRI"
#: Seconds a connection may stay silent (docs/serve.md: stalled connections close after 30 s).
IDLE_S = 30.0
#: Seconds between the accept loop's looks at whether it must stop.
POLL_S = 0.2


class Listener:
    """Accepts on ``sock`` (bound and listening) and routes each connection:
    HTTP/2 to ``connect_grpc()``'s socket, the rest to ``serve_http(sock,
    address, first)``, which serves the connection until it closes (``first``:
    its bytes read here). A connection silent for ``idle`` seconds is closed."""

    def __init__(
        self,
        sock: socket.socket,
        connect_grpc: Callable[[], socket.socket],
        serve_http: Callable[[socket.socket, Any, bytes], object],
        *,
        idle: float = IDLE_S,
    ) -> None:
        self._sock = sock
        self.idle = idle
        self._connect_grpc = connect_grpc
        self._serve_http = serve_http
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._threads: set[threading.Thread] = set()
        self._http: dict[socket.socket, bool] = {}  # HTTP/1.1 connection -> a request is under way
        self._pumped: set[socket.socket] = set()
        self._routing: set[socket.socket] = set()  # connections still to send their first bytes
        self._accepting = threading.Thread(target=self._accept_loop, name="gds-serve-accept", daemon=True)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def start(self) -> None:
        self._sock.settimeout(POLL_S)
        self._accepting.start()

    def busy(self, sock: socket.socket, busy: bool) -> None:
        """An HTTP/1.1 connection says a request is under way, or done."""
        with self._lock:
            if sock in self._http:
                self._http[sock] = busy

    # --- accepting and routing -------------------------------------------------

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, address = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                if self._stopping.is_set():
                    break
                log.warning("accepting a connection failed", exc_info=True)
                time.sleep(POLL_S)
                continue
            conn.settimeout(None)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._spawn(self._route, conn, address, name="gds-serve-conn")
        try:
            self._sock.close()
        except OSError:
            pass

    def _spawn(self, target: Callable[..., None], *args: Any, name: str) -> None:
        def run() -> None:
            try:
                target(*args)
            finally:
                with self._lock:
                    self._threads.discard(thread)

        thread = threading.Thread(target=run, name=name, daemon=True)
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def _route(self, conn: socket.socket, address: Any) -> None:
        with self._lock:
            self._routing.add(conn)
        try:
            first = self._first_bytes(conn) if not self._stopping.is_set() else b""
        except OSError:
            first = b""
        finally:
            with self._lock:
                self._routing.discard(conn)
        if len(first) < len(_HTTP2) or self._stopping.is_set():
            _close(conn)  # closed, or stalled, before saying what it speaks (or the server is stopping)
        elif first == _HTTP2:
            self._pump_to_grpc(conn, first)
        else:
            self._serve(conn, address, first)

    def _first_bytes(self, conn: socket.socket) -> bytes:
        """The connection's first three bytes, read (blocking) within
        ``idle`` seconds of its opening; fewer when it ended or stalled."""
        until = time.monotonic() + self.idle
        first = b""
        try:
            while len(first) < len(_HTTP2):
                left = until - time.monotonic()
                if left <= 0:
                    break
                conn.settimeout(left)
                chunk = conn.recv(len(_HTTP2) - len(first))
                if not chunk:
                    break
                first += chunk
        except socket.timeout:
            pass
        return first

    def _serve(self, conn: socket.socket, address: Any, first: bytes) -> None:
        with self._lock:
            if self._stopping.is_set():
                conn.close()
                return
            self._http[conn] = False
        try:
            conn.settimeout(None)  # the handler sets its own
            self._serve_http(conn, address, first)
        except OSError:
            log.debug("an HTTP connection ended with an error", exc_info=True)
        finally:
            with self._lock:
                self._http.pop(conn, None)
            _close(conn)

    def _pump_to_grpc(self, conn: socket.socket, first: bytes) -> None:
        try:
            inner = self._connect_grpc()
            inner.sendall(first)
        except OSError:
            log.warning("cannot reach the internal gRPC server", exc_info=True)
            _close(conn)
            return
        with self._lock:
            self._pumped.update((conn, inner))
        directions = [2]

        def one_done() -> None:
            with self._lock:
                directions[0] -= 1
                last = directions[0] == 0
                if last:
                    self._pumped.difference_update((conn, inner))
            if last:
                _close(conn)
                _close(inner)

        def back() -> None:
            _pump(inner, conn, None)
            # grpcio closed the connection (it never half-closes one): the
            # client's side is of no more use, and its reader must not wait on it.
            _shutdown(conn, socket.SHUT_RDWR)
            one_done()

        self._spawn(back, name="gds-serve-pump")
        if not _pump(conn, inner, self.idle):
            log.info("closing an HTTP/2 connection silent for %g s", self.idle)
            _shutdown(inner, socket.SHUT_RDWR)  # so that ``back`` ends too
        one_done()

    # --- stopping ----------------------------------------------------------------

    def stop_accepting(self) -> None:
        """No new connection; idle HTTP/1.1 connections are closed, and one
        under way closes after its request is answered."""
        self._stopping.set()
        self._accepting.join()
        with self._lock:
            idle = [sock for sock, busy in self._http.items() if not busy] + list(self._routing)
        for sock in idle:
            _shutdown(sock, socket.SHUT_RD)  # its handler (or router) reads the end and closes

    def close(self, grace: float) -> None:
        """After the gRPC server has stopped: close what the pumps still
        hold, and wait up to ``grace`` seconds for every connection's thread."""
        with self._lock:
            pumped = list(self._pumped)
        for sock in pumped:
            _shutdown(sock, socket.SHUT_RDWR)
        until = time.monotonic() + grace
        while True:
            with self._lock:
                threads = [t for t in self._threads if t is not threading.current_thread()]
                idle = [sock for sock, busy in self._http.items() if not busy]
            for sock in idle:
                _shutdown(sock, socket.SHUT_RD)
            if not threads or time.monotonic() >= until:
                break
            threads[0].join(min(POLL_S, max(0.0, until - time.monotonic())))
        if threads:
            log.warning("%d connection(s) still open after %.1f s; leaving them", len(threads), grace)


def _pump(source: socket.socket, target: socket.socket, idle: float | None) -> bool:
    """Copy ``source`` to ``target`` until ``source`` ends, then end
    ``target``'s writing side; False when ``source`` was silent for ``idle``
    seconds (None: no limit) and the copy gave up."""
    source.settimeout(idle)
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    except socket.timeout:
        return False
    except OSError:
        pass
    finally:
        _shutdown(target, socket.SHUT_WR)
        _shutdown(source, socket.SHUT_RD)
    return True


def _shutdown(sock: socket.socket, how: int) -> None:
    try:
        sock.shutdown(how)
    except OSError:
        pass


def _close(sock: socket.socket) -> None:
    _shutdown(sock, socket.SHUT_RDWR)
    try:
        sock.close()
    except OSError:
        pass
