"""The Gateway protocol and the neutral types that cross it.

Everything above the gateway layer (Store, counters, CLI) speaks only these
types, never google-cloud-datastore or sqlite3 ones. That is what lets one
conformance suite run the same tests on every gateway, and what lets the
embedded SQLite engine stand in for Cloud Datastore in workshops and tests.

Values at the boundary are plain Python: ``None``, ``bool``, ``int``,
``float``, ``str``, ``bytes``, timezone-aware UTC ``datetime``, ``Key``,
``Geopoint``, ``RawEntity`` (an embedded entity) and ``list`` of those.
"""

from __future__ import annotations

import datetime as _dt
import re
import threading
from collections import Counter as _Counter
from typing import Any, Iterator, Literal, Protocol, Sequence, Union, runtime_checkable

import attrs

from gds_counter.errors import BadKeyError, BadValueError

#: Datastore's limits, shared by every gateway so that bad input fails the same
#: way (and before anything is written) whichever storage is behind it.
MAX_KEY_NAME_BYTES = 1500
MAX_INDEXED_STRING_BYTES = 1500
MAX_ID = 2**63 - 1
MAX_MUTATIONS_PER_COMMIT = 500
MAX_KEYS_PER_LOOKUP = 1000

_RESERVED = re.compile(r"^__.*__$", re.DOTALL)


def _check_kind(kind: str) -> None:
    if not isinstance(kind, str) or not kind:
        raise BadKeyError(f"kind must be a non-empty string, got {kind!r}")
    if _RESERVED.match(kind):
        raise BadKeyError(f"kind {kind!r} is reserved (names of the form __x__ belong to Datastore)")
    if utf8_size(kind, "kind", BadKeyError) > MAX_KEY_NAME_BYTES:
        raise BadKeyError(f"kind {kind[:40]!r}... is over {MAX_KEY_NAME_BYTES} bytes")


def utf8_size(text: str, what: str, error: type[BadValueError] = BadValueError) -> int:
    """Bytes in UTF-8, as Datastore counts them; a lone surrogate (what
    ``json.loads('"\\ud800"')`` gives) cannot be stored at all."""
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise error(f"{what} {text[:40]!r} is not valid Unicode ({exc.reason} at index {exc.start})") from None


def check_key_name(name: Any) -> None:
    """Reject key names Datastore would reject, naming the bad value."""
    if not isinstance(name, str):
        raise BadKeyError(f"key name must be a string, got {type(name).__name__} {name!r}")
    if name == "":
        raise BadKeyError("key name must not be empty ('')")
    if _RESERVED.match(name):
        raise BadKeyError(f"key name {name!r} is reserved (names of the form __x__ belong to Datastore)")
    size = utf8_size(name, "key name", BadKeyError)
    if size > MAX_KEY_NAME_BYTES:
        raise BadKeyError(
            f"key name {name[:40]!r}... is {size} bytes, over the {MAX_KEY_NAME_BYTES}-byte limit"
        )


def check_key_id(key_id: Any) -> None:
    if isinstance(key_id, bool) or not isinstance(key_id, int):
        raise BadKeyError(f"key id must be an int, got {type(key_id).__name__} {key_id!r}")
    if not 0 < key_id <= MAX_ID:
        raise BadKeyError(f"key id {key_id!r} is out of range (1 to 2**63-1)")


@attrs.frozen
class PathElement:
    """One (kind, id or name) step of a key path. Both id and name are None
    only in the last element of an incomplete key, whose id the server allocates."""

    kind: str
    id: int | None = None
    name: str | None = None

    def __attrs_post_init__(self) -> None:
        _check_kind(self.kind)
        if self.id is not None and self.name is not None:
            raise BadKeyError(f"key element {self.kind!r} has both id {self.id!r} and name {self.name!r}")
        if self.id is not None:
            check_key_id(self.id)
        if self.name is not None:
            check_key_name(self.name)

    @property
    def id_or_name(self) -> int | str | None:
        return self.id if self.id is not None else self.name


