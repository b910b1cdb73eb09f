"""What this process does around ``fork()``, in one place.

A forked child holds a copy of its parent's memory but only the thread that
forked. Whatever the parent's other threads held at that moment (a lock, a
connection lent to a call, a round of combined writes they were leading) is
held by nobody in the child, for ever. So every object that keeps such
state registers here, and this module's one ``os.register_at_fork`` calls
its hooks, each optional:

* ``_before_fork()``: in the parent, just before the fork (a connection
  pool waits for the calls in progress and closes its connections);
* ``_after_fork_in_parent()``: in the parent, just after it;
* ``_after_fork_in_child()``: first thing in the child (fresh locks; forget
  what the parent's threads were doing).

Registration is weak: an object that is gone needs nothing. The registry's
lock is held from just before the fork to just after it, so no object is
added or dropped half way through.

Between forks, an object that must not be used across one (a pool's
connection, a lock that guards a queue) records ``here()`` when it is made
and asks ``owned_here(recorded)`` before it trusts its state: the one check
of "was this made by the process I am in". In a forked child the answer is
False, so the object starts afresh (or refuses) instead of using what a
parent's thread held. No other module asks the process id
(``tests/test_architecture.py`` checks it).
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from typing import Any, NewType

from gds_counter._process import interrupts

__all__ = ["Owner", "abandon", "began", "forget", "here", "owned_here", "register"]

#: The process an object was made in (or adopted by, after a fork): what
#: ``here()`` returned then. A process id, typed so that one is only ever
#: recorded through ``here()``.
Owner = NewType("Owner", int)

#: Held from just before a fork to just after it; re-entrant, so that a fork
#: made by a signal's handler on a thread that holds it (inside ``register``,
#: or inside another fork's hooks) does not wait for itself.
_LOCK = threading.RLock()
#: Every object with fork hooks (``register``), weakly.
_MEMBERS: "weakref.WeakSet[Any]" = weakref.WeakSet()
#: The objects of the fork in progress, held so none is collected half way.
_FORKING: list[Any] = []
#: When the fork in progress began (``time.monotonic()``), for the members
#: whose ``_before_fork`` waits: one bound for the whole fork, not one each.
_BEGAN: list[float] = []
#: Forks made by a signal's handler while this thread ran another fork's
#: hooks: theirs are skipped (each member also checks ``owned_here``, as
#: for a fork that ran no Python hooks), and the other fork's go on.
_NESTED: list[bool] = []


def here() -> Owner:
    """This process, to record in an object that must not cross a fork."""
    return Owner(os.getpid())


def owned_here(owner: Owner) -> bool:
    """Whether ``owner`` (``here()`` when it was recorded) is the process
    asking now: False in a child forked since."""
    return owner == os.getpid()


#: What a forked child found that its parent made and owns (SQLite
#: connections, gRPC clients): referenced for ever, so that the child never
#: closes one, even when what held it is collected.
_ABANDONED: list[Any] = []


def abandon(*things: Any) -> None:
    """Keep ``things``, made by the parent of this forked child, unused and
    unclosed for as long as the child lives: closing a SQLite connection
    would release the parent's locks, closing a gRPC channel could wait on
    a lock one of the parent's threads held at the fork."""
    _ABANDONED.extend(things)


def began() -> float:
    """When the fork in progress began (``time.monotonic()``; now, when
    asked outside a fork's hooks)."""
    return _BEGAN[0] if _BEGAN else time.monotonic()


def register(member: Any) -> None:
    """Call ``member``'s fork hooks (those it defines) at every fork of this
    process, for as long as ``member`` lives."""
    with _LOCK:
        _MEMBERS.add(member)


def forget(member: Any) -> None:
    """No more fork hooks for ``member`` (a pool closed for good)."""
    with _LOCK:
        _MEMBERS.discard(member)


#: What a ``_before_fork`` hook raised (an interrupt that cut a wait short),
#: for the parent to raise again once the fork is done.
_RAISED: list[BaseException] = []


def _call(hook: str) -> None:
    """Call ``hook`` of every member, each even if one before it raised
    (Python ignores what an at-fork hook raises, so a member skipped would
    miss its hook while the others had theirs); keep the first exception."""
    for member in _FORKING:
        method = getattr(member, hook, None)
        if method is not None:
            try:
                method()
            except BaseException as exc:  # noqa: B902  (kept: raised again in the parent, or dropped in the child)
                if not _RAISED:
                    _RAISED.append(exc)


def _before_fork() -> None:
    if _BEGAN and _LOCK._is_owned():  # type: ignore[attr-defined]  # (this thread is inside a fork's hooks)
        _NESTED.append(True)
        return
    _LOCK.acquire()
    _BEGAN[:] = [time.monotonic()]
    _FORKING[:] = list(_MEMBERS)
    _RAISED.clear()
    _call("_before_fork")


def _after_fork_in_parent() -> None:
    if _NESTED:
        _NESTED.pop()
        return
    try:
        _call("_after_fork_in_parent")
    finally:
        _FORKING.clear()
        _BEGAN.clear()
        raised = _RAISED[:1]
        _RAISED.clear()
        _LOCK.release()
    if raised:
        interrupts.raise_again_soon(raised[0])


def _after_fork_in_child() -> None:
    if _NESTED:  # (the child goes on with the other fork's hooks, and makes that fork itself)
        _NESTED.pop()
        return
    try:
        _call("_after_fork_in_child")
    finally:
        _FORKING.clear()
        _BEGAN.clear()
        _RAISED.clear()  # the parent's to raise
        _LOCK.release()  # the forking thread took it, and the child is that thread


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent, after_in_child=_after_fork_in_child)
