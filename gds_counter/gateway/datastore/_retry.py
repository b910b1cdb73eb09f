"""The Datastore gateway's retry and error policy: which failures are
retried, and which gds_counter error the caller sees.

Retry and error policy (quoted by the README; ``should_retry`` and
``translate_error`` implement it and are unit-tested directly):

=====================  ==========================  ==================================  ===========================
gRPC status            lookup, run_query,          commit                              raised when not retried /
                       allocate_ids, reserve_ids,                                      retries run out
                       begin_tx, rollback
                       (idempotent)
=====================  ==========================  ==================================  ===========================
UNAVAILABLE            retried                     retried if the commit is            ``Unavailable`` (commit:
                                                   idempotent (transactional, or only  ``CommitUnknown`` if any
                                                   complete-key upserts, updates and   attempt may have arrived)
                                                   deletes
                                                   without transforms) or the error
                                                   shows the connection was never
                                                   made; else not retried
RESOURCE_EXHAUSTED     retried                     retried: a quota rejection is not   ``GatewayError``
                                                   applied, so it is safe
INTERNAL               retried                     NOT retried: may have been applied  ``CommitUnknown`` (commit),
                                                                                       ``GatewayError`` (others)
DEADLINE_EXCEEDED      retried                     NOT retried: may have been applied  ``CommitUnknown`` (commit),
                                                                                       ``Unavailable`` (others: a
                                                                                       read that timed out applied
                                                                                       nothing, so callers retry it)
UNKNOWN, CANCELLED     not retried                 NOT retried: may have been applied  ``CommitUnknown`` (commit),
                                                                                       ``GatewayError`` (others)
ABORTED, or a message  not retried here: the       not retried here: the caller must   ``Contention(attempts=1)``
"too much contention"  caller redoes the whole     re-read and redo the transaction    (commit after an unknown
                       transaction                                                     attempt: ``CommitUnknown``)
INVALID_ARGUMENT       not retried here: the       not retried here: the caller        ``TransactionLost``, a
naming the transaction same token gets the same    redoes the whole transaction        ``Contention`` (commit after
(the server lost it)   answer                      (nothing of it was applied)         an unknown attempt:
                                                                                       ``CommitUnknown``)
INVALID_ARGUMENT       not retried                 not retried                         ``BadValueError`` (commit
                                                                                       after an unknown attempt:
                                                                                       ``CommitUnknown``)
ALREADY_EXISTS,        not retried                 not retried: an insert's entity     ``AlreadyExists``,
NOT_FOUND                                          exists, an update's does not        ``NotFound`` (commit after
                                                                                       an unknown attempt:
                                                                                       ``CommitUnknown``)
anything else          not retried                 not retried                         ``GatewayError``
=====================  ==========================  ==================================  ===========================

A transaction the server lost: a server that no longer knows a
transaction (it expired, or the server restarted and forgot it) answers
INVALID_ARGUMENT, as for a bad request, but with a message that names the
transaction (``LOST_TRANSACTION_MARKERS``). The gateway sends only tokens
it began and has not ended (any other is refused before it is sent, as
``BadValueError``), so that answer means the server lost it: nothing of
the transaction was applied, and redoing all of it in a new one is safe.
Google's own Firestore clients retry it the same way, by the message.

Retries use ``google.api_core.retry.Retry`` (exponential backoff with
jitter); the whole call, retries included, is bounded by ``timeout`` seconds
so nothing hangs. A commit is never retried when its outcome is unknown,
because a blind retry of an increment could count it twice. When that
deadline passes, the last attempt's status decides as above; a deadline with
no attempt's error to go by (a bare ``RetryError``, or a ``TimeoutError``)
counts as DEADLINE_EXCEEDED.
"""

from __future__ import annotations

from typing import Sequence

from google.api_core import exceptions as gexc
from google.api_core.retry import AsyncRetry, Retry

from gds_counter.errors import (
    AlreadyExists,
    BadValueError,
    CommitUnknown,
    Contention,
    GatewayError,
    GDSError,
    NotFound,
    ReadTimeTooOld,
    TransactionLost,
    Unavailable,
)

#: Backoff shared by every call; per-call predicates are derived from it.
#: ``timeout`` here is replaced by the gateway's own timeout.
DEFAULT_RETRY = Retry(initial=0.1, maximum=4.0, multiplier=2.0, timeout=30.0)
#: The same backoff for the asyncio transport (``AsyncDatastoreGateway``).
DEFAULT_ASYNC_RETRY = AsyncRetry(
    initial=DEFAULT_RETRY._initial, maximum=DEFAULT_RETRY._maximum,
    multiplier=DEFAULT_RETRY._multiplier, timeout=DEFAULT_RETRY._timeout,
)

#: The calls whose request may name a transaction (a read's read_options,
#: a commit's or rollback's transaction): only they can be told it is lost.
_NAMING_A_TRANSACTION = frozenset({"lookup", "run_query", "commit", "rollback"})

_IDEMPOTENT_CALLS = frozenset({"lookup", "run_query", "allocate_ids", "reserve_ids", "begin_transaction", "rollback"})

#: Fragments of gRPC messages that prove the request never reached a server
#: (the connection was never made), so even a non-idempotent commit may be resent.
_NOT_SENT_MARKERS = (
    "failed to connect to all addresses",
    "connection refused",
    "dns resolution failed",
    "name resolution failure",
    "failed to connect to remote host",
)


