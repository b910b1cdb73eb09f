"""The async gateways, and choosing an async gateway from a URL.

An async gateway offers the ``Gateway`` protocol's calls as coroutines
(``learn_capabilities()`` for the ``capabilities`` property, which may need
a probe): the ``AsyncGateway`` protocol, which the gateway layer defines
beside ``Gateway`` (the async driver performs effects on it) and this face
exports. Three implement it: ``AsyncDatastoreGateway`` and
``AsyncFirestoreGateway`` (gRPC asyncio, real non-blocking I/O: a
``datastore://`` URL or the emulators', and a ``firestore://`` one) and
``ThreadedGateway`` (the embedded engine in a bounded thread pool: SQLite
has no async I/O).
"""

from __future__ import annotations

import sys
from typing import Any

from gds_counter.aio._threaded import DEFAULT_WORKERS, ThreadedGateway
from gds_counter.errors import BadValueError
from gds_counter.gateway import open_gateway as open_blocking
from gds_counter.gateway import shared_gateway as shared_blocking
from gds_counter.gateway import shared_instance
from gds_counter.gateway.base import AsyncGateway
from gds_counter.gateway.datastore import AsyncDatastoreGateway, DatastoreGateway

__all__ = [
    "AsyncGateway",
    "async_twin",
    "open_gateway",
    "resolve_gateway",
    "shared_gateway",
]

_MEMBERS = ("learn_capabilities", "lookup", "run_query", "run_aggregation", "begin_transaction", "commit",
            "rollback", "allocate_ids", "close", "stats", "namespace")


def is_async_gateway(candidate: object) -> bool:
    return all(hasattr(type(candidate), name) or hasattr(candidate, name) for name in _MEMBERS)


def async_twin(blocking: Any, *, owns: bool = False, max_workers: int = DEFAULT_WORKERS) -> Any:
    """The async gateway for the storage a blocking gateway reaches: an
    ``AsyncDatastoreGateway`` with a ``DatastoreGateway``'s settings, an
    ``AsyncFirestoreGateway`` with a ``FirestoreGateway``'s (the blocking
    one closed if ``owns``), else a ``ThreadedGateway`` over it."""
    firestore = _firestore_twin(blocking)
    if firestore is not None:
        if owns:
            blocking.close()  # only its settings were wanted
        return firestore
    if isinstance(blocking, DatastoreGateway):
        gateway = AsyncDatastoreGateway(
            blocking.project, blocking.namespace, blocking.database,
            emulator_host=blocking.emulator_host or "", timeout=blocking.timeout,
        )
        if owns:
            blocking.close()  # only its settings were wanted
        return gateway
    return ThreadedGateway(blocking, max_workers=max_workers, owns=owns)


def _firestore_twin(blocking: Any) -> Any:
    """An ``AsyncFirestoreGateway`` with a ``FirestoreGateway``'s settings,
    or None for another gateway. (google-cloud-firestore is an optional
    extra: a ``FirestoreGateway`` exists only once it was imported.)"""
    if "gds_counter.gateway.firestore" not in sys.modules:
        return None
    from gds_counter.gateway.firestore import AsyncFirestoreGateway, FirestoreGateway

    if not isinstance(blocking, FirestoreGateway):
        return None
    return AsyncFirestoreGateway(
        blocking.project, blocking.database, emulator_host=blocking.emulator_host or "", timeout=blocking.timeout,
        credentials=blocking.credentials,
    )


def open_gateway(url: str | None = None, *, timeout: float | None = None,
                 max_workers: int = DEFAULT_WORKERS) -> AsyncGateway:
    """The async gateway for ``url`` with ``gds_counter.gateway.open_gateway``'s
    rules (``url``, ``GDS_URL``, ``DATASTORE_EMULATOR_HOST``, the embedded
    default; production only by an explicit ``datastore://`` or
    ``firestore://``): Datastore and Firestore over gRPC asyncio, the embedded engine in a pool of ``max_workers``
    threads. Close it with ``await gateway.close()`` or ``async with``."""
    gateway: AsyncGateway = async_twin(open_blocking(url, timeout=timeout), owns=True, max_workers=max_workers)
    return gateway


def shared_gateway(url: str | None = None) -> AsyncGateway:
    """One async gateway per process and configuration, for code that names
    none (``aio.CounterShardDS("Counter Test", 1)``). On the embedded engine
    it shares the blocking API's default gateway (one SQLite file, one
    connection pool); a Datastore one opens its gRPC channel per event loop."""
    blocking = shared_blocking(url)
    gateway: AsyncGateway = shared_instance(
        "aio", url, lambda: async_twin(blocking, owns=False, max_workers=DEFAULT_WORKERS)
    )
    return gateway


def resolve_gateway(gateway: Any) -> AsyncGateway:
    """What ``gateway=`` arguments of the asyncio face accept: an async
    gateway, or a URL (None: the default) for ``shared_gateway``."""
    if gateway is None or isinstance(gateway, str):
        return shared_gateway(gateway)
    if not is_async_gateway(gateway):
        raise BadValueError(
            f"expected an async gateway (gds_counter.aio.open_gateway) or a GDS URL, got {type(gateway).__name__} "
            f"{gateway!r}; wrap a blocking gateway with gds_counter.aio.ThreadedGateway"
        )
    result: AsyncGateway = gateway
    return result
