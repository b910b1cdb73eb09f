"""Every counter operation together, against a model (issue 36).

Defects sit where two features meet, so one stateful test (hypothesis's
``RuleBasedStateMachine``) combines what users combine, on one storage at
a time (memory, a SQLite file, ``gds-counter serve``, the Firestore
emulator): ``add``/``increment``/``decrement`` through several counter
objects (a second object, ``strategy="auto-grow"``, ``cache=True``, a
Redis cache), ``reset``, ``increase_shards``, reads by query and by
lookup, ``get_count(max_age=...)`` and ``gds-counter rollup``,
``get_counts``, a second process, PHP's writer at NUM_SHARDS=40, ndb's
layout, overlapping writes from threads, and faults: Ctrl-C at a random
moment, a lost commit answer, a server restart (also under a write), a
Redis restart.

The model (``model_bounds.py``) is one integer per counter plus the
amounts of calls whose outcome the errors table calls unknown. Every total
read must lie within the bounds the docs allow for that read (exact now;
a rollup: true at some moment within ``max_age``; a cache: true within its
``ttl`` plus the writes it sees), and every error's class must say what
the errors table says ("was the increment stored").

CI runs a short search per gateway (the quick run a shorter one:
``tests/sizes.py``). The long run, on demand::

    GDS_MODEL_SECONDS=1200 pytest tests/reliability/test_counter_model.py -s

keeps drawing new examples (seed, seed+1, ...) until the time is spent on
each gateway, then prints the seed and the steps run. A failure names its
seed: ``GDS_MODEL_SEED=N`` replays it (with the same example counts).
"""

from __future__ import annotations

import datetime as dt
import os
import random
import threading
import time
import uuid
from typing import Any, Callable

import pytest
from hypothesis import HealthCheck, Phase, seed, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from model_bounds import CounterModel
from model_world import Defect, Interrupter, World, call, in_thread, outcome_of, reset_outcome
from sizes import sized

from gds_counter import CounterShardDS, GeneralCounter, RetryPolicy, get_counts
from gds_counter.testing.faults import ABORTED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, UNAVAILABLE, FaultyGateway

GATEWAYS = ["memory", "sqlite", "serve", "firestore"]
#: Every call's deadline: a call never runs for long, even under faults.
RETRY = RetryPolicy(deadline=10.0)
CACHE_TTL = 60.0  # cache=True's and the Redis cache's default ttl
AMOUNTS = st.one_of(st.integers(-5, 5).filter(bool), st.sampled_from([2**40, -(2**40), 1000]))
WRITERS = ("main", "second", "grow", "cached", "redis")
SEEN_BY = {"main": ("local",), "second": ("local",), "grow": ("local",), "cached": ("local",),
           "redis": ("local", "redis")}


def check(problem: str | None) -> None:
    if problem is not None:
        raise Defect(problem)


