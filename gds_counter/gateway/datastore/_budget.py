"""One logical request under the retry policy and one deadline: the part of
sending that every Google gateway shares, blocking or awaited.

``CallBudget`` is mixed into the Datastore gateways (``_requests``) and the
Firestore ones (``gateway.firestore``): a call may take ``timeout``
seconds, retries included, or less when the deadline of the gateway's
calls (``set_deadline``) comes first; the retry policy's predicate is its
row of the policy table (``_retry.should_retry``); every attempt's error is
kept, so the final one is translated knowing what came before (a commit
resent after an unknown attempt stays unknown). ``_call_rpc`` sends blocking,
``_acall_rpc`` awaits; the transports give each the RPC to make (``invoke``,
called with the seconds the attempt may take) and how to word its final
error (``final``).
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Awaitable, Callable, Protocol, TypeVar

from google.api_core import exceptions as gexc

from gds_counter.errors import GDSError, Unavailable
from gds_counter.gateway.datastore._retry import error_message, should_retry

__all__ = ["CallBudget", "FinalError"]

R = TypeVar("R")



class FinalError(Protocol):
    """How the final error of a call is made: ``final(exc, failures,
    rule=rule)``, with every attempt's error and the row of the policy table
    that applied."""

    def __call__(self, exc: BaseException, failures: list[BaseException], *, rule: str) -> GDSError: ...


class CallBudget:
    """The deadline and the retries of a gateway's calls (module docstring)."""

    timeout: float
    #: A ``time.monotonic()`` instant that bounds every call on top of its
    #: ``timeout`` (``set_deadline``); None: each call has its whole ``timeout``.
    deadline: float | None
    _retry: Any
    _retries: dict[tuple[str, bool], Any]
    #: Where retries are logged (each gateway package's own logger).
    _log: logging.Logger
    stats: Any

    def _set_budget(self, timeout: float, retry: Any) -> None:
        self.timeout = float(timeout)
        self.deadline = None
        self._retry = retry.with_timeout(self.timeout) if retry is not None else None
        self._retries = {}

    def set_deadline(self, at: float | None) -> None:
        """Bound every later call, its retries included, by the instant ``at``
        (a ``time.monotonic()`` value) as well as by its own ``timeout``.

        Why: ``timeout`` bounds one call, but one operation makes several (the
        capability probe, reads, a commit, and the counter's retries of a
        server that stays down), so a caller with one deadline for the whole
        operation, such as the ``gds-counter`` command's ``--timeout``, gives
        each call only the time left. A call made once ``at`` has passed is
        not sent and raises ``Unavailable``: true of a commit too, as nothing
        of it reached the server. None lifts the bound.
        """
        self.deadline = at

    def _budget(self, call: str) -> float:
        """Seconds ``call`` may take, retries included: ``timeout``, or less
        when ``deadline`` comes first. Raises ``Unavailable`` (nothing sent)
        when the deadline has passed."""
        if self.deadline is None:
            return self.timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise Unavailable(
                f"{call}: not sent to {self!r}: the deadline set for its calls passed {-left:.1f} s ago, "
                "so nothing of it was written"
            )
        return min(self.timeout, left)

    def _retry_for(self, rule: str, idempotent_commit: bool, budget: float) -> Any:
        """The retry policy with the predicate of ``rule``'s row of the
        policy table (``should_retry``), made once per row: building one
        per call cost more than a request's own encoding. Bounded by
        ``budget`` seconds: the call's ``timeout``, or less when the deadline
        is near (a ``timeout`` changed after construction counts too). None:
        no retries."""
        if self._retry is None:
            return None
        found = self._retries.get((rule, idempotent_commit))
        if found is None:
            found = self._retries[(rule, idempotent_commit)] = self._retry.with_predicate(
                functools.partial(should_retry, call=rule, idempotent_commit=idempotent_commit)
            )
        return found if budget == found.timeout else found.with_timeout(budget)

    def _on_retry(self, call: str) -> Callable[[BaseException], None]:
        """What each transport does before a retry: count it and say why."""

        def on_error(exc: BaseException) -> None:
            self.stats.bump(f"retry.{call}")
            self._log.info("retrying %s after %s: %s", call, type(exc).__name__, error_message(exc))

        return on_error

    def _call_rpc(
        self, call: str, invoke: Callable[[float], R], final: FinalError, *, idempotent_commit: bool = False,
        policy: str = "",
    ) -> R:
        """``invoke(seconds)`` (one attempt of the RPC ``call``) under the
        policy's row for ``policy or call`` and one overall deadline;
        ``final`` words the error it ends in."""
        rule = policy or call
        budget = self._budget(call)
        deadline = time.monotonic() + budget
        failures: list[BaseException] = []

        def attempt() -> R:
            try:
                return invoke(max(0.05, deadline - time.monotonic()))
            except gexc.GoogleAPICallError as exc:
                failures.append(exc)
                raise

        try:
            retry = self._retry_for(rule, idempotent_commit, budget)
            return attempt() if retry is None else retry(attempt, on_error=self._on_retry(call))()
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            raise final(exc, failures, rule=rule) from exc

    async def _acall_rpc(
        self, call: str, invoke: Callable[[float], Awaitable[R]], final: FinalError, *,
        idempotent_commit: bool = False, policy: str = "",
    ) -> R:
        """``_call_rpc``, awaited (google-api-core's ``AsyncRetry``)."""
        rule = policy or call
        budget = self._budget(call)
        deadline = time.monotonic() + budget
        failures: list[BaseException] = []

        async def attempt() -> R:
            try:
                return await invoke(max(0.05, deadline - time.monotonic()))
            except gexc.GoogleAPICallError as exc:
                failures.append(exc)
                raise

        try:
            retry = self._retry_for(rule, idempotent_commit, budget)
            return await (attempt() if retry is None else retry(attempt, on_error=self._on_retry(call))())
        except (gexc.GoogleAPICallError, gexc.RetryError) as exc:
            raise final(exc, failures, rule=rule) from exc
