"""Which storage a gateway reaches: the part of every shared-cache key
(``redis_cache``) that says whose counters they are. It names the storage,
never the spelling of its address, because every process that writes a
counter must find the total another process cached for it:

* Cloud Datastore: ``datastore/PROJECT/DATABASE`` (the host is transport;
  namespaces are in each counter's own key).
* An emulator on this machine: ``emulator/local:PORT/PROJECT/DATABASE``;
  ``localhost``, ``127.0.0.1``, ``[::1]``, ``0.0.0.0``, this machine's name
  and its own addresses all reach it, so all are ``local``. Unless it is
  ``gds-counter serve``, which says which storage it serves (the
  ``STORAGE_HEADER`` of its ``GET /``): then that storage's scope, the
  same as a process opening the SQLite file directly gets, whatever
  project its clients name (the server's store is not divided by project;
  a named database is a file of its own there, asked for by name).
* A SQLite file: ``sqlite/DEVICE:INODE``, the file's identity, whatever
  path, link or mount reaches it (``embedded.file_id``).
* Memory, which no other process can see: a name of the gateway's own.
* ``scope=NAME`` in the cache URL: ``named/NAME``, whatever the gateway.

What the library cannot tell, it refuses (``check_scope``, when a counter
is made): an emulator that is not on this machine may be reached by other
processes under other addresses (a container's service name, a port mapped
to ``localhost``, a LAN address), so it needs ``scope=``.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import urllib.parse
import uuid
from typing import Any

from gds_counter.errors import BadValueError
from gds_counter.gateway.embedded import file_id

__all__ = ["DATABASE_HEADER", "STORAGE_HEADER", "check_scope", "storage_scope"]

#: The header of ``gds-counter serve``'s ``GET /`` that names the storage it serves.
STORAGE_HEADER = "X-Gds-Counter-Storage"
#: The header of a ``GET /`` that asks for a named database's storage.
DATABASE_HEADER = "X-Gds-Counter-Database"


def _owner(gateway: Any) -> Any:
    return getattr(gateway, "blocking", gateway)


def check_scope(gateway: Any, url: str, named: str | None) -> None:
    """Refuse (``BadValueError``, before anything is written) a shared cache
    ``url`` on an emulator that is not on this machine, unless the URL
    names the storage (``named``)."""
    host = getattr(_owner(gateway), "emulator_host", None)
    if named is not None or not isinstance(getattr(_owner(gateway), "project", None), str) or not host:
        return
    try:
        _local_endpoint(host)
    except (OSError, ValueError) as exc:
        raise BadValueError(
            f"cache={url!r} with the emulator at {host}: {exc}; other processes may reach it under another address, "
            "and the cache cannot tell they share a storage: name it in the cache URL with scope=NAME "
            "(the same in every process)") from None


def storage_scope(gateway: Any, timeout: float, named: str | None = None) -> str:
    """The scope of ``gateway``'s storage (see the module's notes); asks an
    emulator whether it is ``gds-counter serve`` (waiting up to ``timeout``
    seconds), so ``OSError`` when it cannot be reached."""
    if named is not None:
        return f"named/{named}"
    owner = _owner(gateway)
    project = getattr(owner, "project", None)
    if isinstance(project, str):
        database = getattr(owner, "database", "") or ""
        host = getattr(owner, "emulator_host", None)
        if not host:
            return f"datastore/{project}/{database}"
        served = _served_storage(host, timeout, database)
        return served if served is not None else f"emulator/{_local_endpoint(host)}/{project}/{database}"
    path = getattr(owner, "path", None)
    if isinstance(path, str):
        found = file_id(path)
        if found is None:
            raise FileNotFoundError(f"{path} is gone: which storage it was cannot be told")
        return f"sqlite/{found[0]}:{found[1]}"
    return "memory/" + vars(owner).setdefault("_gds_cache_scope", uuid.uuid4().hex)


def _split(host: str) -> tuple[str, int | None]:
    parts = urllib.parse.urlsplit("//" + host)
    return (parts.hostname or "").rstrip("."), parts.port


def _local_endpoint(host: str) -> str:
    """``local:PORT`` for an address of this machine; ``ValueError`` or
    ``OSError`` (it cannot be resolved) for any other."""
    name, port = _split(host)
    if not (name == "localhost" or name.endswith(".localhost")):
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(name, port, type=socket.SOCK_STREAM)}
        if not addresses or not all(_on_this_machine(address) for address in addresses):
            raise ValueError("it is not on this machine")
    return f"local:{port}"


def _on_this_machine(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if ip.is_loopback or ip.is_unspecified:
        return True
    with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))  # only an address of this machine can be bound
        except OSError:
            return False
    return True


def _served_storage(host: str, timeout: float, database: str = "") -> str | None:
    """The storage ``gds-counter serve`` at ``host`` says it serves for
    ``database`` (each database is a store of its own there); None for
    another emulator (its ``GET /`` names none)."""
    name, port = _split(host)
    connection = http.client.HTTPConnection(name, port, timeout=timeout)
    try:
        connection.request("GET", "/", headers={DATABASE_HEADER: database} if database else {})
        response = connection.getresponse()
        response.read()
        return response.getheader(STORAGE_HEADER)
    except http.client.HTTPException as exc:
        raise OSError(f"the emulator at {host} did not answer GET / ({type(exc).__name__}: {exc})") from None
    finally:
        connection.close()
