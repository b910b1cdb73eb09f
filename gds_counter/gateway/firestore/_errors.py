"""The Firestore gateway's errors: the Datastore gateway's retry and error
policy (``datastore._retry``: its table, ``should_retry`` and
``translate_error``), applied to Firestore's gRPC statuses, with texts
that say Firestore and name the documents or the query involved.

The policy is one for both gateways, because the question it answers is
one: was the write stored? ABORTED (a transaction lost a lock, or
"Transaction lock timeout" on the emulator) is ``Contention``, nothing
written; UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, UNKNOWN or CANCELLED on
a commit that may have reached the server is ``CommitUnknown``, never an
error a retry answers by counting again (a transactional commit is resent
on UNAVAILABLE: the server commits a transaction at most once, and a
resend after an unknown attempt is ``CommitUnknown`` whatever it says);
INVALID_ARGUMENT is ``BadValueError``; ALREADY_EXISTS (an ``Insert`` of an
existing document: the precondition exists=false) is ``AlreadyExists`` and
NOT_FOUND (an ``Update`` of a missing one: exists=true) ``NotFound``, as
the Datastore gateway and the embedded engine raise them.

One difference from Datastore: a Firestore commit is atomic with or
without a transaction, so a refused insert or update leaves nothing of its
commit written.
"""

from __future__ import annotations

from google.api_core import exceptions as gexc

from gds_counter.errors import AlreadyExists, GDSError, NotFound
from gds_counter.gateway.datastore._retry import translate_error

__all__ = ["final_error"]

#: What a refused insert or update left written.
_NOTHING_WRITTEN = "nothing of this commit was written (a Firestore commit is atomic, with or without a transaction)"


def final_error(exc: BaseException, failures: list[BaseException], *, call: str, rule: str, about: str) -> GDSError:
    """The gds_counter error for a call whose retries ended in ``exc``
    (``failures``: every attempt's error), by the policy table, naming
    ``call`` and what the request was ``about``."""
    final = exc.cause if isinstance(exc, gexc.RetryError) and exc.cause is not None else exc
    earlier = [e for e in failures if e is not final]
    error = translate_error(final, call=rule, earlier_attempts=earlier)
    text = str(error).replace("Datastore", "Firestore")
    if rule != call:
        text = text.replace(rule, call, 1)
    if type(error) is AlreadyExists:
        text = f"commit refused, an inserted document exists ({_message(final)}); {_NOTHING_WRITTEN}"
    elif type(error) is NotFound:
        text = f"commit refused, an updated document does not exist ({_message(final)}); {_NOTHING_WRITTEN}"
    error.args = (f"{text} [{about}]" if about else text, *error.args[1:])
    return error


def _message(exc: BaseException) -> str:
    return getattr(exc, "message", None) or str(exc)
