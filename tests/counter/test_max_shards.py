"""A counter has at most ``MAX_SHARDS`` shards (issue 23, item 8).

Why a maximum at all: every total reads every shard in one exact read, so
the shard count is also the size of every read. 10,000 shards are ten
lookups of 1,000 keys; a billion was accepted once, stored in the config
entity, and from then on every reader of that counter died of a raw
``MemoryError``. So a count above the maximum is refused on every way in
(the constructors of both faces, ``increase_shards``, the CLI) with
``BadValueError`` before anything is stored; and a config entity that
already holds one (written by an older version, by PHP or by ndb) is
``CorruptDataError`` naming the entity and the value, never an attempt to
read a billion shards.
"""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import sys
import textwrap

import attrs
import pytest

from gds_counter import aio
from gds_counter.cli import main
from gds_counter.counter import NDB_GENERAL, PHP_ARTICLE, CounterShardDS, GeneralCounter, ShardedCounter
from gds_counter.counter._arguments import MAX_SHARDS
from gds_counter.errors import BadValueError
from gds_counter.gateway import open_gateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity

ABSURD = [MAX_SHARDS + 1, 10**9]


def _configs(gateway) -> list[RawEntity]:
    """Every config entity of both layouts, read with the raw gateway."""
    from gds_counter.gateway.base import run_query_all
    from gds_counter.gateway.query import Query

    found: list[RawEntity] = []
    for kind in (PHP_ARTICLE.config_kind, NDB_GENERAL.config_kind):
        found += run_query_all(gateway, Query(kind, namespace=gateway.namespace))
    return found


def _shards(gateway) -> list[RawEntity]:
    from gds_counter.gateway.base import run_query_all
    from gds_counter.gateway.query import Query

    found: list[RawEntity] = []
    for kind in (PHP_ARTICLE.shard_kind, NDB_GENERAL.shard_kind):
        found += run_query_all(gateway, Query(kind, namespace=gateway.namespace))
    return found


# --- refused before anything is stored ---------------------------------------------------


def test_max_shards_is_ten_thousand_and_public():
    """The number a later exact read is sized for: 10 lookups of 1,000 keys."""
    assert MAX_SHARDS == 10_000


@pytest.mark.parametrize("absurd", ABSURD)
@pytest.mark.parametrize(
    "build",
    [
        lambda gw, n: CounterShardDS("Counter Test", 1, num_shards=n, gateway=gw),
        lambda gw, n: GeneralCounter("hits", num_shards=n, gateway=gw),
        lambda gw, n: ShardedCounter("hits", layout=NDB_GENERAL, num_shards=n, gateway=gw),
    ],
    ids=["CounterShardDS", "GeneralCounter", "ShardedCounter"],
)
def test_blocking_constructors_refuse_more_than_max_shards(memory_gateway, build, absurd):
    with pytest.raises(BadValueError, match=f"at most {MAX_SHARDS:,}.*{absurd:,}"):
        build(memory_gateway, absurd)
    assert _configs(memory_gateway) == [] and _shards(memory_gateway) == []


@pytest.mark.parametrize("absurd", ABSURD)
@pytest.mark.parametrize(
    "build",
    [
        lambda gw, n: aio.CounterShardDS("Counter Test", 1, num_shards=n, gateway=gw),
        lambda gw, n: aio.GeneralCounter("hits", num_shards=n, gateway=gw),
        lambda gw, n: aio.ShardedCounter("hits", layout=NDB_GENERAL, num_shards=n, gateway=gw),
    ],
    ids=["CounterShardDS", "GeneralCounter", "ShardedCounter"],
)
def test_aio_constructors_refuse_more_than_max_shards(build, absurd):
    async def scenario():
        async with aio.open_gateway("memory://") as gateway:
            with pytest.raises(BadValueError, match=f"at most {MAX_SHARDS:,}.*{absurd:,}"):
                build(gateway, absurd)

    asyncio.run(asyncio.wait_for(scenario(), 60))


@pytest.mark.parametrize("absurd", ABSURD)
def test_increase_shards_refuses_more_than_max_shards_and_stores_nothing(memory_gateway, absurd):
    for counter in (CounterShardDS("Counter Test", 1, gateway=memory_gateway), GeneralCounter("hits", gateway=memory_gateway)):
        counter.increment()
        before = _configs(memory_gateway)
        with pytest.raises(BadValueError, match=f"at most {MAX_SHARDS:,}.*{absurd:,}"):
            counter.increase_shards(absurd)
        assert _configs(memory_gateway) == before
        assert counter.get_count() == 1


def test_aio_increase_shards_refuses_more_than_max_shards_and_stores_nothing():
    async def scenario():
        async with aio.open_gateway("memory://") as gateway:
            counter = aio.GeneralCounter("hits", gateway=gateway)
            await counter.increment()
            with pytest.raises(BadValueError, match=f"at most {MAX_SHARDS:,}"):
                await counter.increase_shards(10**9)
            return await counter.get_count()

    assert asyncio.run(asyncio.wait_for(scenario(), 60)) == 1


def test_exactly_max_shards_is_accepted_and_read(memory_gateway):
    """The maximum itself is a counter like any other: recorded, and read
    in full (ten lookups of 1,000 keys, plus the config entity)."""
    counter = GeneralCounter("wide", gateway=memory_gateway)
    assert counter.increase_shards(MAX_SHARDS) == MAX_SHARDS
    memory_gateway.commit([Upsert(RawEntity(Key.of(NDB_GENERAL.shard_kind, f"shard-wide-{MAX_SHARDS - 1}"), {"count": 7}))])
    assert GeneralCounter("wide", gateway=memory_gateway).get_count() == 7


