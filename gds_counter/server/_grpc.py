"""The gRPC face: ``google.datastore.v1.Datastore`` served by grpcio.

No generated servicer is needed: google-cloud-datastore ships the request and
response messages, and grpcio's generic handler routes each method's path
(``/google.datastore.v1.Datastore/Lookup``...) to ``DatastoreService.call``
with those classes as the (de)serializers. The server listens on an internal
address only; ``_listener`` hands it the HTTP/2 connections of the public port.
"""

from __future__ import annotations

import time
from concurrent import futures
from typing import Any, Callable

import grpc

from gds_counter.server._databases import Databases
from gds_counter.server._service import METHODS
from gds_counter.server._status import ServiceError

__all__ = ["SERVICE_NAME", "grpc_server"]

#: The service's full name, as clients put it in each call's path.
SERVICE_NAME = "google.datastore.v1.Datastore"

#: The largest message either way: Datastore's 10 MiB request limit, with room for a batch of results.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


#: How much earlier than its header says a call's deadline may be: a
#: client's deadline reaches the server rounded up to the millisecond
#: (google-cloud-ndb's ``fetch(timeout=1e-9)`` arrives with 0.75 ms left), and
#: the client's timer has that grain too, so an answer sent within it may be
#: taken by a client whose deadline had passed. A call taken with less than
#: this left is answered DEADLINE_EXCEEDED, unrun, as the emulator answers it.
WIRE_GRAIN_S = 0.001


def _unary(service: Databases, method: str) -> Callable[[Any, Any], Any]:
    def handle(request: Any, context: Any) -> Any:
        left = context.time_remaining()
        deadline = time.monotonic() + left - WIRE_GRAIN_S if left is not None else None
        try:
            return service.call(method, request, deadline=deadline, via="grpc")
        except ServiceError as error:
            context.abort(getattr(grpc.StatusCode, error.status), error.message)
            raise  # not reached: abort raises

    return handle


def _idle_options(idle: float) -> list[tuple[str, int]]:
    """grpcio's own limits on a connection that stalls, at the server's
    ``idle`` seconds (its defaults would hold one for a minute or more):

    * ``settings_timeout``: a client must acknowledge the server's HTTP/2
      SETTINGS (a client that sent the preface alone never does; the
      default, 60 s, is why such a connection was held 61 s);
    * ``server_handshake_timeout_ms``: the preface itself must arrive (120 s);
    * ``max_connection_idle_ms``: a connection with no call under way is
      closed with a GOAWAY, which clients take as "reconnect for the next
      call" (no limit by default);
    * keepalive pings every third of the limit while a call is under way,
      so that a client waiting for a slow answer is not silent (its HTTP/2
      stack answers them) and one that stopped answering is let go.
    """
    ms = max(1, int(idle * 1000))
    return [
        ("grpc.http2.settings_timeout", ms),
        ("grpc.server_handshake_timeout_ms", ms),
        ("grpc.max_connection_idle_ms", ms),
        ("grpc.keepalive_time_ms", max(1, ms // 3)),
        ("grpc.keepalive_timeout_ms", ms),
    ]


def grpc_server(service: Databases, address: str, *, workers: int, idle: float) -> tuple[Any, int]:
    """A started gRPC server of ``service`` on ``address`` (``unix:PATH`` or
    ``HOST:PORT``; port 0 picks one), ``workers`` requests at a time, closing
    connections stalled for ``idle`` seconds (``_idle_options``), and the
    port it bound (1 for a unix socket)."""
    handlers = {
        name: grpc.unary_unary_rpc_method_handler(
            _unary(service, name),
            request_deserializer=request_class.FromString,
            response_serializer=response_class.SerializeToString,
        )
        for name, _verb, request_class, response_class in METHODS
    }
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gds-serve-grpc"),
        handlers=[grpc.method_handlers_generic_handler(SERVICE_NAME, handlers)],
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.so_reuseport", 0),
            *_idle_options(idle),
        ],
    )
    port = server.add_insecure_port(address)
    if not port:
        raise ServiceError("UNAVAILABLE", f"the gRPC server could not listen on {address}")
    server.start()
    return server, port
