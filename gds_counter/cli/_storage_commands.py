"""The subcommands about every counter in the storage: ``list`` and
``rollup``. They find the counters by key only (``counter_names_plan``) or
read every shard and config entity once, so their cost grows with the
storage, not with one counter; apart from the one-counter commands for that
reason.
"""

from __future__ import annotations

import datetime as dt
import logging
from typing import Callable

import attrs

from gds_counter.cli._context import EXIT_FAILURE, EXIT_OK, PROG, Context, command, table
from gds_counter.counter import FIRESTORE_PAGE, PHP_ARTICLE, Layout, ShardedCounter, counter_names_plan, rollup_all_plan
from gds_counter.errors import GDSError
from gds_counter.gateway import Gateway, plan
from gds_counter.gateway.base import run_query_all
from gds_counter.gateway.query import Query
from gds_counter.gds.transaction import DEFAULT_RETRY

log = logging.getLogger("gds_counter.cli")


def _counters(ctx: Context) -> tuple[list[str], Callable[[str], ShardedCounter]]:
    """Every counter in the storage, found by key only
    (``counter._inventory``): the PHP article's, by target, and Firestore's
    distributed counters, by document path (none in a namespace, which
    Firestore does not have); and how to build one by name."""
    gateway = ctx.gateway()
    found = {name: PHP_ARTICLE for name in plan.run(counter_names_plan(PHP_ARTICLE, gateway.namespace), gateway)}
    if not gateway.namespace:
        for name in plan.run(counter_names_plan(FIRESTORE_PAGE, ""), gateway):
            found.setdefault(name, FIRESTORE_PAGE)
    retry = attrs.evolve(DEFAULT_RETRY, deadline=max(ctx.left(), 0.001))
    return sorted(found), lambda name: ShardedCounter(name, layout=found[name], gateway=gateway, retry=retry)


def _as_of(moment: dt.datetime) -> str:
    return moment.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@command("rollup")
def _rollup(ctx: Context) -> int:
    """Refresh the rollup of every counter older than ``--max-age`` (0: all),
    25 counters per transaction. Safe to run from cron, several at once."""
    names, make = _counters(ctx)
    rolled = plan.run(rollup_all_plan(names, make, ctx.args.max_age, forced=True), ctx.gateway())
    fresh = sum(found.from_rollup for _, found in rolled.totals)
    writes = rolled.writes
    data = {"counters": len(names), "fresh": fresh, "read": len(names) - fresh, "written": writes.written,
            "failed": writes.failed}
    if writes.written:
        ctx.was_stored(f"{writes.written} rollups WERE written")
    ctx.emit(data, f"{len(names)} counters: {fresh} rollups fresh, {len(names) - fresh} read from their shards, "
                   f"{writes.written} rollups written" + (f", {writes.failed} failed" if writes.failed else ""))
    for failure in writes.not_written:
        print(f"{getattr(ctx.args, 'prog', PROG)} rollup: error: rollup not written: {failure}", file=ctx.err)
    return EXIT_FAILURE if writes.failed else EXIT_OK  # so cron learns that some were not written


@command("list")
def _list(ctx: Context) -> int:
    """Every PHP-layout counter in the storage: its shard entities grouped by
    ``target``, and its config entity. Reads every shard entity and every
    config entity once (Datastore bills each read).

    Two shard numbers per counter, because both matter: ``shards``, how many
    shards it is configured for (what its config entity records, else the
    layout's default of 20, as every reader assumes), which is what
    ``increase-shards`` changes and how many shards readers look up; and
    ``written``, how many shard entities exist (a shard is written on its
    first increment, so fewer on a counter that is rarely incremented).

    With ``--max-age``: each counter's total at most that old, from its
    rollup (1 entity read) or else read from its shards and rolled up, and
    when it was true; counters are found by key only (``counter._inventory``)."""
    if ctx.args.max_age is not None:
        names, make = _counters(ctx)
        rolled = plan.run(rollup_all_plan(names, make, ctx.args.max_age), ctx.gateway())
        data = [{"target": name, "count": f.total, "as_of": f.as_of.isoformat(), "from_rollup": f.from_rollup}
                for name, f in rolled.totals]
        aged: list[tuple[object, ...]] = [(f.total, _as_of(f.as_of), name) for name, f in rolled.totals]
        ctx.emit(data, table(("count", "as of (UTC)", "target"), aged, text_last=True))
        return EXIT_OK
    gateway = ctx.gateway()
    counters = _listed_counters(gateway, PHP_ARTICLE)
    if not gateway.namespace:
        for path, entry in _listed_documents(gateway).items():
            counters.setdefault(path, entry)
    rows = [(c.count, c.shards if c.shards is not None else "?", c.written, target)
            for target, c in sorted(counters.items())]
    data = [{"target": target, "count": c.count, "shards": c.shards, "written": c.written}
            for target, c in sorted(counters.items())]
    ctx.emit(data, table(("count", "shards", "written", "target"), rows, text_last=True))
    return EXIT_OK


