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

from gds_counter.server._service import METHODS, DatastoreService
from gds_counter.server._status import ServiceError

__all__ = ["SERVICE_NAME", "grpc_server"]

#: The service's full name, as clients put it in each call's path.
SERVICE_NAME = "google.datastore.v1.Datastore"

#: The largest message either way: Datastore's 10 MiB request limit, with room for a batch of results.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


def _unary(service: DatastoreService, method: str) -> Callable[[Any, Any], Any]:
    def handle(request: Any, context: Any) -> Any:
        left = context.time_remaining()
        deadline = time.monotonic() + left if left is not None else None
        try:
            return service.call(method, request, deadline=deadline, via="grpc")
        except ServiceError as error:
            context.abort(getattr(grpc.StatusCode, error.status), error.message)
            raise  # not reached: abort raises

    return handle


def grpc_server(service: DatastoreService, address: str, *, workers: int) -> tuple[Any, int]:
    """A started gRPC server of ``service`` on ``address`` (``unix:PATH`` or
    ``HOST:PORT``; port 0 picks one), ``workers`` requests at a time, and the
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
        ],
    )
    port = server.add_insecure_port(address)
    if not port:
        raise ServiceError("UNAVAILABLE", f"the gRPC server could not listen on {address}")
    server.start()
    return server, port
