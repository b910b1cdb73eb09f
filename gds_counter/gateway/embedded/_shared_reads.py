"""Identical reads that arrive together, answered by one read.

Sixteen threads incrementing one counter each read its total right after
their own commit: sixteen runs of the same query over the same rows, each
paying for SQLite's steps, the decoding and the GIL handed back and forth
between them. Here they queue instead: while one read of a query runs,
every caller that arrives for the same query joins the *next* read, which
starts when the running one ends and answers all of them.

That keeps reads strongly consistent: a caller is only ever answered by a
read that began after the caller arrived, so it sees every commit that was
acknowledged before its call (its own included), exactly as if it had run
the query itself at that moment. A read that fails answers only its own
caller; the callers that joined it run the query themselves.

One ``SharedReads`` per gateway; reads in a transaction never go through it
(they read their own snapshot).
"""

from __future__ import annotations

import os
import threading
from typing import Callable, Generic, TypeVar

R = TypeVar("R")

__all__ = ["SharedReads"]


class _Round(Generic[R]):
    """The next read of one query: who joined it, and its answer."""

    __slots__ = ("turn", "done", "result", "failed")

    def __init__(self) -> None:
        self.turn = threading.Event()  # set when the read before it ended: run now
        self.done = threading.Event()  # set when its answer (or failure) is known
        self.result: R | None = None
        self.failed = False


class _Line(Generic[R]):
    """One query's reads: whether one runs, and the round waiting behind it."""

    __slots__ = ("next",)

    def __init__(self) -> None:
        self.next: _Round[R] | None = None


class SharedReads(Generic[R]):
    """See the module docstring. Safe across ``fork()``: a child starts with
    no reads in flight (the threads running them are not there)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._lines: dict[str, _Line[R]] = {}

    def run(self, key: str, read: Callable[[], R]) -> tuple[R, bool]:
        """``read()``'s answer for ``key``, or the answer of a read of the
        same key that began after this call did; and whether it was another
        caller's (then the caller must not hand out the same mutable objects
        twice)."""
        if self._pid != os.getpid():
            self._reset()
        with self._lock:
            line = self._lines.get(key)
            if line is None:
                line = self._lines[key] = _Line()
                mine: _Round[R] | None = None  # nothing runs: read at once
                leads = True
            else:
                mine = line.next
                leads = mine is None
                if mine is None:
                    mine = line.next = _Round()  # run it when the running read ends
        if mine is not None and not leads:
            mine.done.wait()
            if mine.failed:
                return read(), False  # its failure was its own: try once more alone
            return mine.result, True  # type: ignore[return-value]  # set with done
        if mine is not None:
            try:
                mine.turn.wait()
            except BaseException:  # interrupted before its turn: its callers read alone
                mine.failed = True
                mine.done.set()
                raise
        try:
            result = read()
        except BaseException:
            self._finish(key, line, mine, None, failed=True)
            raise
        self._finish(key, line, mine, result, failed=False)
        return result, False

    def _finish(self, key: str, line: _Line[R], mine: _Round[R] | None, result: R | None, *, failed: bool) -> None:
        """Answer the callers that joined this read, then let the next round run."""
        if mine is not None:
            mine.result, mine.failed = result, failed
            mine.done.set()
        with self._lock:
            following = line.next
            if following is None or following.done.is_set():  # none, or abandoned (see run)
                del self._lines[key]
            else:
                line.next = None  # closed: callers arriving from now on wait for the read after it
                following.turn.set()
