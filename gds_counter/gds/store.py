"""Store: php-gds's front door, reading and writing one kind through a gateway.

Behaviour kept from php-gds: the default query is ``SELECT * FROM Kind ORDER
BY __key__ ASC``; ``query()`` remembers a query that ``fetch_one`` (LIMIT 1),
``fetch_all`` and ``fetch_page`` (cursor paging) then run; batch lookups keep
input order; ``begin_transaction()`` makes the next write transactional and
is used up by it. Added for Python: ``with store.transaction():``,
``run_in_transaction`` with backoff, ``fetch_all`` that follows every
batch instead of stopping at the first, and aggregations run by the server
(``count``, ``sum``, ``avg``, ``aggregate``).

Transaction state is per thread, so one Store may be shared by threads.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterable, Iterator, Sequence, TypeVar

from gds_counter.gateway import plan, resolve_gateway
from gds_counter.gateway.base import Gateway, iterate_batches
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Insert, Mutation, Update
from gds_counter.gateway.query import AggregationQuery, Query
from gds_counter.gds._mapper import from_raw
from gds_counter.gds._store_core import StoreCore
from gds_counter.gds.entity import Entity
from gds_counter.gds.schema import Schema
from gds_counter.gds.transaction import DEFAULT_RETRY, RetryPolicy, retry_plan

__all__ = ["Store"]

T = TypeVar("T")


class _TransactionState(threading.local):
    """This thread's transaction: a php-gds style pending token, or a block."""

    def __init__(self) -> None:
        self.token: bytes | None = None
        self.block_mutations: list[Mutation] | None = None


