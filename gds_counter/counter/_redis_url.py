"""The shared cache's URL (``cache="redis://host:port/db?ttl=..."``), checked
before anything is written: its scheme, its one Redis db, and the cache's
own options (``ttl``, ``lease``, ``timeout``, ``prefix``, ``scope``) taken
out of it, so redis-py is given only its own. A cache URL is told by a
counter's options (``CounterOptions``) as well as opened by the cache
(``redis_cache.RedisCountCache``), so it has a module of its own.
"""

from __future__ import annotations

import re
import urllib.parse
from typing import Any

from gds_counter.errors import BadValueError

_SCHEMES = ("redis", "rediss", "unix")
_OPTIONS = {"ttl": 60.0, "lease": 30.0, "timeout": 0.25, "prefix": "gds_counter", "scope": None}
#: What ``ttl``, ``lease`` and ``timeout`` may be, in seconds: from a
#: millisecond (Redis counts in them) to what Redis's expiries and the
#: platform's clocks take.
RANGES = {"ttl": (0.001, 365 * 86_400.0), "lease": (0.001, 86_400.0), "timeout": (0.001, 3_600.0)}
#: A Redis db number: plain decimal digits, at most the highest a server can
#: have (its ``databases`` is a C int); the server's own bound is learned at
#: the first call.
_DB = re.compile(r"[0-9]{1,10}")
_DB_MAX = 2**31 - 2


def check_redis_url(url: object) -> str:
    """A ``redis://``, ``rediss://`` or ``unix://`` URL whose own options
    (``ttl``, ``lease``, ``timeout``: seconds within ``RANGES``;
    ``prefix``, ``scope``) are well formed; ``BadValueError`` naming it otherwise.
    (redis-py's own options are checked when the cache is made.)"""
    try:
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
    except ValueError as exc:
        raise BadValueError(f"cache URL {url!r}: {exc}") from None
    if parts is None or parts.scheme.lower() not in _SCHEMES:
        raise BadValueError(
            f"cache must be True, False, None, a CountCache or a redis://host:port/db URL (or rediss://, unix://), got {url!r}"
        )
    if not (parts.netloc if parts.scheme.lower() != "unix" else parts.path):
        raise BadValueError(f"cache URL {url!r} names no {'host' if parts.scheme.lower() != 'unix' else 'socket path'}")
    assert isinstance(url, str)
    split_redis_url(url)
    return url


def _check_db(url: str, parts: urllib.parse.SplitResult, query: list[tuple[str, str]]) -> None:
    """Refuse a Redis db redis-py would read as another than its writer may
    mean (it reads ``/abc`` and ``/1.5`` as db 0, ``/0/1`` and ``/ 1`` as
    db 1, and takes ``db=`` over the path): one plain decimal, in the path
    (``/`` or none: 0) or in ``db=``, the same wherever given. Whether the
    server has that many databases only the server tells (``RedisCountCache._call``)."""
    given = [value for name, value in query if name == "db"]
    if parts.scheme.lower() != "unix" and parts.path not in ("", "/"):
        given.insert(0, parts.path[1:])
    for value in given:
        if not (_DB.fullmatch(value) and int(value) <= _DB_MAX):
            raise BadValueError(f"cache URL {url!r}: the Redis db must be a plain number from 0 to {_DB_MAX} "
                                f"(as in redis://host:6379/0), got {value!r}")
    if len({int(value) for value in given}) > 1:
        raise BadValueError(f"cache URL {url!r} names more than one Redis db ({', '.join(map(repr, given))}): "
                            "give one")


def split_redis_url(url: str) -> tuple[str, dict[str, Any]]:
    """The URL for redis-py, and this cache's own options taken out of it."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    _check_db(url, parts, query)
    options: dict[str, Any] = dict(_OPTIONS)
    rest = []
    for name, value in query:
        if name in ("decode_responses", "encoding"):
            raise BadValueError(f"cache URL {url!r}: {name} is this cache's to set (it reads bytes)")
        if name not in _OPTIONS:
            rest.append((name, value))
        elif name in ("prefix", "scope"):
            if not value:
                raise BadValueError(f"cache URL {url!r}: {name} must not be empty")
            options[name] = value
        else:
            try:
                seconds = float(value)
            except ValueError:
                seconds = float("nan")
            low, high = RANGES[name]
            if not low <= seconds <= high:
                raise BadValueError(f"cache URL {url!r}: {name} must be from {low:g} to {high:g} seconds, got {value!r}")
            options[name] = seconds
    kept = urllib.parse.urlencode(rest)
    if parts.scheme.lower() == "unix":  # urlunsplit would drop the "//" of a URL with no host
        return f"{parts.scheme}://{parts.netloc}{parts.path}" + (f"?{kept}" if kept else ""), options
    return urllib.parse.urlunsplit(parts._replace(query=kept)), options
