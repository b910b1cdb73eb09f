"""Named databases: each one a store of its own, as on the emulator.

A Datastore request names its database (``database_id``; empty for the
default one). On the Firestore emulator, and on Datastore, what is written
to one database is not seen in another, so the server gives each database
id its own store and its own service (its open transactions included: a
transaction begun in one database is unknown to another): the default
database is the storage the server was started on; a named one is opened
on first use beside it, from the same URL (``_named_url``): a SQLite file
``served.sqlite3`` keeps database ``reports`` in ``served@reports.sqlite3``,
and ``memory://`` opens another in-memory store.

Ids are checked before anything is opened: at most 63 letters, digits,
``-`` and ``_`` (what Firestore allows, and safe as part of a file name),
not ``(default)`` (the emulator refuses it), and at most ``MAX_DATABASES``
named ones per server, so a client cannot fill a disk with files.
"""

from __future__ import annotations

import re
import threading
from typing import Any, Callable

from gds_counter.gateway.base import Gateway
from gds_counter.server._service import DatastoreService
from gds_counter.server._status import ServiceError

__all__ = ["MAX_DATABASES", "Databases", "named_url"]

#: Named databases one server opens at most.
MAX_DATABASES = 100

_DATABASE_ID = re.compile(r"^[A-Za-z0-9_-]{1,63}$")


def named_url(url: str, database: str) -> str:
    """The storage URL of the named ``database`` beside the default
    database's ``url`` (``sqlite:///x/served.sqlite3`` ->
    ``sqlite:///x/served@reports.sqlite3``; ``memory://`` stays ``memory://``,
    a store of its own each time it is opened)."""
    if not url.lower().startswith("sqlite:"):
        return url
    base, mark, query = url.partition("?")
    folder, _, name = base.rpartition("/")
    stem, dot, suffix = name.rpartition(".")
    renamed = f"{stem}@{database}.{suffix}" if dot and stem else f"{name}@{database}"
    return f"{folder}/{renamed}{mark}{query}"


class Databases:
    """The service of each database id, the default one given and the named
    ones opened by ``open_named`` (``None``: this server serves the default
    database only); ``close()`` closes the named ones' storage."""

    def __init__(self, default: DatastoreService, open_named: Callable[[str], Gateway] | None,
                 transaction_idle: float) -> None:
        self.default = default
        self._open_named = open_named
        self._idle = transaction_idle
        self._named: dict[str, DatastoreService] = {}
        self._lock = threading.Lock()

    @property
    def gateway(self) -> Gateway:
        """The default database's storage."""
        return self.default.gateway

    def gateway_of(self, database: str) -> Gateway:
        """The storage of ``database`` ("" the default one), opened if it
        was not (what a shared count cache names its counters by)."""
        return self.default.gateway if not database else self._service(database).gateway

    def call(self, method: str, request: Any, *, deadline: float | None = None, via: str = "") -> Any:
        """``DatastoreService.call`` on the service of the request's database."""
        database = getattr(request, "database_id", "")
        service = self.default if not database else self._service(database)
        return service.call(method, request, deadline=deadline, via=via)

    def _service(self, database: str) -> DatastoreService:
        if not _DATABASE_ID.fullmatch(database):
            raise ServiceError("INVALID_ARGUMENT", f"{database[:80]!r} is an invalid database id (at most 63 "
                               "letters, digits, '-' and '_')")
        with self._lock:
            service = self._named.get(database)
            if service is not None:
                return service
            if self._open_named is None:
                raise ServiceError("INVALID_ARGUMENT", f"database {database!r}: this server serves the default "
                                   "database only")
            if len(self._named) >= MAX_DATABASES:
                raise ServiceError("RESOURCE_EXHAUSTED", f"database {database!r}: this server has opened "
                                   f"{MAX_DATABASES} named databases, its limit")
            service = DatastoreService(self._open_named(database), transaction_idle=self._idle)
            self._named[database] = service
            return service

    def close(self) -> None:
        with self._lock:
            named, self._named = list(self._named.values()), {}
        for service in named:
            service.gateway.close()
