"""``reset()`` zeroes every shard ``get_count()`` counts, and a reset that
fails part way says exactly what it applied (issue 36, defects 1 and 2).

A reset used to zero the shards this counter object knew of (1..20 unless
it had itself learned of more), so a counter another process or object had
grown, or that a PHP writer at ``NUM_SHARDS`` 40 wrote, kept its shards
21..40 after a reset that returned. And a reset of more than 25 shards that
failed after its first transaction raised ``Contention``, which the errors
table says means nothing was applied, while some shards were already 0.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid

import pytest

from gds_counter import CounterShardDS, GeneralCounter, PartialReset
from gds_counter.counter import NDB_GENERAL, PHP_ARTICLE
from gds_counter.errors import Contention
from gds_counter.gateway import open_gateway
from gds_counter.gateway.base import run_query_all
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.query import PropertyFilter, Query
from gds_counter.gateway.values import RawEntity
from gds_counter.gds import RetryPolicy
from gds_counter.testing import GATEWAY_NAMES
from gds_counter.testing.faults import ABORTED, DEADLINE_EXCEEDED, UNAVAILABLE, FaultyGateway

#: The gateways whose storage another process can open: a SQLite file and the emulators.
SHARED = ["sqlite", "firestore"]
#: Every gateway (and the asyncio face on the embedded engine) for what one process can show.
EVERY = [name for name in GATEWAY_NAMES if name != "serve"] + ["memory+aio"]


def php_get_count(gateway, target: str) -> int:
    """The article's PHP ``getCount()``: the sum of what its query by target finds."""
    query = Query(kind=PHP_ARTICLE.shard_kind, namespace=gateway.namespace, filter=PropertyFilter("target", "=", target))
    return sum(int(shard.properties["count"]) for shard in run_query_all(gateway, query))


def _php_writes(gateway, target: str, counts: dict[int, int]) -> None:
    """Shards as the article's PHP ``increment()`` at ``NUM_SHARDS`` 40
    leaves them: ``{target}_{n}``, ``target`` indexed, ``count`` not, and
    no config entity (PHP records its NUM_SHARDS nowhere)."""
    gateway.commit([
        Upsert(RawEntity(Key.of(PHP_ARTICLE.shard_kind, f"{target}_{n}", namespace=gateway.namespace),
                         {"target": target, "count": count}, frozenset({"count"})))
        for n, count in counts.items()
    ])


def _stored(gateway, layout, target: str, numbers) -> dict[int, int]:
    keys = [layout.shard_key(target, n, gateway.namespace) for n in numbers]
    return {n: layout.count_of(raw) for n, raw in zip(numbers, gateway.lookup(keys))}


# --- defect 1: every shard get_count() counts -----------------------------------------


@pytest.fixture(params=SHARED)
def shared(request, tmp_path, make_gateway):
    """(url, environment, gateway): storage that a second process opens by URL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'reset.sqlite3'}"
        gateway = open_gateway(url)
        request.addfinalizer(gateway.close)
        return url, {}, gateway
    gateway = make_gateway(request.param)
    emulator = request.getfixturevalue(f"{request.param}_emulator")
    return f"datastore://{emulator.project}?namespace={gateway.namespace}", emulator.env, gateway


def _in_another_process(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    environ = {**os.environ, **env, "PYTHONPATH": repo}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=environ,
                          capture_output=True, text=True, timeout=120)


_GROW_AND_ADD = """
    import sys
    from gds_counter import CounterShardDS, aio, open_gateway
    gateway = open_gateway(sys.argv[1])
    counter = CounterShardDS(sys.argv[2], 1, gateway=gateway)
    counter.increase_shards(40)
    for _ in range(80):
        counter.add(5)
    print(counter.get_count())
    gateway.close()
