"""The PHP article's shard entity, ``IK\\CounterShardEntity``, in Python."""

from __future__ import annotations

from typing import ClassVar

from gds_counter._checks import check_int
from gds_counter.gds.entity import Entity
from gds_counter.gds.schema import Schema
from gds_counter.counter.layout import PHP_ARTICLE, Layout


class CounterShardEntity(Entity):
    """One shard of a PHP-article counter: ``target`` (indexed, so PHP's
    ``WHERE target = @target`` query finds it) and ``count`` (unindexed:
    nobody filters on it, and an indexed value that changes on every
    increment would double the write cost).

    The shard number lives only in the key name ``"{target}_{shard_num}"``,
    exactly as PHP stored it, so both languages address the same entity.
    Subclass and set ``KIND_PFX`` to prefix the kind, as in php-gds.
    """

    KIND_PFX: ClassVar[str] = ""

    def __init__(self, target: str, shard_num: int, count: int = 0) -> None:
        super().__init__()
        check_int(shard_num, "shard_num")
        layout = type(self).layout()
        self.set_namespace(None)
        for name, value in layout.shard_fields(target, count).items():
            self[name] = value
        self.set_key_name(layout.shard_name(target, shard_num))

    @classmethod
    def layout(cls) -> Layout:
        """Read at call time so a ``KIND_PFX`` set after import still counts."""
        return PHP_ARTICLE.with_prefix(cls.KIND_PFX)

    @classmethod
    def kind(cls) -> str:
        return cls.layout().shard_kind

    @classmethod
    def schema(cls) -> Schema:
        return cls.layout().shard_schema().set_entity_class(cls)
