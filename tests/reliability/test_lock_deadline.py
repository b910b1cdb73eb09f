"""A writer stuck behind another process's SQLite lock gives up at its deadline.

The embedded engine waits for the file's write lock up to its busy timeout
(30 s). A call with a 1 s retry deadline used to take those 30 s behind a
frozen lock holder, and ``gds-counter --timeout 2`` 30 s too: the promise
is that no call hangs past its deadline. Now the deadline reaches the wait
(``_process.deadlines``), and the call raises ``Contention`` (nothing
stored) soon after it. The lock is held by a second SQLite connection in
``BEGIN IMMEDIATE``, which is to SQLite what another process is.
"""

from __future__ import annotations

import asyncio
import io
import sqlite3
import time
from typing import Any, Iterator

import pytest

from gds_counter import CounterShardDS, RetryPolicy, aio
from gds_counter.cli import main
from gds_counter.errors import Contention

#: How far past its deadline a call may end: one poll of the lock, the
#: error's construction, a loaded machine. Far below the 30 s busy timeout.
SLACK_S = 4.0


@pytest.fixture
def url(tmp_path: Any) -> str:
    url = f"sqlite:///{tmp_path / 'locked.sqlite3'}"
    CounterShardDS("stuck", 1, gateway=url).add(1)  # the file and its tables exist
    return url


@pytest.fixture
def held(url: str) -> Iterator[None]:
    """Another writer holds the file's write lock, and does not let go."""
    holder = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def _stored(url: str) -> int:
    return CounterShardDS("stuck", 1, gateway=url).get_count()


def test_a_blocking_add_gives_up_at_its_retry_deadline(url: str, held: None) -> None:
    counter = CounterShardDS("stuck", 1, gateway=url, retry=RetryPolicy(deadline=1.0))
    started = time.monotonic()
    with pytest.raises(Contention, match="NOT counted; its deadline \\(1 s\\) ran out"):  # not "conflicted", not "add shards"
        counter.add(1)
    assert time.monotonic() - started < 1.0 + SLACK_S


def test_an_async_add_gives_up_at_its_retry_deadline(url: str, held: None) -> None:
    async def attempt() -> float:
        async with aio.open_gateway(url) as gateway:
            counter = aio.CounterShardDS("stuck", 1, gateway=gateway, retry=RetryPolicy(deadline=1.0))
            started = time.monotonic()
            with pytest.raises(Contention):
                await counter.add(1)
            return time.monotonic() - started

    assert asyncio.run(attempt()) < 1.0 + SLACK_S


def test_async_calls_queued_for_an_in_flight_slot_give_up_at_their_deadline(url: str, held: None) -> None:
    """More tasks than the loop's in-flight slots (32 on the embedded
    engine): the wait for a slot counts toward each call's deadline. (It
    did not: 100 tasks with a 0.5 s deadline ended at 0.5, 1.0, 1.5 and 2 s,
    four turns of 32.) Those that never got a slot raise ``Contention``
    too, and nothing of any was stored."""
    tasks = 100

    async def attempt() -> tuple[list[float], list[BaseException]]:
        async with aio.open_gateway(url) as gateway:
            assert gateway.max_in_flight * 2 < tasks
            counter = aio.CounterShardDS("stuck", 1, gateway=gateway, retry=RetryPolicy(deadline=0.5))

            async def one() -> tuple[float, BaseException | None]:
                started = time.monotonic()
                try:
                    await counter.add(1)
                except Contention as exc:
                    return time.monotonic() - started, exc
                return time.monotonic() - started, None

            out = await asyncio.gather(*(one() for _ in range(tasks)))
            return [took for took, _ in out], [exc for _, exc in out if exc is not None]

    took, errors = asyncio.run(attempt())
    assert len(errors) == tasks
    assert any("in flight" in str(exc) and "nothing of it was sent" in str(exc) for exc in errors)
    assert max(took) < 0.5 + SLACK_S / 4, sorted(took)[-5:]


def test_the_command_line_timeout_bounds_a_locked_file(url: str, held: None) -> None:
    out, err = io.StringIO(), io.StringIO()
    started = time.monotonic()
    code = main(["--url", url, "--timeout", "2", "increment", "stuck", "1"], out=out, err=err)
    assert time.monotonic() - started < 2.0 + SLACK_S
    assert code == 1 and "Contention" in err.getvalue() and "NOT counted" in err.getvalue()


def test_nothing_was_stored_by_the_calls_that_gave_up(url: str) -> None:
    """The same three calls, then the lock let go: the total is the one
    increment made before (every call that gave up said NOT counted)."""
    holder = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(Contention):
            CounterShardDS("stuck", 1, gateway=url, retry=RetryPolicy(deadline=0.5)).add(1)
        assert main(["--url", url, "--timeout", "1", "increment", "stuck", "1"], out=io.StringIO(), err=io.StringIO()) == 1
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert _stored(url) == 1


def test_nothing_was_stored_by_async_calls_that_gave_up_waiting_for_a_slot(url: str) -> None:
    holder = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")

    async def attempt() -> int:
        async with aio.open_gateway(url) as gateway:
            counter = aio.CounterShardDS("stuck", 1, gateway=gateway, retry=RetryPolicy(deadline=0.3))
            out = await asyncio.gather(*(counter.add(1) for _ in range(3 * gateway.max_in_flight)), return_exceptions=True)
            return sum(isinstance(x, Contention) for x in out)

    try:
        refused = asyncio.run(attempt())
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert refused > 0
    assert _stored(url) == 1