@attrs.frozen
class Key:
    """An immutable, hashable Datastore key: a path of (kind, id|name) steps
    plus a namespace (``""`` is the default namespace).

    The project and database are a property of the gateway, not of the key, so
    keys compare equal across gateways and the conformance suite can check
    them exactly.
    """

    path: tuple[PathElement, ...] = attrs.field(converter=tuple)
    namespace: str = attrs.field(default="", converter=lambda ns: ns or "")

    def __attrs_post_init__(self) -> None:
        if not self.path:
            raise BadKeyError("a key needs at least one path element")
        for element in self.path[:-1]:
            if element.id_or_name is None:
                raise BadKeyError(f"ancestor {element.kind!r} in a key path must have an id or a name")

    @classmethod
    def of(cls, *flat: Any, namespace: str | None = "") -> "Key":
        """``Key.of("Parent", "p1", "Child", 7)``; an odd-length path ends with
        an incomplete element (``Key.of("Book")``)."""
        if not flat:
            raise BadKeyError("Key.of() needs at least a kind")
        elements = []
        items = list(flat)
        if len(items) % 2:
            items.append(None)
        for kind, ident in zip(items[0::2], items[1::2]):
            if ident is None:
                elements.append(PathElement(kind))
            elif isinstance(ident, str):
                elements.append(PathElement(kind, name=ident))
            else:
                elements.append(PathElement(kind, id=ident))
        return cls(tuple(elements), namespace or "")

    @property
    def kind(self) -> str:
        return self.path[-1].kind

    @property
    def id(self) -> int | None:
        return self.path[-1].id

    @property
    def name(self) -> str | None:
        return self.path[-1].name

    @property
    def id_or_name(self) -> int | str | None:
        return self.path[-1].id_or_name

    @property
    def is_partial(self) -> bool:
        return self.path[-1].id_or_name is None

    @property
    def parent(self) -> "Key | None":
        return Key(self.path[:-1], self.namespace) if len(self.path) > 1 else None

    @property
    def flat_path(self) -> tuple[Any, ...]:
        out: list[Any] = []
        for element in self.path:
            out.append(element.kind)
            if element.id_or_name is not None:
                out.append(element.id_or_name)
        return tuple(out)

    def child(self, kind: str, id_or_name: int | str | None = None) -> "Key":
        return Key.of(*self.flat_path, kind, id_or_name, namespace=self.namespace)

    def completed(self, id_or_name: int | str) -> "Key":
        """The same key with the last element's allocated id or name filled in."""
        if not self.is_partial:
            raise BadKeyError(f"key {self} is already complete")
        return Key.of(*self.flat_path, id_or_name, namespace=self.namespace)

    def is_ancestor_of(self, other: "Key") -> bool:
        """True for ``other`` itself and its descendants, as HAS ANCESTOR matches."""
        return self.namespace == other.namespace and other.path[: len(self.path)] == self.path

    def __str__(self) -> str:
        inner = ", ".join(repr(p) for p in self.flat_path)
        ns = f", namespace={self.namespace!r}" if self.namespace else ""
        return f"Key({inner}{ns})"


def _check_latitude(_: Any, __: Any, value: float) -> None:
    if not -90.0 <= value <= 90.0:
        raise BadValueError(f"latitude {value!r} is outside -90..90")


def _check_longitude(_: Any, __: Any, value: float) -> None:
    if not -180.0 <= value <= 180.0:
        raise BadValueError(f"longitude {value!r} is outside -180..180")


@attrs.frozen
class Geopoint:
    """A latitude/longitude pair, as php-gds's ``Geopoint``."""

    latitude: float = attrs.field(converter=float, validator=_check_latitude)
    longitude: float = attrs.field(converter=float, validator=_check_longitude)


@attrs.define(eq=True)
class RawEntity:
    """An entity as it crosses the gateway: key, values and index flags.

    ``unindexed`` names the properties stored with exclude_from_indexes. For a
    list property the flag applies to each element, as php-gds writes it.
    ``key`` may be None only for an entity embedded as a property value.
    """

    key: Key | None
    properties: dict[str, Any] = attrs.field(factory=dict)
    unindexed: frozenset[str] = attrs.field(factory=frozenset, converter=frozenset)


Value = Union[None, bool, int, float, str, bytes, _dt.datetime, Key, Geopoint, RawEntity, list]


def check_value(name: str, value: Any, indexed: bool) -> None:
    """Reject values Datastore cannot store, naming the property."""
    if isinstance(value, list):
        for item in value:
            if isinstance(item, list):
                raise BadValueError(f"property {name!r}: a list may not contain a list")
            check_value(name, item, indexed)
        return
    if value is None or isinstance(value, (bool, float, Key, Geopoint)):
        return
    if isinstance(value, int):
        if not -(2**63) <= value <= MAX_ID:
            raise BadValueError(f"property {name!r}: integer {value} does not fit in 64 bits")
        return
    if isinstance(value, str):
        size = utf8_size(value, f"property {name!r}: string")
        if indexed:
            if size > MAX_INDEXED_STRING_BYTES:
                raise BadValueError(
                    f"property {name!r}: indexed string of {size} bytes is over the "
                    f"{MAX_INDEXED_STRING_BYTES}-byte limit; store it unindexed (index=False)"
                )
        return
    if isinstance(value, bytes):
        if indexed and len(value) > MAX_INDEXED_STRING_BYTES:
            raise BadValueError(
                f"property {name!r}: indexed blob of {len(value)} bytes is over the "
                f"{MAX_INDEXED_STRING_BYTES}-byte limit; store it unindexed (index=False)"
            )
        return
    if isinstance(value, _dt.datetime):
        if value.tzinfo is None:
            raise BadValueError(f"property {name!r}: naive datetime {value!r}; give it a timezone")
        return
    if isinstance(value, RawEntity):
        validate_entity(value)
        return
    raise BadValueError(f"property {name!r}: cannot store a {type(value).__name__} ({value!r})")


