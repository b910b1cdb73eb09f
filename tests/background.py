"""Work in a background thread, for tests that must not block on it (a
writer a locking server makes wait, a call held inside a gate)."""

from __future__ import annotations

import threading
from typing import Any, Callable

__all__ = ["in_thread"]


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Start ``work`` in a daemon thread: the thread, and a list that gets
    what it returned or raised once it ends."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:  # reported by the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out