class CounterMachine(RuleBasedStateMachine):
    """The rules; ``world`` is set by the test, one per gateway."""

    world: World
    steps = 0

    def __init__(self) -> None:
        super().__init__()
        world = self.world
        gateway = world.gateway
        self.kind = f"m{uuid.uuid4().hex[:10]}"
        self.models = {t: CounterModel(f"{self.kind}_{t}") for t in (1, 2)}
        self.ndb_model = CounterModel(f"n-{self.kind}")

        def make(target: int, **options: Any) -> CounterShardDS:
            return CounterShardDS(self.kind, target, gateway=gateway, retry=RETRY, **options)

        self.objects: dict[tuple[int, str], CounterShardDS] = {
            (1, "main"): make(1), (1, "second"): make(1, strategy="transactional"),
            (1, "grow"): make(1, strategy="auto-grow"), (1, "cached"): make(1, cache=True),
            (1, "redis"): make(1, cache=world.redis_url),
            (2, "main"): make(2), (2, "second"): make(2, strategy="transactional"),
            (2, "grow"): make(2, strategy="auto-grow"), (2, "cached"): make(2, cache=True),
            (2, "redis"): make(2, cache=world.redis_url),
        }
        self.ndb = GeneralCounter(self.ndb_model.name, gateway=gateway, retry=RETRY)

    @invariant()
    def count_steps(self) -> None:
        type(self).steps += 1

    # --- writes --------------------------------------------------------------------------

    def _wrote(self, target: int, writer: str, amount: int, started: float,
               result: tuple[Any, BaseException | None], what: str) -> None:
        value, error = result
        model = self.models[target]
        model.write(amount, outcome_of(error, what), started, time.time(), SEEN_BY[writer])
        if writer == "grow":
            model.grown(self.objects[target, "grow"].num_shards)
        if what.startswith("increment") and error is None:
            # increment() reads its new total from storage, by the query
            check(model.exact(value, lookup=False))

    @rule(which=st.sampled_from([1, 2]), writer=st.sampled_from(WRITERS), amount=AMOUNTS,
          how=st.sampled_from(["add", "increment", "decrement"]))
    def write(self, which: int, writer: str, amount: int, how: str) -> None:
        counter = self.objects[which, writer]
        started = time.time()
        if how == "add":
            result = call(lambda: counter.add(amount))
        elif how == "increment":
            result = call(lambda: counter.increment(amount))
        else:
            result = call(lambda: counter.decrement(-amount))
        self._wrote(which, writer, amount, started, result, f"{how} via {writer}")

    @rule(amounts=st.lists(st.tuples(st.sampled_from(["main", "second", "cached"]), AMOUNTS), min_size=2, max_size=5))
    def overlapping_writes(self, amounts: list[tuple[str, int]]) -> None:
        """Writes from several threads at once, combined where they meet."""
        started = time.time()
        runs = [in_thread(lambda c=self.objects[1, w], a=a: c.add(a)) for w, a in amounts]
        for thread, _ in runs:
            thread.join(60)
            assert not thread.is_alive(), "an add hung past its deadline"
        for (writer, amount), (_, out) in zip(amounts, runs):
            if not out:
                raise Defect("an add raised an error that is not a GDSError (see the thread's traceback)")
            self._wrote(1, writer, amount, started, out[0], f"add via {writer} (in a thread)")

    @rule(which=st.sampled_from([1, 2]), amount=AMOUNTS,
          fault=st.sampled_from([ABORTED, UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED]),
          call_name=st.sampled_from(["commit", "commit", "lookup", "begin_transaction"]),
          strategy=st.sampled_from(["auto", "transactional"]))
    def write_under_a_fault(self, which: int, amount: int, fault: str, call_name: str, strategy: str) -> None:
        """One fault on the next call of that name: ABORTED/UNAVAILABLE are
        retried (stored once), a commit whose answer is lost is
        ``CommitUnknown``, quota exhaustion a ``GatewayError``."""
        faulty = FaultyGateway(self.world.gateway, script={call_name: [fault]})
        counter = CounterShardDS(self.kind, which, gateway=faulty, retry=RETRY, strategy=strategy)
        started = time.time()
        result = call(lambda: counter.add(amount))
        # another gateway object: the local cache does not see its writes
        self.models[which].write(amount, outcome_of(result[1], f"add under {fault} on {call_name}"), started,
                                  time.time())

    @precondition(lambda self: self.world.name in ("memory", "sqlite"))
    @rule(amount=AMOUNTS, delay=st.floats(0.0, 0.003))
    def interrupted_write(self, amount: int, delay: float) -> None:
        """Ctrl-C ``delay`` s into an add: returned means stored, an
        interrupt means unknown. (Not on the gRPC gateways:
        docs/reliability.md, "Ctrl-C and the Datastore gateway".)"""
        interrupter = Interrupter()
        try:
            started = time.time()
            result = interrupter.run(lambda: self.objects[1, "main"].add(amount), delay)
        finally:
            interrupter.close()
        # an interrupt before the write began takes its amount out and leaves
        # the cache alone, so the cache is not assumed to have seen it
        self.models[1].write(amount, outcome_of(result[1], "interrupted add"), started, time.time(),
                             () if isinstance(result[1], KeyboardInterrupt) else ("local",))

    @precondition(lambda self: self.world.spec is not None)
    @rule(which=st.sampled_from([1, 2]), amount=AMOUNTS)
    def second_process_writes(self, which: int, amount: int) -> None:
        started = time.time()
        answer = self.world.child.ask({"op": "add", "type": self.kind, "id": which, "amount": amount})
        error = None if answer.get("ok") else _named_error(answer)
        self.models[which].write(amount, outcome_of(error, "add in the second process"), started, time.time())

    @rule(which=st.sampled_from([1, 2]), shard=st.integers(1, 40))
    def php_writes(self, which: int, shard: int) -> None:
        started = time.time()
        self.world.php_increment(self.models[which].name, shard)
        self.models[which].php_write(shard, started, time.time())

    @rule(amount=AMOUNTS)
    def ndb_writes(self, amount: int) -> None:
        started = time.time()
        result = call(lambda: self.ndb.add(amount))
        self.ndb_model.write(amount, outcome_of(result[1], "ndb add"), started, time.time(), ("local",))

    @rule(which=st.sampled_from([1, 2]), writer=st.sampled_from(["main", "second", "redis"]))
    def reset(self, which: int, writer: str) -> None:
        """``reset()`` "sets every shard to 0": acknowledged, the total is 0.

        Before issue 36's fixes this found two defects: a reset by an object
        that had not seen another object's (or process's)
        ``increase_shards`` left the shards past 20; and a reset left the
        shards PHP's NUM_SHARDS=40 writer wrote past the recorded count,
        which the query still counts."""
        model = self.models[which]
        started = time.time()
        _, error = call(self.objects[which, writer].reset)
        model.reset(reset_outcome(error, model.num_shards), started, time.time(), SEEN_BY[writer])

    @rule(writer=st.sampled_from(["main", "second", "redis"]),
          amounts=st.lists(st.tuples(st.sampled_from(["main", "second", "grow"]), AMOUNTS), min_size=1, max_size=4))
    def reset_under_writes(self, writer: str, amounts: list[tuple[str, int]]) -> None:
        """A reset racing with adds: each add it acknowledged is "either
        wiped or kept whole, never half", so each counts as 0 or its amount."""
        model = self.models[1]
        started = time.time()
        runs = [in_thread(lambda c=self.objects[1, w], a=a: c.add(a)) for w, a in amounts]
        _, error = call(self.objects[1, writer].reset)
        for thread, _ in runs:
            thread.join(60)
            assert not thread.is_alive(), "an add hung past its deadline"
        model.reset(reset_outcome(error, model.num_shards), started, time.time(), SEEN_BY[writer])
        model.grown(self.objects[1, "grow"].num_shards)  # its adds may have met contention
        for (adder, amount), (_, out) in zip(amounts, runs):
            if not out:
                raise Defect("an add raised an error that is not a GDSError (see the thread's traceback)")
            outcome = outcome_of(out[0][1], f"add via {adder} beside a reset")
            # stored: wiped or kept; the caches saw it either way, and a reset drops their total
            model.write(amount, "not" if outcome == "not" else "unknown", started, time.time(), SEEN_BY[adder])

    @rule(which=st.sampled_from([1, 2]), change=st.sampled_from([-5, 0, 5, 20]))
    def increase_shards(self, which: int, change: int) -> None:
        model = self.models[which]
        wanted = max(1, model.num_shards + change)
        result, error = call(lambda: self.objects[which, "second"].increase_shards(wanted))
        if wanted < model.num_shards:
            # "Fewer than now is refused with BadValueError", nothing changed
            assert isinstance(error, Exception) and type(error).__name__ == "BadValueError", (wanted, result, error)
            return
        if error is not None:
            raise Defect(f"increase_shards({wanted}) from {model.num_shards} raised {error!r}")
        assert result == wanted, (wanted, result)
        model.grown(wanted)

    # --- reads ------------------------------------------------------------------------------

    @rule(which=st.sampled_from([1, 2]), writer=st.sampled_from(["main", "second", "grow"]),
          method=st.sampled_from(["query", "lookup", "auto"]))
    def read(self, which: int, writer: str, method: str) -> None:
        value, error = call(lambda: self.objects[which, writer].get_count(method=method))
        if error is not None:
            raise Defect(f"get_count(method={method!r}) raised {error!r}")
        problem = self.models[which].exact(value, lookup=method == "lookup")
        if problem is not None:
            shards, _ = call(lambda: self.objects[which, "main"].shards(method="query"))
            raise Defect(f"{problem}; its shards now: {[s for s in shards or [] if s[1]]}")

    @rule(which=st.sampled_from([1, 2]), cache=st.sampled_from(["cached", "redis"]))
    def read_cached(self, which: int, cache: str) -> None:
        started = time.time()
        value, error = call(self.objects[which, cache].get_count)
        if error is not None:
            raise Defect(f"a {cache} get_count() raised {error!r}")
        check(self.models[which].cached(value, started, CACHE_TTL, "local" if cache == "cached" else "redis"))

    @rule(which=st.sampled_from([1, 2]), max_age=st.sampled_from([0, 0.5, 3, 600]),
          method=st.sampled_from(["auto", "lookup"]))
    def read_max_age(self, which: int, max_age: float, method: str) -> None:
        """A rollup read: true at its ``as_of``, at most ``max_age`` old."""
        started = time.time()
        found, error = call(lambda: self.objects[which, "main"].get_count_as_of(method, max_age=max_age))
        if error is not None:
            raise Defect(f"get_count_as_of(max_age={max_age}) raised {error!r}")
        as_of = found.as_of.timestamp()
        if as_of < started - max_age - 0.05:
            raise Defect(f"a total as of {found.as_of} is older than max_age={max_age} at {_utc(started)}")
        check(self.models[which].as_of(found.total, as_of, 0.0))
        plain, _ = call(lambda: self.objects[which, "main"].get_count(max_age=max_age))
        if plain is not None:
            check(self.models[which].as_of(plain, started, max_age))

    @rule(which=st.sampled_from([1, 2]), reads=st.sampled_from([5, 130]))
    def fresh_reads(self, which: int, reads: int) -> None:
        """A burst of ``get_count(max_age=0)`` reads (each may roll up; past
        ``MAX_CLAIMS`` live claims they write nothing), each one exact.
        (Before issue 36's fixes, ``gds-counter rollup`` then wrote nothing
        and exited 0: the ``rollup`` rule's check failed.)"""
        counter, model = self.objects[which, "main"], self.models[which]
        for _ in range(reads):
            started = time.time()
            value, error = call(lambda: counter.get_count(max_age=0))
            if error is not None:
                raise Defect(f"get_count(max_age=0) raised {error!r}")
            check(model.as_of(value, started, 0.0))

    @rule(real_command=st.booleans())
    def rollup(self, real_command: bool) -> None:
        """``gds-counter rollup`` refreshes the rollup of every counter in
        the storage (one with a shard stored): a read with any ``max_age``
        afterwards is true at a moment since it began, unless the command
        named the counter as held back by its claims and exited 1 (a long
        run refreshes every counter of the storage a few hundred times a
        minute, past the bound of live claims a rollup may list)."""
        started = time.time()
        held_back = self.world.rollup(real_command)  # named, with the command's exit status 1
        for target, model in self.models.items():
            found = self.objects[target, "main"].get_count_as_of(max_age=3600)
            if model.stored and model.name not in held_back and found.as_of.timestamp() < started - 0.05:
                raise Defect(f"{model.name}: after gds-counter rollup began at {_utc(started)}, its rollup is "
                             f"still as of {found.as_of} (from_rollup={found.from_rollup})")
            check(model.as_of(found.total, found.as_of.timestamp(), 0.0))

    @rule(use_cache=st.booleans(), max_age=st.sampled_from([None, None, 0, 5]))
    def read_many(self, use_cache: bool, max_age: float | None) -> None:
        started = time.time()
        listed = [(1, "main"), (2, "main"), (1, "cached"), (2, "redis")]
        totals, error = call(lambda: get_counts([*(self.objects[k] for k in listed), self.ndb],
                                                use_cache=use_cache, max_age=max_age))
        if error is not None:
            raise Defect(f"get_counts(use_cache={use_cache}, max_age={max_age}) raised {error!r}")
        for (target, writer), total in zip(listed, totals):
            self._check_listed(self.models[target], total, started, writer, use_cache, max_age)
        self._check_listed(self.ndb_model, totals[-1], started, "main", use_cache, max_age)

    @staticmethod
    def _check_listed(model: CounterModel, total: int, started: float, writer: str, use_cache: bool,
                      max_age: float | None) -> None:
        """``get_counts`` reads as ``get_count(method="lookup")``, a fresh
        cached total is not read, and with ``max_age`` a rollup at most that old."""
        allowed: list[Callable[[], str | None]] = [
            lambda: model.exact(total, lookup=True) if max_age is None else model.as_of(total, started, max_age)]
        if use_cache and writer in ("cached", "redis"):
            allowed.append(lambda: model.cached(total, started, CACHE_TTL, "local" if writer == "cached" else "redis"))
        problems = [found() for found in allowed]
        if all(problems):
            raise Defect(f"get_counts: {' / '.join(p for p in problems if p)}")

    @rule()
    def ndb_reads(self) -> None:
        value, error = call(self.ndb.get_count)
        if error is not None:
            raise Defect(f"GeneralCounter.get_count() raised {error!r}")
        check(self.ndb_model.exact(value, lookup=True))

    @precondition(lambda self: self.world.spec is not None)
    @rule(which=st.sampled_from([1, 2]), method=st.sampled_from(["query", "lookup"]))
    def second_process_reads(self, which: int, method: str) -> None:
        answer = self.world.child.ask({"op": "count", "type": self.kind, "id": which, "method": method})
        if not answer.get("ok"):
            raise Defect(f"get_count in the second process raised {answer}")
        check(self.models[which].exact(answer["total"], lookup=method == "lookup"))

    # --- restarts ---------------------------------------------------------------------------

    @rule()
    def snapshot_redis(self) -> None:
        """Redis saves a snapshot (as Memorystore does for its backups)."""
        self.world.snapshot_redis()
        for model in self.models.values():
            model.cache_saved("redis")

    @rule(restore=st.booleans())
    def restart_redis(self, restore: bool) -> None:
        """Redis restarts empty (then a read finds nothing cached), or from
        its last snapshot (a restore, or a failover to a copy): a total it
        then shows is still one the cache may show, true within its ttl and
        missing no add of its own writers that returned before the read.
        (Before issue 36's fixes, a restored total missed the adds
        acknowledged after the snapshot: ``read_cached`` failed.)"""
        restored = self.world.restart_redis(restore)
        for model in self.models.values():
            if restored:
                model.cache_restored("redis")
            else:
                model.cache_lost("redis")

    @precondition(lambda self: self.world.server is not None)
    @rule(under_writes=st.booleans(), amount=AMOUNTS, delay=st.floats(0.0, 0.02))
    def restart_server(self, under_writes: bool, amount: int, delay: float) -> None:
        """``gds-counter serve`` restarted on the same file: acknowledged
        writes stay; a transaction under way is lost, and a write that used
        it must raise a class that tells the truth. Under writes: a thread
        adds ``amount`` again and again (transactions) across the restart.
        (Before issue 36's fixes, the lost transaction's commit raised
        ``BadValueError``, "refused, nothing written", on valid input.)"""
        self.models[1].events.append(f"gds-counter serve restarted{' under adds' if under_writes else ''}")
        if not under_writes:
            self.world.restart_server(grace=1.0)
            return
        done = threading.Event()
        outcomes: list[tuple[float, float, tuple[Any, BaseException | None]]] = []

        def keep_adding() -> None:
            counter = self.objects[1, "second"]
            while not done.is_set() and len(outcomes) < 200:
                started = time.time()
                outcome = call(lambda: counter.add(amount))
                outcomes.append((started, time.time(), outcome))

        thread, out = in_thread(keep_adding)
        time.sleep(delay)
        self.world.restart_server(grace=0.0)
        time.sleep(0.01)
        done.set()
        thread.join(60)
        assert not thread.is_alive(), "an add hung past its deadline across a server restart"
        if not out:
            raise Defect("an add across a server restart raised an error that is not a GDSError")
        for started, ended, outcome in outcomes:
            self.models[1].write(amount, outcome_of(outcome[1], "add across a server restart"), started, ended,
                                 SEEN_BY["second"])


