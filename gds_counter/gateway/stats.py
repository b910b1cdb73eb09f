"""Cost accounting: RPCs and entity reads/writes, because Datastore bills by them."""

from __future__ import annotations

import threading
from collections import Counter as _Counter

__all__ = ["Stats"]

class Stats:
    """Counts RPCs and entity reads/writes, because Datastore bills by them.

    Thread-safe. Benchmarks and the workshop print it; tests use it to prove
    costs ("get_count is one RPC").
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: _Counter[str] = _Counter()

    def _after_fork_in_child(self) -> None:
        """A thread of the parent may have held the lock at the fork (its
        gateway renews it: ``GatewayRules``)."""
        self._lock = threading.Lock()

    def record(self, rpc: str, *, reads: int = 0, writes: int = 0, deletes: int = 0) -> None:
        with self._lock:
            self._counts["rpcs"] += 1
            self._counts[f"rpc.{rpc}"] += 1
            self._counts["entity_reads"] += reads
            self._counts["entity_writes"] += writes
            self._counts["entity_deletes"] += deletes

    def bump(self, name: str, by: int = 1) -> None:
        """Count an event that is not an RPC (aborts, retries, fallbacks)."""
        with self._lock:
            self._counts[name] += by

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            base = {"rpcs": 0, "entity_reads": 0, "entity_writes": 0, "entity_deletes": 0}
            base.update(self._counts)
            return base

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def __repr__(self) -> str:
        return f"Stats({self.snapshot()})"

