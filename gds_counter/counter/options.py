"""How a counter writes and reads: one value, ``CounterOptions``.

Every counter constructor of both faces takes ``options=`` (a
``CounterOptions``) and, for convenience, any of its fields as keywords
(``cache=True``), which change those fields of ``options``: the fields are
declared once, here, not repeated by six constructors.
"""

from __future__ import annotations

from typing import Any, Mapping, TypedDict

import attrs

from gds_counter._checks import check_int
from gds_counter.counter._arguments import check_num_shards
from gds_counter.counter._redis_url import check_redis_url
from gds_counter.counter.cache import CountCache
from gds_counter.counter.shard_choice import ShardChooser
from gds_counter.counter.strategy import Strategy, get_strategy
from gds_counter.errors import BadValueError
from gds_counter.gds.transaction import DEFAULT_RETRY, RetryPolicy

__all__ = ["AutoGrow", "CounterOptions"]


@attrs.frozen
class AutoGrow:
    """Grow a counter's shards when writers keep colliding.

    After ``after_attempts`` conflicting attempts in a row, the shard count
    is multiplied by ``factor`` (up to ``max_shards``), recorded in the
    config entity so every process spreads its writes wider, and the
    increment is tried again on the larger set. Growth is never undone.
    """

    after_attempts: int = attrs.field(default=3, validator=lambda _, __, value: check_int(value, "AutoGrow.after_attempts", low=1, high=None))
    #: An int: a shard count is always a whole number (a float would be stored as one).
    factor: int = attrs.field(default=2, validator=lambda _, __, value: check_int(value, "AutoGrow.factor", low=2, high=None))
    #: At most ``MAX_SHARDS`` (refused with BadValueError when built).
    max_shards: int = attrs.field(default=320, validator=lambda _, __, value: check_num_shards(value, "AutoGrow.max_shards"))


@attrs.frozen
class CounterOptions:
    """What a counter does beyond where it lives and how many shards it has.

    * ``strategy``: how one attempt adds to one shard: ``"auto"``
      (server-side increments where the server applies them, transactions
      elsewhere), ``"transactional"``, ``"increment"``, ``"auto-grow"``
      (``"auto"`` with ``auto_grow``), or a ``Strategy`` of your own
      (``counter.strategy``).
    * ``retry``: attempts, backoff and deadline for conflicts and outages
      (``RetryPolicy``).
    * ``cache``: ``True`` for the gateway's shared count cache, a
      ``CountCache`` of your own, a ``redis://host:port/db`` URL for a cache
      every process shares (``counter.redis_cache``; the ``redis`` extra),
      or None (every read reads storage).
    * ``auto_grow``: an ``AutoGrow`` (or ``True`` for its defaults) to grow
      the shard count under sustained contention.
    * ``shards``: a ``ShardChooser`` for this counter (None: the gateway's
      runtime's, shared by every counter of the process on that gateway;
      a chooser learns from every write it places, so give one instance to
      all the counter objects of one counter).

    Each value is checked when the options are built (``BadValueError``
    naming it), so before anything is read or written."""

    strategy: str | Strategy = attrs.field(default="auto", validator=lambda _, __, value: get_strategy(value))
    retry: RetryPolicy = attrs.field(default=DEFAULT_RETRY, validator=lambda _, __, value: _check_retry(value))
    cache: CountCache | str | bool | None = attrs.field(default=None, validator=lambda _, __, value: _check_cache(value))
    auto_grow: AutoGrow | bool | None = attrs.field(default=None, validator=lambda _, __, value: _check_grow(value))
    shards: ShardChooser | None = attrs.field(default=None, validator=lambda _, __, value: _check_chooser(value))


def _check_retry(value: object) -> None:
    if not isinstance(value, RetryPolicy):
        raise BadValueError(f"retry must be a RetryPolicy, got {type(value).__name__} {value!r}")


def _check_cache(value: object) -> None:
    if isinstance(value, str):
        check_redis_url(value)
    elif not (value is None or isinstance(value, (bool, CountCache))):
        raise BadValueError(
            f"cache must be True, False, None, a CountCache or a redis:// URL, got {type(value).__name__} {value!r}"
        )


def _check_grow(value: object) -> None:
    if not (value is None or isinstance(value, (bool, AutoGrow))):
        raise BadValueError(f"auto_grow must be True, False, None or an AutoGrow, got {type(value).__name__} {value!r}")


def _check_chooser(value: object) -> None:
    if value is not None and (isinstance(value, type) or not isinstance(value, ShardChooser)):
        raise BadValueError(f"shards must be a ShardChooser instance, got {value!r}")


class CounterChanges(TypedDict, total=False):
    """``CounterOptions``' fields, as a constructor's keywords (typed, so
    that mypy checks ``CounterShardDS("x", 1, cache=True)``)."""

    strategy: str | Strategy
    retry: RetryPolicy
    cache: CountCache | str | bool | None
    auto_grow: AutoGrow | bool | None
    shards: ShardChooser | None


_FIELDS = tuple(field.name for field in attrs.fields(CounterOptions))


def options_of(options: CounterOptions | None, changes: Mapping[str, Any]) -> CounterOptions:
    """``options`` (default: ``CounterOptions()``) with ``changes`` made:
    what a counter constructor was given. An unknown keyword, or options
    that are not a ``CounterOptions``, is ``BadValueError``."""
    if options is None:
        options = CounterOptions()
    elif not isinstance(options, CounterOptions):
        raise BadValueError(f"options must be a CounterOptions, got {type(options).__name__} {options!r}")
    unknown = sorted(set(changes) - set(_FIELDS))
    if unknown:
        raise BadValueError(
            f"unknown counter option {', '.join(repr(name) for name in unknown)}; "
            f"the options are {', '.join(_FIELDS)} (CounterOptions)"
        )
    return attrs.evolve(options, **changes) if changes else options
