"""The async Datastore transport follows the blocking one's retry table and
error rules exactly: for any sequence of server errors, both retry the same
calls the same number of times and end in the same result or the same
gds_counter error (``CommitUnknown`` for a commit that may have been
applied, never a blind resend). Generated cases, compared side by side."""

from __future__ import annotations

import asyncio
from typing import Any

from google.api_core import exceptions as gexc
from google.api_core.retry import AsyncRetry, Retry
from hypothesis import given, settings
from hypothesis import strategies as st

from gds_counter.gateway.datastore import DatastoreGateway
from gds_counter.gateway.datastore._async_gateway import AsyncDatastoreGateway

ERRORS = {
    "unavailable": lambda: gexc.ServiceUnavailable("connection reset"),
    "never sent": lambda: gexc.ServiceUnavailable("failed to connect to all addresses"),
    "deadline": lambda: gexc.DeadlineExceeded("slow"),
    "internal": lambda: gexc.InternalServerError("boom"),
    "quota": lambda: gexc.ResourceExhausted("quota"),
    "aborted": lambda: gexc.Aborted("too much contention on these datastore entities"),
    "invalid": lambda: gexc.InvalidArgument("bad"),
    "unknown": lambda: gexc.Unknown("?"),
}
FAST = {"initial": 0.001, "maximum": 0.002, "multiplier": 2.0, "timeout": 5.0}


def blocking_outcome(call: str, errors: list[str], idempotent: bool) -> tuple[Any, ...]:
    gateway = DatastoreGateway("p", emulator_host="127.0.0.1:9", retry=Retry(**FAST))
    queue = list(errors)

    def rpc(*, request: Any, retry: Any, timeout: float) -> str:
        if queue:
            raise ERRORS[queue.pop(0)]()
        return "done"

    try:
        result: Any = gateway._call(call, rpc, object(), idempotent_commit=idempotent)
    except Exception as exc:  # the outcome compared is the error itself
        result = (type(exc).__name__, str(exc))
    finally:
        gateway.close()
    return result, len(errors) - len(queue), gateway.stats.snapshot().get(f"retry.{call}", 0)


def async_outcome(call: str, errors: list[str], idempotent: bool) -> tuple[Any, ...]:
    gateway = AsyncDatastoreGateway("p", emulator_host="127.0.0.1:9", retry=AsyncRetry(**FAST))
    queue = list(errors)

    async def rpc(*, request: Any, retry: Any, timeout: float) -> str:
        if queue:
            raise ERRORS[queue.pop(0)]()
        return "done"

    class Client:
        pass

    client = Client()
    setattr(client, call, rpc)
    gateway._client = lambda: client  # type: ignore[method-assign]

    async def send() -> Any:
        try:
            return await gateway._send(call, object(), idempotent_commit=idempotent)
        except Exception as exc:
            return (type(exc).__name__, str(exc))

    result = asyncio.run(send())
    return result, len(errors) - len(queue), gateway.stats.snapshot().get(f"retry.{call}", 0)


@settings(max_examples=60, deadline=None)
@given(
    call=st.sampled_from(["lookup", "run_query", "begin_transaction", "commit", "allocate_ids"]),
    errors=st.lists(st.sampled_from(sorted(ERRORS)), max_size=3),
    idempotent=st.booleans(),
)
def test_both_transports_retry_and_fail_alike(call, errors, idempotent):
    assert async_outcome(call, errors, idempotent) == blocking_outcome(call, errors, idempotent)


def test_an_ambiguous_commit_is_commit_unknown_and_sent_once():
    result, attempts, retries = async_outcome("commit", ["deadline"], idempotent=False)
    assert result[0] == "CommitUnknown" and attempts == 1 and retries == 0
    result, attempts, retries = async_outcome("lookup", ["unavailable", "deadline"], idempotent=False)
    assert result == "done" and attempts == 2 and retries == 2