def _named_error(answer: dict[str, Any]) -> BaseException:
    """The second process's error, as an instance of the same class."""
    import gds_counter.errors as errors

    kind = getattr(errors, answer["error"], None)
    if not (isinstance(kind, type) and issubclass(kind, BaseException)):
        raise Defect(f"the second process raised {answer}")
    error: BaseException = kind(answer["message"]) if kind.__name__ != "Contention" else kind(answer["message"], attempts=1)
    return error


def _utc(moment: float) -> str:
    return dt.datetime.fromtimestamp(moment, dt.timezone.utc).isoformat()


def _settings(examples: int, steps: int) -> settings:
    shrink = os.environ.get("GDS_MODEL_SHRINK", "1") != "0"
    return settings(
        max_examples=examples, stateful_step_count=steps, deadline=None, database=None, print_blob=True,
        phases=[Phase.generate, Phase.shrink] if shrink else [Phase.generate],
        suppress_health_check=list(HealthCheck),
    )


@pytest.mark.parametrize("gateway_name", GATEWAYS)
def test_every_counter_operation_together_keeps_the_models_bounds(gateway_name, tmp_path, request, redis_server):
    """A short search in CI (``GDS_MODEL_EXAMPLES``/``GDS_MODEL_STEPS``
    change it); with ``GDS_MODEL_SECONDS`` it goes on drawing examples,
    seed after seed, for that long on this gateway."""
    if gateway_name == "serve":
        pytest.importorskip("grpc")
    first_seed = int(os.environ.get("GDS_MODEL_SEED") or random.SystemRandom().randrange(2**32))
    examples = sized("GDS_MODEL_EXAMPLES", 2, 6)
    steps = sized("GDS_MODEL_STEPS", 15, 25)
    seconds = float(os.environ.get("GDS_MODEL_SECONDS", "0"))

    world = World(gateway_name, tmp_path, redis_server, request)
    machine = type("Machine", (CounterMachine,), {"world": world, "steps": 0})
    ends = time.monotonic() + seconds
    current = first_seed
    try:
        while True:
            try:
                run_state_machine_as_test(seed(current)(machine), settings=_settings(examples, steps))
            except BaseException as exc:
                note = (f"model test on {gateway_name}: seed {current}; replay with GDS_MODEL_SEED={current} "
                        f"GDS_MODEL_EXAMPLES={examples} GDS_MODEL_STEPS={steps} pytest "
                        f"'tests/reliability/test_counter_model.py::{request.node.name}'")
                print(note)  # in the captured output, on every Python
                if hasattr(exc, "add_note"):  # Python 3.11+: in the traceback too
                    exc.add_note(note)
                raise
            if time.monotonic() >= ends:
                break
            current += 1
    finally:
        world.close()
    print(f"\nmodel test on {gateway_name}: seeds {first_seed}..{current}, {machine.steps} steps, "
          f"{examples} examples of up to {steps} steps per seed")
