"""A count cache shared by every process: ``cache="redis://host:port/db"``.

Redis plays the part memcache plays in Google's sharding article (in
production, Memorystore): a page that shows a count many times a second in
many app instances pays for one read of the shards, not one per instance.
It is an optional extra (``pip install "gds-counter[redis]"``).

It is write-through. After its commit, a writer adds its amount to the
cached total, when there is one, in the same Redis step that ends its
write; so another process reads the increment as soon as the writer's call
has returned.

**What a total it shows promises**: it counts only increments that were
committed, and every increment whose call returned before the read began.
(It may miss increments still in flight, and count one in flight that
another in flight committed before it: totals seen by two readers are
each true in that sense, not necessarily ordered.)

**The race between a commit and a cache update** (a reader filling the
cache while a write commits: the write counted twice, or missing) is closed
in Redis, by an epoch and a set of writes in flight per counter, each step
one script (``_redis_scripts``, where the race and its closing are told).

A write whose outcome is unknown (an interrupt, a cancellation,
``CommitUnknown``) drops the total and blocks filling it for ``ttl``; a
reset drops it. An interrupt that cuts off a write's end itself leaves the
drop owed, paid at this process's next Redis call. A writer whose lease ran out (a crash between commit and
update, or Redis unreachable for it) is treated the same by the next reader
(the total is dropped), and its own late update finds itself gone from the
set and drops the total instead of adding to it.

**When Redis is down or slow**: every Redis call has a short timeout; on
any Redis error (anything redis-py raises) a read reads storage (a warning is logged, at most every
30 s), and a write is counted as usual: a cache error never fails an
increment. After a failed call, no call is tried for the timeout's length
(reads go to storage, writes count), so a stalled Redis costs about one
timeout, not one per counter read. A db the server does not have (past its
``databases``, which only it knows) turns the cache off in this process at
its first call, said once (``_turn_off``). Redis losing its keys (a restart, an
eviction) cannot make an old ticket match: a lost epoch starts again from
Redis's clock, not from 0. Redis restarted from a snapshot (or an
append-only file, or a replica promoted) brings keys back, totals and
epochs included, that may be older than adds that returned: each
counter's keys carry the run id of the server that wrote them, and under
another run (checked in every script) they are no total (see ``_redis_scripts.BUMP``).
The keys name the storage, not its address (``_storage_scope``). The window left: a writer that cannot reach Redis around its commit
leaves the cached total short of its amount until that process next
reaches Redis (it drops the total then), or the writer's lease ends (when
it reached Redis before its commit), or the total's ``ttl`` ends (a
process that exited before Redis came back). Writes by counters built
without this cache (another ``cache=``, none, or ``gds-counter``) are not
seen before ``ttl`` either, as with any cache: give every writer of a
counter the same ``cache=`` URL.

A counter that is written all the time, from many processes, is rarely
seen with no write in flight, so its total is rarely stored: its reads
then go to storage (correct, not cheaper). ``get_count(max_age=S)`` (the
rollup) is the cheap read for such a counter.

On the asyncio face the cache's Redis calls are blocking ones, each bounded
by the timeout (0.25 s by default; a local Redis answers in well under a
millisecond).

**Interrupts**: redis-py never runs in the main thread, where a signal's
handler raises (``KeyboardInterrupt``): the main thread's calls (an event
loop's too, when it runs there) are made by the cache's worker thread
(``_off_main``), and an interrupt lands in the caller's wait (see
``_call``). Anything redis-py raises is the cache's failure, and after an
error it does not declare the client's connections are discarded.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
import uuid
from typing import Any, Hashable, Iterator

from gds_counter._checks import INT64_MAX
from gds_counter._process import forks
from gds_counter.counter._off_main import OffMain
from gds_counter.counter._redis_scripts import BEGIN, END, GET, STORE, TICKET, counter_keys
from gds_counter.counter._redis_url import RANGES, check_redis_url, split_redis_url
from gds_counter.counter._storage_scope import check_scope, storage_scope
from gds_counter.errors import BadValueError, Contention, TransformsIgnored, Unavailable

__all__ = ["RedisCountCache", "check_redis_url"]

log = logging.getLogger("gds_counter.counter.redis_cache")

_NOT_STORED = (Contention, Unavailable, TransformsIgnored)
_WARN_EVERY_S = 30.0
#: What a stored total looks like (as this module writes it: INCRBY's digits).
_TOTAL = re.compile(rb"-?[0-9]{1,19}")




class RedisCountCache:
    """The shared cache of the storage ``gateway`` reaches in the Redis
    ``url`` names; see the module's notes. Counters get one with
    ``cache="redis://..."`` (``Runtime.redis_cache``: one per URL per gateway).

    Its keys name the storage (``scope``, see ``_storage_scope``), known
    at once, or for an emulator at the first call that reaches it (until
    then, as when Redis fails, reads go to storage and writes count)."""

    def __init__(self, url: str, gateway: Any) -> None:
        check_redis_url(url)
        try:
            import redis
        except ImportError:
            raise BadValueError(
                f"cache={url!r} needs the redis package: pip install \"gds-counter[redis]\""
            ) from None
        client_url, options = split_redis_url(url)
        check_scope(gateway, url, options["scope"])
        self.url, self._gateway, self._named = url, gateway, options["scope"]
        self.ttl, self.lease, self.timeout = options["ttl"], options["lease"], options["timeout"]
        self.scope: str | None = None
        self._prefix = f"{options['prefix']}:"
        if self._named is not None or not getattr(getattr(gateway, "blocking", gateway), "emulator_host", None):
            with contextlib.suppress(OSError):  # (a file deleted meanwhile: told at the first call)
                self._scoped()  # no emulator to ask: known now
        #: The errors redis-py declares (and the network's): after one, its
        #: connection is sound, or redis-py closed it. Anything else out of a
        #: Redis call (a ``TypeError`` of its parser, an interrupt) makes the
        #: cache discard its connections (``_run``); every error is the
        #: cache's failure, never the caller's (``_call``).
        self._declared: tuple[type[BaseException], ...] = (redis.RedisError, OSError)
        self._client_url = client_url
        self._connect()
        #: Runs the main thread's Redis calls in a worker thread (``_call``).
        self._hop = OffMain(f"gds_counter redis cache {self.url}")
        #: How long the main thread waits for its call: each Redis step is
        #: bounded by ``timeout`` (connect, handshake, script, what is owed).
        self._wait = 8 * self.timeout + 1.0
        self._warned = -_WARN_EVERY_S
        #: Guards ``_warned``, ``_down_until`` and ``_owed``; made anew in a
        #: forked child (``_after_fork_in_child``), where a thread of the
        #: parent may have held it.
        self._lock = threading.Lock()
        #: Until this ``time.monotonic()``, after a Redis call failed, no
        #: call is tried (each would wait its timeout): reads go to storage,
        #: writes count, and what is owed waits (``_call``).
        self._down_until = 0.0
        #: Why the cache is off for good (its db is past the server's
        #: ``databases``): then no call is tried.
        self._off: str | None = None
        #: Counters whose write this process could not announce or end in
        #: Redis: their totals are dropped at its next successful call.
        self._owed: dict[Hashable, str] = {}
        forks.register(self)

    def _connect(self) -> None:
        """A redis-py client (no connection yet) and the scripts on it; its
        own URL options are checked here, by making (not opening) one
        connection, so a bad one is refused before anything is written."""
        import redis

        url = self._client_url
        extra: dict[str, Any] = {}
        try:  # redis-py 7+ asks a RESP3 server for maintenance notices at each connect: a round trip
            from redis.maint_notifications import MaintNotificationsConfig  # (Redis 7.0 refuses) for no use here
        except ImportError:
            pass
        else:
            extra["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
        try:
            self._client = redis.Redis.from_url(url, socket_timeout=self.timeout, socket_connect_timeout=self.timeout,
                                                retry_on_timeout=False, **extra)
            pool = self._client.connection_pool
            pool.connection_class(**pool.connection_kwargs)
            low, high = RANGES["timeout"]
            for name in ("socket_timeout", "socket_connect_timeout"):
                value = pool.connection_kwargs.get(name)
                if value is not None and not low <= value <= high:
                    raise ValueError(f"{name} must be from {low:g} to {high:g} seconds, got {value!r}")
        except (ValueError, TypeError, redis.RedisError) as exc:
            raise BadValueError(f"cache URL {self.url!r}: {exc}") from None
        self._scripts = {name: self._client.register_script(text) for name, text in
                         (("get", GET), ("ticket", TICKET), ("store", STORE), ("begin", BEGIN), ("end", END))}

    def __repr__(self) -> str:
        return f"RedisCountCache({self.url!r}, scope={self.scope!r})"

    def _after_fork_in_child(self) -> None:
        """A fresh lock and a fresh redis-py client: a thread of the parent
        that held the lock, or the lock of redis-py's connection pool, is
        not here to let it go."""
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._hop.forget_worker()
        self._connect()

    def _scoped(self) -> str:
        """The prefix of this storage's keys; the first call works out the
        storage (``storage_scope``: it may ask an emulator, and raise
        ``OSError`` when that fails)."""
        if self.scope is None:
            self.scope = storage_scope(self._gateway, self.timeout, self._named)
        return f"{self._prefix}{self.scope}:"

    def _keys(self, key: Hashable) -> list[str]:
        return counter_keys(self._scoped(), key)

    def _call(self, script: str, key: Hashable, *args: Any) -> Any:
        """Run a script; None (and a warning, now and then) when Redis fails.
        First, the totals of writes this process could not report are
        dropped (and kept from being filled for ttl).

        From the main thread the call is run by the cache's worker thread
        (``_off_main``: an interrupt never lands inside redis-py); one
        that lands while the caller waits is raised here, and the call goes
        on in the worker: the caller assumes either outcome (``writing``
        counts an end it did not see done as owed). Whatever redis-py
        raises (not only its declared errors) is the cache's failure."""
        with self._lock:
            if self._off is not None or time.monotonic() < self._down_until:
                return None
        try:
            return self._hop.run(lambda: self._run(script, key, args), self._wait)
        except Exception as exc:  # noqa: B902  (any failure of the cache's: never the caller's)
            if "DB index is out of range" in str(exc):  # the server's SELECT: never right until it restarts
                self._turn_off(str(exc))
                return None
            self._mark_down()
            self._warn(f"the shared cache {self.url} failed ({type(exc).__name__}: {exc}): totals are read from "
                       "storage, writes count as usual")
            return None

    def _run(self, script: str, key: Hashable, args: tuple[Any, ...]) -> Any:
        """``_call``'s Redis work, in the thread that does it: what is owed,
        then the script. After an error redis-py does not declare, or an
        interrupt, inside it, the client's connections are discarded: one
        may be half read, and must never serve another call.

        A job the worker reaches after a failure (queued by a main thread
        that an interrupt took away from its wait, or behind a stalled
        call) is not tried while the cache is down, and a failure here
        marks it down whether or not its caller still waits: otherwise a
        backlog of N such jobs cost every later call N timeouts."""
        with self._lock:
            if self._off is not None or time.monotonic() < self._down_until:
                return None
        try:
            with self._lock:
                owed, self._owed = self._owed, {}
            for stale, why in owed.items():
                try:
                    self._scripts["end"](keys=self._keys(stale), args=[int(self.ttl * 1000), "", why, 0])
                except BaseException:
                    with self._lock:
                        self._owed.setdefault(stale, why)
                    raise
            return self._scripts[script](keys=self._keys(key), args=[int(self.ttl * 1000), *args])
        except self._declared:
            self._mark_down()
            raise
        except BaseException:  # noqa: B902  (discard the connections, and raise it)
            self._mark_down()
            self._discard()
            raise

    def _mark_down(self) -> None:
        """No call is tried for the timeout's length after a failure."""
        with self._lock:
            self._down_until = time.monotonic() + self.timeout

    def _discard(self) -> None:
        """A fresh client for the next calls; the old one's idle connections
        closed now, those other threads are using when they are done
        (redis-py closes a connection it collects)."""
        old = self._client
        self._connect()
        with contextlib.suppress(Exception):
            old.connection_pool.disconnect(inuse_connections=False)

    def _turn_off(self, why: str) -> None:
        """The Redis server has fewer databases than the URL's db: the cache
        stays off in this process (reads from storage, writes count), said
        once; not tried again every ``timeout``."""
        db = self._client.connection_pool.connection_kwargs.get("db", 0)
        with self._lock:
            first, self._off = self._off is None, why
        if first:
            log.warning("the shared cache %s is off in this process: the Redis server has no db %s (%s: it has as "
                        "many as its 'databases' setting, 16 by default); totals are read from storage, writes "
                        "count as usual", self.url, db, why)

    def _warn(self, message: str) -> None:
        """Log ``message`` as a warning, at most once every ``_WARN_EVERY_S``
        seconds (a cache that fails fails on every call)."""
        now = time.monotonic()
        with self._lock:
            due = now - self._warned >= _WARN_EVERY_S
            if due:
                self._warned = now
        if due:
            log.warning("%s", message)

    def get(self, key: Hashable) -> int | None:
        found = self._call("get", key)
        if found is None:
            return None
        total = int(found) if _TOTAL.fullmatch(found) else INT64_MAX + 1
        if not -INT64_MAX - 1 <= total <= INT64_MAX:  # not ours (another program's key)
            self._warn(f"the shared cache {self.url} holds {found[:40]!r} for {key!r}, not a total: read from storage")
            return None
        return total

    def reading(self, key: Hashable) -> str | None:
        """Before reading a total from storage: a ticket for ``store``, or
        None when a write is in flight (the total will not be stored)."""
        found = self._call("ticket", key)
        return found.decode() if isinstance(found, bytes) else None

    def store(self, key: Hashable, total: int, ticket: Any) -> bool:
        if not isinstance(ticket, str):
            return False
        return bool(self._call("store", key, ticket, int(total)))

    @contextlib.contextmanager
    def writing(self, key: Hashable, amount: int | None) -> Iterator[None]:
        """Around a write that adds ``amount`` (None: an amount not known
        here, as a reset's); see the module's notes."""
        token = uuid.uuid4().hex
        entered = self._call("begin", key, token, int(self.lease * 1000)) == 1
        outcome = "unknown"
        try:
            yield
            outcome = "stored" if amount is not None else "dropped"
        except _NOT_STORED:
            outcome = "not stored"
            raise
        finally:
            if not entered and outcome != "not stored":
                outcome = "unknown"  # unannounced: a reader may have filled the total around it
            ended = None
            try:
                ended = self._call("end", key, token, outcome, int(amount or 0))
            finally:  # Redis failed, or an interrupt came: the end may not have reached it
                if ended is None and outcome != "not stored":
                    with self._lock:  # dropped at this process's next call that reaches Redis
                        self._owed[key] = "unknown" if outcome == "unknown" and entered else "forget"

    def invalidate(self, key: Hashable) -> None:
        with self.writing(key, None):
            pass

    def clear(self) -> None:
        """Drop every total of this storage (its keys under the prefix)."""
        def clearing() -> None:
            for name in self._client.scan_iter(match=self._scoped() + "*:total"):
                self._client.delete(name)

        try:
            self._hop.run(clearing, None)  # (each Redis step bounded by the timeout)
        except Exception as exc:  # noqa: B902  (any failure of the cache's)
            log.warning("the shared cache %s could not be cleared: %s", self.url, exc)
