"""The Store's rules, shared by its blocking face (``gds.store.Store``) and
its asyncio face (``gds_counter.aio.Store``).

``StoreCore`` holds a Store's state (schema, namespace, remembered query,
cursor, this thread's or task's transaction) and every operation that
touches storage as a plan (``gateway.plan``): mapping entities to raw ones
and back, key building, php-gds's query and paging rules, transactions.
The faces only run those plans, blocking or awaited.
"""

from __future__ import annotations

import base64
import binascii
import logging
from typing import Any, Iterable, Mapping, Protocol, Sequence

from typing_extensions import Self

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
from gds_counter.gateway import plan
from gds_counter.gateway.keys import Key, require_complete
from gds_counter.gateway.mutations import Delete, Increment, Insert, Mutation, Update, Upsert, path_of
from gds_counter.gateway.query import Aggregation, AggregationQuery, Order, PropertyFilter, Query
from gds_counter.gateway.values import RawEntity
from gds_counter.gds import gql
from gds_counter.gds._mapper import from_raw, to_raw
from gds_counter.gds.entity import Entity, child_key, parent_key
from gds_counter.gds.schema import Schema
from gds_counter.gds.transaction import RetryPolicy

__all__ = ["StoreCore", "TransactionSlot", "decode_cursor", "encode_cursor"]

log = logging.getLogger("gds_counter.gds.store")  # the name logging configuration knows


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
    if not isinstance(cursor, str):
        raise BadValueError(f"a cursor is the text Store.cursor gave, got {type(cursor).__name__} {cursor!r}")
    try:
        decoded = base64.urlsafe_b64decode(cursor.encode("ascii"))
    except (binascii.Error, UnicodeEncodeError, ValueError):
        decoded = b""
    if not decoded:  # (also "" and "!!!!", which decode to nothing: no cursor restarts the query)
        raise BadValueError(f"not a cursor from this library: {cursor!r}")
    return decoded


class TransactionSlot(Protocol):
    """Where a Store keeps the caller's transaction: a php-gds style pending
    token, or an open block's buffered writes. Per thread on the blocking
    face, per asyncio task on the async one."""

    token: bytes | None
    block_mutations: list[Mutation] | None


