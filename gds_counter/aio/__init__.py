"""``gds_counter.aio``: the asyncio face of gds_counter.

The same names, arguments and semantics as the blocking API, every call
that touches storage a coroutine::

    from gds_counter import aio

    counter = aio.CounterShardDS("Counter Test", 1)
    total = await counter.increment()
    totals = await aio.get_counts([counter, aio.CounterShardDS("Counter Test", 2)])

    async with aio.open_gateway("memory://") as gateway:
        books = aio.Store("Book", gateway)
        async with books.transaction():
            ...

One implementation of the rules: the Store, the counters and the gateways'
checks are plans (``gds_counter.gateway.plan``) that both faces run; only
the I/O differs. On Datastore (and both emulators) the I/O is gRPC asyncio
(``AsyncDatastoreGateway``); the embedded SQLite engine has no async I/O, so
its calls run in a bounded thread pool the async gateway owns
(``ThreadedGateway``) and the event loop never blocks. That pool, the
in-flight slots (``counter.runtime``) and the shared gateways are per process: a child forked
with a gateway it inherited (gunicorn ``--preload``, ``multiprocessing``)
gets threads and locks of its own, and never runs the parent's queued calls.
"""

from gds_counter.aio._gateway import (
    AsyncGateway,
    async_twin,
    is_async_gateway,
    open_gateway,
    resolve_gateway,
    shared_gateway,
)
from gds_counter.aio._threaded import ThreadedGateway
from gds_counter.aio.counter import CounterShardDS, DistributedCounter, GeneralCounter, ShardedCounter, get_counts
from gds_counter.aio.store import Store
from gds_counter.gateway.datastore import AsyncDatastoreGateway

__all__ = [
    "AsyncDatastoreGateway",
    "AsyncGateway",
    "CounterShardDS",
    "DistributedCounter",
    "GeneralCounter",
    "ShardedCounter",
    "Store",
    "ThreadedGateway",
    "async_twin",
    "get_counts",
    "is_async_gateway",
    "open_gateway",
    "resolve_gateway",
    "shared_gateway",
]
