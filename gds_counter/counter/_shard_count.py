"""How many shards a counter has, and the record of it every process reads:
the config entity (kind ``layout.config_kind``, key name = the counter's
name, ``num_shards``), or for a counter of documents its own document.

Shards only grow. A process learns the recorded count before its first
write (``_writable``), records a larger one before it writes beyond the
layout's default (``_ensure_recorded``; ``increase_shards`` and growth under
contention go through ``_record`` too), and learns what others recorded
from any read of the config. A counter of documents (Firestore's page)
records its count at its first write and makes every shard document of it
exist (``_create_shards``), for the page's writers, which ``update``.
``ShardCount`` is ``CounterCore``'s part that holds this; the engine
(``_engine``) holds the rest.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Hashable, Sequence

from gds_counter.counter._lone import HashedKey, SharedRead
from gds_counter.counter.layout import Layout
from gds_counter.counter.runtime import Runtime
from gds_counter.errors import GDSError
from gds_counter.gateway import plan
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Mutation, Upsert, path_of
from gds_counter.gateway.values import RawEntity
from gds_counter.gds.transaction import RetryPolicy, retry_plan

__all__ = ["ShardCount"]

log = logging.getLogger("gds_counter.counter.sharded")  # the engine's logger: one name for a counter's logs


class ShardCount:
    """The shard count of one counter: what this process writes into, what
    it knows is recorded, and (documents) which shard documents it knows
    exist. ``CounterCore`` sets these attributes in its constructor."""

    layout: Layout
    name: str
    _lock: threading.Lock
    _config_key: Key
    _config_seen: bool
    _num_shards: int
    #: The largest shard count known to be recorded in the config.
    _recorded: int
    #: Shards known to exist as documents (a ``documents`` layout creates
    #: every shard it records, for the page's writers, which ``update``).
    _created: int
    _retry: RetryPolicy
    _runtime: Runtime
    _ident: Hashable

    def _shard_keys(self, count: int) -> list[Key]:
        raise NotImplementedError

    def _must_record(self) -> bool:
        raise NotImplementedError

    def _writable(self) -> plan.Plan[None]:
        """Know how many shards to write into before the first write."""
        if not self._config_seen:
            [config] = yield from plan.lookup([self._config_key])
            self._learn(self.layout.config_of(config))

    def _learn(self, recorded: int | None) -> None:
        with self._lock:
            self._config_seen = True
            if recorded is None:
                self._num_shards = self._num_shards or self.layout.default_shards
                return
            if self._created >= self._recorded:  # not while it owes shards it recorded (_record, _create_shards)
                self._created = max(self._created, recorded)  # another writer's record: it created them
            self._recorded = max(self._recorded, recorded)
            if recorded > self._num_shards:
                if self._num_shards:
                    log.info("%s has grown to %d shards", self, recorded)
                self._num_shards = recorded

    def _record(self, decide: Callable[[int | None], int]) -> plan.Plan[None]:
        """In one transaction (retried on conflict), read the recorded shard
        count, let ``decide`` say what it should be, write it if it grew, and
        learn the result."""
        before: list[int] = [0]  # what the config held when this process recorded more
        if self.layout.documents:
            # The shard documents first, for the count the stored one now
            # decides (a refusal is raised here, before anything is written):
            # none is missing if this process dies after recording it.
            [config] = yield from plan.lookup([self._config_key])
            yield from self._create_shards(decide(self.layout.config_of(config)))

        def attempt() -> plan.Plan[int]:
            outcome: list[int] = []

            def work(token: bytes) -> plan.Plan[Sequence[Mutation]]:
                [stored] = yield from plan.lookup([self._config_key], transaction=token)
                recorded = self.layout.config_of(stored)
                outcome[:] = [decide(recorded)]
                before[0] = recorded or 0
                if outcome[0] <= (recorded or 0):
                    return []
                if self.layout.documents:  # maybe recorded from here on (an answer may be lost)
                    with self._lock:
                        owed = self._created < outcome[0]  # shards not made before: this process's to create
                        self._recorded = max(self._recorded, outcome[0])
                        self._created = min(self._created, before[0]) if owed else self._created
                fields = {self.layout.config_property: outcome[0]}
                # A counter document is the app's too: keep its other fields.
                mask = (path_of(self.layout.config_property),) if self.layout.documents else None
                return [Upsert(RawEntity(self._config_key, fields), property_mask=mask)]

            yield from plan.in_transaction(work)
            return outcome[0]

        decided = yield from retry_plan(attempt, self._retry, what=f"recording the shards of {self}")
        self._learn(decided)
        if self.layout.documents and self._created < self._num_shards:
            yield from self._create_shards()

    def _create_shards(self, upto: int | None = None) -> plan.Plan[None]:
        """Make shard documents up to ``upto`` (the recorded count) exist, as
        the page's ``init_counter`` does: its writers ``update``, an error on
        a missing one. An increment by 0 keeps a count written meanwhile. A
        failure is logged and tried again at the next write, never raised
        (our own writes create the shard they write)."""
        first, upto = self._created, self._num_shards if upto is None else upto
        if upto <= first:
            return
        count = path_of(self.layout.count_property)
        creations = [
            Upsert(self.layout.shard_entity_at(key, self.name, None), property_mask=(), transforms=(Increment(count, 0),))
            for key in self._shard_keys(upto)[first:]
        ]
        try:
            yield from plan.commit(creations)
        except GDSError as exc:
            log.warning("%s: creating shard documents %d-%d failed (tried again at the next write): %s", self, first, upto - 1, exc)
            return
        with self._lock:
            self._created = max(self._created, upto)

    def _ensure_recorded(self) -> plan.Plan[None]:
        """Before writing beyond the default shards, make sure the config
        says so, or a reader built with the default would miss those shards;
        a counter of documents records (and creates) every shard it writes."""
        wanted = self._num_shards
        if not self._must_record():
            return

        def record() -> plan.Plan[None]:
            yield from self._record(lambda stored: max(stored or 0, wanted))

        runtime = self._runtime
        if not (self.layout.documents and runtime.share_reads):
            yield from record()
            return
        # A counter of documents records its shards at its first write: the
        # callers of one process that write at once share one transaction
        # on the counter document (as a read of the total is shared), not
        # one each (20 tasks at once timed out on the emulator's locks).
        key = HashedKey(("record", self.layout, self._ident, wanted))
        yield from plan.ask(SharedRead(runtime.shared, runtime.async_shared, key, record, lambda: None))