@attrs.define
class _Listed:
    """One counter as ``list`` shows it."""

    count: int = 0
    #: Shards configured (None: its config entity cannot be read; logged).
    shards: int | None = PHP_ARTICLE.default_shards
    written: int = 0
    highest: int = 0


def _listed_counters(gateway: Gateway, layout: Layout) -> dict[str, _Listed]:
    """Each counter's total, configured shards and written shards, from one
    pass over the shard kind and one over the config kind."""
    found: dict[str, _Listed] = {}
    for raw in run_query_all(gateway, Query(layout.config_kind, namespace=gateway.namespace)):
        target = raw.key.name if raw.key is not None else None
        if not target:
            log.warning("skipped %s: a counter's config entity is keyed by the counter's name", raw.key)
            continue
        entry = found.setdefault(target, _Listed())
        try:
            entry.shards = max(layout.config_of(raw) or 0, layout.default_shards)
        except GDSError as exc:
            log.warning("%s: its configured shard count is shown as ?: %s", target, exc)
            entry.shards = None
    target_property = layout.target_property or "target"
    for raw in run_query_all(gateway, Query(layout.shard_kind, namespace=gateway.namespace)):
        target = raw.properties.get(target_property)
        if not isinstance(target, str):
            log.warning("skipped %s: it has no string %r property", raw.key, target_property)
            continue
        entry = found.setdefault(target, _Listed())
        entry.written += 1
        entry.count += layout.count_of(raw)
        if raw.key is not None:
            entry.highest = max(entry.highest, layout.shard_number(target, raw.key) or 0)
    for target, entry in found.items():
        if entry.shards is not None and entry.highest > entry.shards:
            log.warning(
                "%s has shard %d, beyond the %d shards it is configured for (a writer with a larger NUM_SHARDS?): "
                "its total counts it, but get_count(method='lookup') does not look it up until increase-shards "
                "records %d or more", target, entry.highest, entry.shards, entry.highest)
    return found


def _listed_documents(gateway: Gateway) -> dict[str, _Listed]:
    """Firestore's distributed counters, as ``list`` shows them: every
    document of every ``shards`` subcollection, grouped by the counter
    document it is under, and each counter document's ``num_shards`` (one
    batched lookup; the page's default of 10 when none is recorded)."""
    layout = FIRESTORE_PAGE
    found: dict[str, _Listed] = {}
    for raw in run_query_all(gateway, Query(layout.shard_kind)):
        target = layout.target_of(raw.key) if raw.key is not None else None
        if target is None:
            continue  # a "shards" document that is no counter's (a non-numeric id, or under a numeric id)
        entry = found.setdefault(target, _Listed(shards=layout.default_shards))
        entry.written += 1
        try:
            entry.count += layout.count_of(raw)
        except GDSError as exc:
            log.warning("%s: its count is left out of %s's total: %s", raw.key, target, exc)
    names = sorted(found)
    configs = gateway.lookup([layout.config_key(name) for name in names]) if names else []
    for name, config in zip(names, configs):
        try:
            found[name].shards = max(layout.config_of(config) or 0, layout.default_shards)
        except GDSError as exc:
            log.warning("%s: its configured shard count is shown as ?: %s", name, exc)
            found[name].shards = None
    return found
