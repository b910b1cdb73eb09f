"""The connection pool's per-thread state is made in one place.

A pool keeps state that belongs to the threads of the process it is in:
its locks, what is lent, held or being opened, whether a fork is pending,
and a thread-local flag. A forked child has only the thread that forked,
so that state must be made afresh there exactly as when the pool is built.
It used to be written out twice, in ``ConnectionPool.__init__`` and in
``_after_fork_in_child``: a field added to one and forgotten in the other
would carry a parent's lock or lent connections into the child. Now both
call ``_fresh_thread_state``, and neither sets one of its fields itself.
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
from typing import Callable

import pytest

from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.embedded._connection_life import ConnectionLife
from gds_counter.gateway.embedded._connections import ConnectionPool


def _tree(function: Callable[..., object]) -> ast.AST:
    return ast.parse(textwrap.dedent(inspect.getsource(function)))


def _assigned(function: Callable[..., object], *, before: int | None = None) -> set[str]:
    """The attributes of ``self`` that ``function`` assigns (on source lines
    before ``before``, when given)."""
    names = set()
    for node in ast.walk(_tree(function)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            targets = [node.target]
        for target in targets:
            parts = target.elts if isinstance(target, ast.Tuple) else [target]
            for part in parts:
                if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and part.value.id == "self":
                    if before is None or part.lineno < before:
                        names.add(part.attr)
    return names


def _fresh_state_call(function: Callable[..., object]) -> int | None:
    """The line where ``function`` calls ``self._fresh_thread_state()``."""
    for node in ast.walk(_tree(function)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "_fresh_thread_state":
            return node.lineno
    return None


@pytest.mark.parametrize("function", [ConnectionPool.__init__, ConnectionLife._after_fork_in_child],
                         ids=["built", "forked child"])
def test_the_thread_state_is_made_by_one_helper(function: Callable[..., object]) -> None:
    """Both call the helper; neither sets one of its fields before that
    (``__init__`` then uses them: it reserves its first connection's
    opening), and the child none at all."""
    fresh = _assigned(ConnectionLife._fresh_thread_state)
    assert {"_lock", "_cond", "write_lock", "_lent", "_held", "_calling", "_no_fork_pending"} <= fresh
    line = _fresh_state_call(function)
    assert line is not None, f"{function.__qualname__} does not call _fresh_thread_state"
    before = line if function is ConnectionPool.__init__ else None
    again = sorted(_assigned(function, before=before) & fresh)
    assert not again, f"{function.__qualname__} sets {again} itself: set them in _fresh_thread_state only"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_has_the_thread_state_of_a_new_pool(tmp_path: object) -> None:
    """In the child, every field the helper makes is what a new pool has:
    no lock owned, nothing lent or held, nothing being opened, no fork
    pending (so a call there does not wait at the fork gate)."""
    gateway = EmbeddedGateway(os.path.join(str(tmp_path), "fresh.sqlite3"))
    try:
        pool = gateway._pool
        with pool.connection():  # the parent's connections are closed at the fork: open one
            pass
        pid = os.fork()
        if pid == 0:  # pragma: no cover  (the child)
            code = 1
            try:
                fine = (
                    pool._lent == {} and pool._held == {} and pool._opening == pool._waiting == pool._reclaimed == 0
                    and not pool._forking and not pool._fork_inside and pool._fork_trouble is None
                    and pool._no_fork_pending.is_set() and not pool._lock._is_owned()
                    and not getattr(pool._calling, "opening", False)
                )
                code = 0 if fine else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, "the child's pool did not start fresh"
    finally:
        gateway.close()
