"""Shard affinity: which shard each attempt takes.

Writers of one process never share a shard while a free one remains; a
process stays on its own few shards, and leaves a shard where an attempt
met ``Contention`` or where it finds another writer's count, so that
processes settle onto disjoint shards. Two gateways on one SQLite file stand
for two processes: affinity is kept per gateway (in its runtime), as it is
per process. The clock, the dice and the number standing for the process id
are given to ``Runtime``/``AffinityShards``, never patched into modules.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
from typing import Hashable, Iterator, Mapping

import pytest

from gds_counter.counter import CounterShardDS
from gds_counter.counter.runtime import Runtime
from gds_counter.counter.shard_choice import (
    AVOID_SECONDS,
    MAX_COUNTERS,
    YIELD_PROBABILITY,
    AffinityShards,
    ShardChooser,
    _arc_start,
)
from gds_counter.counter.strategy import TRANSACTIONAL, Shard
from gds_counter.errors import Contention
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gds import RetryPolicy

FAST_RETRY = RetryPolicy(attempts=5, initial=0.001, maximum=0.002)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Always(random.Random):
    """Dice that always throw ``value``."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


#: Throws on either side of ``YIELD_PROBABILITY``: a process that throws
#: ``LEAVES`` leaves a shard where it finds another writer's count, one that
#: throws ``STAYS`` stays.
LEAVES, STAYS = YIELD_PROBABILITY / 2, (1 + YIELD_PROBABILITY) / 2


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def dice() -> random.Random:
    """Seeded choices, so a run is repeatable."""
    return random.Random(14)


@pytest.fixture
def chooser(clock, dice) -> AffinityShards:
    """The shard chooser of one process (of one gateway's runtime)."""
    return AffinityShards(clock, dice)


@contextlib.contextmanager
def holding(chooser: ShardChooser, counter: Hashable, shards: range) -> Iterator[int]:
    """A shard for one attempt, given back however the block ends, as the
    engine takes and gives back one per attempt."""
    shard = chooser.take(counter, shards)
    error: BaseException | None = None
    try:
        yield shard
    except BaseException as exc:
        error = exc
        raise
    finally:
        chooser.give_back(counter, shard, error)


@pytest.fixture
def open_process(tmp_path, clock, dice):
    """``open_process(instance=None, dice=None)``: a gateway on one shared
    SQLite file, standing for another process (affinity is per gateway's
    runtime), with a runtime on the test's clock and (unless given others)
    its dice; ``instance`` numbers the app instance it stands for (None:
    this process's id)."""
    opened: list[EmbeddedGateway] = []

    def open_process(instance: int | None = None, dice: random.Random = dice) -> EmbeddedGateway:
        opened.append(EmbeddedGateway(str(tmp_path / "shared.sqlite3")))
        Runtime(clock=clock, dice=dice, instance=instance).install(opened[-1])
        return opened[-1]

    yield open_process
    for gateway in opened:
        gateway.close()


def known(gateway) -> Mapping[Hashable, object]:
    """What the gateway's shard chooser knows, per counter."""
    shards = Runtime.of(gateway).shards
    assert isinstance(shards, AffinityShards)
    return shards._known


class Recording:
    """A strategy that writes nothing and records the shard of each attempt."""

    name = "recording"

    def __init__(self, fail_on: set[int] | None = None, barrier: threading.Barrier | None = None) -> None:
        self.attempts: list[int] = []
        self.fail_on = fail_on or set()
        self.barrier = barrier
        self.lock = threading.Lock()

    def add(self, shard: Shard, amount: int) -> None:
        with self.lock:
            self.attempts.append(shard.number)
        if self.barrier is not None:
            self.barrier.wait(timeout=30)
        if shard.number in self.fail_on:
            self.fail_on = set()  # once
            raise Contention(f"{shard} is taken (test)", attempts=1)


def shards_written(counter: CounterShardDS) -> set[int]:
    return {number for number, count in counter.shards() if count}