@pytest.mark.parametrize("absurd", ABSURD)
def test_a_layout_whose_default_is_over_max_shards_is_refused(absurd):
    """Every read covers at least a layout's default shards."""
    with pytest.raises(BadValueError, match=f"default_shards must be at most {MAX_SHARDS:,}"):
        attrs.evolve(NDB_GENERAL, default_shards=absurd)


def test_cli_increase_shards_refuses_a_billion_with_exit_2_and_stores_nothing(tmp_path):
    url = f"sqlite:///{tmp_path / 'cli.sqlite3'}"
    out, err = io.StringIO(), io.StringIO()
    code = main(["--url", url, "increase-shards", "Counter Test", "1", "1000000000", "--yes"],
                out=out, err=err, stdin=io.StringIO())
    assert code == 2, err.getvalue()
    assert str(MAX_SHARDS) in err.getvalue().replace(",", "") and "Traceback" not in err.getvalue()
    with open_gateway(url) as gateway:
        assert _configs(gateway) == []


def test_cli_refuses_a_billion_before_asking_to_confirm(tmp_path):
    """Without ``--yes`` the command would ask (or, with no terminal, refuse
    as unconfirmed: exit 1). A count no counter may have is bad input,
    exit 2, before any question."""
    url = f"sqlite:///{tmp_path / 'cli.sqlite3'}"
    out, err = io.StringIO(), io.StringIO()
    code = main(["--url", url, "increase-shards", "Counter Test", "1", "1000000000"],
                out=out, err=err, stdin=io.StringIO())
    assert code == 2, err.getvalue()
    assert "?" not in out.getvalue() + err.getvalue().split("error:")[0]


@pytest.mark.parametrize("absurd", ABSURD)
def test_auto_grow_cannot_be_built_to_grow_past_max_shards(absurd):
    """Growth records shard counts in the config entity: its cap is a shard
    count like any other, refused when built."""
    from gds_counter.counter import AutoGrow

    with pytest.raises(BadValueError, match="AutoGrow.max_shards"):
        AutoGrow(max_shards=absurd)
    assert AutoGrow(max_shards=MAX_SHARDS).max_shards == MAX_SHARDS


# --- a config entity that already holds an absurd count ----------------------------------

#: Run in a child process with its address space capped, so that a reader
#: that does try to build a billion keys fails there (MemoryError) instead
#: of exhausting the machine that runs the suite.
_READERS = textwrap.dedent(
    """
    import asyncio, json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
    from gds_counter import aio, GeneralCounter, CounterShardDS, get_counts
    from gds_counter.gateway import open_gateway
    from gds_counter.gateway.keys import Key
    from gds_counter.gateway.mutations import Upsert
    from gds_counter.gateway.values import RawEntity

    value = int(sys.argv[1])
    gw = open_gateway("memory://")
    gw.commit([
        Upsert(RawEntity(Key.of("GeneralCounterShardConfig", "big"), {"num_shards": value})),
        Upsert(RawEntity(Key.of("IK_CounterShardConfig", "Counter Test_1"), {"num_shards": value})),
    ])
    calls = {
        "GeneralCounter.get_count": lambda: GeneralCounter("big", gateway=gw).get_count(),
        "GeneralCounter.increment": lambda: GeneralCounter("big", gateway=gw).increment(),
        "GeneralCounter.shards": lambda: GeneralCounter("big", gateway=gw).shards(),
        "GeneralCounter.increase_shards": lambda: GeneralCounter("big", gateway=gw).increase_shards(30),
        # (its default read, the article's target query, and its writes into
        # the shards it was built with, never consult the config: they are right)
        "CounterShardDS.get_count": lambda: CounterShardDS("Counter Test", 1, gateway=gw).get_count("lookup"),
        "CounterShardDS.shards": lambda: CounterShardDS("Counter Test", 1, gateway=gw).shards(),
        "get_counts": lambda: get_counts([GeneralCounter("big", gateway=gw)]),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
            out[name] = ["returned", ""]
        except BaseException as exc:
            out[name] = [type(exc).__name__, str(exc)]

    async def faces():
        async with aio.open_gateway("memory://") as agw:
            await agw.commit([Upsert(RawEntity(Key.of("GeneralCounterShardConfig", "big"), {"num_shards": value}))])
            for name, call in {
                "aio.GeneralCounter.get_count": lambda: aio.GeneralCounter("big", gateway=agw).get_count(),
                "aio.GeneralCounter.increment": lambda: aio.GeneralCounter("big", gateway=agw).increment(),
            }.items():
                try:
                    await call()
                    out[name] = ["returned", ""]
                except BaseException as exc:
                    out[name] = [type(exc).__name__, str(exc)]

    asyncio.run(faces())
    print(json.dumps(out))
    """
)


@pytest.mark.parametrize("absurd", ABSURD)
def test_a_stored_count_over_max_shards_is_corrupt_data_naming_the_config(absurd):
    done = subprocess.run([sys.executable, "-c", _READERS, str(absurd)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.splitlines()[-1])
    assert len(results) == 9
    for call, (error, message) in results.items():
        assert error == "CorruptDataError", (call, error, message)
        assert f"num_shards={absurd}" in message, (call, message)
        assert "ShardConfig" in message, (call, message)  # the config entity's key
