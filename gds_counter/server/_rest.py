"""The REST face: Datastore v1's JSON API over HTTP/1.1, as the emulators serve it.

``POST /v1/projects/{project}:{verb}`` with the request's JSON (the
``lookup``, ``runQuery``, ``runAggregationQuery``, ``beginTransaction``,
``commit``, ``rollback``, ``allocateIds`` and ``reserveIds`` verbs) answers
the response's JSON, both through ``google.protobuf.json_format`` on the very
messages the gRPC face uses, so the two faces cannot drift apart: field names
in lowerCamelCase, bytes in base64, 64-bit integers as strings, as Google's
REST APIs write them. The project of the path wins over one in the body.
``GET /`` answers ``Ok``, which existing wait loops for the emulators poll,
with a header naming the storage served (``counter._storage_scope``: a
shared count cache's clients of the server and of the file are one).

A request sent as ``Content-Type: application/x-protobuf`` (what
google-cloud-datastore's HTTP transport sends, ``GOOGLE_CLOUD_DISABLE_GRPC``)
carries the request message in protobuf's binary form and is answered in
it, its errors as a binary ``google.rpc.Status`` (the gRPC code number and
the message), as the Firestore emulator answers it; a body that is not the
message is INVALID_ARGUMENT "Payload isn't valid for request.", the
emulator's words.

Errors of JSON requests are Google's JSON error shape, ``{"error": {"code",
"message", "status"}}``; both kinds carry the HTTP status Google maps each
gRPC status to (400 INVALID_ARGUMENT, 404 NOT_FOUND, 409 ALREADY_EXISTS and
ABORTED...).

One connection is served by one thread (``_listener`` starts it), with
keep-alive; the listener closes an idle connection when the server stops,
and a request under way finishes first (``busy``). A connection that sends
nothing for the server's ``connection_idle`` (``RestContext.idle``; idle, or
stalled half way through a request) is closed, so slow clients cannot keep
threads for ever.

**Web pages may not use it.** A page the developer visits can send a
simple cross-site POST to ``127.0.0.1`` (no preflight is needed for
``text/plain``), or reach it under a name of its own that resolves there
(DNS rebinding). Browsers name the page's origin in an ``Origin`` header,
which other clients do not send; a request whose ``Origin`` is not on this
machine (``localhost``, ``127.x.x.x``, ``[::1]``) is refused with 403
PERMISSION_DENIED before anything is read or written.
"""

from __future__ import annotations

import io
import json
import logging
import re
import time
from http.server import BaseHTTPRequestHandler
from typing import Any, Callable

import attrs
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from google.rpc import status_pb2

from gds_counter.counter import DATABASE_HEADER, STORAGE_HEADER, storage_scope
from gds_counter.server._databases import Databases
from gds_counter.server._service import METHODS
from gds_counter.server._status import HTTP_STATUS, ServiceError

__all__ = ["RestContext", "RestHandler"]

log = logging.getLogger("gds_counter.server")

#: ``/v1/projects/{project}:{verb}``, with an optional query string (``?alt=json``...).
_PATH = re.compile(r"^/v1/projects/(?P<project>[^/:?]+):(?P<verb>[A-Za-z]+)(?:\?.*)?$")

#: The largest request body taken: more than Datastore's 10 MiB request limit.
MAX_BODY_BYTES = 32 * 1024 * 1024

#: The media type of protobuf's binary form, as Google's HTTP clients name it.
PROTOBUF = "application/x-protobuf"

#: A chunk's size: hex digits only.
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")

#: Origins of this machine: a browser page served from one may use the server.
_LOCAL_ORIGIN = re.compile(r"^https?://(localhost|127(\.\d{1,3}){3}|\[::1\])(:\d+)?$", re.IGNORECASE)


@attrs.frozen
class RestContext:
    """What a connection's handler needs of the server: the service, whether
    the server is stopping (then the connection closes after its request),
    and where to say that a request is under way (``busy(sock, True)``) or
    done, so that stopping closes only idle connections; ``idle``: the
    seconds a connection may send nothing (between requests, or within one)."""

    service: Databases
    stopping: Callable[[], bool]
    busy: Callable[[Any, bool], None]
    idle: float


class _Prefixed(io.RawIOBase):
    """A connection's reading side with the bytes already read from it
    (by the listener, to route it) put back in front."""

    def __init__(self, first: bytes, rest: Any) -> None:
        super().__init__()
        self._first, self._rest = first, rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._first:
            size = min(len(buffer), len(self._first))
            buffer[:size] = self._first[:size]
            self._first = self._first[size:]
            return size
        return int(self._rest.readinto(buffer))

    def close(self) -> None:
        self._rest.close()
        super().close()