class StoreCore:
    """A Store's state and rules; ``gateway`` is resolved by the face."""

    def __init__(
        self,
        kind_or_schema: "str | Schema | type[Entity]",
        gateway: Any,
        *,
        namespace: str | None,
        retry: RetryPolicy,
        slot: TransactionSlot,
    ) -> None:
        if not isinstance(retry, RetryPolicy):
            raise BadValueError(f"retry must be a RetryPolicy, got {type(retry).__name__} {retry!r}")
        self._schema = _resolve_schema(kind_or_schema)
        self._gateway = gateway
        self._namespace = gateway.namespace if namespace is None else namespace
        self._retry = retry
        self._tx = slot
        self._query = self._default_query()
        self._cursor: bytes | None = None

    @property
    def schema(self) -> Schema:
        return self._schema

    @property
    def namespace(self) -> str:
        return self._namespace

    def _default_query(self) -> Query:
        return Query(kind=self._schema.kind, namespace=self._namespace, order=(Order("__key__"),))

    def create_entity(self, data: Mapping[str, Any] | None = None) -> Entity:
        """A new entity of this store's kind and entity class, not yet saved."""
        entity_class: type[Entity] = self._schema.get_entity_class() or Entity
        entity = entity_class.__new__(entity_class)
        Entity.__init__(entity, data or {})
        entity.set_kind(self._schema.kind)
        entity.set_namespace(self._namespace)
        return entity

    # --- writes -----------------------------------------------------------

    def _upsert(self, entities: Entity | Iterable[Entity], mode: type[Upsert] = Upsert) -> plan.Plan[None]:
        """Every entity is checked before anything is sent, so one bad value
        never leaves a batch half-written; allocated ids are written back.
        ``mode``: ``Insert`` or ``Update`` to require that each entity does
        not exist, or does (the commit then writes nothing)."""
        batch = [entities] if isinstance(entities, Entity) else list(entities)
        raws = [to_raw(entity, self._schema, self._namespace) for entity in batch]
        if mode is Update:  # now, not at the end of a transaction block
            for raw in raws:
                require_complete(raw.key, "Store.update")
        if self._tx.block_mutations is not None or mode is Insert:
            # Ids now (callers expect them at once in a transaction block),
            # and always for inserts: a batch that stops at an entity that
            # exists keeps the ones before it, which must carry their ids,
            # or inserting the batch again would store them twice.
            yield from self._allocate_into(batch, raws)
        if self._tx.block_mutations is not None:
            self._tx.block_mutations.extend(mode(raw) for raw in raws)
            return
        result = yield from plan.commit([mode(raw) for raw in raws], transaction=self._take_token())
        for entity, mutation_result in zip(batch, result.mutation_results):
            if mutation_result.key is not None and entity.get_key_id() is None and entity.get_key_name() is None:
                entity.set_key_id(mutation_result.key.id)

    def _increment(self, entity: Entity, name: str, amount: int | float = 1) -> plan.Plan[int | float]:
        """The server-side increment (see ``Store.increment``)."""
        if not isinstance(amount, float):
            check_int(amount, "increment amount")
        capabilities = yield from plan.capabilities()
        if not capabilities.applies_transforms:
            # Such a server ignores the property mask too and would replace
            # the whole entity with the masked fields: refuse before sending.
            raise TransformsIgnored(f"{self._gateway!r} does not apply increment transforms; nothing was sent")
        raw = to_raw(entity, self._schema, self._namespace)
        if raw.key is None or raw.key.is_partial:
            raise BadKeyError(f"cannot increment {entity!r}: it has no complete key")
        fields = {n: v for n, v in raw.properties.items() if n != name}
        raw = RawEntity(raw.key, fields, raw.unindexed | ({name} if not self._schema.is_indexed(name) else set()))
        # Names, not paths: a field named ``a.b`` or ``a-b`` is one property (``path_of`` quotes it).
        mutation = Upsert(raw, property_mask=tuple(sorted(map(path_of, fields))), transforms=(Increment(path_of(name), amount),))
        if self._tx.block_mutations is not None:
            raise GatewayError("increment() commits at once; call it outside a transaction block")
        result = yield from plan.commit([mutation], transaction=self._take_token())
        values = result.mutation_results[0].transform_results
        if not values:
            raise TransformsIgnored(f"the server ignored the increment of {raw.key}.{name}; nothing was counted")
        entity[name] = values[0]
        value: int | float = values[0]  # a double stays one: 1.5 + 1 is 2.5, never 2
        return value

    def _allocate_into(self, batch: list[Entity], raws: list[RawEntity]) -> plan.Plan[None]:
        """Inside a transaction block writes are buffered until commit, but
        callers expect ids at once: allocate them now."""
        partial = [i for i, raw in enumerate(raws) if raw.key is not None and raw.key.is_partial]
        if not partial:
            return
        keys = yield from plan.allocate_ids([raws[i].key for i in partial])  # type: ignore[misc]
        for i, key in zip(partial, keys):
            batch[i].set_key_id(key.id)
            raws[i] = RawEntity(key, raws[i].properties, raws[i].unindexed)

    def _delete(self, entities: Entity | Key | Iterable[Entity | Key]) -> plan.Plan[None]:
        if isinstance(entities, (Entity, Key)):
            batch: list[Any] = [entities]
        elif isinstance(entities, Iterable) and not isinstance(entities, (str, bytes, Mapping)):
            batch = list(entities)
        else:
            raise BadKeyError(f"cannot delete {entities!r}: give an Entity, a Key, or an iterable of them")
        keys = [self._key_of(item) for item in batch]
        mutations = [Delete(key) for key in keys]
        if self._tx.block_mutations is not None:
            self._tx.block_mutations.extend(mutations)
            return
        yield from plan.commit(mutations, transaction=self._take_token())

    def _key_of(self, item: Entity | Key) -> Key:
        if not isinstance(item, (Entity, Key)):
            raise BadKeyError(f"cannot delete {item!r}: give an Entity or a Key")
        key = item if isinstance(item, Key) else item.get_key()
        if key is None or key.is_partial:
            raise BadKeyError(f"cannot delete {item!r}: it has no complete key")
        return key

    # --- lookups -----------------------------------------------------------

    def _key(self, ident: int | str, parent: Entity | Key | None) -> Key:
        return child_key(parent_key(parent), self._schema.kind, ident, self._namespace)

    def _ids_keys(self, key_ids: Sequence[int | str], parent: Entity | Key | None) -> list[Key]:
        """Decimal strings are accepted because php-gds passes ids as strings."""
        return [self._key(_as_id(key_id), parent) for key_id in key_ids]

    def _names_keys(self, key_names: Sequence[str], parent: Entity | Key | None) -> list[Key]:
        for name in key_names:
            if not isinstance(name, str):
                raise BadKeyError(f"key name must be a string, got {type(name).__name__} {name!r}")
        return [self._key(name, parent) for name in key_names]

    def _fetch_keys(self, keys: Sequence[Key]) -> plan.Plan[list[Entity | None]]:
        """One batch lookup; results in input order, None for missing."""
        raws = yield from plan.lookup(list(keys), transaction=self._read_token())
        return [None if raw is None else from_raw(raw, self._schema) for raw in raws]

    # --- queries -----------------------------------------------------------

    def query(self, query: str | Query | None = None, bindings: Mapping[str, Any] | Sequence[Any] | None = None) -> Self:
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

    def _fetch_one(self, query: str | Query | None = None, bindings: Any = None) -> plan.Plan[Entity | None]:
        self._use(query, bindings)
        limit = 1 if self._query.limit is None else min(1, self._query.limit)
        batch = yield from plan.run_query(self._query.replace(limit=limit), transaction=self._read_token())
        return from_raw(batch.entities[0], self._schema) if batch.entities else None

    def _fetch_all(self, query: str | Query | None = None, bindings: Any = None) -> plan.Plan[list[Entity]]:
        """Every result, following all batches (php-gds stopped at the
        first). As in php-gds, only ``fetch_page`` moves the paging cursor."""
        self._use(query, bindings)
        raws = yield from plan.query_all(self._query, transaction=self._read_token())
        return [from_raw(raw, self._schema) for raw in raws]

    def _page_query(self, page_size: int, offset: int | str | None) -> Query:
        """The query of ``fetch_page``: php-gds's paging rules."""
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
        return query

    def _fetch_page(self, page_size: int, offset: int | str | None = None) -> plan.Plan[list[Entity]]:
        query = self._page_query(page_size, offset)
        page: list[Entity] = []
        for batch in (yield from plan.query_batches(query, transaction=self._read_token())):
            page.extend(from_raw(raw, self._schema) for raw in batch.entities)
            self._cursor = batch.end_cursor if batch.end_cursor is not None else self._cursor
        return page

    @property
    def cursor(self) -> str | None:
        """Where the last fetch ended, as URL-safe text (php-gds getCursor)."""
        return encode_cursor(self._cursor)

    def set_cursor(self, cursor: str | bytes | None) -> Self:
        self._cursor = decode_cursor(cursor)
        return self

    def _fetch_entity_group(self, entity: Entity | Key) -> plan.Plan[list[Entity]]:
        """The entity and its descendants of this store's kind. As in
        php-gds, the remembered query is kept and the cursor is left where
        the group query ended."""
        ancestor = entity if isinstance(entity, Key) else entity.__gds_key__()
        query = Query(
            kind=self._schema.kind,
            namespace=ancestor.namespace,
            filter=PropertyFilter("__key__", "HAS_ANCESTOR", ancestor),
        )
        found: list[Entity] = []
        for batch in (yield from plan.query_batches(query, transaction=self._read_token())):
            found.extend(from_raw(raw, self._schema) for raw in batch.entities)
            self._cursor = batch.end_cursor
        return found

    # --- aggregations ---------------------------------------------------------

    def _count(self, query: str | Query | None = None, bindings: Any = None, *, up_to: int | None = None) -> plan.Plan[int]:
        if up_to is not None:
            check_int(up_to, "count up_to", low=0)
        item = Aggregation.count() if up_to is None else Aggregation.count_up_to(up_to)
        return int((yield from self._aggregate_one(item, query, bindings)))

    def _sum(self, name: str, query: str | Query | None = None, bindings: Any = None) -> plan.Plan[int | float]:
        self._check_aggregated(name, "sum")
        value: int | float = yield from self._aggregate_one(Aggregation.sum(name), query, bindings)
        return value

    def _avg(self, name: str, query: str | Query | None = None, bindings: Any = None) -> plan.Plan[float | None]:
        self._check_aggregated(name, "avg")
        value: float | None = yield from self._aggregate_one(Aggregation.avg(name), query, bindings)
        return value

    def _aggregate(self, query: str | AggregationQuery, bindings: Any = None) -> plan.Plan[dict[str, Any]]:
        if isinstance(query, str):
            aggregation = gql.parse_aggregation(query, bindings, namespace=self._namespace)
        elif isinstance(query, AggregationQuery):
            if bindings:
                raise GQLError("bindings are only for GQL text; an AggregationQuery holds its values")
            aggregation = query if query.query.namespace else query.replace(query=query.query.replace(namespace=self._namespace))
        else:
            raise GQLError(f"an aggregation is GQL text or an AggregationQuery, got {type(query).__name__} {query!r}")
        return dict((yield from plan.run_aggregation(aggregation, transaction=self._read_token())))

    def _aggregate_one(self, item: Aggregation, query: str | Query | None, bindings: Any) -> plan.Plan[Any]:
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
        result = yield from plan.run_aggregation(AggregationQuery(over, (item,)), transaction=self._read_token())
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

    def _begin_transaction(self, cross_group: bool = False, *, read_only: bool = False) -> plan.Plan[Self]:
        """php-gds's ``beginTransaction`` (see ``Store.begin_transaction``)."""
        if not isinstance(cross_group, bool):
            raise BadValueError(f"cross_group must be True or False, got {type(cross_group).__name__} {cross_group!r}")
        if self._tx.block_mutations is not None:
            raise GatewayError("a transaction block is open on this store in this thread; end it first")
        pending = self._take_token()
        if pending is not None:
            # php-gds replaces a pending transaction; roll the old one back so
            # a locking server (Firestore) frees its locks at once.
            log.info("begin_transaction() replaces a pending transaction on %s; rolling it back", self._schema.kind)
            yield from plan.rollback(pending)
        self._tx.token = yield from plan.begin_transaction(read_only=read_only)
        return self

    def _take_token(self) -> bytes | None:
        token, self._tx.token = self._tx.token, None
        return token

    def _read_token(self) -> bytes | None:
        return self._tx.token

    def _open_block(self, read_only: bool) -> plan.Plan[bytes]:
        """Begin a transaction block: reads use it, writes are buffered."""
        yield from self._begin_transaction(read_only=read_only)
        token = self._tx.token
        assert token is not None
        self._tx.block_mutations = []
        return token

    def _abort_block(self, token: bytes) -> plan.Plan[None]:
        """The block raised: roll back (the error is the caller's to raise)."""
        self._end_block()
        try:
            yield from plan.rollback(token)
        except GatewayError:
            pass

    def _close_block(self, token: bytes, read_only: bool) -> plan.Plan[None]:
        """The block ended: commit what it buffered (or, read-only, roll back)."""
        mutations = self._end_block()
        if read_only:
            yield from plan.rollback(token)
            return
        try:
            yield from plan.commit(mutations, transaction=token)
        except GDSError:
            # A commit that never arrived leaves the transaction open, and on
            # a server with locks (Firestore) its locks block other writers
            # until they expire. Rolling back is harmless if it did arrive.
            try:
                yield from plan.rollback(token)
            except GDSError:
                pass
            raise

    def _end_block(self) -> list[Mutation]:
        mutations = self._tx.block_mutations or []
        self._tx.block_mutations = None
        self._tx.token = None
        return mutations


def _as_id(key_id: Any) -> int:
    if isinstance(key_id, str) and key_id.isdigit():
        return int(key_id)
    return check_int(key_id, "key id", error=BadKeyError)
