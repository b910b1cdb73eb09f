"""Where a sharded counter keeps its data, as plain data.

A layout is what another program (the PHP article's ``CounterShardDS``, the
Google article's Python 2 ndb ``general_counter``, or Firestore's
"Distributed counters" page) already wrote into Datastore or Firestore. Keeping it as data, not as a class per layout, is what lets one
engine (``sharded.py``) serve both: an app that moves to Python keeps reading
and writing the very same entities.
"""

from __future__ import annotations

from typing import Any

import attrs

from gds_counter._checks import is_int
from gds_counter.counter._arguments import MAX_SHARDS, check_num_shards
from gds_counter.errors import BadKeyError, BadValueError, CorruptDataError
from gds_counter.gateway.keys import Key, PathElement, document_key, document_path
from gds_counter.gateway.query import PropertyFilter, Query
from gds_counter.gateway.values import RawEntity
from gds_counter.gds.schema import Schema, read_integer

__all__ = ["FIRESTORE_PAGE", "NDB_GENERAL", "PHP_ARTICLE", "Layout"]


def _check_default_shards(value: object) -> None:
    """Every read covers at least the default shards, so the default is
    bound by ``MAX_SHARDS`` like any shard count."""
    check_num_shards(value, "default_shards")


@attrs.frozen
class Layout:
    """Kinds, key names and property names of one counter layout.

    ``key_format`` builds a shard's key name from ``{target}`` (the counter's
    name) and ``{shard}`` (its number, counted from ``first_shard``).
    ``target_property`` is the indexed property that lets a query find a
    counter's shards (PHP reads totals that way); None when the layout has
    none (ndb reads its shards by key only).

    ``config_kind`` holds one entity per counter (key name = counter name)
    whose ``num_shards`` property records how many shards the counter has
    grown to. The ndb layout always had it; for the PHP layout it is this
    port's addition, in a separate kind that PHP's query never sees, so
    that a reader built with 20 shards still finds shard 35 of a counter
    that grew.

    ``documents``: the counter's name is a document path
    (``"counters/likes"``) and its shards are the documents of that
    document's subcollection ``shard_kind`` (Firestore's distributed
    counters). The counter's own document is its config (``num_shards`` on
    it, as the page's Web sample keeps it), written with a property mask
    so that the app's other fields on it are kept. ``config_kind`` is then
    unused (a counter document may be in any collection).
    """

    name: str
    shard_kind: str
    key_format: str
    count_property: str
    count_indexed: bool
    target_property: str | None
    first_shard: int
    config_kind: str
    config_property: str = "num_shards"
    default_shards: int = attrs.field(default=20, validator=lambda _, __, value: _check_default_shards(value))
    kind_prefix: str = ""
    documents: bool = False

    def with_prefix(self, prefix: str) -> "Layout":
        """The same layout with kinds prefixed, as php-gds's ``KIND_PFX``
        does (used to keep test or tenant data apart in one project)."""
        if not isinstance(prefix, str):
            raise BadValueError(f"kind prefix must be a string, got {type(prefix).__name__} {prefix!r}")
        base_shard = self.shard_kind[len(self.kind_prefix):]
        base_config = self.config_kind[len(self.kind_prefix):]
        return attrs.evolve(
            self, shard_kind=prefix + base_shard, config_kind=prefix + base_config, kind_prefix=prefix
        )

    def shard_numbers(self, num_shards: int) -> range:
        return range(self.first_shard, self.first_shard + num_shards)

    def shard_name(self, target: str, shard: int) -> str:
        return self.key_format.format(target=target, shard=shard)

    def shard_number(self, target: str, key: Key) -> int | None:
        """The shard number in a shard key of ``target``; None if the key
        name is not one this layout makes for it."""
        if self.documents and not self.owns(target, key):
            return None
        before, _, after = self.key_format.partition("{shard}")
        prefix, suffix = before.format(target=target), after.format(target=target)
        name = key.name
        if name is None or not name.startswith(prefix) or not name.endswith(suffix):
            return None
        digits = name[len(prefix) : len(name) - len(suffix)]
        return int(digits) if digits.isdigit() and digits.isascii() else None

    def target_of(self, key: Key) -> str | None:
        """The counter a shard key belongs to (``shard_name`` read back: the
        target is all but the last shard number); None for another key."""
        name = key.name
        if self.documents:
            parent = key.parent
            if parent is None or key.kind != self.shard_kind:
                return None
            try:
                target = document_path(Key(parent.path))
                return target if self.shard_number(target, key) is not None else None
            except BadKeyError:  # a numeric id in the path (``__id7__``): no counter path of ours
                return None
        before, _, after = self.key_format.partition("{shard}")
        head, _, tail = before.partition("{target}")
        if name is None or key.kind != self.shard_kind or not name.startswith(head) or not name.endswith(after):
            return None
        rest = name[len(head) : len(name) - len(after)]
        target, _, digits = rest.rpartition(tail) if tail else ("", "", "")
        return target if target and digits.isdigit() and digits.isascii() else None

    def shard_key(self, target: str, shard: int, namespace: str = "") -> Key:
        if self.documents:
            return self._child(target, PathElement(self.shard_kind, name=self.shard_name(target, shard)), namespace)
        return Key.of(self.shard_kind, self.shard_name(target, shard), namespace=namespace)

    def config_key(self, target: str, namespace: str = "") -> Key:
        if self.documents:
            return Key(document_key(target, "counter path").path, namespace)
        return Key.of(self.config_kind, target, namespace=namespace)

    def _child(self, target: str, element: PathElement, namespace: str) -> Key:
        return Key((*document_key(target, "counter path").path, element), namespace)

    def owns(self, target: str, key: Key) -> bool:
        """Whether ``key`` is in the place this layout keeps ``target``'s
        shards: for documents, a document of the counter document's own
        ``shard_kind`` subcollection (a deeper one, which an ancestor query
        also finds, is not); otherwise any key of the shard kind."""
        if not self.documents:
            return key.kind == self.shard_kind
        return self.under(self.config_key(target), key)

    def under(self, counter: Key, key: Key) -> bool:
        """``owns`` for documents, given the counter document's key (a
        reader that holds it checks each row without parsing the path)."""
        return key.kind == self.shard_kind and key.path[:-1] == counter.path

    @property
    def can_query(self) -> bool:
        """Whether a counter's shards can be found by a query (every shard
        any writer wrote, whatever its shard count): by the PHP article's
        target property, or as a counter document's subcollection."""
        return self.target_property is not None or self.documents

    def shards_query(self, target: str, namespace: str = "") -> Query:
        """The query that finds every shard of ``target`` (``can_query``)."""
        if self.documents:
            ancestor = self.config_key(target, namespace)
            return Query(self.shard_kind, namespace=namespace, filter=PropertyFilter("__key__", "HAS_ANCESTOR", ancestor))
        assert self.target_property is not None
        return Query(self.shard_kind, namespace=namespace, filter=PropertyFilter(self.target_property, "=", target))

    @property
    def rollup_kind(self) -> str:
        """Where a counter's rollup lives (``counter.rollup``): a kind of its
        own, which neither PHP's target query nor ndb's key reads ever see.
        For documents, the counter document's subcollection ``rollup``
        (document ``total``), beside ``shards``, which the page's reader
        lists alone."""
        return "rollup" if self.documents else self.shard_kind + "Rollup"

    def rollup_key(self, target: str, namespace: str = "") -> Key:
        if self.documents:
            return self._child(target, PathElement(self.rollup_kind, name="total"), namespace)
        return Key.of(self.rollup_kind, target, namespace=namespace)

    def claim_key(self, target: str, generation: str, namespace: str = "") -> Key:
        """The claim on refreshing the rollup of ``generation`` (a child of
        the rollup's key, so its name stays short whatever the target)."""
        return self.rollup_key(target, namespace).child(self.rollup_kind + "Claim", generation)

    def shard_schema(self) -> Schema:
        schema = Schema(self.shard_kind)
        if self.target_property is not None:
            schema.add_string(self.target_property, index=True)
        return schema.add_integer(self.count_property, index=self.count_indexed)

    def config_schema(self) -> Schema:
        # ndb's IntegerProperty is indexed; keep it so for both layouts.
        return Schema(self.config_kind).add_integer(self.config_property, index=True)

    def shard_fields(self, target: str, count: int | None) -> dict[str, object]:
        """The properties a shard stores; ``count`` None leaves it out (for a
        server-side increment, which supplies it)."""
        fields: dict[str, object] = {}
        if self.target_property is not None:
            fields[self.target_property] = target
        if count is not None:
            fields[self.count_property] = count
        return fields

    def shard_entity(self, target: str, shard: int, count: int | None, namespace: str = "") -> RawEntity:
        """A shard as it is stored, index flags included (``count`` None:
        without count, for a server-side increment to supply it)."""
        return self.shard_entity_at(self.shard_key(target, shard, namespace), target, count)

    def shard_entity_at(self, key: Key, target: str, count: int | None) -> RawEntity:
        """``shard_entity`` for a shard whose key the caller holds already
        (a counter builds each shard's key once)."""
        unindexed = frozenset() if self.count_indexed else frozenset({self.count_property})
        return RawEntity(key, self.shard_fields(target, count), unindexed)

    def count_of(self, shard: RawEntity | None) -> int:
        """A stored shard's count, read straight from the stored values (a
        read needs one integer per shard, not a mapped entity). A missing
        shard or count is 0; a count some PHP code wrote as a string is read
        as php-gds reads it; anything else is ``CorruptDataError``."""
        if shard is None:
            return 0
        value = shard.properties.get(self.count_property)
        if type(value) is int:  # what every writer but an odd PHP one stores: nothing to convert or refuse
            return value
        return self._stored_int(shard, self.count_property, low=None)

    def config_of(self, config: RawEntity | None) -> int | None:
        """The shard count a config entity records (None: none recorded).

        A count above ``MAX_SHARDS`` (written by an older version of this
        port, or by PHP or ndb code) is ``CorruptDataError`` naming the
        config key: a reader trusts this number to build every shard key
        it reads, and a billion of them would end in ``MemoryError``."""
        if config is None or config.properties.get(self.config_property) is None:
            return None
        recorded: int = self._stored_int(config, self.config_property, low=1)
        if recorded > MAX_SHARDS:
            raise CorruptDataError(
                f"{config.key} holds {self.config_property}={recorded}, over the {MAX_SHARDS:,} shards a counter "
                f"may have (MAX_SHARDS); the counter is not read until that entity is corrected"
            )
        return recorded

    def _stored_int(self, raw: RawEntity, name: str, *, low: int | None) -> Any:
        value = raw.properties.get(name)
        if isinstance(value, str):
            value = read_integer(value, f"{raw.key}.{name}")
        if value is None:
            return 0 if low is None else None
        if not is_int(value) or (low is not None and value < low):
            what = "a shard count must be an integer" if low is None else "it must be a positive integer"
            raise CorruptDataError(f"{raw.key} holds {name}={value!r} ({type(value).__name__}); {what}")
        return value


#: The PHP article's ``IK\CounterShardEntity``: the default, byte for byte.
PHP_ARTICLE = Layout(
    name="php-article",
    shard_kind="IK_CounterShardEntity",
    key_format="{target}_{shard}",
    count_property="count",
    count_indexed=False,
    target_property="target",
    first_shard=1,
    config_kind="IK_CounterShardConfig",
)

#: The Google article's ndb ``GeneralCounterShard`` / ``GeneralCounterShardConfig``.
NDB_GENERAL = Layout(
    name="ndb-general",
    shard_kind="GeneralCounterShard",
    key_format="shard-{target}-{shard}",
    count_property="count",
    count_indexed=True,
    target_property=None,
    first_shard=0,
    config_kind="GeneralCounterShardConfig",
)


#: Firestore's "Distributed counters" page: the counter is a document, its
#: shards the documents ``"0"``..``"N-1"`` of its subcollection ``shards``
#: with an integer ``count``; ``num_shards`` on the counter document.
FIRESTORE_PAGE = Layout(
    name="firestore-page",
    shard_kind="shards",
    key_format="{shard}",
    count_property="count",
    count_indexed=True,
    target_property=None,
    first_shard=0,
    config_kind="",
    default_shards=10,
    documents=True,
)
