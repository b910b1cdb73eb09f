"""The PHP article's shard entity, ``IK\\CounterShardEntity``, in Python."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from gds_counter._checks import check_int
from gds_counter.counter.layout import PHP_ARTICLE, Layout
from gds_counter.errors import BadValueError
from gds_counter.gds.entity import Entity
from gds_counter.gds.schema import Schema

#: The keys of the PHP constructor's array argument.
_PHP_PARAMS = ("target", "shardNum", "count")


class CounterShardEntity(Entity):
    """One shard of a PHP-article counter: ``target`` (indexed, so PHP's
    ``WHERE target = @target`` query finds it) and ``count`` (unindexed:
    nobody filters on it, and an indexed value that changes on every
    increment would double the write cost).

    The shard number lives only in the key name ``"{target}_{shard_num}"``,
    exactly as PHP stored it, so both languages address the same entity.
    Subclass and set ``KIND_PFX`` to prefix the kind, as in php-gds.

    Built three ways:

    * ``CounterShardEntity("Counter Test_1", 7, count=0)``;
    * the PHP article's array form,
      ``CounterShardEntity({"target": "Counter Test_1", "shardNum": 7, "count": 0})``
      (a missing ``count`` is 0; any other key is refused, so a misspelt
      ``shardnum`` cannot build a wrong key);
    * ``CounterShardEntity()`` (or ``None``, or an empty mapping, as PHP's
      ``$params != null`` test treats ``[]`` like null): an empty entity of
      this kind with no key name and no data, which a Store fills when it
      reads a shard.
    """

    KIND_PFX: ClassVar[str] = ""

    def __init__(
        self,
        target: str | Mapping[str, Any] | None = None,
        shard_num: int | None = None,
        count: int = 0,
    ) -> None:
        super().__init__()
        if isinstance(target, Mapping):
            if shard_num is not None:
                raise BadValueError(
                    f"CounterShardEntity takes the PHP array form or (target, shard_num, count), "
                    f"not both: got {dict(target)!r} and shard_num={shard_num!r}"
                )
            target, shard_num, count = _from_php_params(target)
        if target is None:
            if shard_num is not None:
                raise BadValueError(f"CounterShardEntity(shard_num={shard_num!r}) needs a target too")
            return
        if not isinstance(target, str) or not target:
            raise BadValueError(f"a shard's target must be a non-empty string, got {type(target).__name__} {target!r}")
        if shard_num is None:
            raise BadValueError(f"CounterShardEntity({target!r}) needs a shard number")
        check_int(shard_num, "shard_num")
        check_int(count, "count")
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


def _from_php_params(params: Mapping[str, Any]) -> tuple[str | None, int | None, int]:
    """``(target, shard_num, count)`` from PHP's ``['target' => ..., 'shardNum'
    => ..., 'count' => ...]``; an empty mapping is PHP's "no params"."""
    if not params:
        return None, None, 0
    unknown = sorted(str(name) for name in params if name not in _PHP_PARAMS)
    if unknown:
        raise BadValueError(
            f"CounterShardEntity's array form takes the keys {', '.join(_PHP_PARAMS)}; "
            f"unknown: {', '.join(unknown)}"
        )
    missing = [name for name in _PHP_PARAMS[:2] if params.get(name) is None]
    if missing:
        raise BadValueError(f"CounterShardEntity's array form needs {' and '.join(missing)}, got {dict(params)!r}")
    return params["target"], params["shardNum"], params.get("count", 0)
