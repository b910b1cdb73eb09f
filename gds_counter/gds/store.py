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

import base64
import binascii
import contextlib
import logging
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

from gds_counter._checks import check_int, is_int
from gds_counter.errors import (
    BadKeyError,
    BadValueError,
    GatewayError,
    GDSError,
    GQLError,
    SchemaError,
    TransformsIgnored,
)
from gds_counter.gateway import resolve_gateway
from gds_counter.gateway.base import Gateway, iterate_batches
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Increment, Mutation, Upsert
from gds_counter.gateway.query import Aggregation, AggregationQuery, Order, PropertyFilter, Query
from gds_counter.gateway.values import RawEntity
from gds_counter.gds import gql
from gds_counter.gds.entity import Entity, parent_key
from gds_counter.gds.mapper import from_raw, to_raw
from gds_counter.gds.schema import Schema
from gds_counter.gds.transaction import DEFAULT_RETRY, RetryPolicy, retry_contention

log = logging.getLogger(__name__)

T = TypeVar("T")


def _resolve_schema(kind_or_schema: "str | Schema | type[Entity]") -> Schema:
    if isinstance(kind_or_schema, Schema):
        return kind_or_schema
    if isinstance(kind_or_schema, str):
        return Schema(kind_or_schema)
    if isinstance(kind_or_schema, type) and issubclass(kind_or_schema, Entity):
        schema = kind_or_schema.schema()
        if schema is None:
            kind = kind_or_schema.kind()
            if kind is None:
                raise SchemaError(f"{kind_or_schema.__name__} declares no kind() or schema()")
            schema = Schema(kind)
        if schema.get_entity_class() is None:
            schema.set_entity_class(kind_or_schema)
        return schema
    raise SchemaError(f"a Store needs a kind name, a Schema or an Entity subclass, got {kind_or_schema!r}")


def encode_cursor(cursor: bytes | None) -> str | None:
    """Cursors travel as URL-safe text, e.g. in a 'next page' link."""
    return None if cursor is None else base64.urlsafe_b64encode(cursor).decode("ascii")