class RestHandler(BaseHTTPRequestHandler):
    """One HTTP/1.1 connection whose ``first`` bytes the listener has read
    already; ``server`` is a ``RestContext``."""

    protocol_version = "HTTP/1.1"
    server_version = "gds-counter-serve"
    server: RestContext  # type: ignore[assignment]
    #: Whether the request being answered came in protobuf's binary form (then so does its answer).
    _binary = False

    def __init__(self, request: Any, client_address: Any, server: RestContext, first: bytes = b"") -> None:
        self._first = first
        super().__init__(request, client_address, server)  # type: ignore[arg-type]

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.idle)  # a read past it ends the connection
        if self._first:
            self.rfile = io.BufferedReader(_Prefixed(self._first, self.rfile.detach()))

    def parse_request(self) -> bool:
        # The request line has been read: from here the request is under way.
        self.server.busy(self.connection, True)
        return super().parse_request()

    def handle_one_request(self) -> None:
        try:
            super().handle_one_request()
        finally:
            self.server.busy(self.connection, False)
            if self.server.stopping():
                self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("http %s: " + format, self.address_string(), *args)

    # --- methods -------------------------------------------------------------

    def _from_elsewhere(self) -> bool:
        """Whether a web page of another site sent this request (its
        ``Origin`` is not this machine); then it is refused, answered 403."""
        origin = self.headers.get("Origin")
        if origin is None or _LOCAL_ORIGIN.match(origin.strip()):
            return False
        self.close_connection = True
        self._error(ServiceError("PERMISSION_DENIED", f"requests from web pages of {origin[:100]!r} are refused"))
        return True

    def do_GET(self) -> None:
        self._binary = False
        if self._from_elsewhere():
            return
        if self.path.split("?", 1)[0] == "/":
            try:  # the storage of the database asked for (a store of its own), else the default one's
                gateway = self.server.service.gateway_of(self.headers.get(DATABASE_HEADER, ""))
                storage = {STORAGE_HEADER: storage_scope(gateway, 0.0)}
            except ServiceError as error:
                self._error(error)
                return
            except OSError:  # its file is gone: no storage to name
                storage = {}
            self._send(200, b"Ok", "text/plain; charset=utf-8", storage)
        else:
            self._error(ServiceError("NOT_FOUND", f"no such resource: GET {self.path}"))

    def do_POST(self) -> None:
        media = self.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
        self._binary = media == PROTOBUF
        if self._from_elsewhere():
            return
        try:
            body = self._body()
        except ServiceError as error:
            self.close_connection = True  # what is left of the body cannot be told from the next request
            self._error(error)
            return
        match = _PATH.match(self.path)
        found = [m for m in METHODS if match is not None and m[1] == match.group("verb")]
        if match is None or not found:
            self._error(ServiceError("NOT_FOUND", f"no such method: POST {self.path}"))
            return
        [(method, _verb, request_class, _response_class)] = found
        try:
            request = self._request(request_class, body)
        except ServiceError as error:
            self._error(error)
            return
        request.project_id = match.group("project")
        try:
            response = self.server.service.call(method, request, deadline=self._deadline(), via="http")
        except ServiceError as error:
            self._error(error)
            return
        if self._binary:
            self._send(200, response.SerializeToString(), PROTOBUF)
        else:
            payload = json_format.MessageToJson(response, indent=None)
            self._send(200, payload.encode("utf-8"), "application/json; charset=utf-8")

    def _request(self, request_class: Any, body: bytes) -> Any:
        """The request message from its body, binary or JSON as the
        request's media type says."""
        request = request_class()
        if self._binary:
            try:
                request.ParseFromString(body)
            except DecodeError:
                raise ServiceError("INVALID_ARGUMENT", "Payload isn't valid for request.") from None
            return request
        try:
            json_format.Parse(body.decode("utf-8") if body.strip() else "{}", request)
        except (json_format.ParseError, UnicodeDecodeError, ValueError) as exc:
            raise ServiceError("INVALID_ARGUMENT", f"Invalid JSON payload received. {exc}") from None
        return request

    # --- plumbing ------------------------------------------------------------

    def _body(self) -> bytes:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self._chunked()
        length_text = self.headers.get("Content-Length", "0")
        try:
            length = int(length_text)
        except ValueError:
            raise ServiceError("INVALID_ARGUMENT", f"Content-Length {length_text!r} is not a number") from None
        if length < 0 or length > MAX_BODY_BYTES:
            raise ServiceError("INVALID_ARGUMENT", f"a request body of {length} bytes is refused (at most {MAX_BODY_BYTES})")
        body = self.rfile.read(length)
        if len(body) < length:
            raise ServiceError("INVALID_ARGUMENT", f"the request body ended after {len(body)} of {length} bytes")
        return body

    def _chunked(self) -> bytes:
        parts: list[bytes] = []
        size = 0
        while True:
            line = self.rfile.readline(1024).split(b";", 1)[0].strip()
            try:
                if not _CHUNK_SIZE.fullmatch(line):  # (int(..., 16) also takes "-1", "+1", "0x1" and "1_0")
                    raise ValueError(line)
                chunk = int(line, 16)
            except ValueError:
                raise ServiceError("INVALID_ARGUMENT", f"a malformed chunk size {line[:20]!r}") from None
            if chunk == 0:
                while self.rfile.readline(1024).strip():
                    pass  # trailers
                return b"".join(parts)
            size += chunk
            if size > MAX_BODY_BYTES:
                raise ServiceError("INVALID_ARGUMENT", f"a request body over {MAX_BODY_BYTES} bytes is refused")
            parts.append(self.rfile.read(chunk))
            if self.rfile.readline(8) != b"\r\n":  # a chunk's data ends exactly where its size said
                raise ServiceError("INVALID_ARGUMENT", f"a chunk of the body is longer than its size {line[:20]!r} says")

    def _deadline(self) -> float | None:
        """Google's REST header for a call's time limit, in seconds, if sent."""
        text = self.headers.get("X-Server-Timeout")
        try:
            return time.monotonic() + float(text) if text else None
        except ValueError:
            return None

    def _error(self, error: ServiceError) -> None:
        number, code = HTTP_STATUS[error.status]
        if self._binary:
            status = status_pb2.Status(code=number, message=error.message)
            self._send(code, status.SerializeToString(), PROTOBUF)
            return
        body = json.dumps({"error": {"code": code, "message": error.message, "status": error.status}})
        self._send(code, body.encode("utf-8"), "application/json; charset=utf-8")

    def _send(self, code: int, body: bytes, content_type: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if self.close_connection or self.server.stopping():
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)