def validate_entity(entity: RawEntity) -> None:
    """Check every property of an entity against Datastore's rules."""
    for name, value in entity.properties.items():
        if not isinstance(name, str) or not name:
            raise BadValueError(f"property name must be a non-empty string, got {name!r}")
        if _RESERVED.match(name):
            raise BadValueError(f"property name {name!r} is reserved (names of the form __x__)")
        check_value(name, value, name not in entity.unindexed)


# --- queries -------------------------------------------------------------

Operator = Literal["=", "<", "<=", ">", ">=", "!=", "IN", "NOT_IN", "HAS_ANCESTOR"]
OPERATORS: tuple[str, ...] = ("=", "<", "<=", ">", ">=", "!=", "IN", "NOT_IN", "HAS_ANCESTOR")

#: The pseudo-property that filters and orders by key.
KEY_PROPERTY = "__key__"


@attrs.frozen
class PropertyFilter:
    """``name op value``. For IN and NOT_IN, ``value`` is a tuple. For
    HAS_ANCESTOR, ``name`` is ``__key__`` and ``value`` a Key."""

    name: str
    op: str = attrs.field(validator=attrs.validators.in_(OPERATORS))
    value: Any


@attrs.frozen
class CompositeFilter:
    op: Literal["AND", "OR"] = attrs.field(validator=attrs.validators.in_(("AND", "OR")))
    filters: tuple["Filter", ...] = attrs.field(converter=tuple)


Filter = Union[PropertyFilter, CompositeFilter]


@attrs.frozen
class Order:
    name: str
    descending: bool = False


@attrs.frozen
class Cursor:
    """A query cursor bound at a LIMIT or OFFSET position.

    Cursors and blobs are both bytes, but they mean different things (a
    place in the results versus a value to compare), and the Datastore API
    sends them differently, so the caller says which one is meant by
    wrapping cursors.
    """

    value: bytes = attrs.field(validator=attrs.validators.instance_of(bytes))


@attrs.frozen
class GqlSource:
    """The GQL text a query was parsed from, with its bindings, so a gateway
    that speaks GQL natively (Cloud Datastore) can send the text itself."""

    text: str
    named: tuple[tuple[str, Any], ...] = ()
    positional: tuple[Any, ...] = ()


@attrs.frozen
class Query:
    """A structured Datastore query; what GQL parses into and what every
    gateway executes.

    ``projection`` empty means whole entities; ``keys_only`` returns keys only
    (``SELECT __key__``). ``distinct_on`` lists the projected properties whose
    combination must be unique (``DISTINCT`` is ``distinct_on == projection``).
    ``start_cursor``/``end_cursor`` are opaque bytes issued by the same gateway.
    ``gql`` is set when the query came from GQL text and nothing was changed
    since; gateways may use it or ignore it.
    """

    kind: str | None = None
    namespace: str = attrs.field(default="", converter=lambda ns: ns or "")
    filter: Filter | None = None
    order: tuple[Order, ...] = attrs.field(default=(), converter=tuple)
    projection: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    distinct_on: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    keys_only: bool = False
    limit: int | None = None
    offset: int = 0
    start_cursor: bytes | None = None
    end_cursor: bytes | None = None
    gql: GqlSource | None = attrs.field(default=None, eq=False)

    def replace(self, **changes: Any) -> "Query":
        """A copy with ``changes``; the GQL source is dropped because the
        text no longer describes the query."""
        changes.setdefault("gql", None)
        return attrs.evolve(self, **changes)


@attrs.frozen
class QueryResult:
    """One batch of results.

    ``entities`` holds RawEntity objects (with only the projected properties
    for projections; with empty properties for keys-only queries).
    ``end_cursor`` resumes after the last result; ``more_results`` is False
    when the query (or its limit) is exhausted.
    """

    entities: tuple[RawEntity, ...]
    end_cursor: bytes | None
    more_results: bool


# --- mutations -----------------------------------------------------------


@attrs.frozen
class Increment:
    """A server-side transform: add ``amount`` to integer property ``name``
    (a missing property counts as 0). Datastore's PropertyTransform.increment."""

    name: str
    amount: int


@attrs.frozen
class Upsert:
    """Write ``entity``. With ``property_mask``, only the named properties are
    written and other stored properties are kept (an empty mask keeps every
    stored property); ``transforms`` run after the write, in the same
    mutation, atomically. A server that ignores masks and transforms (the
    legacy Datastore emulator) would replace the whole entity instead, so
    callers must check ``Gateway.supports_transforms`` before sending them."""

    entity: RawEntity
    property_mask: tuple[str, ...] | None = None
    transforms: tuple[Increment, ...] = attrs.field(default=(), converter=tuple)