def decode_cursor(cursor: str | bytes | None) -> bytes | None:
    if cursor is None or isinstance(cursor, bytes):
        return cursor
    try:
        return base64.urlsafe_b64decode(cursor.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise BadValueError(f"not a cursor from this library: {cursor!r}") from None


class _TransactionState(threading.local):
    """This thread's transaction: a php-gds style pending token, or a block."""

    def __init__(self) -> None:
        self.token: bytes | None = None
        self.block_mutations: list[Mutation] | None = None


class Store:
    def __init__(
        self,
        kind_or_schema: "str | Schema | type[Entity]",
        gateway: Gateway | str | None = None,
        *,
        namespace: str | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
    ) -> None:
        self._schema = _resolve_schema(kind_or_schema)
        self._gateway = resolve_gateway(gateway)
        self._namespace = self._gateway.namespace if namespace is None else namespace
        self._retry = retry
        self._tx = _TransactionState()
        self._query = self._default_query()
        self._cursor: bytes | None = None

    # --- introspection ------------------------------------------------------

    @property
    def gateway(self) -> Gateway:
        return self._gateway

    @property
    def schema(self) -> Schema:
        return self._schema

    @property
    def namespace(self) -> str:
        return self._namespace

    def _default_query(self) -> Query:
        return Query(kind=self._schema.kind, namespace=self._namespace, order=(Order("__key__"),))

    # --- writes -----------------------------------------------------------

    def create_entity(self, data: Mapping[str, Any] | None = None) -> Entity:
        """A new entity of this store's kind and entity class, not yet saved."""
        entity_class: type[Entity] = self._schema.get_entity_class() or Entity
        entity = entity_class.__new__(entity_class)
        Entity.__init__(entity, data or {})
        entity.set_kind(self._schema.kind)
        entity.set_namespace(self._namespace)
        return entity

    def upsert(self, entities: Entity | Iterable[Entity]) -> None:
        """Write entities; ids allocated for new ones are written back to them.

        Every entity is checked before anything is sent, so one bad value
        never leaves a batch half-written.
        """
        batch = [entities] if isinstance(entities, Entity) else list(entities)
        raws = [to_raw(entity, self._schema, self._namespace) for entity in batch]
        if self._tx.block_mutations is not None:
            self._allocate_into(batch, raws)
            self._tx.block_mutations.extend(Upsert(raw) for raw in raws)
            return
        result = self._gateway.commit([Upsert(raw) for raw in raws], transaction=self._take_token())
        for entity, mutation_result in zip(batch, result.mutation_results):
            if mutation_result.key is not None and entity.get_key_id() is None and entity.get_key_name() is None:
                entity.set_key_id(mutation_result.key.id)

    def increment(self, entity: Entity, name: str, amount: int = 1) -> int:
        """Add ``amount`` to integer property ``name`` on the server, without
        reading it first, and return the new value.

        One commit, no transaction: Datastore's PropertyTransform.increment
        (the Datastore-mode twin of Firestore's FieldValue.increment). The
        entity's other fields are written with a property mask, so stored
        properties the entity does not carry are kept. A missing property
        counts as 0. Raises ``TransformsIgnored`` when the server dropped the
        increment, so it is never reported as counted.
        """
        check_int(amount, "increment amount")
        if not self._gateway.capabilities.applies_transforms:
            # Such a server ignores the property mask too and would replace
            # the whole entity with the masked fields: refuse before sending.
            raise TransformsIgnored(f"{self._gateway!r} does not apply increment transforms; nothing was sent")
        raw = to_raw(entity, self._schema, self._namespace)
        if raw.key is None or raw.key.is_partial:
            raise BadKeyError(f"cannot increment {entity!r}: it has no complete key")
        fields = {n: v for n, v in raw.properties.items() if n != name}
        raw = RawEntity(raw.key, fields, raw.unindexed | ({name} if not self._schema.is_indexed(name) else set()))
        mutation = Upsert(raw, property_mask=tuple(sorted(fields)), transforms=(Increment(name, amount),))
        if self._tx.block_mutations is not None:
            raise GatewayError("increment() commits at once; call it outside a transaction block")
        result = self._gateway.commit([mutation], transaction=self._take_token())
        values = result.mutation_results[0].transform_results
        if not values:
            raise TransformsIgnored(f"the server ignored the increment of {raw.key}.{name}; nothing was counted")
        entity[name] = values[0]
        return int(values[0])

    def _allocate_into(self, batch: list[Entity], raws: list[RawEntity]) -> None:
        """Inside a transaction block writes are buffered until commit, but
        callers expect ids at once: allocate them now."""
        partial = [i for i, raw in enumerate(raws) if raw.key is not None and raw.key.is_partial]
        if not partial:
            return
        keys = self._gateway.allocate_ids([raws[i].key for i in partial])  # type: ignore[misc]
        for i, key in zip(partial, keys):
            batch[i].set_key_id(key.id)
            raws[i] = RawEntity(key, raws[i].properties, raws[i].unindexed)

    def delete(self, entities: Entity | Key | Iterable[Entity | Key]) -> None:
        batch = [entities] if isinstance(entities, (Entity, Key)) else list(entities)
        keys = [self._key_of(item) for item in batch]
        mutations = [Delete(key) for key in keys]
        if self._tx.block_mutations is not None:
            self._tx.block_mutations.extend(mutations)
            return
        self._gateway.commit(mutations, transaction=self._take_token())

    def _key_of(self, item: Entity | Key) -> Key:
        key = item if isinstance(item, Key) else item.get_key()
        if key is None or key.is_partial:
            raise BadKeyError(f"cannot delete {item!r}: it has no complete key")
        return key

    # --- lookups -----------------------------------------------------------

    def _key(self, ident: int | str, parent: Entity | Key | None) -> Key:
        parent = parent_key(parent)
        flat = parent.flat_path if parent is not None else ()
        return Key.of(*flat, self._schema.kind, ident, namespace=self._namespace)

    def _lookup(self, keys: list[Key]) -> list[Entity | None]:
        raws = self._gateway.lookup(keys, transaction=self._read_token())
        return [None if raw is None else from_raw(raw, self._schema) for raw in raws]

    def fetch_by_id(self, key_id: int | str, parent: Entity | Key | None = None) -> Entity | None:
        return self.fetch_by_ids([key_id], parent)[0]

    def fetch_by_ids(self, key_ids: Sequence[int | str], parent: Entity | Key | None = None) -> list[Entity | None]:
        """One batch lookup; results in input order, None for missing.
        Decimal strings are accepted because php-gds passes ids as strings."""
        return self._lookup([self._key(_as_id(key_id), parent) for key_id in key_ids])

    def fetch_by_name(self, key_name: str, parent: Entity | Key | None = None) -> Entity | None:
        return self.fetch_by_names([key_name], parent)[0]

    def fetch_by_names(self, key_names: Sequence[str], parent: Entity | Key | None = None) -> list[Entity | None]:
        for name in key_names:
            if not isinstance(name, str):
                raise BadKeyError(f"key name must be a string, got {type(name).__name__} {name!r}")
        return self._lookup([self._key(name, parent) for name in key_names])

    def fetch_by_keys(self, keys: Sequence[Key]) -> list[Entity | None]:
        return self._lookup(list(keys))

    # --- queries -----------------------------------------------------------

    def query(self, query: str | Query | None = None, bindings: Mapping[str, Any] | Sequence[Any] | None = None) -> "Store":
        """Remember a query (GQL text or a structured Query) for the fetch
        calls that follow; resets the cursor. None restores the default."""
        if query is None:
            self._query = self._default_query()
        elif isinstance(query, Query):
            if bindings:
                raise GQLError("bindings are only for GQL text; a structured Query holds its values")
            self._query = query if query.namespace else query.replace(namespace=self._namespace)
        elif isinstance(query, str):
            self._query = gql.parse(query, bindings, namespace=self._namespace)
        else:
            raise GQLError(f"a query is GQL text or a Query, got {type(query).__name__}")
        self._cursor = None
        return self

    def _use(self, query: str | Query | None, bindings: Any) -> None:
        if query is not None:
            self.query(query, bindings)

    def fetch_one(self, query: str | Query | None = None, bindings: Any = None) -> Entity | None:
        self._use(query, bindings)
        limit = 1 if self._query.limit is None else min(1, self._query.limit)
        batch = self._gateway.run_query(self._query.replace(limit=limit), transaction=self._read_token())
        return from_raw(batch.entities[0], self._schema) if batch.entities else None

    def fetch_all(self, query: str | Query | None = None, bindings: Any = None) -> list[Entity]:
        """Every result, following all batches (php-gds stopped at the
        first). As in php-gds, only ``fetch_page`` moves the paging cursor."""
        return list(self.iter_all(query, bindings))

    def iter_all(self, query: str | Query | None = None, bindings: Any = None) -> Iterator[Entity]:
        """Like fetch_all, but yields as batches arrive, for large result sets."""
        self._use(query, bindings)
        yield from self._results(self._query)

    def _results(self, query: Query) -> Iterator[Entity]:
        for batch in iterate_batches(self._gateway, query, transaction=self._read_token()):
            for raw in batch.entities:
                yield from_raw(raw, self._schema)

    def fetch_page(self, page_size: int, offset: int | str | None = None) -> list[Entity]:
        """The next ``page_size`` results after the store's cursor.

        ``offset`` may be an int (skip that many) or a cursor string (start
        there); by default paging continues from the last page's end. A LIMIT
        in the query would fight with the page size (php-gds silently
        returned an empty page), so it is an error.
        """
        if not is_int(page_size) or page_size < 1:
            raise BadValueError(f"page size must be a positive int, got {page_size!r}")
        if self._query.limit is not None:
            raise GQLError(
                f"the query already has LIMIT {self._query.limit}; fetch_page({page_size}) sets its own "
                "limit, so remove the LIMIT from the query"
            )
        query = self._query.replace(limit=page_size)
        if is_int(offset):
            query = query.replace(offset=offset)
        elif offset is not None:
            query = query.replace(start_cursor=decode_cursor(offset))
        elif self._cursor is not None:
            query = query.replace(start_cursor=self._cursor)
        page: list[Entity] = []
        for batch in iterate_batches(self._gateway, query, transaction=self._read_token()):
            page.extend(from_raw(raw, self._schema) for raw in batch.entities)
            self._cursor = batch.end_cursor if batch.end_cursor is not None else self._cursor
        return page

    @property
    def cursor(self) -> str | None:
        """Where the last fetch ended, as URL-safe text (php-gds getCursor)."""
        return encode_cursor(self._cursor)

    def set_cursor(self, cursor: str | bytes | None) -> "Store":
        self._cursor = decode_cursor(cursor)
        return self

    def fetch_entity_group(self, entity: Entity | Key) -> list[Entity]:
        """The entity and its descendants of this store's kind. As in
        php-gds, the remembered query is kept (fetch calls after this one
        run it, not the group query) and the cursor is left where the group
        query ended."""
        ancestor = entity if isinstance(entity, Key) else entity.__gds_key__()
        query = Query(
            kind=self._schema.kind,
            namespace=ancestor.namespace,
            filter=PropertyFilter("__key__", "HAS_ANCESTOR", ancestor),
        )
        found: list[Entity] = []
        for batch in iterate_batches(self._gateway, query, transaction=self._read_token()):
            found.extend(from_raw(raw, self._schema) for raw in batch.entities)
            self._cursor = batch.end_cursor
        return found

    # --- aggregations ---------------------------------------------------------

    def count(
        self, query: str | Query | None = None, bindings: Any = None, *, up_to: int | None = None
    ) -> int:
        """How many results ``query`` has (GQL text or a Query; None: the
        remembered query, LIMIT and OFFSET included), counted by the server:
        one RPC and one entity read per started 1,000 index entries, however
        many there are. ``up_to`` stops counting there (``COUNT_UP_TO``),
        which also stops the cost. Like every aggregation here it leaves the
        remembered query and the cursor alone, and inside a transaction it
        reads in the transaction."""
        if up_to is not None:
            check_int(up_to, "count up_to", low=0)
        item = Aggregation.count() if up_to is None else Aggregation.count_up_to(up_to)
        return int(self._aggregate_one(item, query, bindings))

    def sum(self, name: str, query: str | Query | None = None, bindings: Any = None) -> int | float:
        """The sum of property ``name`` over ``query``'s results, by the
        server: only indexed numbers count (each list element; integers,
        doubles and, as integer microseconds, datetimes); an int when all
        were ints and the total fits in 64 bits, else a float; 0 for none."""
        self._check_aggregated(name, "sum")
        value: int | float = self._aggregate_one(Aggregation.sum(name), query, bindings)
        return value

    def avg(self, name: str, query: str | Query | None = None, bindings: Any = None) -> float | None:
        """The average of property ``name`` over ``query``'s results (the
        values ``sum`` counts), as a float; None when there are none."""
        self._check_aggregated(name, "avg")
        value: float | None = self._aggregate_one(Aggregation.avg(name), query, bindings)
        return value

    def aggregate(self, query: str | AggregationQuery, bindings: Any = None) -> dict[str, Any]:
        """Run an aggregation query (GQL ``SELECT COUNT(*) AS n ... `` or
        ``AGGREGATE ... OVER (...)``, or an ``AggregationQuery``) and return
        its values by alias, in order (unnamed ones are ``property_1``, ...)."""
        if isinstance(query, str):
            aggregation = gql.parse_aggregation(query, bindings, namespace=self._namespace)
        elif isinstance(query, AggregationQuery):
            if bindings:
                raise GQLError("bindings are only for GQL text; an AggregationQuery holds its values")
            aggregation = query if query.query.namespace else query.replace(query=query.query.replace(namespace=self._namespace))
        else:
            raise GQLError(f"an aggregation is GQL text or an AggregationQuery, got {type(query).__name__} {query!r}")
        return dict(self._gateway.run_aggregation(aggregation, transaction=self._read_token()))

    def _aggregate_one(self, item: Aggregation, query: str | Query | None, bindings: Any) -> Any:
        if query is None:
            if bindings:
                raise GQLError("bindings are only for GQL text; no query was given")
            over = self._query
        elif isinstance(query, Query):
            if bindings:
                raise GQLError("bindings are only for GQL text; a structured Query holds its values")
            over = query if query.namespace else query.replace(namespace=self._namespace)
        elif isinstance(query, str):
            over = gql.parse(query, bindings, namespace=self._namespace)
        else:
            raise GQLError(f"a query is GQL text or a Query, got {type(query).__name__} {query!r}")
        result = self._gateway.run_aggregation(AggregationQuery(over, (item,)), transaction=self._read_token())
        return next(iter(result.values()))

    def _check_aggregated(self, name: Any, what: str) -> None:
        """A property the schema keeps out of the indexes would always add
        up to nothing (Datastore aggregates index entries): say so instead."""
        if isinstance(name, str) and not self._schema.is_indexed(name):
            raise SchemaError(
                f"{what}({name!r}): {self._schema.kind} stores {name!r} unindexed, and Datastore aggregates only "
                "indexed values; index it in the schema"
            )

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
        if not isinstance(cross_group, bool):
            raise BadValueError(f"cross_group must be True or False, got {type(cross_group).__name__} {cross_group!r}")
        if self._tx.block_mutations is not None:
            raise GatewayError("a transaction block is open on this store in this thread; end it first")
        pending = self._take_token()
        if pending is not None:
            # php-gds replaces a pending transaction; roll the old one back so
            # a locking server (Firestore) frees its locks at once.
            log.info("begin_transaction() replaces a pending transaction on %s; rolling it back", self._schema.kind)
            self._gateway.rollback(pending)
        self._tx.token = self._gateway.begin_transaction(read_only=read_only)
        return self

    def _take_token(self) -> bytes | None:
        token, self._tx.token = self._tx.token, None
        return token

    def _read_token(self) -> bytes | None:
        return self._tx.token

    @contextlib.contextmanager
    def transaction(self, *, read_only: bool = False) -> Iterator["Store"]:
        """Reads inside see one snapshot; writes are buffered and committed
        together on exit (raising ``Contention`` if another writer changed
        what was read). Any exception rolls back and is re-raised.
        ``read_only`` (keyword-only) rolls back on exit instead of committing.
        There are no entity groups to declare (see ``begin_transaction``)."""
        self.begin_transaction(read_only=read_only)
        token = self._tx.token
        assert token is not None
        self._tx.block_mutations = []
        try:
            yield self
        except BaseException:
            self._end_block()
            with contextlib.suppress(GatewayError):
                self._gateway.rollback(token)
            raise
        mutations = self._end_block()
        if read_only:
            self._gateway.rollback(token)
            return
        try:
            self._gateway.commit(mutations, transaction=token)
        except GDSError:
            # A commit that never arrived leaves the transaction open, and on
            # a server with locks (Firestore) its locks block other writers
            # until they expire. Rolling back is harmless if it did arrive.
            with contextlib.suppress(GDSError):
                self._gateway.rollback(token)
            raise

    def _end_block(self) -> list[Mutation]:
        mutations = self._tx.block_mutations or []
        self._tx.block_mutations = None
        self._tx.token = None
        return mutations

    def run_in_transaction(self, work: Callable[["Store"], T], *, retry: RetryPolicy | None = None) -> T:
        """Run ``work(store)`` in a transaction, retrying with backoff when it
        conflicts; raise ``Contention`` with the attempt count when retries
        run out. ``work`` must be safe to repeat."""

        def attempt() -> T:
            with self.transaction():
                return work(self)

        return retry_contention(
            attempt,
            retry or self._retry,
            what=f"transaction on {self._schema.kind}",
            on_retry=lambda n: self._gateway.stats.bump("retries"),
        )


def _as_id(key_id: Any) -> int:
    if isinstance(key_id, str) and key_id.isdigit():
        return int(key_id)
    return check_int(key_id, "key id", error=BadKeyError)