"""


def test_the_command_resets_a_counter_another_process_grew(shared):
    """The issue's report: grown to 40 shards in one process, 400 added,
    then ``gds-counter reset T 1 --yes`` in another, which said it reset the
    counter and left 200. Every reader must now find 0."""
    url, env, gateway = shared
    target_type = f"T{uuid.uuid4().hex[:6]}"
    grown = _in_another_process(_GROW_AND_ADD, env, url, target_type)
    assert grown.returncode == 0, grown.stderr
    assert grown.stdout.split() == ["400"]
    before = dict(CounterShardDS(target_type, 1, gateway=gateway).shards())
    assert sum(count for n, count in before.items() if n > 20) > 0  # the shards a 20-shard reset missed

    reset = _in_another_process(
        "import sys; from gds_counter.cli import main; sys.exit(main(sys.argv[1:]))",
        env, "--url", url, "reset", target_type, "1", "--yes",
    )
    assert reset.returncode == 0, reset.stderr
    counter = CounterShardDS(target_type, 1, gateway=gateway)
    assert counter.get_count() == counter.get_count(method="lookup") == 0
    assert php_get_count(gateway, f"{target_type}_1") == 0
    assert all(count == 0 for _, count in counter.shards())


@pytest.mark.parametrize("any_gateway", EVERY, indirect=True)
def test_a_fresh_object_resets_every_shard_the_config_records(any_gateway):
    """Another object grew the counter; a new object, which has learned
    nothing yet, resets it all (it reads the config entity first)."""
    writer = CounterShardDS("Reset", 1, gateway=any_gateway)
    writer.increase_shards(40)
    for _ in range(40):
        writer.add(3)
    assert writer.get_count() == 120
    assert sum(count for n, count in writer.shards() if n > 20) > 0
    CounterShardDS("Reset", 1, gateway=any_gateway).reset()
    assert writer.get_count() == writer.get_count(method="lookup") == 0
    assert php_get_count(any_gateway, "Reset_1") == 0


@pytest.mark.parametrize("any_gateway", EVERY, indirect=True)
def test_a_general_counter_resets_every_shard_its_config_records(any_gateway):
    """The ndb layout: its reads trust the config entity, and so does its
    reset, whichever object grew it."""
    GeneralCounter("hits", gateway=any_gateway).increase_shards(40)
    counts = {n: n % 7 + 1 for n in NDB_GENERAL.shard_numbers(40)}
    any_gateway.commit([Upsert(NDB_GENERAL.shard_entity("hits", n, c, any_gateway.namespace)) for n, c in counts.items()])
    assert GeneralCounter("hits", gateway=any_gateway).get_count() == sum(counts.values())
    GeneralCounter("hits", gateway=any_gateway).reset()
    assert GeneralCounter("hits", gateway=any_gateway).get_count() == 0
    assert set(_stored(any_gateway, NDB_GENERAL, "hits", counts).values()) == {0}


@pytest.mark.parametrize("any_gateway", EVERY, indirect=True)
def test_a_reset_zeroes_what_a_php_writer_at_40_shards_wrote(any_gateway):
    """PHP at ``NUM_SHARDS`` 40 records its shard count nowhere, but
    ``get_count()`` (the article's query by target) counts shards 21..40, so
    a reset by a counter built with the article's 20 must zero them too;
    and an entity PHP keyed oddly for this target, which that query also
    counts."""
    counts = {n: n % 7 + 1 for n in range(1, 41)}
    _php_writes(any_gateway, "Counter Test_1", counts)
    any_gateway.commit([Upsert(RawEntity(Key.of(PHP_ARTICLE.shard_kind, "Counter Test_1_extra", namespace=any_gateway.namespace),
                                         {"target": "Counter Test_1", "count": 9}, frozenset({"count"})))])
    counter = CounterShardDS("Counter Test", 1, gateway=any_gateway)
    assert counter.get_count() == sum(counts.values()) + 9
    counter.reset()
    assert counter.get_count() == counter.get_count(method="lookup") == 0
    assert php_get_count(any_gateway, "Counter Test_1") == 0
    assert set(_stored(any_gateway, PHP_ARTICLE, "Counter Test_1", counts).values()) == {0}


@pytest.mark.parametrize("any_gateway", ["memory", "sqlite", "firestore"], indirect=True)
def test_after_a_reset_a_read_with_max_age_does_not_answer_the_old_total(any_gateway):
    """A rollup (``get_count(max_age=...)``) written before the reset held
    the old total, fresh for an hour: the reset writes it again, so the
    reads after it that accept an old total still see the reset."""
    counter = CounterShardDS("Reset", 1, gateway=any_gateway)
    counter.add(7)
    assert counter.get_count(max_age=3600) == 7  # rolled up
    assert counter.get_count_as_of(max_age=3600).from_rollup
    CounterShardDS("Reset", 1, gateway=any_gateway).reset()
    assert counter.get_count(max_age=3600) == 0
    assert CounterShardDS("Reset", 1, gateway=any_gateway).get_count(max_age=3600) == 0


def test_a_reset_writes_the_rollup_again_even_after_a_burst_of_rollup_reads(make_gateway):
    """Readers pace their rollup writes once a burst of ``max_age=0`` reads
    spent half the rollup's claims; the reset's own write is not a reader's
    and is not paced, or the total from before the reset would be served."""
    gateway = make_gateway("memory")
    counter = CounterShardDS("Reset", 2, gateway=gateway)
    for _ in range(80):
        counter.add(1)
        counter.get_count_as_of(max_age=0)
    counter.reset()
    assert counter.get_count(max_age=3600) == 0


# --- defect 2: a reset that fails part way tells what it applied -----------------------


RETRY = RetryPolicy(attempts=2, initial=0.001, maximum=0.002)


@pytest.fixture
def sixty_shards(make_gateway):
    """A PHP-layout counter of 60 shards (3 transactions: 25, 25, 10), each
    shard holding its number, on a memory gateway; the counter goes through
    a ``FaultyGateway`` whose commit faults the test scripts."""
    inner = make_gateway("memory")
    counts = {n: n for n in range(1, 61)}
    _php_writes(inner, "Reset_1", counts)

    def build(*commits):
        faulty = FaultyGateway(inner, script={"commit": list(commits)})
        return CounterShardDS("Reset", 1, gateway=faulty, num_shards=60, retry=RETRY), inner, counts

    return build


def test_a_reset_that_fails_after_its_first_chunk_raises_partial_reset_naming_what_it_zeroed(sixty_shards):
    """The second transaction keeps conflicting: shards 1..25 are 0 by then,
    so ``Contention`` ("nothing was applied") would be a lie. ``PartialReset``
    names the shards set to 0 and those left, and that is what is stored;
    a second ``reset()`` finishes the job."""
    counter, inner, counts = sixty_shards(None, ABORTED, ABORTED)
    with pytest.raises(PartialReset) as raised:
        counter.reset()
    error = raised.value
    assert error.zeroed == tuple(f"Reset_1_{n}" for n in range(1, 26))
    assert error.not_zeroed == tuple(f"Reset_1_{n}" for n in range(26, 61))
    assert error.unknown == ()
    assert isinstance(error.__cause__, Contention)
    assert "PARTLY reset" in str(error) and "shards 1-25" in str(error) and "shards 26-60" in str(error)
    stored = _stored(inner, PHP_ARTICLE, "Reset_1", counts)
    assert {n: c for n, c in stored.items() if n <= 25} == dict.fromkeys(range(1, 26), 0)
    assert {n: c for n, c in stored.items() if n > 25} == {n: counts[n] for n in range(26, 61)}
    assert counter.get_count() == sum(range(26, 61))

    counter.reset()
    assert counter.get_count() == 0


def test_a_reset_whose_later_commit_outcome_is_unknown_says_which_shards_are_in_doubt(sixty_shards):
    """The second commit was applied but its answer lost (``CommitUnknown``,
    never retried): its 25 shards are in doubt, the last 10 untouched."""
    counter, inner, counts = sixty_shards(None, DEADLINE_EXCEEDED)
    with pytest.raises(PartialReset) as raised:
        counter.reset()
    error = raised.value
    assert error.zeroed == tuple(f"Reset_1_{n}" for n in range(1, 26))
    assert error.unknown == tuple(f"Reset_1_{n}" for n in range(26, 51))
    assert error.not_zeroed == tuple(f"Reset_1_{n}" for n in range(51, 61))
    stored = _stored(inner, PHP_ARTICLE, "Reset_1", counts)
    assert all(stored[n] == 0 for n in range(1, 26))
    assert all(stored[n] in (0, counts[n]) for n in range(26, 51))
    assert all(stored[n] == counts[n] for n in range(51, 61))


def test_a_reset_whose_first_chunk_fails_raises_its_error_and_applied_nothing(sixty_shards):
    """Before any transaction committed, the error is the chunk's own, and
    its class tells the truth: ``Contention``, nothing applied."""
    counter, inner, counts = sixty_shards(ABORTED, ABORTED)
    with pytest.raises(Contention):
        counter.reset()
    assert _stored(inner, PHP_ARTICLE, "Reset_1", counts) == counts


def test_a_reset_whose_rollup_cannot_be_written_again_still_returns(make_gateway, caplog):
    """Every shard is 0 by the time the rollup is looked up again: a failure
    there must not raise (``Unavailable`` would say nothing was reset). It
    is logged, and the old rollup serves until it is ``max_age`` old."""
    inner = make_gateway("memory")
    CounterShardDS("Reset", 1, gateway=inner).add(7)
    assert CounterShardDS("Reset", 1, gateway=inner).get_count(max_age=3600) == 7  # rolled up
    # The reset's lookups: the config entity, its one transaction's shards, then the rollup.
    faulty = FaultyGateway(inner, script={"lookup": [None, None, UNAVAILABLE]})
    CounterShardDS("Reset", 1, gateway=faulty).reset()
    assert faulty.injector.counts() == {UNAVAILABLE: 1}
    assert CounterShardDS("Reset", 1, gateway=inner).get_count() == 0
    assert "rollup was not written again" in caplog.text
