"""Every error gds_counter raises, in one module.

This module sits below all layers (gateway, gds, counter, cli) so that each of
them can raise the same classes: a caller catches ``Contention`` whether it came
from SQLite or from Cloud Datastore.
"""

from __future__ import annotations


class GDSError(Exception):
    """Base class: catch this to catch anything gds_counter raises on purpose."""


class BadValueError(GDSError, ValueError):
    """A value cannot be stored as given (wrong type, too long, out of range).

    Raised before anything is written, so a batch is never half-applied
    because of one bad value.
    """


class BadKeyError(BadValueError, KeyError):
    """A key or key name that Datastore would reject or that would collide.

    It is also a ``KeyError`` so code ported from php-gds that caught key
    problems generically keeps working.
    """

    def __str__(self) -> str:  # KeyError quotes its message; we want it plain
        return str(self.args[0]) if self.args else ""


class SchemaError(BadValueError):
    """Data does not fit the schema (unknown kind, wrong property type)."""


class ReadTimeTooOld(BadValueError):
    """A read at a past ``read_time`` older than the storage keeps versions
    for (Datastore's FAILED_PRECONDITION, "The requested 'read_time' is too
    old."): nothing was read. The message says how far back it reaches."""


class CorruptDataError(GDSError):
    """Stored data is not what its layout promises (e.g. a shard count that is
    not an integer). The message names the entity so it can be repaired."""


class GQLError(GDSError, ValueError):
    """A GQL statement cannot be parsed or bound.

    ``position`` is the 0-based character offset of the problem (or None when
    the problem is not at one place, such as an unused binding).
    """

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


class Contention(GDSError):
    """A transaction kept conflicting with other writers and retries ran out.

    ``attempts`` is how many times the operation was tried, so callers and
    logs can tell a single conflict from sustained overload.
    """

    def __init__(self, message: str, attempts: int = 1) -> None:
        super().__init__(message)
        self.attempts = attempts


class PartialReset(GDSError):
    """``reset()`` set some of a counter's shards to 0, then failed: the
    counter's total is neither what it was nor 0.

    ``zeroed`` names the shard keys (key names) committed as 0, ``not_zeroed``
    those left as they were, and ``unknown`` those in the one commit whose
    outcome was not learned (empty when the failing commit applied nothing).
    The failing chunk's own error is ``__cause__``. A reset writes 0, not a
    difference, so calling ``reset()`` again finishes it.
    """

    def __init__(
        self,
        message: str,
        *,
        zeroed: tuple[str, ...] = (),
        not_zeroed: tuple[str, ...] = (),
        unknown: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.zeroed = zeroed
        self.not_zeroed = not_zeroed
        self.unknown = unknown


class TransactionLost(Contention):
    """The server no longer knows a transaction this process began and has
    not ended: it expired (idle too long, or past its lifetime), or the
    server restarted and forgot it. Cloud Datastore and both emulators
    answer INVALID_ARGUMENT then (docs/storage.md quotes what each says).

    Nothing of that transaction was applied, so redoing the whole of it in
    a new one is safe: it is a ``Contention``, which the Store's
    ``run_in_transaction`` and the counters retry. A commit that was sent
    earlier and whose outcome is unknown stays ``CommitUnknown``, never this.
    """


class AlreadyExists(GDSError):
    """An insert named an entity that exists (Datastore's ALREADY_EXISTS):
    that entity was not written. Nor was anything else of a transaction;
    a commit without one keeps the mutations before the one that failed
    (Datastore applies it in order and stops there)."""


class NotFound(GDSError):
    """An update named an entity that does not exist (Datastore's
    NOT_FOUND): nothing was written for it. Nor was anything else of a
    transaction; a commit without one keeps the mutations before it."""


class GatewayError(GDSError):
    """Storage failed for a reason that is neither contention nor bad input."""


class Unavailable(GatewayError):
    """Storage could not be reached; the request was not applied."""


class CommitUnknown(GatewayError):
    """A commit was sent but its outcome is unknown (e.g. deadline exceeded
    after the request left). It may or may not have been applied, so it is
    never retried blindly: retrying a non-idempotent increment could count it
    twice."""


class TransformsIgnored(GatewayError):
    """The server accepted a commit with property transforms but did not apply
    them (the legacy Datastore emulator does this silently). The rest of the
    mutation was written; the increment was not, so it is safe to redo it
    another way, and it must never be reported as counted."""


class CountSaturated(GatewayError):
    """An increment WAS written, but the shard it went to now holds a 64-bit
    bound (2**63-1 or -2**63), where Datastore's increment transform
    saturates instead of failing: the amount may have been cut short.

    Never retry it (the write was applied; a retry would count again, or
    saturate again). The shard needs repair: its message names the shard's
    key and the value it holds. Unlike ``BadValueError`` (nothing written),
    this says the write happened, so combined writes never re-send it.
    """


class TotalUnavailable(GatewayError):
    """An increment WAS counted, but reading the new total afterwards failed.

    Raised by ``increment()`` (which returns the total) instead of the read's
    own error, because retrying an increment on a read failure would count
    it twice. Use ``add()`` where the total is not needed.
    """
