"""Retrying work that loses a transaction race.

Conflicts are normal under load: the right response is to wait a random,
growing time and try again, then give up loudly. The waits come from
google-api-core's truncated exponential backoff with full jitter, so many
writers that collided once do not collide again in lockstep.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, TypeVar

import attrs
from google.api_core.retry import exponential_sleep_generator

from gds_counter.errors import Contention

log = logging.getLogger(__name__)

T = TypeVar("T")


@attrs.frozen
class RetryPolicy:
    """How hard to try before raising ``Contention``."""

    attempts: int = attrs.field(default=6, validator=attrs.validators.ge(1))
    initial: float = 0.02
    maximum: float = 1.0
    multiplier: float = 2.0


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
    """Run ``work`` until it does not raise ``Contention`` or attempts run out.

    ``work`` must be safe to repeat: each attempt starts a fresh transaction
    (and, for counters, picks a fresh shard). ``on_retry(attempt)`` is called
    before each wait, for stats. The final ``Contention`` names ``what`` and
    carries the number of attempts. ``also_retry`` names more errors that
    are retried the same way (within the same attempts); the last one is
    re-raised as it is when attempts run out.
    """
    delays = exponential_sleep_generator(policy.initial, policy.maximum, policy.multiplier)
    for attempt in range(1, policy.attempts + 1):
        try:
            return work()
        except also_retry as exc:
            if attempt == policy.attempts:
                raise
            if on_retry is not None:
                on_retry(attempt)
            delay = next(delays)
            log.debug("%s failed (attempt %d: %s), retrying in %.3fs", what, attempt, exc, delay)
            sleep(delay)
        except Contention as exc:
            if attempt == policy.attempts:
                raise Contention(
                    f"{what} still conflicted after {attempt} attempts: {exc}", attempts=attempt
                ) from exc
            if on_retry is not None:
                on_retry(attempt)
            delay = next(delays)
            log.debug("%s conflicted (attempt %d), retrying in %.3fs", what, attempt, delay)
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
