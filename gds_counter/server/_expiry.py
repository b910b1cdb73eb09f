"""Transactions a client began and left: ended once idle, as Datastore ends them.

A client that crashes, or simply forgets, between BeginTransaction and its
Commit or Rollback leaves a transaction open for ever. On a file store
each open transaction holds a connection and its snapshot, and past the
pool's share for transactions a new one waits ``HOLD_WAIT_S`` for one
(``gateway.embedded._connections``): a few crashed clients would slow every
later transaction of every client. Firestore ends a transaction that has
been idle for 60 seconds; the server does the same, at the next request
that comes (so nothing runs while no one asks), and a later use of that
transaction is refused as any unknown transaction is (``TransactionLost``,
answered INVALID_ARGUMENT as the emulators do).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable, Iterator

__all__ = ["IDLE_S", "REMEMBERED", "OpenTransactions"]

log = logging.getLogger("gds_counter.server")

#: Seconds a transaction may stay unused before the server ends it.
IDLE_S = 60.0
#: Ended transactions remembered, so that rolling one back again is a
#: no-op while rolling back one never begun here is refused.
REMEMBERED = 10_000


class OpenTransactions:
    """The transactions begun through the server and not ended yet, each
    with when it was last used; ``expire()`` rolls back the idle ones."""

    def __init__(self, rollback: Callable[[bytes], None], idle: float = IDLE_S) -> None:
        self._rollback = rollback
        self.idle = idle
        self._lock = threading.Lock()
        self._last_used: dict[bytes, float] = {}
        self._ended: dict[bytes, None] = {}  # oldest first, at most REMEMBERED
        self._busy: dict[bytes, int] = {}  # requests under way in each transaction

    def __len__(self) -> int:
        return len(self._last_used)

    def began(self, token: bytes) -> None:
        with self._lock:
            self._last_used[token] = time.monotonic()

    @contextlib.contextmanager
    def in_use(self, token: bytes | None) -> Iterator[None]:
        """Around a request in transaction ``token`` (None: in none): it is
        not idle while the request runs, and its idle time starts anew
        when the request ends, however long the request took."""
        if token is None:
            yield
            return
        with self._lock:
            self._busy[token] = self._busy.get(token, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._busy.pop(token) - 1
                if left:
                    self._busy[token] = left
                if token in self._last_used:
                    self._last_used[token] = time.monotonic()

    def ended(self, token: bytes) -> None:
        with self._lock:
            self._forget(token)

    def is_open(self, token: bytes) -> bool:
        """Whether ``token`` was begun here and has not ended (nor expired)."""
        with self._lock:
            return token in self._last_used

    def known(self, token: bytes) -> bool:
        """Whether ``token`` was begun here (open, or ended not long ago)."""
        with self._lock:
            return token in self._last_used or token in self._ended

    def _forget(self, token: bytes) -> None:
        if self._last_used.pop(token, None) is not None:
            self._ended[token] = None
            while len(self._ended) > REMEMBERED:
                del self._ended[next(iter(self._ended))]

    def expire(self) -> None:
        """Roll back every transaction idle for longer than ``idle``."""
        cutoff = time.monotonic() - self.idle
        with self._lock:
            idle = [token for token, last in self._last_used.items() if last < cutoff and token not in self._busy]
            for token in idle:
                self._forget(token)
        for token in idle:
            try:
                self._rollback(token)
            except Exception:  # noqa: BLE001 - already ended by its client, or the store is closing
                log.debug("ending an idle transaction failed", exc_info=True)
        if idle:
            log.info("ended %d transaction(s) idle for more than %g s", len(idle), self.idle)