@attrs.frozen
class Delete:
    key: Key


Mutation = Union[Upsert, Delete]


@attrs.frozen
class MutationResult:
    """What a commit did for one mutation: the entity's (possibly newly
    allocated) key, and the values the transforms produced. A gateway that
    ignored the transforms returns ``transform_results=None``, which is how
    the counter detects a server that silently drops increments."""

    key: Key | None
    transform_results: tuple[Any, ...] | None = None


@attrs.frozen
class CommitResult:
    mutation_results: tuple[MutationResult, ...]


# --- cost accounting -----------------------------------------------------


class Stats:
    """Counts RPCs and entity reads/writes, because Datastore bills by them.

    Thread-safe. Benchmarks and the workshop print it; tests use it to prove
    costs ("get_count is one RPC").
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: _Counter[str] = _Counter()

    def record(self, rpc: str, *, reads: int = 0, writes: int = 0, deletes: int = 0) -> None:
        with self._lock:
            self._counts["rpcs"] += 1
            self._counts[f"rpc.{rpc}"] += 1
            self._counts["entity_reads"] += reads
            self._counts["entity_writes"] += writes
            self._counts["entity_deletes"] += deletes

    def bump(self, name: str, by: int = 1) -> None:
        """Count an event that is not an RPC (aborts, retries, fallbacks)."""
        with self._lock:
            self._counts[name] += by

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            base = {"rpcs": 0, "entity_reads": 0, "entity_writes": 0, "entity_deletes": 0}
            base.update(self._counts)
            return base

    def reset(self) -> None:
        with self._lock:
            self._counts.clear()

    def __getitem__(self, name: str) -> int:
        with self._lock:
            return self._counts[name]

    def __repr__(self) -> str:
        return f"Stats({self.snapshot()})"


# --- the protocol --------------------------------------------------------


@runtime_checkable
class Gateway(Protocol):
    """What every storage backend implements.

    Contract shared by all gateways (the conformance suite checks it):

    * ``lookup`` returns one item per key, in input order, None for missing.
    * ``commit`` applies the mutations of a transaction atomically (at most
      500). Without a transaction a gateway may split more than 500
      mutations into legal batches, each atomic on its own. With a
      transaction it raises ``Contention`` (and writes nothing) if any entity
      the transaction read was changed by someone else since; the
      transaction is used up either way. Incomplete keys get ids allocated
      and returned in the ``MutationResult``. A commit whose outcome is
      unknown (sent, then the deadline passed) raises ``CommitUnknown``,
      transactional or not: it must never be retried blindly.
    * ``begin_transaction`` returns an opaque token; passing it to lookup and
      run_query makes those reads part of the transaction.
    * ``run_query`` applies ``offset`` fully before it returns a batch, so a
      continuation from ``end_cursor`` never needs the offset again.
    * Every call counts itself in ``stats``.
    """

    stats: Stats

    #: The namespace the Store uses when the caller names none.
    namespace: str

    #: True when ``Upsert.transforms`` are applied by the server. False means
    #: the caller must not rely on them (they may be silently ignored).
    supports_transforms: bool

    def lookup(self, keys: Sequence[Key], *, transaction: bytes | None = None) -> list[RawEntity | None]: ...

    def run_query(self, query: Query, *, transaction: bytes | None = None) -> QueryResult: ...

    def begin_transaction(self, *, read_only: bool = False) -> bytes: ...

    def commit(self, mutations: Sequence[Mutation], *, transaction: bytes | None = None) -> CommitResult: ...

    def rollback(self, transaction: bytes) -> None: ...

    def allocate_ids(self, keys: Sequence[Key]) -> list[Key]: ...

    def close(self) -> None: ...


def iterate_batches(gateway: Gateway, query: Query, *, transaction: bytes | None = None) -> Iterator[QueryResult]:
    """Follow a query's batches to the end or to its limit, yielding each
    batch (php-gds stopped at the first one, silently truncating results)."""
    remaining = query.limit
    current = query
    while True:
        result = gateway.run_query(current, transaction=transaction)
        yield result
        if remaining is not None:
            remaining -= len(result.entities)
        if not result.more_results or result.end_cursor is None or (remaining is not None and remaining <= 0):
            return
        current = current.replace(start_cursor=result.end_cursor, offset=0, limit=remaining)


def run_query_all(gateway: Gateway, query: Query, *, transaction: bytes | None = None) -> Iterator[RawEntity]:
    """Every result of a query, across all batches."""
    for batch in iterate_batches(gateway, query, transaction=transaction):
        yield from batch.entities
