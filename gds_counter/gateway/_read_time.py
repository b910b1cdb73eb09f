"""A read at a past time (``read_time``): which times a gateway takes.

A read-only transaction may read the database as it was at a past time
(``begin_transaction(read_only=True, read_time=...)``), as Datastore's
``TransactionOptions.ReadOnly.read_time`` does; ``gds-counter serve`` runs a
read with ``ReadOptions.read_time`` in one. The time is an aware
``datetime``; these are the checks every gateway makes before it sends or
reads anything, with the Firestore emulator's words (clients compare
them). How far back a time may be is the storage's: the emulator keeps 7
days, the embedded engine ``HISTORY_S`` (``embedded._history``).
"""

from __future__ import annotations

import datetime as _dt
import time

from gds_counter.errors import BadValueError
from gds_counter.gateway.values import EPOCH, epoch_micros

__all__ = ["FUTURE", "TOO_OLD", "check_read_time", "epoch_seconds"]

#: The Firestore emulator's words for a time after now (INVALID_ARGUMENT).
FUTURE = "The requested 'read_time' cannot be in the future."
#: ... and for one older than it keeps versions for (FAILED_PRECONDITION).
TOO_OLD = "The requested 'read_time' is too old."


def epoch_seconds(read_time: _dt.datetime) -> float:
    """``read_time`` as seconds since the epoch (microseconds kept)."""
    return epoch_micros(read_time) / 1_000_000


def check_read_time(read_time: object, *, read_only: bool) -> _dt.datetime:
    """``read_time`` if a transaction may read at it: an aware ``datetime``
    after the epoch and not after now, in a read-only transaction (Datastore
    has no read-write transaction at a past time); else ``BadValueError``
    naming it. Its age is the storage's to judge."""
    if not isinstance(read_time, _dt.datetime) or read_time.tzinfo is None or read_time.utcoffset() is None:
        raise BadValueError(f"read_time must be an aware datetime (a time zone, e.g. UTC), got {read_time!r}")
    if not read_only:
        raise BadValueError(f"read_time={read_time.isoformat()} needs a read-only transaction (read_only=True)")
    if read_time <= EPOCH:
        raise BadValueError(f"Only timestamps past epoch are supported (read_time={read_time.isoformat()}).")
    if epoch_seconds(read_time) > time.time():
        raise BadValueError(f"{FUTURE} (read_time={read_time.isoformat()})")
    return read_time