#: Fragments of the INVALID_ARGUMENT messages a server gives for a
#: transaction it does not know (lowercase; docs/storage.md quotes them whole).
LOST_TRANSACTION_MARKERS = (
    "transaction has expired or is no longer valid",  # Cloud Datastore
    "transaction is invalid or closed",  # the Firestore emulator (lookup, commit), gds-counter serve
    "transaction is invalid or expired",  # the Firestore emulator (rollback)
    "transaction has expired or is invalid",  # the legacy Datastore emulator
    "invalid transaction",  # both emulators: a token they never gave out, or from before a restart
)


def error_message(exc: BaseException) -> str:
    """The server's message (google.api_core keeps it apart from the status
    code), else the error's text: what the policy matches markers against."""
    return getattr(exc, "message", None) or str(exc)


def _is_contention(exc: BaseException) -> bool:
    return isinstance(exc, gexc.Aborted) or "too much contention" in error_message(exc).lower()


def _is_transaction_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is a server's answer that it does not know the
    transaction the request named (this module's docstring)."""
    text = error_message(exc).lower()
    return isinstance(exc, gexc.InvalidArgument) and any(m in text for m in LOST_TRANSACTION_MARKERS)


def _never_sent(exc: BaseException) -> bool:
    text = error_message(exc).lower()
    return isinstance(exc, gexc.ServiceUnavailable) and any(m in text for m in _NOT_SENT_MARKERS)


def should_retry(exc: BaseException, *, call: str, idempotent_commit: bool = False) -> bool:
    """The retry predicate of the policy table in this module's docstring.

    ``call`` is the RPC name; ``idempotent_commit`` says a commit can be
    applied twice with the same result (transactional, or only complete-key
    upserts/deletes with no transforms).
    """
    if _is_contention(exc):
        return False
    if call in _IDEMPOTENT_CALLS:
        return isinstance(
            exc,
            (gexc.ServiceUnavailable, gexc.ResourceExhausted, gexc.InternalServerError, gexc.DeadlineExceeded),
        )
    if call == "commit":
        if isinstance(exc, gexc.ResourceExhausted):
            return True
        if isinstance(exc, gexc.ServiceUnavailable):
            return idempotent_commit or _never_sent(exc)
        return False
    return False


def _outcome_unknown(exc: BaseException) -> bool:
    """True when a failed commit attempt may nevertheless have been applied."""
    if isinstance(exc, gexc.ServiceUnavailable):
        return not _never_sent(exc)
    return isinstance(
        exc, (gexc.DeadlineExceeded, gexc.Unknown, gexc.InternalServerError, gexc.Cancelled)
    )


#: What an insert's or an update's failure left written.
_STOPPED = (
    "it was not written, nor anything else of a transaction; a commit without a transaction keeps the "
    "mutations before it (Datastore applies them in order and stops at the first that fails)"
)

#: Errors that say a call ran out of time: google.api_core's ``GatewayTimeout``
#: (``DeadlineExceeded`` is one), and the retries' own deadline when no
#: attempt's error says more (a ``RetryError`` without a cause).
_TIMEOUTS = (gexc.GatewayTimeout, gexc.RetryError, TimeoutError)


def translate_error(
    exc: BaseException, *, call: str, earlier_attempts: Sequence[BaseException] = ()
) -> GDSError:
    """Map a google.api_core error to the gds_counter error of the policy table.

    ``earlier_attempts`` are the errors of attempts that were retried before
    ``exc``: for a commit, any of them with an unknown outcome makes the final
    result unknown too (the first attempt may have been applied).
    """
    if isinstance(exc, gexc.RetryError) and exc.cause is not None:
        exc = exc.cause
    text = error_message(exc)
    if call == "commit" and any(_outcome_unknown(e) for e in earlier_attempts):
        # An earlier attempt may have been applied: whatever the resend says
        # (even ABORTED, which would invite a retry), the outcome is unknown.
        return CommitUnknown(f"commit outcome unknown (it may or may not have been applied): {text}")
    if _is_contention(exc):
        return Contention(f"{call}: contention: {text}", attempts=1)
    if call == "commit":
        if _outcome_unknown(exc):
            return CommitUnknown(f"commit outcome unknown (it may or may not have been applied): {text}")
    if isinstance(exc, gexc.ServiceUnavailable):
        return Unavailable(f"{call}: Datastore unavailable: {text}")
    if call in _IDEMPOTENT_CALLS and isinstance(exc, _TIMEOUTS):
        # Nothing a read (or begin, rollback, allocate_ids) did needs undoing:
        # Unavailable, so the counter and the Store retry it.
        return Unavailable(f"{call}: Datastore did not answer in time ({type(exc).__name__}): {text}")
    if call in _NAMING_A_TRANSACTION and _is_transaction_lost(exc):
        return TransactionLost(
            f"{call}: the server no longer knows this transaction (it expired, or the server restarted), "
            f"so nothing of it was applied; redo the whole transaction: {text}"
        )
    if isinstance(exc, gexc.InvalidArgument):
        return BadValueError(f"{call}: rejected by Datastore: {text}")
    if isinstance(exc, gexc.FailedPrecondition) and "'read_time'" in text:
        return ReadTimeTooOld(f"{call}: rejected by Datastore: {text}")
    if call == "commit" and isinstance(exc, gexc.AlreadyExists):
        return AlreadyExists(f"commit refused, an inserted entity exists ({text}); {_STOPPED}")
    if call == "commit" and isinstance(exc, gexc.NotFound):
        return NotFound(f"commit refused, an updated entity does not exist ({text}); {_STOPPED}")
    return GatewayError(f"{call} failed: {type(exc).__name__}: {text}")
