"""The subcommands about one counter, named by ``TYPE ID`` (the PHP
article's counter) or by a document ``PATH`` (Firestore's distributed counter): ``increment``,
``decrement``, ``count``, ``shards``, ``increase-shards`` and ``reset``.
Each builds the counter through ``Context.counter`` (the command's deadline
bounds its retries) and says what it did; the two that cannot be undone
past a point ask first, before any storage is opened. The arguments were
checked before (``_arguments.check_input``). A command that stores a change
notes it (``Context.was_stored``) before printing its result.
"""

from __future__ import annotations

import math

from gds_counter.cli._context import EXIT_FAILURE, EXIT_OK, Context, command, table
from gds_counter.gateway.base import MAX_KEYS_PER_LOOKUP

#: ``increase-shards`` past this many shards asks first (``--yes`` skips it).
CONFIRM_SHARDS_OVER = 100


def _changed(ctx: Context, amount: int) -> int:
    counter = ctx.counter()
    total = counter.increment(amount)
    ctx.was_stored(f"the {ctx.args.command} by {ctx.args.n} of {counter.name!r} WAS stored (new total {total}; "
                   "do not retry it)")
    ctx.emit({"target": counter.name, "amount": amount, "count": total}, str(total))
    return EXIT_OK


@command("increment")
def _increment(ctx: Context) -> int:
    return _changed(ctx, ctx.args.n)


@command("decrement")
def _decrement(ctx: Context) -> int:
    return _changed(ctx, -ctx.args.n)


@command("count")
def _count(ctx: Context) -> int:
    counter = ctx.counter()
    method = ctx.args.method or "auto"
    if ctx.args.max_age is None:
        total = counter.get_count(method=method)
        ctx.emit({"target": counter.name, "count": total}, str(total))
        return EXIT_OK
    found = counter.get_count_as_of(method, max_age=ctx.args.max_age)
    ctx.emit({"target": counter.name, "count": found.total, "as_of": found.as_of.isoformat(),
              "from_rollup": found.from_rollup}, str(found.total))
    return EXIT_OK


@command("shards")
def _shards(ctx: Context) -> int:
    counter = ctx.counter()
    rows = counter.shards()
    total = sum(count for _, count in rows)
    data = {"target": counter.name, "count": total,
            "shards": [{"shard": shard, "count": count} for shard, count in rows]}
    ctx.emit(data, table(("shard", "count"), [*rows, ("total", total)]))
    return EXIT_OK


@command("increase-shards")
def _increase_shards(ctx: Context) -> int:
    wanted = ctx.args.num_shards  # within MAX_SHARDS (check_input): exit 2 before asking anything
    if wanted > CONFIRM_SHARDS_OVER:
        target = ctx.target()
        reads = wanted + 1
        rpcs = math.ceil(reads / MAX_KEYS_PER_LOOKUP)
        cost = (f"every get_count() of {target!r} will then read {reads} entities ({wanted} shards and "
                f"the config entity) in {rpcs} lookup RPC{'s' if rpcs > 1 else ''}, and shards never decrease")
        if not ctx.confirm(f"Spread {target!r} over {wanted} shards? {cost}.",
                           refused=f"refusing increase-shards to {wanted} (over {CONFIRM_SHARDS_OVER}): {cost}"):
            return EXIT_FAILURE
    counter = ctx.counter()
    shards = counter.increase_shards(wanted)
    ctx.was_stored(f"increase-shards of {counter.name!r} to {shards} WAS stored")
    ctx.emit({"target": counter.name, "shards": shards}, str(shards))
    return EXIT_OK


@command("reset")
def _reset(ctx: Context) -> int:
    target = ctx.target()
    if not ctx.confirm(f"Set every shard of {target!r} to 0?",
                       refused=f"refusing to reset {target!r}: it sets every shard to 0 and cannot be undone"):
        return EXIT_FAILURE
    counter = ctx.counter()
    counter.reset()
    ctx.was_stored(f"the reset of {counter.name!r} WAS stored (every shard 0)")
    ctx.emit({"target": counter.name, "count": 0}, f"reset {counter.name!r}")
    return EXIT_OK
