"""The subcommands that count nothing stored: ``size`` (the shards a write
rate needs, computed), ``demo`` (the workshop, in a database of its own)
and ``serve`` (the Datastore API over the embedded engine until a signal).
"""

from __future__ import annotations

import logging
import os

import attrs

from gds_counter import _demo as demo
from gds_counter.cli._context import EXIT_OK, Context, command, storage_label
from gds_counter.counter import size_shards
from gds_counter.errors import BadValueError
from gds_counter.gateway import Gateway, open_gateway

log = logging.getLogger("gds_counter.cli")


@command("size")
def _size(ctx: Context) -> int:
    found = size_shards(ctx.args.rate, ctx.args.per_shard)
    data = attrs.asdict(found)
    rows = [
        ("increments per second", f"{found.rate:g}"),
        ("writes per second per shard", f"{found.per_shard:g}"),
        ("shards needed", f"{found.shards:,}"),
        ("exact read: entity reads", f"{found.exact_reads:,}"),
        ("exact read: RPCs (batch lookup)", f"{found.exact_rpcs:,}"),
        ("rollup read: entity reads", f"{found.rollup_reads:,}"),
        ("rollup read: RPCs", f"{found.rollup_rpcs:,}"),
    ]
    width = max(len(label) for label, _ in rows)
    ctx.emit(data, "\n".join(f"{label.ljust(width)}  {value}" for label, value in rows))
    return EXIT_OK


@command("demo")
def _demo(ctx: Context) -> int:
    if ctx.args.url:
        log.warning("demo ignores --url %s: it counts in a temporary database of its own", ctx.args.url)
    return demo.cli_handler(ctx.args, ctx.out)


@command("serve")
def _serve(ctx: Context) -> int:
    from gds_counter.gateway import DEFAULT_URL
    from gds_counter.server import Server, named_url, serve_until_signalled

    url = ctx.args.serve_url or ctx.args.url or os.environ.get("GDS_URL") or DEFAULT_URL
    if not url.lower().startswith(("sqlite:", "memory:")):
        raise BadValueError(f"serve puts the embedded engine behind the Datastore API: --url must be sqlite:/// or "
                            f"memory://, got {url!r}")
    gateway = open_gateway(url)
    try:
        def ready(server: Server) -> None:
            print(f"gds-counter serve: Datastore API (gRPC and REST) on {server.emulator_host} over "
                  f"{storage_label(gateway, url)}; export DATASTORE_EMULATOR_HOST={server.emulator_host}",
                  file=ctx.err, flush=True)

        def open_named(database: str) -> Gateway:
            return open_gateway(named_url(url, database))

        serve_until_signalled(Server(gateway, ctx.args.host, ctx.args.port, databases=open_named), ready)
    finally:
        gateway.close()
    return EXIT_OK