class Store(StoreCore):
    """php-gds's Store on a blocking gateway: every rule is ``StoreCore``'s
    (``gds._store_core``), run here with ``plan.run``."""

    def __init__(
        self,
        kind_or_schema: "str | Schema | type[Entity]",
        gateway: Gateway | str | None = None,
        *,
        namespace: str | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        super().__init__(
            kind_or_schema, resolve_gateway(gateway), namespace=namespace, retry=retry, slot=_TransactionState()
        )

    @property
    def gateway(self) -> Gateway:
        gateway: Gateway = self._gateway
        return gateway

    def _run(self, planned: plan.Plan[T]) -> T:
        return plan.run(planned, self._gateway)

    # --- writes -----------------------------------------------------------

    def upsert(self, entities: Entity | Iterable[Entity]) -> None:
        """Write entities; ids allocated for new ones are written back to them.

        Every entity is checked before anything is sent, so one bad value
        never leaves a batch half-written.
        """
        self._run(self._upsert(entities))

    def insert(self, entities: Entity | Iterable[Entity]) -> None:
        """``upsert``, for entities that must not exist yet: if one does,
        ``AlreadyExists`` is raised and it is not written. In a transaction
        nothing is; without one, the entities before it in the batch are
        written (with their ids, allocated first) and the rest are not, and
        the error says how many (php-gds has only upsert:
        docs/migrating-from-php.md)."""
        self._run(self._upsert(entities, Insert))

    def update(self, entities: Entity | Iterable[Entity]) -> None:
        """``upsert``, for entities that must exist (each with a complete
        key): if one does not, ``NotFound`` is raised and it is not written;
        as with ``insert``, a batch without a transaction keeps the entities
        before it."""
        self._run(self._upsert(entities, Update))

    def increment(self, entity: Entity, name: str, amount: int | float = 1) -> int | float:
        """Add ``amount`` to property ``name`` on the server, without
        reading it first, and return the new value: as Datastore adds, an
        integer (saturating at the 64-bit bounds), or a double when either
        side is one; a stored value that is not a number is replaced.

        One commit, no transaction: Datastore's PropertyTransform.increment
        (the Datastore-mode twin of Firestore's FieldValue.increment). The
        entity's other fields are written with a property mask, so stored
        properties the entity does not carry are kept. A missing property
        counts as 0. Raises ``TransformsIgnored`` when the server dropped the
        increment, so it is never reported as counted.
        """
        return self._run(self._increment(entity, name, amount))

    def delete(self, entities: Entity | Key | Iterable[Entity | Key]) -> None:
        self._run(self._delete(entities))

    # --- lookups -----------------------------------------------------------

    def fetch_by_id(self, key_id: int | str, parent: Entity | Key | None = None) -> Entity | None:
        return self.fetch_by_ids([key_id], parent)[0]

    def fetch_by_ids(self, key_ids: Sequence[int | str], parent: Entity | Key | None = None) -> list[Entity | None]:
        """One batch lookup; results in input order, None for missing.
        Decimal strings are accepted because php-gds passes ids as strings."""
        return self._run(self._fetch_keys(self._ids_keys(key_ids, parent)))

    def fetch_by_name(self, key_name: str, parent: Entity | Key | None = None) -> Entity | None:
        return self.fetch_by_names([key_name], parent)[0]

    def fetch_by_names(self, key_names: Sequence[str], parent: Entity | Key | None = None) -> list[Entity | None]:
        return self._run(self._fetch_keys(self._names_keys(key_names, parent)))

    def fetch_by_keys(self, keys: Sequence[Key]) -> list[Entity | None]:
        return self._run(self._fetch_keys(list(keys)))

    # --- queries -----------------------------------------------------------

    def fetch_one(self, query: str | Query | None = None, bindings: Any = None) -> Entity | None:
        return self._run(self._fetch_one(query, bindings))

    def fetch_all(self, query: str | Query | None = None, bindings: Any = None) -> list[Entity]:
        """Every result, following all batches (php-gds stopped at the
        first). As in php-gds, only ``fetch_page`` moves the paging cursor."""
        return self._run(self._fetch_all(query, bindings))

    def iter_all(self, query: str | Query | None = None, bindings: Any = None) -> Iterator[Entity]:
        """Like fetch_all, but yields as batches arrive, for large result sets."""
        self._use(query, bindings)
        for batch in iterate_batches(self.gateway, self._query, transaction=self._read_token()):
            for raw in batch.entities:
                yield from_raw(raw, self._schema)

    def fetch_page(self, page_size: int, offset: int | str | None = None) -> list[Entity]:
        """The next ``page_size`` results after the store's cursor.

        ``offset`` may be an int (skip that many) or a cursor string (start
        there); by default paging continues from the last page's end. A LIMIT
        in the query would fight with the page size (php-gds silently
        returned an empty page), so it is an error.
        """
        return self._run(self._fetch_page(page_size, offset))

    def fetch_entity_group(self, entity: Entity | Key) -> list[Entity]:
        """The entity and its descendants of this store's kind. As in
        php-gds, the remembered query is kept (fetch calls after this one
        run it, not the group query) and the cursor is left where the group
        query ended."""
        return self._run(self._fetch_entity_group(entity))

    # --- aggregations ---------------------------------------------------------

    def count(self, query: str | Query | None = None, bindings: Any = None, *, up_to: int | None = None) -> int:
        """How many results ``query`` has (GQL text or a Query; None: the
        remembered query, LIMIT and OFFSET included), counted by the server:
        one RPC and one entity read per started 1,000 index entries, however
        many there are. ``up_to`` stops counting there (``COUNT_UP_TO``),
        which also stops the cost. Like every aggregation here it leaves the
        remembered query and the cursor alone, and inside a transaction it
        reads in the transaction."""
        return self._run(self._count(query, bindings, up_to=up_to))

    def sum(self, name: str, query: str | Query | None = None, bindings: Any = None) -> int | float:
        """The sum of property ``name`` over ``query``'s results, by the
        server: only indexed numbers count (each list element; integers,
        doubles and, as integer microseconds, datetimes); an int when all
        were ints and the total fits in 64 bits, else a float; 0 for none."""
        return self._run(self._sum(name, query, bindings))

    def avg(self, name: str, query: str | Query | None = None, bindings: Any = None) -> float | None:
        """The average of property ``name`` over ``query``'s results (the
        values ``sum`` counts), as a float; None when there are none."""
        return self._run(self._avg(name, query, bindings))

    def aggregate(self, query: str | AggregationQuery, bindings: Any = None) -> dict[str, Any]:
        """Run an aggregation query (GQL ``SELECT COUNT(*) AS n ... `` or
        ``AGGREGATE ... OVER (...)``, or an ``AggregationQuery``) and return
        its values by alias, in order (unnamed ones are ``property_1``, ...)."""
        return self._run(self._aggregate(query, bindings))

    # --- transactions --------------------------------------------------------

    def begin_transaction(self, cross_group: bool = False, *, read_only: bool = False) -> "Store":
        """php-gds semantics: reads until the next write use this transaction,
        and the next upsert or delete commits it (and uses it up).

        ``cross_group`` is php-gds's ``beginTransaction($bol_cross_group)``
        flag, accepted so ported calls keep their shape; it has no effect
        (php-gds's own gRPC gateway ignores it too, and its REST gateway
        refuses True). Firestore in Datastore mode, which Cloud Datastore
        now runs on, has no entity-group limits to lift; the embedded engine
        has none either. (The legacy Datastore emulator still limits a
        transaction to 25 entity groups, flag or not.) ``read_only`` is
        keyword-only, so a ported ``begin_transaction(True)`` never means
        read-only by accident.
        """
        return self._run(self._begin_transaction(cross_group, read_only=read_only))

    @contextlib.contextmanager
    def transaction(self, *, read_only: bool = False) -> Iterator["Store"]:
        """Reads inside see one snapshot; writes are buffered and committed
        together on exit (raising ``Contention`` if another writer changed
        what was read). Any exception rolls back and is re-raised.
        ``read_only`` (keyword-only) rolls back on exit instead of committing.
        There are no entity groups to declare (see ``begin_transaction``)."""
        token = self._run(self._open_block(read_only))
        try:
            yield self
        except BaseException:
            self._run(self._abort_block(token))
            raise
        self._run(self._close_block(token, read_only))

    def run_in_transaction(self, work: Callable[["Store"], T], *, retry: RetryPolicy | None = None) -> T:
        """Run ``work(store)`` in a transaction, retrying with backoff when it
        conflicts; raise ``Contention`` with the attempt count when retries
        run out. ``work`` must be safe to repeat."""

        def attempt() -> plan.Plan[T]:
            token = yield from self._open_block(False)
            try:
                result = yield from plan.call(lambda: work(self))
            except GeneratorExit:
                raise  # closed, not driven: nothing can be sent (``plan.in_transaction``)
            except BaseException:
                yield from self._abort_block(token)
                raise
            yield from self._close_block(token, False)
            return result

        return self._run(
            retry_plan(
                attempt,
                retry or self._retry,
                what=f"transaction on {self._schema.kind}",
                on_retry=lambda n: self._gateway.stats.bump("retries"),
            )
        )