def test_writers_of_one_process_never_share_a_shard_while_one_is_free(chooser):
    # 16 writers all holding a shard of one counter at once, on 20 shards: 16
    # different shards. (Callers of one counter object are combined into one
    # write at a time, test_combined_writes; these are writers that are not:
    # counters written with different strategies, or other event loops.)
    counter = ("", "CounterShard", "Counter Test")
    for _ in range(3):
        barrier = threading.Barrier(16)
        taken: list[int] = []

        def write() -> None:
            with holding(chooser, counter, range(1, 21)) as number:
                taken.append(number)
                barrier.wait(timeout=30)

        threads = [threading.Thread(target=write) for _ in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(taken) == 16
        assert len(set(taken)) == 16


def test_counters_written_differently_hold_different_shards_at_once(memory_gateway):
    """Two counter objects of one counter whose writes are not combined
    (different strategies) take different shards while both write."""
    barrier = threading.Barrier(2)
    strategies = [Recording(barrier=barrier), Recording(barrier=barrier)]
    counters = [CounterShardDS("Counter Test", 1, 20, gateway=memory_gateway, strategy=s) for s in strategies]
    threads = [threading.Thread(target=c.add) for c in counters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    [first], [second] = (s.attempts for s in strategies)
    assert first != second


def test_when_every_shard_is_held_the_least_held_is_shared(chooser):
    counter = ("ns", "Kind", "c")
    with holding(chooser, counter, range(1, 4)) as a:
        with holding(chooser, counter, range(1, 4)) as b:
            with holding(chooser, counter, range(1, 4)) as c:
                assert {a, b, c} == {1, 2, 3}
                with holding(chooser, counter, range(1, 4)) as d:
                    with holding(chooser, counter, range(1, 4)) as e:
                        assert d in {1, 2, 3} and e in {1, 2, 3} and d != e


def test_a_process_alone_writes_every_shard_in_turn(memory_gateway, dice):
    Runtime(dice=dice).install(memory_gateway)
    counter = CounterShardDS("Counter Test", 1, 20, gateway=memory_gateway, strategy="transactional")
    for expected in range(1, 41):
        assert counter.increment() == expected
    assert dict(counter.shards(method="lookup")) == {n: 2 for n in range(1, 21)}  # not piled onto one entity
    assert memory_gateway.stats["counter.shard_moves"] == 0


def test_processes_started_together_begin_their_arcs_apart():
    """Worker processes started together have consecutive ids: their arcs
    start at least 2 of 20 shards apart, for any such ids (random starts
    put two of four on the same or the next shard most of the time)."""
    for first in range(1, 3000, 7):
        starts = []
        for pid in range(first, first + 4):
            starts.append(_arc_start(20, ("", "CounterShard", "Counter Test"), pid))
        ordered = sorted(starts)
        gaps = [(ordered[(i + 1) % 4] - ordered[i]) % 20 for i in range(4)]
        assert min(gaps) >= 2, (first, starts)


def test_after_contention_a_process_keeps_off_that_shard_and_to_its_first_choices(memory_gateway, clock, dice):
    Runtime(clock=clock, dice=dice).install(memory_gateway)
    strategy = Recording()
    counter = CounterShardDS("Counter Test", 1, 20, gateway=memory_gateway, strategy=strategy, retry=FAST_RETRY)
    counter.add()
    strategy.fail_on = set(range(1, 21))  # whichever shard the next attempt takes
    counter.add()  # contention, then a retry elsewhere
    failed, moved_to = strategy.attempts[-2:]
    assert failed != moved_to
    for _ in range(10):  # others are about: no longer spread, and never `failed`
        counter.add()
        assert strategy.attempts[-1] == moved_to
    clock.now += AVOID_SECONDS + 1  # later, alone again: spread over all, `failed` too
    for _ in range(100):
        counter.add()
    assert failed in strategy.attempts[-100:] and len(set(strategy.attempts[-100:])) > 5
    assert memory_gateway.stats["counter.shard_moves"] == 1


def test_with_others_about_a_process_keeps_to_an_arc_of_consecutive_shards(chooser, clock):
    """Its first choices are consecutive (wrapping around), from a start of
    its own: arcs of two processes overlap less often than random sets."""
    counter = ("ns", "Kind", "arc")
    starts = set()
    for trial in range(8):
        gateway_counter = (*counter, trial)
        with contextlib.ExitStack() as held:
            with chooser._lock:
                chooser._state(gateway_counter).contended(clock.now)
            taken = [held.enter_context(holding(chooser, gateway_counter, range(1, 21))) for _ in range(4)]
        start = taken[0]
        assert taken == [(start - 1 + i) % 20 + 1 for i in range(4)]
        starts.add(start)
    assert len(starts) > 1  # each counter state draws its own start


@pytest.mark.parametrize("throw, moves", [(LEAVES, 1), (STAYS, 0)])
def test_a_process_leaves_a_shard_where_it_finds_another_writers_count(open_process, clock, throw, moves):
    """It leaves when its dice say so (``YIELD_PROBABILITY``), and either
    way knows that others are about."""
    ours, php = open_process(dice=Always(throw)), open_process()
    counter = CounterShardDS("Counter Test", 1, 1, gateway=ours, strategy="transactional")
    assert counter.increment() == 1
    assert counter.increment() == 2  # its own count: nothing to leave
    assert ours.stats["counter.shard_moves"] == 0
    # Another writer (a PHP app, another process) adds 5 to that very shard.
    TRANSACTIONAL.add(Shard(php, counter.layout, counter.name, 1), 5)
    assert counter.increment() == 8  # found 7 where this process left 2
    assert ours.stats["counter.shard_moves"] == moves
    state = known(ours)[counter._identity()]
    assert (1 in state.avoid_until) == bool(moves)
    assert state.contended_until > clock.now  # others are about, either way


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_processes_settle_onto_disjoint_shards(open_process, clock, dice, seed):
    dice.seed(seed)
    processes = [open_process() for _ in range(4)]
    counters = [CounterShardDS("Counter Test", 1, 20, gateway=p, strategy="transactional") for p in processes]
    used: list[list[int]] = [[] for _ in counters]

    def spy(i: int) -> None:
        before = dict(counters[i].shards(method="lookup"))
        counters[i].add()
        after = dict(counters[i].shards(method="lookup"))
        [shard] = [n for n in after if after[n] != before.get(n, 0)]
        used[i].append(shard)

    for _ in range(40):
        for i in range(len(counters)):
            spy(i)
    last = [set(shards[-10:]) for shards in used]
    for i in range(len(last)):
        for j in range(i + 1, len(last)):
            assert not last[i] & last[j], f"processes {i} and {j} still share shards {last[i] & last[j]}"
    total = sum(len(shards) for shards in used)
    assert counters[0].get_count() == total


def test_a_grown_counter_spreads_over_its_new_shards_too(chooser):
    counter = ("ns", "Kind", "grown")
    with holding(chooser, counter, range(1, 3)):
        pass
    held = []
    with contextlib.ExitStack() as stack:
        for _ in range(6):
            held.append(stack.enter_context(holding(chooser, counter, range(1, 7))))
    assert sorted(held) == [1, 2, 3, 4, 5, 6]


def test_knowledge_is_kept_for_the_most_recent_counters_only(chooser):
    """At most ``MAX_COUNTERS`` (and the ones being written): the least
    recently used counter nobody is writing is forgotten first."""
    last = f"c{MAX_COUNTERS + 9}"
    with holding(chooser, "held", range(1, 3)):
        for i in range(MAX_COUNTERS + 10):
            with holding(chooser, f"c{i}", range(1, 3)):
                pass
        remembered = chooser._known
        assert len(remembered) <= MAX_COUNTERS + 1 and "held" in remembered and last in remembered


def test_a_strategy_used_outside_a_counter_reports_to_nobody(memory_gateway, clock, dice):
    class Told(AffinityShards):
        def __init__(self) -> None:
            super().__init__(clock, dice)
            self.told: list[str] = []

        def take(self, counter: Hashable, shards: range) -> int:
            self.told.append("take")
            return super().take(counter, shards)

        def wrote(self, counter: Hashable, shard: int, found: int, stored: int) -> bool:
            self.told.append("wrote")
            return super().wrote(counter, shard, found, stored)

    chooser = Told()
    Runtime(clock=clock, dice=dice, shards=chooser).install(memory_gateway)
    counter = CounterShardDS("Counter Test", 1, 20, gateway=memory_gateway)
    TRANSACTIONAL.add(Shard(memory_gateway, counter.layout, counter.name, 3), 2)
    assert chooser.told == [] and not chooser._known
    assert counter.get_count() == 2


def test_processes_on_a_locking_server_count_every_increment_once(firestore_emulator):
    # Two gateways in one namespace stand for two processes on the Firestore
    # emulator (pessimistic locks): 2 x 3 writers, whichever shards they settle on.
    namespace = f"t-affinity-{random.randrange(1 << 32):08x}"
    processes = [firestore_emulator.gateway(namespace=namespace) for _ in range(2)]
    try:
        counters = [CounterShardDS("Counter Test", 1, 20, gateway=p, strategy="transactional") for p in processes]
        totals: list[int] = []

        def write(counter: CounterShardDS) -> None:
            for _ in range(10):
                totals.append(counter.increment())

        threads = [threading.Thread(target=write, args=(c,)) for c in counters for _ in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(totals) == 60
        assert counters[0].get_count() == counters[1].get_count("lookup") == 60
        assert max(totals) == 60
    finally:
        for gateway in processes:
            gateway.close()


def test_a_writer_skips_a_shard_another_process_is_seen_writing(open_process, clock, dice):
    ours, theirs = open_process(), open_process()
    counter = CounterShardDS("Counter Test", 1, 20, gateway=ours, strategy="transactional")
    assert counter.increment() == 1  # its read of every shard is the baseline
    [mine] = shards_written(counter)
    order = known(ours)[counter._identity()].order
    busy = next(n for n in order if n != mine)
    TRANSACTIONAL.add(Shard(theirs, counter.layout, counter.name, busy), 1)
    assert counter.get_count() == 2  # sees `busy` change: another process writes it
    before = dict(counter.shards())
    counter.add()
    [landed] = [n for n, count in counter.shards() if count != before[n]]
    # others are about: the first of this process's choices that is not busy
    assert landed == next(n for n in order if n != busy)


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork() (POSIX)")
def test_processes_forked_from_one_parent_draw_arcs_of_their_own(memory_gateway):
    """gunicorn --preload hands every worker a fork of one process: each must
    still start its arc at a shard of its own choosing, not its siblings'
    (nor carry on along its parent's)."""
    counter = ("ns", "Kind", "forked")
    chooser = Runtime.of(memory_gateway).shards  # the default runtime's: this process's id, fresh dice
    with holding(chooser, counter, range(1, 1001)):  # the parent has an arc, and has moved along it
        pass
    starts = []
    for _ in range(6):
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child's side
            try:
                # A writer alone takes the first shard of its arc.
                os.write(write_end, str(chooser.take(counter, range(1, 1001))).encode())
            finally:
                os._exit(0)
        os.close(write_end)
        starts.append(int(os.read(read_end, 16)))
        os.close(read_end)
        os.waitpid(pid, 0)
    assert len(set(starts)) > 1, starts  # identical dice would give one start, six times


# --- app instances modelled in one process (the workshop demo) -------------------------


def test_gateways_of_one_process_share_its_arc_unless_their_runtimes_are_separate_instances(open_process):
    """The arc's start belongs to the process: two gateways of one process
    begin at the same shard. A gateway whose runtime is
    ``Runtime(instance=n)`` begins where a process with id ``n`` would,
    whatever this process's id, so that a program modelling several app
    instances in one process models them honestly."""
    counter = ("", "CounterShard", "Counter Test")

    def first_choice(gateway) -> int:
        with holding(Runtime.of(gateway).shards, counter, range(1, 21)) as shard:
            return shard

    plain = [first_choice(open_process()) for _ in range(2)]
    assert plain[0] == plain[1] == _arc_start(20, counter, os.getpid()) + 1
    marked = [first_choice(open_process(instance=number)) for number in (1, 2, 3, 4)]
    assert marked == [_arc_start(20, counter, number) + 1 for number in (1, 2, 3, 4)]
    assert len(set(marked)) == 4


def test_a_separate_instance_throws_its_own_dice(open_process, clock):
    """Whether an instance leaves a shard where it finds another writer's
    count is its own throw (its runtime's dice), not another instance's of
    the same process: separate processes do not share dice."""
    ours = open_process(instance=7, dice=Always(LEAVES))  # this instance's dice: always leave
    theirs = open_process(instance=8, dice=Always(STAYS))  # the other's: never leave
    mine = CounterShardDS("Counter Test", 1, 1, gateway=ours, strategy="transactional")
    other = CounterShardDS("Counter Test", 1, 1, gateway=theirs, strategy="transactional")
    assert mine.increment() == 1
    assert other.increment() == 2  # its first write there: nothing to compare
    assert mine.increment() == 3  # found 2 where this instance left 1: leaves
    assert other.increment() == 4  # found 3 where it left 2: stays
    assert ours.stats["counter.shard_moves"] == 1
    assert theirs.stats["counter.shard_moves"] == 0


def test_a_runtime_installed_as_another_instance_starts_without_what_the_gateway_learned(memory_gateway):
    counter = ("ns", "Kind", "relearn")
    with holding(Runtime.of(memory_gateway).shards, counter, range(1, 21)):
        pass
    assert counter in known(memory_gateway)
    Runtime(instance=3).install(memory_gateway)
    assert not known(memory_gateway)
    with holding(Runtime.of(memory_gateway).shards, counter, range(1, 21)) as shard:
        assert shard == _arc_start(20, counter, 3) + 1
