"""Storage gateways, and the one function that chooses between them."""

from __future__ import annotations

import logging
import math
import os
import re
import sqlite3
import threading
from typing import Any, Callable, TypeVar
from urllib.parse import parse_qsl, urlsplit

from gds_counter._process import forks
from gds_counter.errors import BadKeyError, BadValueError, GatewayError
from gds_counter.gateway._aggregation import check_aggregation
from gds_counter.gateway.base import Gateway, is_gateway

# Imported now, not on first use: a process that forks while another thread
# imports it would leave its child waiting for that import's lock for ever.
# (The Datastore gateway's import, several times heavier, stays deferred.)
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.keys import local_project, project_name
from gds_counter.gateway.stats import Stats

__all__ = [
    "DEFAULT_URL",
    "Gateway",
    "Stats",
    "check_aggregation",
    "open_gateway",
    "resolve_gateway",
    "shared_gateway",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Where the embedded default keeps its data when nothing else is chosen: a
#: file in the working directory, so `gds-counter increment` then
#: `gds-counter count` see the same counter with no setup.
DEFAULT_URL = "sqlite:///gds_counter.sqlite3"

#: What a GDS URL may look like, for error messages.
URL_FORMS = (
    "sqlite:///relative/path.db (relative to the working directory), "
    "sqlite:////absolute/path.db (four slashes), memory://, "
    "datastore://PROJECT?namespace=NS&database=DB or firestore://PROJECT?database=DB"
)

#: Query parameters each scheme takes; anything else is a typo, refused.
_PARAMS = {
    "sqlite": ("namespace", "project"), "memory": ("namespace", "project"), "datastore": ("namespace", "database"),
    "firestore": ("database",),
}
#: Parameters that name something when given: empty, they are a typo (an
#: empty ``namespace`` is the default namespace, as in Datastore).
_NOT_EMPTY = ("project", "database")
#: Datastore's rules: namespaces and project ids as the server accepts them.
_NAMESPACE = re.compile(r"[0-9A-Za-z._-]{0,100}")
#: A database id, or ``(default)``: Firestore's name for the default database
#: (the gateway sends it as ``""``, the only spelling the Datastore API takes).
_DATABASE = re.compile(r"\(default\)|[a-z0-9-]{1,63}")


def open_gateway(url: str | None = None, *, timeout: float | None = None) -> Gateway:
    """Open the gateway named by ``url``, ``GDS_URL``, the emulator, or the default.

    Order, first match wins:

    1. ``url`` argument, then the ``GDS_URL`` environment variable:
       ``sqlite:///relative/path.db`` (relative to the working directory),
       ``sqlite:////absolute/path.db``, ``memory://``,
       ``datastore://PROJECT?namespace=NS&database=DB``,
       ``firestore://PROJECT?database=DB`` (Cloud Firestore in native mode;
       its emulator when ``FIRESTORE_EMULATOR_HOST`` is set, as
       google-cloud-firestore honours it). The embedded ones
       take ``?project=P`` too: the project a GQL ``KEY(PROJECT(...))`` is
       told apart from (default: ``keys.local_project``, the emulator's:
       ``DATASTORE_PROJECT_ID``, else ``gds-counter-local``).
    2. ``DATASTORE_EMULATOR_HOST`` set: the Datastore gateway on that emulator.
    3. The embedded SQLite default (``DEFAULT_URL``, in the working directory).

    A malformed URL (``""``, which is not None; a ``#fragment``), an
    unknown or empty ``project``/``database`` query parameter, a reserved
    namespace, or a SQLite file whose directory does not exist raises
    ``BadValueError`` naming it (the SQLite path made absolute) before
    anything is created or any credentials are looked up.
    ``timeout`` (seconds) bounds each Datastore call, retries included; the
    embedded engine has no network and ignores it.

    Production Cloud Datastore is only reached through an explicit
    ``datastore://`` URL, never by accident. The storage chosen is logged at
    INFO; falling back to the local default while ``GOOGLE_CLOUD_PROJECT`` is
    set (as on App Engine) is logged as a warning.
    """
    if timeout is not None and not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise BadValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    url = _given(url)
    source = "the url argument" if url else "GDS_URL"
    chosen = url or os.environ.get("GDS_URL")
    if not chosen:
        emulator = os.environ.get("DATASTORE_EMULATOR_HOST")
        if emulator:
            from gds_counter.gateway.datastore import DatastoreGateway

            project = local_project()
            log.info("storage: the Datastore emulator at %s, project %r (from DATASTORE_EMULATOR_HOST)",
                     emulator, project)
            return DatastoreGateway(project=project, **_timeout(timeout))
        chosen, source = DEFAULT_URL, "the default"
        cloud = os.environ.get("GOOGLE_CLOUD_PROJECT")
        if cloud:
            log.warning(
                "GOOGLE_CLOUD_PROJECT=%s is set, but no GDS_URL or URL names the storage: counting in the "
                "local SQLite file %s, NOT in Cloud Datastore (use datastore://%s to count there)",
                cloud, sqlite_path(DEFAULT_URL), cloud,
            )
    scheme, _, rest = chosen.partition(":")
    scheme = scheme.lower()
    userinfo = urlsplit(chosen).netloc.rpartition("@")[0] if rest.startswith("//") else ""
    if userinfo:
        raise BadValueError(f"GDS URL {_masked(chosen, userinfo)!r} names a user or a password, which no GDS URL "
                            "takes (Datastore's credentials come from the environment, as the google-cloud "
                            f"clients find them): expected {URL_FORMS}")
    if "#" in chosen and scheme in _PARAMS:
        raise BadValueError(f"GDS URL {chosen!r} has a fragment ({chosen[chosen.index('#'):]!r}), which no GDS URL "
                            f"takes: expected {URL_FORMS}")
    if scheme == "sqlite":
        path = sqlite_path(chosen)
        params = _params(chosen, rest.partition("?")[2], scheme)
        _ignored_timeout(timeout, chosen)
        log.info("storage: the SQLite file %s (from %s)", path, source)
        return _open_sqlite(path, params.get("namespace", ""), params.get("project"))
    parts = urlsplit(chosen)
    if scheme == "memory":
        if not rest.startswith("//") or parts.netloc or parts.path or parts.fragment:
            raise BadValueError(f"GDS URL {chosen!r} is malformed: an in-memory database is memory:// "
                                "(optionally memory://?namespace=NS), with no host or path")
        params = _params(chosen, parts.query, scheme)
        _ignored_timeout(timeout, chosen)
        log.info("storage: an in-memory SQLite database, gone when the process exits (from %s)", source)
        return EmbeddedGateway(None, namespace=params.get("namespace", ""), project=params.get("project"))
    if scheme == "datastore":
        project = parts.netloc
        if not rest.startswith("//") or not project:
            raise BadValueError(f"GDS URL {chosen!r} names no project; use datastore://PROJECT")
        if not _is_project(project) or parts.path not in ("", "/") or parts.fragment:
            raise BadValueError(f"GDS URL {chosen!r} is malformed: expected datastore://PROJECT?namespace=NS"
                                f"&database=DB with a project id such as my-project, got project {project!r}")
        params = _params(chosen, parts.query, scheme)
        database = params.get("database", "")
        if "database" in params and not _DATABASE.fullmatch(database):
            raise BadValueError(f"GDS URL {chosen!r}: database {database!r} is not a Firestore database id")
        from gds_counter.gateway.datastore import DatastoreGateway

        gateway = DatastoreGateway(project=project, namespace=params.get("namespace", ""), database=database,
                                   **_timeout(timeout))
        where = f"the Datastore emulator at {gateway.emulator_host}" if gateway.emulator_host else "Cloud Datastore"
        log.info("storage: %s, project %r, namespace %r, database %r (from %s)", where, project,
                 gateway.namespace, database or "(default)", source)
        return gateway
    if scheme == "firestore":
        return _open_firestore(chosen, rest, parts, timeout, source)
    raise BadValueError(f"unknown GDS URL {chosen!r}: expected {URL_FORMS}")


def _open_firestore(chosen: str, rest: str, parts: Any, timeout: float | None, source: str) -> Gateway:
    """``firestore://PROJECT?database=DB``: the Firestore (native mode)
    gateway, its optional extra imported only now."""
    project = parts.netloc
    if not rest.startswith("//") or not project:
        raise BadValueError(f"GDS URL {chosen!r} names no project; use firestore://PROJECT?database=DB")
    if not _is_project(project) or parts.path not in ("", "/") or parts.fragment:
        raise BadValueError(f"GDS URL {chosen!r} is malformed: expected firestore://PROJECT?database=DB with a "
                            f"project id such as my-project, got project {project!r}")
    params = _params(chosen, parts.query, "firestore")
    database = params.get("database", "(default)")
    if not _DATABASE.fullmatch(database):
        raise BadValueError(f"GDS URL {chosen!r}: database {database!r} is not a Firestore database id")
    from gds_counter.gateway.firestore import FirestoreGateway

    gateway = FirestoreGateway(project, database, **_timeout(timeout))
    where = f"the Firestore emulator at {gateway.emulator_host}" if gateway.emulator_host else "Cloud Firestore"
    log.info("storage: %s (native mode), project %r, database %r (from %s)", where, project, database, source)
    return gateway


def _masked(url: str, userinfo: str) -> str:
    """``url`` with its ``userinfo`` hidden, for errors and logs (a refused
    URL must not put a secret, a password or a token, on a terminal or in a
    log)."""
    return url.replace(userinfo + "@", "***@", 1)


def _given(url: str | None) -> str | None:
    """``url`` as given: None names the default storage; ``""`` is not
    None, and is refused rather than taken for it."""
    if isinstance(url, str) and not url.strip():
        raise BadValueError(f"GDS URL {url!r} is empty: pass None (or leave it out) for the default storage, "
                            f"else one of {URL_FORMS}")
    return url


def sqlite_path(url: str) -> str:
    """The absolute file a ``sqlite:`` URL names, checked before opening.

    ``sqlite:///x.db`` is ``x.db`` in the working directory (three slashes,
    then a relative path); ``sqlite:////tmp/x.db`` is ``/tmp/x.db`` (the
    fourth slash starts an absolute path). Raises ``BadValueError`` naming
    the absolute path when the URL is malformed, names a directory, or its
    directory does not exist.
    """
    scheme, _, rest = url.partition(":")
    if scheme.lower() != "sqlite" or not rest.startswith("///"):
        raise BadValueError(f"GDS URL {url!r} is not a SQLite URL: use {URL_FORMS}")
    raw = rest[3:].partition("?")[0]
    if not raw:
        raise BadValueError(f"GDS URL {url!r} names no file; use sqlite:///path.db or memory://")
    if raw == ":memory:":
        raise BadValueError(f"GDS URL {url!r} would create a file named ':memory:'; use memory:// instead")
    try:
        os.fsencode(raw)  # bytes the command line could not decode are fine; a lone surrogate is not
    except UnicodeEncodeError as exc:
        raise BadValueError(f"GDS URL {url!r}: the path cannot be a file name ({exc.reason} at index {exc.start})") from None
    if "\x00" in raw:
        raise BadValueError(f"GDS URL {url!r}: the path cannot be a file name (a NUL character at index {raw.index(chr(0))})")
    path = os.path.abspath(raw)
    if os.path.isdir(path):
        raise BadValueError(f"GDS URL {url!r} names {path}, which is a directory, not a database file")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        hint = ""
        if not os.path.isabs(raw):
            hint = f" (sqlite:/// then a relative path is relative to the working directory {os.getcwd()}"
            if os.path.isdir(os.path.dirname("/" + raw)):
                hint += f"; for the absolute path /{raw} write four slashes: sqlite:////{raw}"
            hint += ")"
        raise BadValueError(f"GDS URL {url!r} names the file {path}, but its directory {folder} does not exist{hint}")
    return path


def _open_sqlite(path: str, namespace: str, project: str | None = None) -> Gateway:
    try:
        return EmbeddedGateway(path, namespace=namespace, project=project)
    except (OSError, sqlite3.Error) as exc:
        raise GatewayError(f"cannot open the SQLite file {path}: {exc}") from exc


def _params(url: str, query: str, scheme: str) -> dict[str, str]:
    """The URL's query parameters, refusing malformed or unknown ones (a
    misspelt ``namspace`` must not silently count in the default namespace)."""
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=True)
    except ValueError:
        raise BadValueError(f"GDS URL {url!r} has a malformed query {query!r}; expected name=value&...") from None
    allowed = _PARAMS[scheme]
    unknown = sorted({name for name, _ in pairs if name not in allowed})
    if unknown:
        raise BadValueError(f"GDS URL {url!r}: unknown parameter {', '.join(unknown)}; "
                            f"a {scheme} URL takes {', '.join(allowed)}")
    repeated = sorted({name for name, _ in pairs if sum(1 for other, _ in pairs if other == name) > 1})
    if repeated:
        raise BadValueError(f"GDS URL {url!r} gives {', '.join(repeated)} more than once")
    params = dict(pairs)
    empty = sorted(name for name, value in pairs if name in _NOT_EMPTY and not value)
    if empty:
        raise BadValueError(f"GDS URL {url!r}: {empty[0]} is empty (leave it out for the default)")
    if "project" in params:
        try:
            project_name(params["project"])
        except BadKeyError as exc:
            raise BadValueError(f"GDS URL {url!r}: project {exc}") from None
    namespace = params.get("namespace", "")
    if not _NAMESPACE.fullmatch(namespace) or (namespace.startswith("__") and namespace.endswith("__")):
        raise BadValueError(f"GDS URL {url!r}: namespace {namespace!r} is not allowed (up to 100 of A-Z a-z "
                            "0-9 . _ -, and not of the reserved form __x__)")
    return params


