"""What one server can do, as one immutable value owned by its gateway."""

from __future__ import annotations

import attrs

__all__ = ["Capabilities"]


@attrs.frozen
class Capabilities:
    """What a server was seen (or is known) to do.

    A gateway learns this once, on first use, and keeps it for its lifetime;
    callers read ``gateway.capabilities`` and never probe on their own, so
    what one counter finds out holds for every other caller of that gateway.

    ``applies_transforms``
        The server applies ``Upsert.transforms`` and property masks. The legacy
        Datastore emulator accepts both and silently IGNORES them (an
        "increment" write there replaces the whole entity), so a caller must
        not send them where this is False.
    ``indexes_transformed``
        A property written by a transform ends up indexed even when it was
        sent unindexed (seen on the Firestore emulator; the embedded engine
        follows it, docs/gql.md). A PHP-layout shard's
        ``count`` then ends up indexed after a server-side increment, until
        PHP next rewrites the shard; values are unaffected.
    ``not_equal_in_or``
        ``!=``, ``IN``, ``NOT IN`` and ``OR`` filters run.
    ``aggregation``
        Aggregation queries (``COUNT``, ``COUNT_UP_TO``, ``SUM``, ``AVG``)
        run: natively on Cloud Datastore and the Firestore emulator (the
        probe sends one ``COUNT(*)``), and on the embedded engine, which
        computes them from the query's index rows (``gateway._aggregation``).
        The legacy Datastore emulator does not implement
        ``RunAggregationQuery``: there ``run_aggregation`` raises
        ``GatewayError``, sending nothing once this is known.
    """

    applies_transforms: bool
    indexes_transformed: bool
    not_equal_in_or: bool = True
    aggregation: bool = False
