"""Storage gateways, and the one function that chooses between them."""

from __future__ import annotations

import logging
import os
import threading
from urllib.parse import parse_qs, urlsplit

from gds_counter.errors import BadValueError
from gds_counter.gateway.base import Gateway, is_gateway
from gds_counter.gateway.stats import Stats

__all__ = ["Gateway", "Stats", "open_gateway", "resolve_gateway", "shared_gateway", "DEFAULT_URL"]

log = logging.getLogger(__name__)

#: Where the embedded default keeps its data when nothing else is chosen: a
#: file in the working directory, so `gds-counter increment` then
#: `gds-counter count` see the same counter with no setup.
DEFAULT_URL = "sqlite:///gds_counter.sqlite3"


def open_gateway(url: str | None = None) -> Gateway:
    """Open the gateway named by ``url``, ``GDS_URL``, the emulator, or the default.

    Order, first match wins:

    1. ``url`` argument, then the ``GDS_URL`` environment variable:
       ``sqlite:///path.db``, ``memory://``, ``datastore://PROJECT?namespace=NS&database=DB``.
    2. ``DATASTORE_EMULATOR_HOST`` set: the Datastore gateway on that emulator.
    3. The embedded SQLite default (``DEFAULT_URL``).

    Production Cloud Datastore is only reached through an explicit
    ``datastore://`` URL, never by accident.
    """
    chosen = url or os.environ.get("GDS_URL")
    if not chosen:
        emulator = os.environ.get("DATASTORE_EMULATOR_HOST")
        if emulator:
            from gds_counter.gateway.datastore import DatastoreGateway

            log.info("using the Datastore emulator at %s (DATASTORE_EMULATOR_HOST)", emulator)
            return DatastoreGateway(project=os.environ.get("DATASTORE_PROJECT_ID") or "gds-counter-local")
        chosen = DEFAULT_URL
    parts = urlsplit(chosen)
    params = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    if parts.scheme == "memory":
        from gds_counter.gateway.embedded import EmbeddedGateway

        return EmbeddedGateway(None, namespace=params.get("namespace", ""))
    if parts.scheme == "sqlite":
        from gds_counter.gateway.embedded import EmbeddedGateway

        # sqlite:///rel.db -> "rel.db"; sqlite:////abs/x.db -> "/abs/x.db"
        path = chosen.split("://", 1)[1].split("?", 1)[0]
        path = path[1:] if path.startswith("/") else path
        if not path:
            raise BadValueError(f"GDS URL {chosen!r} names no file; use sqlite:///path.db or memory://")
        return EmbeddedGateway(path, namespace=params.get("namespace", ""))
    if parts.scheme == "datastore":
        from gds_counter.gateway.datastore import DatastoreGateway

        if not parts.netloc:
            raise BadValueError(f"GDS URL {chosen!r} names no project; use datastore://PROJECT")
        return DatastoreGateway(
            project=parts.netloc,
            namespace=params.get("namespace", ""),
            database=params.get("database", ""),
        )
    raise BadValueError(
        f"unknown GDS URL {chosen!r}: expected sqlite:///path.db, memory:// or datastore://PROJECT"
    )


_shared: dict[tuple[int, str | None, str | None, str | None], Gateway] = {}
_shared_lock = threading.Lock()


def shared_gateway(url: str | None = None) -> Gateway:
    """One gateway per process and configuration, for code that names none.

    ``CounterShardDS("Counter Test", 1).increment()`` builds a Store each
    time; opening a fresh SQLite connection or gRPC channel for each would
    cost more than the increment. The process id is part of the cache key so
    a forked child never shares its parent's connection.
    """
    config = (
        os.getpid(),
        url or os.environ.get("GDS_URL"),
        os.environ.get("DATASTORE_EMULATOR_HOST"),
        os.environ.get("DATASTORE_PROJECT_ID"),
    )
    with _shared_lock:
        gateway = _shared.get(config)
        if gateway is None:
            gateway = _shared[config] = open_gateway(url)
        return gateway


def resolve_gateway(gateway: Gateway | str | None) -> Gateway:
    """What ``gateway=`` arguments accept: a gateway, or a URL (None: the
    default) for ``shared_gateway``."""
    if gateway is None or isinstance(gateway, str):
        return shared_gateway(gateway)
    if not is_gateway(gateway):
        raise BadValueError(f"expected a gateway or a GDS URL, got {type(gateway).__name__} {gateway!r}")
    return gateway
