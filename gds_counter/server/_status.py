"""Which status a failed request answers with, on both protocols.

The server's clients decide what to do from the status alone (the Datastore
gateway's retry table, google-cloud-datastore's and ndb's retries, php-gds's
exceptions), so each gds_counter error maps to the status the official
emulator gives for the same failure: a bad request is INVALID_ARGUMENT (never
retried), a conflict ABORTED (the caller redoes the transaction), a
transaction the server does not know (``TransactionLost``) INVALID_ARGUMENT
"Transaction is invalid or closed" as the Firestore emulator says it (the
Datastore gateway tells it from a bad request by that message), an insert
of an existing entity ALREADY_EXISTS, an update of a missing one NOT_FOUND. The
HTTP status of each is Google's own mapping for its REST APIs.
"""

from __future__ import annotations

from gds_counter.errors import (
    AlreadyExists,
    BadValueError,
    CommitUnknown,
    Contention,
    GDSError,
    GQLError,
    NotFound,
    ReadTimeTooOld,
    TransactionLost,
    Unavailable,
)

__all__ = ["HTTP_STATUS", "ServiceError", "status_of"]

#: gRPC status name -> (its code number, the HTTP status Google's REST APIs give it).
HTTP_STATUS: dict[str, tuple[int, int]] = {
    "OK": (0, 200),
    "CANCELLED": (1, 499),
    "UNKNOWN": (2, 500),
    "INVALID_ARGUMENT": (3, 400),
    "DEADLINE_EXCEEDED": (4, 504),
    "NOT_FOUND": (5, 404),
    "ALREADY_EXISTS": (6, 409),
    "PERMISSION_DENIED": (7, 403),
    "RESOURCE_EXHAUSTED": (8, 429),
    "FAILED_PRECONDITION": (9, 400),
    "ABORTED": (10, 409),
    "OUT_OF_RANGE": (11, 400),
    "UNIMPLEMENTED": (12, 501),
    "INTERNAL": (13, 500),
    "UNAVAILABLE": (14, 503),
}


class ServiceError(GDSError):
    """A request the server answers with a status other than OK: ``status``
    is the gRPC status name (a key of ``HTTP_STATUS``)."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS[self.status][1]


def status_of(exc: BaseException) -> ServiceError:
    """The status a request that raised ``exc`` answers with. Anything
    that is not a gds_counter error is the server's own bug: INTERNAL."""
    if isinstance(exc, ServiceError):
        return exc
    text = str(exc)
    if isinstance(exc, TransactionLost):
        return ServiceError("INVALID_ARGUMENT", text)  # as Cloud Datastore and both emulators answer
    if isinstance(exc, Contention):
        return ServiceError("ABORTED", text)
    if isinstance(exc, AlreadyExists):
        return ServiceError("ALREADY_EXISTS", text)
    if isinstance(exc, NotFound):
        return ServiceError("NOT_FOUND", text)
    if isinstance(exc, ReadTimeTooOld):
        return ServiceError("FAILED_PRECONDITION", text)  # as Datastore and the Firestore emulator answer
    if isinstance(exc, (BadValueError, GQLError)):
        return ServiceError("INVALID_ARGUMENT", text)
    if isinstance(exc, CommitUnknown):
        return ServiceError("INTERNAL", text)  # may have been applied: a status no client retries blindly
    if isinstance(exc, Unavailable):
        return ServiceError("UNAVAILABLE", text)
    if isinstance(exc, GDSError):
        return ServiceError("INTERNAL", text)
    return ServiceError("INTERNAL", f"{type(exc).__name__}: {text}")
