"""Faults below a Datastore gateway's retry layer: ``inject_rpc_faults``
puts a ``FaultyRpcClient`` in place of the GAPIC client inside a
``DatastoreGateway`` (or of the per-loop clients of an
``AsyncDatastoreGateway``), so the faults are google.api_core exceptions
raised by the RPC itself, and the gateway's real retry policy decides what
the caller sees (see ``faults``, where they are described and exported).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Mapping, Sequence

from gds_counter.errors import BadValueError
from gds_counter.testing._fault_injector import (
    ABORTED,
    CALLS,
    DEADLINE_EXCEEDED,
    RESOURCE_EXHAUSTED,
    RPC_FAULTS,
    UNAVAILABLE,
    UNAVAILABLE_AFTER,
    FaultInjector,
)


class FaultyRpcClient:
    """Stands in for the GAPIC client inside a Datastore gateway: the
    blocking ``DatastoreClient`` of a ``DatastoreGateway`` or the
    ``DatastoreAsyncClient`` of an ``AsyncDatastoreGateway``. Each RPC
    method may raise a google.api_core exception instead of (or, for the
    applied faults, after) calling the real one; a coroutine method stays a
    coroutine, so the async gateway's ``AsyncRetry`` sees the same errors as
    the blocking gateway's ``Retry``. Anything else is the real client's."""

    def __init__(self, client: Any, injector: FaultInjector) -> None:
        self._real = client
        self.injector = injector

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name not in CALLS:
            return attr
        if inspect.iscoroutinefunction(attr):
            return self._wrap_async(name, attr)
        return self._wrap(name, attr)

    # One decision per fault, for both kinds of client.

    @staticmethod
    def _error_before(call: str, fault: str | None) -> Exception | None:
        """What the RPC raises instead of being sent (nothing applied)."""
        from google.api_core import exceptions as gexc

        if fault == ABORTED:
            return gexc.Aborted(f"injected ABORTED on {call}: too much contention on these datastore entities")
        if fault == UNAVAILABLE:
            return gexc.ServiceUnavailable(
                f"injected on {call}: failed to connect to all addresses; last error: "
                "UNAVAILABLE: Failed to connect to remote host: Connection refused"
            )
        if fault == RESOURCE_EXHAUSTED:
            return gexc.ResourceExhausted(f"injected RESOURCE_EXHAUSTED on {call}: quota exceeded")
        return None

    @staticmethod
    def _error_after(call: str, fault: str | None) -> Exception | None:
        """What the RPC raises after it was applied (its answer lost)."""
        from google.api_core import exceptions as gexc

        if fault == DEADLINE_EXCEEDED:
            return gexc.DeadlineExceeded(f"injected DEADLINE_EXCEEDED on {call} after it was applied")
        if fault == UNAVAILABLE_AFTER:
            return gexc.ServiceUnavailable(f"injected on {call} after it was applied: Socket closed")
        return None

    @staticmethod
    def _ending_rollback(call: str, fault: str | None, request: Any) -> Any:
        """The rollback a server does itself when it aborts a transactional
        commit (ending the transaction and, on Firestore, releasing its
        locks), as a request to send; None when there is none."""
        if call != "commit" or fault != ABORTED:
            return None
        transaction = getattr(request, "transaction", b"")
        if not transaction:
            return None
        from google.cloud.datastore_v1.types import datastore as _ds

        return _ds.RollbackRequest(
            project_id=request.project_id, database_id=request.database_id, transaction=transaction
        )

    def _wrap(self, call: str, method: Any) -> Any:
        from google.api_core import exceptions as gexc

        def rpc(*args: Any, **kwargs: Any) -> Any:
            fault = self.injector.draw(call)
            rollback = self._ending_rollback(call, fault, kwargs.get("request"))
            if rollback is not None:
                with contextlib.suppress(gexc.GoogleAPICallError):
                    self._real.rollback(request=rollback, timeout=5.0)
            before = self._error_before(call, fault)
            if before is not None:
                raise before
            answer = method(*args, **kwargs)
            after = self._error_after(call, fault)
            if after is not None:
                raise after
            return answer

        return rpc

    def _wrap_async(self, call: str, method: Any) -> Any:
        from google.api_core import exceptions as gexc

        async def rpc(*args: Any, **kwargs: Any) -> Any:
            fault = self.injector.draw(call)
            rollback = self._ending_rollback(call, fault, kwargs.get("request"))
            if rollback is not None:
                with contextlib.suppress(gexc.GoogleAPICallError):
                    await self._real.rollback(request=rollback, timeout=5.0)
            before = self._error_before(call, fault)
            if before is not None:
                raise before
            answer = await method(*args, **kwargs)
            after = self._error_after(call, fault)
            if after is not None:
                raise after
            return answer

        return rpc


class _FaultyClients:
    """Stands in for a Datastore gateway's ``_client`` method (the async
    one makes a client per event loop, on first use in it; either makes its
    own in a forked child): the same clients, each behind a
    ``FaultyRpcClient`` sharing one injector, so the faults reach clients
    made after the injection."""

    def __init__(self, clients: Any, injector: FaultInjector) -> None:
        self.real = clients
        self.injector = injector

    def __call__(self) -> FaultyRpcClient:
        return FaultyRpcClient(self.real(), self.injector)


def inject_rpc_faults(
    gateway: Any,
    rates: Mapping[str, Mapping[str, float]] | None = None,
    *,
    seed: int | None = 0,
    script: Mapping[str, Sequence[str | None]] | None = None,
) -> FaultInjector:
    """Make a ``DatastoreGateway``'s or ``AsyncDatastoreGateway``'s RPCs
    fail on purpose, below its retry policy; returns the injector (counts,
    ``paused()``). Call ``remove_rpc_faults(gateway)`` to undo."""
    from gds_counter.gateway.datastore import AsyncDatastoreGateway, DatastoreGateway

    if not isinstance(gateway, (DatastoreGateway, AsyncDatastoreGateway)):
        raise BadValueError(
            f"inject_rpc_faults needs a DatastoreGateway or an AsyncDatastoreGateway, got {type(gateway).__name__}"
        )
    if isinstance(vars(gateway).get("_client"), _FaultyClients):
        raise BadValueError(f"{gateway!r} already has RPC faults injected")
    injector = FaultInjector(rates, seed=seed, allowed=RPC_FAULTS, script=script)
    setattr(gateway, "_client", _FaultyClients(gateway._client, injector))  # shadows the method
    return injector


def remove_rpc_faults(gateway: Any) -> None:
    """Undo ``inject_rpc_faults`` (nothing to undo: nothing done)."""
    if isinstance(vars(gateway).get("_client"), _FaultyClients):
        del gateway._client  # the class's method again