def _is_project(project: str) -> bool:
    try:
        return project_name(project) is not None
    except BadKeyError:
        return False


def _timeout(timeout: float | None) -> dict[str, Any]:
    return {} if timeout is None else {"timeout": float(timeout)}


def _ignored_timeout(timeout: float | None, url: str) -> None:
    if timeout is not None:
        log.debug("timeout %gs has no per-call use on %s (local storage, no network calls): its waits for "
                  "another process's lock end at the caller's retry deadline instead", timeout, url)


class _SharedGateways:
    """The gateways of code that names none, per process, face and storage
    settings (``shared_gateway_key``): one registry for both faces."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gateways: dict[tuple[Any, ...], Any] = {}

    def get(self, key: tuple[Any, ...], make: Callable[[], T]) -> T:
        with self._lock:
            gateway = self._gateways.get(key)
            if gateway is None:
                gateway = self._gateways[key] = make()
            found: T = gateway
            return found

    def _after_fork_in_child(self) -> None:
        """A thread of the parent may have held the lock at the fork. (The
        gateways stay: their keys name the parent's process id, so the child
        opens its own.)"""
        self._lock = threading.Lock()


_SHARED = _SharedGateways()
forks.register(_SHARED)


def shared_gateway_key(url: str | None) -> tuple[Any, ...]:
    """What makes a shared gateway the same one (for both faces): the
    process id, so that a forked child never shares its parent's connection,
    and the settings that choose the storage."""
    return (
        forks.here(),
        _given(url) or os.environ.get("GDS_URL"),
        os.environ.get("DATASTORE_EMULATOR_HOST"),
        os.environ.get("DATASTORE_PROJECT_ID"),
        os.environ.get("FIRESTORE_EMULATOR_HOST"),
    )


def shared_gateway(url: str | None = None) -> Gateway:
    """One gateway per process and configuration, for code that names none.

    ``CounterShardDS("Counter Test", 1).increment()`` builds a Store each
    time; opening a fresh SQLite connection or gRPC channel for each would
    cost more than the increment. The cache key is ``shared_gateway_key``.
    A relative SQLite path is resolved against the working directory when
    the gateway is first opened.
    """
    return _SHARED.get(("blocking", *shared_gateway_key(url)), lambda: open_gateway(url))


def shared_instance(face: str, url: str | None, make: Callable[[], T]) -> T:
    """Another face's shared gateway for ``url`` (``gds_counter.aio``'s),
    made by ``make()`` the first time, kept beside the blocking ones."""
    return _SHARED.get((face, *shared_gateway_key(url)), make)


def resolve_gateway(gateway: Gateway | str | None) -> Gateway:
    """What ``gateway=`` arguments accept: a gateway, or a URL (None: the
    default) for ``shared_gateway``."""
    if gateway is None or isinstance(gateway, str):
        return shared_gateway(gateway)
    if not is_gateway(gateway):
        raise BadValueError(f"expected a gateway or a GDS URL, got {type(gateway).__name__} {gateway!r}")
    return gateway
