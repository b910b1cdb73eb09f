"""Reads that time out on Cloud Datastore are ``Unavailable``, so they are retried.

A lookup, query, begin, rollback or id allocation whose deadline passed
(DEADLINE_EXCEEDED, after the gateway's own retries ran out) applied nothing
that needs undoing. The gateway therefore raises ``Unavailable`` for it,
which the counter retries on a fresh shard, instead of a plain
``GatewayError``, which it would raise to the caller. A commit that timed
out keeps its ``CommitUnknown`` (it may have been applied): never retried.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.api_core.retry import Retry

from gds_counter.counter import CounterShardDS
from gds_counter.errors import CommitUnknown, GatewayError, Unavailable
from gds_counter.gateway.datastore import DatastoreGateway
from gds_counter.gateway.datastore._retry import translate_error
from gds_counter.gateway.keys import Key
from gds_counter.gds import RetryPolicy
from gds_counter.testing.faults import DEADLINE_EXCEEDED, inject_rpc_faults, remove_rpc_faults

READS = ["lookup", "run_query", "begin_transaction", "rollback", "allocate_ids"]
#: Patient and fast: many attempts, millisecond waits.
PATIENT = RetryPolicy(attempts=12, initial=0.001, maximum=0.01)


@pytest.mark.parametrize("call", READS)
@pytest.mark.parametrize("exc", [
    gexc.DeadlineExceeded("Deadline Exceeded"),
    gexc.RetryError("Timeout of 5.0s exceeded", None),
    gexc.RetryError("Timeout of 5.0s exceeded", gexc.DeadlineExceeded("Deadline Exceeded")),
])
def test_a_read_that_timed_out_is_unavailable(call: str, exc: Exception) -> None:
    mapped = translate_error(exc, call=call)
    assert type(mapped) is Unavailable
    assert call in str(mapped) and "in time" in str(mapped)


@pytest.mark.parametrize("exc", [
    gexc.DeadlineExceeded("Deadline Exceeded"),
    gexc.RetryError("Timeout of 5.0s exceeded", gexc.DeadlineExceeded("Deadline Exceeded")),
])
def test_a_commit_that_timed_out_stays_unknown(exc: Exception) -> None:
    assert type(translate_error(exc, call="commit")) is CommitUnknown


def test_other_read_failures_keep_their_errors() -> None:
    assert type(translate_error(gexc.InternalServerError("oops"), call="lookup")) is GatewayError
    assert type(translate_error(gexc.PermissionDenied("no"), call="run_query")) is GatewayError


class SlowRpc:
    """A GAPIC method that never answers in time."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *, request: Any, retry: Any, timeout: float) -> Any:
        assert retry is None and timeout > 0
        self.calls += 1
        raise gexc.DeadlineExceeded("Deadline Exceeded")


@pytest.fixture
def offline_gw() -> Any:
    # Port 9 (discard) is never dialled: every RPC is the fake's.
    gw = DatastoreGateway("p", emulator_host="127.0.0.1:9", timeout=0.5, retry=Retry(initial=0.01, maximum=0.02))
    yield gw
    gw.close()


def test_a_read_out_of_retries_on_timeouts_raises_unavailable(offline_gw: DatastoreGateway) -> None:
    rpc = SlowRpc()
    with pytest.raises(Unavailable, match="lookup"):
        offline_gw._call("lookup", rpc, object())
    assert rpc.calls >= 2 and offline_gw.stats["retry.lookup"] >= 1  # retried, then out of time
    rpc = SlowRpc()
    with pytest.raises(CommitUnknown):
        offline_gw._call("commit", rpc, object(), idempotent_commit=False)
    assert rpc.calls == 1  # an increment of unknown outcome is never resent


@pytest.mark.emulator
def test_the_counter_retries_reads_that_timed_out(datastore_emulator: Any, tally: Any) -> None:
    """The Datastore emulator's counter is transactional (begin, lookup,
    commit). With the gateway's own retries off, every injected
    DEADLINE_EXCEEDED on a lookup or begin is final: each must come back as
    Unavailable, be retried by the counter, and every add must count once."""
    gateway = datastore_emulator.gateway(namespace=f"rel-{uuid.uuid4().hex}", retry=None, timeout=10.0)
    try:
        gateway.capabilities  # the one-off probe, before the faults
        injector = inject_rpc_faults(
            gateway, {"lookup": {DEADLINE_EXCEEDED: 0.3}, "begin_transaction": {DEADLINE_EXCEEDED: 0.1}}, seed=8
        )
        counter = CounterShardDS("timeouts", uuid.uuid4().hex[:12], gateway=gateway, strategy="transactional", retry=PATIENT)
        n = 60
        failed: list[str] = []
        for _ in range(n):
            try:
                counter.add(1)
            except GatewayError as exc:  # anything but Unavailable/Contention ends the add
                failed.append(f"{type(exc).__name__}: {exc}")
        with injector.paused():
            total = counter.get_count()
        area = "read timeouts (RPC level, Datastore emulator)"
        tally.add_faults(area, injector.counts())
        tally.add(area, operations=n, increments_lost=max(0, n - len(failed) - total),
                  double_counts=max(0, total - (n - len(failed))))
        assert injector.total >= 10
        assert failed == []
        assert total == n
        assert gateway.stats["counter.retries"] >= injector.total
    finally:
        remove_rpc_faults(gateway)
        gateway.close()


@pytest.mark.emulator
def test_a_lookup_that_keeps_timing_out_is_unavailable(datastore_emulator: Any) -> None:
    gateway = datastore_emulator.gateway(
        namespace=f"rel-{uuid.uuid4().hex}", retry=Retry(initial=0.01, maximum=0.05), timeout=1.0
    )
    try:
        injector = inject_rpc_faults(gateway, {"lookup": {DEADLINE_EXCEEDED: 1.0}})
        with pytest.raises(Unavailable, match="lookup"):
            gateway.lookup([Key.of("K", 1)])
        assert gateway.stats["retry.lookup"] >= 1  # the gateway's own retries ran out first
        assert injector.counts()[DEADLINE_EXCEEDED] >= 2
    finally:
        remove_rpc_faults(gateway)
        gateway.close()
