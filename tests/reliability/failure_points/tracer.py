"""Reaching a named point of the product's code without changing the product.

A ``Point`` names a place declaratively: a module, a function (its
attribute path in the module, such as ``CombinedWrites.run``) and *where* in it:
``"call"`` (as the function is entered), ``"return"`` (as it returns or
raises out) or a regular expression matched against the source line about to
run (``"line:mine\\.done\\.wait\\(\\)"``). ``Trap`` arms one point with one
action: through ``sys.settrace`` and ``threading.settrace`` every thread
started afterwards (and the threads that call ``Trap.install_here``) is
traced, and the action runs, once, in whichever traced thread reaches the
point for the ``nth`` time. A trace function may raise (the exception
appears in the traced frame, exactly at that line), sleep, fork or kill the
process, which is how the faults are made.

Why a tracer and not patches: a patch replaces a whole function and tests
the patch; the tracer stops the real code at the real line. And why the
point must be *reached*: a refactor that moves or renames code must make
these tests fail loudly (``Trap.hits == 0``), never silently test nothing.
"""

from __future__ import annotations

import linecache
import re
import sys
import threading
from dataclasses import dataclass, field
from types import CodeType, FrameType
from typing import Any, Callable, Optional

__all__ = ["Point", "Trap", "resolve"]

TraceFunction = Callable[[FrameType, str, Any], Optional["TraceFunction"]]


@dataclass(frozen=True)
class Point:
    """One place where a mechanism blocks or hands work over."""

    #: A short stable name, ``mechanism.what`` (the results are keyed by it).
    name: str
    #: The product module, dotted (``gds_counter.counter._combined``).
    module: str
    #: The function's qualified name in that module (``CombinedWrites.run``).
    function: str
    #: ``"call"``, ``"return"`` or ``"line:<regex>"`` (see the module docstring).
    where: str
    #: Why the point matters: what blocks or is handed over there.
    why: str = ""
    #: Which faces reach it: ``"threads"``, ``"aio"`` (the scenario drivers).
    faces: tuple[str, ...] = ("threads",)
    #: Which storage reaches it: ``"memory"``, ``"sqlite"``.
    backends: tuple[str, ...] = ("memory", "sqlite")
    #: Callers at once in its scenarios: a point reached only when many
    #: overlap (a leader waiting for its turn) needs more.
    crowd: int = 4
    #: Forks go on beside its callers (another thread forks again and
    #: again): for a point reached only while a fork is pending.
    forks_beside: bool = False
    #: Its ``fork`` fault is made by the thread at the point itself, as a
    #: signal's handler would fork inside the call it interrupts (not by
    #: another thread while this one waits there); the child goes on with
    #: that call.
    fork_here: bool = False
    #: Which counter its scenarios run: ``"article"`` (``CounterShardDS``,
    #: the PHP article's entities) or ``"documents"`` (``DistributedCounter``,
    #: Firestore's page's documents).
    layout: str = "article"


@dataclass
class _Resolved:
    code: CodeType
    event: str  # "call", "return" or "line"
    lines: frozenset[int] = field(default_factory=frozenset)


def resolve(point: Point) -> _Resolved:
    """Where ``point`` is in today's source: the file, and for a line point
    every line of the function that matches. A point that names a function
    or a line that does not exist raises ``LookupError`` at once."""
    module = __import__(point.module, fromlist=["_"])
    target: Any = module
    for part in point.function.split("."):
        target = getattr(target, part)
    target = getattr(target, "__func__", target)  # a static or class method
    target = getattr(target, "__wrapped__", target)  # a contextlib.contextmanager
    code: CodeType = target.__code__
    filename = code.co_filename
    if point.where in ("call", "return"):
        return _Resolved(code, point.where)
    kind, _, pattern = point.where.partition(":")
    if kind != "line" or not pattern:
        raise LookupError(f"{point.name}: where must be 'call', 'return' or 'line:<regex>', got {point.where!r}")
    matcher = re.compile(pattern)
    numbers = {number for _, _, number in code.co_lines() if number is not None}
    lines = frozenset(n for n in numbers if matcher.search(linecache.getline(filename, n)))
    if not lines:
        raise LookupError(f"{point.name}: no line of {point.module}.{point.function} matches {pattern!r}")
    return _Resolved(code, "line", lines)


class Trap:
    """``action(frame)`` runs once, in the thread that reaches ``point`` for
    the ``nth`` time (an action that returns False did not apply there, and
    waits for the next time). ``hits`` counts every time it was reached (before and
    after firing), ``fired`` says whether the action ran."""

    def __init__(self, point: Point, action: Callable[[FrameType], Optional[bool]], nth: int = 1) -> None:
        self.point = point
        self.where = resolve(point)
        self.action = action
        self.nth = nth
        self.hits = 0
        self.fired = False
        self.fired_in: str | None = None
        self._lock = threading.Lock()

    # -- tracing -------------------------------------------------------------

    def _global(self, frame: FrameType, event: str, arg: Any) -> TraceFunction | None:
        if frame.f_code is not self.where.code:
            return None
        if self.where.event == "call":
            self._reached(frame)
            return None
        return self._local

    def _local(self, frame: FrameType, event: str, arg: Any) -> TraceFunction | None:
        if self.where.event == "line" and event == "line" and frame.f_lineno in self.where.lines:
            self._reached(frame)
        elif self.where.event == "return" and event == "return":
            self._reached(frame)
        return self._local

    def _reached(self, frame: FrameType) -> None:
        with self._lock:
            self.hits += 1
            fire = not self.fired and self.hits >= self.nth
            if fire:
                self.fired = True
                self.fired_in = threading.current_thread().name
        if fire and self.action(frame) is False:  # the action may raise into the traced frame
            with self._lock:
                self.fired = False  # not a place it applies to (no call of the scenario runs here): later

    # -- installing ------------------------------------------------------------

    def install(self) -> None:
        """Trace every thread started from now on, and this one."""
        threading.settrace(self._global)
        sys.settrace(self._global)

    def install_here(self) -> None:
        """Trace the calling thread (one started before ``install``)."""
        sys.settrace(self._global)

    def uninstall(self) -> None:
        threading.settrace(None)
        sys.settrace(None)
