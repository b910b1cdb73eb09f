"""Retrying work that loses a transaction race.

Conflicts are normal under load: the right response is to wait a random,
growing time and try again, then give up loudly. The waits come from
google-api-core's truncated exponential backoff with full jitter, so many
writers that collided once do not collide again in lockstep.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Callable, Iterator, TypeVar

import attrs
from google.api_core.retry import exponential_sleep_generator

from gds_counter._checks import check_int
from gds_counter._process import deadlines
from gds_counter.errors import BadValueError, Contention
from gds_counter.gateway import plan

log = logging.getLogger(__name__)

T = TypeVar("T")

#: What every retry loop retries (``also_retry`` adds to it).
_CONTENTION: tuple[type[BaseException], ...] = (Contention,)


@attrs.frozen
class RetryPolicy:
    """How hard to try before raising ``Contention``.

    ``deadline``: seconds after the first attempt began past which no new
    attempt starts (None: only ``attempts`` limits it). A call therefore
    returns or raises within the deadline plus one attempt's own timeout,
    even while another writer holds a lock for minutes.
    """

    attempts: int = 6
    initial: float = 0.02
    maximum: float = 1.0
    multiplier: float = 2.0
    deadline: float | None = 30.0

    def __attrs_post_init__(self) -> None:
        """Every field checked when the policy is built (``BadValueError``
        naming it), not when a retry first needs it."""
        check_int(self.attempts, "RetryPolicy.attempts", low=1, high=None)
        for name in ("initial", "maximum", "multiplier", "deadline"):
            value = getattr(self, name)
            if name == "deadline" and value is None:
                continue
            if not _positive_number(value) or (name == "multiplier" and value < 1):
                least = "at least 1" if name == "multiplier" else "a positive number"
                raise BadValueError(f"RetryPolicy.{name} must be {least} (seconds), got {value!r}")
        if self.maximum < self.initial:
            raise BadValueError(f"RetryPolicy.maximum ({self.maximum!r}) must not be below initial ({self.initial!r})")


def _positive_number(value: object) -> bool:
    return (
        isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


DEFAULT_RETRY = RetryPolicy()


def retry_contention(
    work: Callable[[], T],
    policy: RetryPolicy = DEFAULT_RETRY,
    *,
    what: str = "transaction",
    on_retry: Callable[[int], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    also_retry: tuple[type[BaseException], ...] = (),
) -> T:
    """Run ``work`` until it does not raise ``Contention`` or attempts run out
    (``retry_plan`` with a blocking ``work``; see there)."""
    return plan.run(
        retry_plan(lambda: plan.call(work), policy, what=what, on_retry=on_retry, also_retry=also_retry),
        None,
        wait=sleep,
    )


def retry_plan(
    attempt: Callable[[], plan.Plan[T]],
    policy: RetryPolicy = DEFAULT_RETRY,
    *,
    what: str = "transaction",
    on_retry: Callable[[int], None] | None = None,
    also_retry: tuple[type[BaseException], ...] = (),
) -> plan.Plan[T]:
    """Run the plan ``attempt()`` makes until it does not raise ``Contention``
    or attempts run out: the one retry rule of the blocking and async APIs.

    Each attempt must be safe to repeat: it starts a fresh transaction
    (and, for counters, picks a fresh shard). ``on_retry(attempt)`` is called
    before each wait, for stats. The final ``Contention`` names ``what`` and
    carries the number of attempts. ``also_retry`` names more errors that
    are retried the same way (within the same attempts); the last one is
    re-raised as it is when attempts run out.
    """
    # Nothing here is built for a retry until one is needed: the backoff's
    # delays are drawn from the first failure on (a lone call that succeeds
    # at once, the common case, pays for none of it).
    delays: Iterator[float] | None = None
    retried: tuple[type[BaseException], ...] = (Contention, *also_retry) if also_retry else _CONTENTION
    started = time.monotonic()
    for number in range(1, policy.attempts + 1):
        # Storage waits inside the attempt (another process's lock) end at
        # the deadline too, not at their own bound (``_process.deadlines``).
        bounded = deadlines.limit(started + policy.deadline) if policy.deadline is not None else None
        try:
            result: T = yield from attempt()
            return result
        except retried as exc:
            if delays is None:
                delays = exponential_sleep_generator(policy.initial, policy.maximum, policy.multiplier)
            delay = next(delays)
            out_of_time = (
                policy.deadline is not None and time.monotonic() - started + delay > policy.deadline
            ) or deadlines.remaining(delay) < delay  # (the whole call's deadline, set by its caller, comes first)
            if number < policy.attempts and not out_of_time:
                if on_retry is not None:
                    on_retry(number)
                log.debug("%s failed (attempt %d: %s), retrying in %.3fs", what, number, exc, delay)
                yield from plan.sleep(delay)
                continue
            if not isinstance(exc, Contention):
                raise
            why = f"its {policy.deadline:g} s deadline passed" if out_of_time else "attempts ran out"
            # Its own class: a TransactionLost stays one (nothing applied either way).
            raise type(exc)(
                f"{what} still conflicted after {number} attempts in {time.monotonic() - started:.1f} s "
                f"({why}): {exc}",
                attempts=number,
            ) from exc
        finally:
            if bounded is not None:
                deadlines.restore(bounded)
    raise AssertionError("unreachable")  # pragma: no cover
