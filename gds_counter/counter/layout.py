"""Where a sharded counter keeps its data, as plain data.

A layout is what another program (the PHP article's ``CounterShardDS`` or the
Google article's Python 2 ndb ``general_counter``) already wrote into
Datastore. Keeping it as data, not as a class per layout, is what lets one
engine (``sharded.py``) serve both: an app that moves to Python keeps reading
and writing the very same entities.
"""

from __future__ import annotations

import attrs

from gds_counter.errors import BadValueError
from gds_counter.gateway.base import Key
from gds_counter.gds.schema import Schema


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
    default_shards: int = 20
    kind_prefix: str = ""

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

    def shard_key(self, target: str, shard: int, namespace: str = "") -> Key:
        return Key.of(self.shard_kind, self.shard_name(target, shard), namespace=namespace)

    def config_key(self, target: str, namespace: str = "") -> Key:
        return Key.of(self.config_kind, target, namespace=namespace)

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

LAYOUTS: dict[str, Layout] = {layout.name: layout for layout in (PHP_ARTICLE, NDB_GENERAL)}
