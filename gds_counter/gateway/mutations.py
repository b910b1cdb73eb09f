"""Writes as data: the mutations a commit carries and what it reports back."""

from __future__ import annotations

from typing import Any, Iterable, Union

import attrs

from gds_counter.gateway.keys import Key
from gds_counter.gateway.values import RawEntity

__all__ = ["MAX_MUTATIONS_PER_COMMIT", "CommitResult", "Delete", "Increment", "Mutation", "MutationResult", "Upsert"]

#: Datastore's limit on the mutations of one commit.
MAX_MUTATIONS_PER_COMMIT = 500

@attrs.frozen
class Increment:
    """A server-side transform: add ``amount`` to property ``name``.
    Datastore's PropertyTransform.increment: integers saturate at the 64-bit
    bounds, a double on either side makes a double, and a value that is not
    a number (or none) is replaced by ``amount``."""

    name: str
    amount: int | float


def _transforms(transforms: Iterable[Increment]) -> tuple[Increment, ...]:
    return tuple(transforms)


@attrs.frozen
class Upsert:
    """Write ``entity``. With ``property_mask``, only the named properties are
    written and other stored properties are kept (an empty mask keeps every
    stored property); ``transforms`` run after the write, in the same
    mutation, atomically. A server that ignores masks and transforms (the
    legacy Datastore emulator) would replace the whole entity instead, so
    callers must check ``Gateway.capabilities`` before sending them."""

    entity: RawEntity
    property_mask: tuple[str, ...] | None = None
    transforms: tuple[Increment, ...] = attrs.field(default=(), converter=_transforms)


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

