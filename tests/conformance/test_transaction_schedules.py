"""Generated two-actor transaction schedules, the Firestore emulator as oracle.

Hypothesis draws seed data over a small key space and two transactions, A
and B, interleaved step by step: each begins (read-write or read-only),
looks keys up, runs queries (kind-wide and ancestor, with or without a
filter), buffers puts and deletes, then commits or rolls back. The same
seed and schedule play on the embedded engine (memory and SQLite file) and
on the Firestore emulator in Datastore mode.

Each actor runs in a thread of its own and the schedule hands it one step
at a time, waiting ``STEP_WAIT`` seconds for the step to finish. The
emulator takes locks: a step can wait for the other actor (a writer for a
reader's lock, an insert for a query's range), so the schedule moves on
without it and the actor carries on when the lock is released; a deadlock
ends with the emulator aborting one of them ("Transaction lock timeout").
The embedded engine never waits; it validates at commit. So the two may
commit different subsets of a conflicting schedule, and what is compared
is what both guarantee:

* on every backend, the history is serializable: there is an order of the
  committed transactions in which every read of a committed transaction
  equals what that read gives on the state before it, the reads of every
  other transaction (rolled back, aborted, read-only) all equal one state
  of that order (one snapshot, repeatable), and the final state is the
  last one (an aborted transaction wrote nothing);
* two read-write transactions that both asked to commit are never both
  aborted;
* where the emulator's outcome does not depend on timing, the embedded
  result equals it exactly, order of query rows included
  (``fixed_by_schedule``): when neither actor writes what the other reads,
  locks or writes (a query locks its whole kind, in every namespace, on
  the emulator), and when one actor is read-only (it takes no locks; it
  reads as of its begin) and no step had to wait.

``GDS_TRANSACTION_SCHEDULES`` (100 in the full run, 15 in the quick run) sets how many schedules run;
``derandomize`` keeps CI deterministic.
"""

from __future__ import annotations

import itertools
import queue
import threading
import uuid
from typing import Any, Iterator, Sequence

import attrs
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sizes import sized

from gds_counter.errors import Contention
from gds_counter.gateway import open_gateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Upsert
from gds_counter.gateway.query import CompositeFilter, PropertyFilter, Query
from gds_counter.gateway.values import RawEntity

SCHEDULES = sized("GDS_TRANSACTION_SCHEDULES", 15, 100)
#: How long the schedule waits for one step before moving on (the step is
#: then waiting for a lock the other actor holds).
STEP_WAIT = 0.4
#: How long both actors may take to finish once every step was handed out
#: (the emulator's lock timeout is a few seconds).
FINISH_WAIT = 60.0
#: Kinds of this suite's own: the emulator's queries slow down with every
#: entity of their kind in any namespace, so other suites' kinds stay small.
KIND = "SchedT"
GROUP = "SchedP"
OTHER = "SchedU"
VALUES = (0, 1, 2)

# --- the key space ---------------------------------------------------------------
#: Entities (kinds GROUP, KIND and OTHER, written P, T and U in comments):
#: two in entity group P:g1, one in P:g2, one root entity, one root entity
#: in a second namespace, and one of another kind (the last two invisible
#: to the queries).
KEY_SPACE: tuple[tuple[str, tuple[Any, ...]], ...] = (
    ("", (GROUP, "g1", KIND, "a")),
    ("", (GROUP, "g1", KIND, "b")),
    ("", (GROUP, "g2", KIND, "c")),
    ("", (KIND, "d")),
    ("-other", (KIND, "e")),
    ("", (OTHER, "u")),
)
KEY_COUNT = len(KEY_SPACE)
#: Query scopes: which keys of the space a query can ever return.
SCOPES: dict[str, frozenset[int]] = {
    "kind": frozenset({0, 1, 2, 3}),
    "g1": frozenset({0, 1}),
    "g2": frozenset({2}),
}


#: What a query locks on the emulator: every entity of its kind, in every
#: namespace, whatever its ancestor or filter (measured: a transaction's
#: ancestor query on P:g2 makes a write of T:e in another namespace wait,
#: a write of U:u in its own namespace does not).
QUERY_LOCKS = frozenset(i for i, (_, flat) in enumerate(KEY_SPACE) if flat[-2] == KIND)


def keys_for(ns: str) -> list[Key]:
    return [Key.of(*flat, namespace=ns + suffix) for suffix, flat in KEY_SPACE]


def query_for(ns: str, scope: str, minimum: int | None) -> Query:
    flt: Any = None
    conditions = []
    if scope != "kind":
        conditions.append(PropertyFilter("__key__", "HAS_ANCESTOR", Key.of(GROUP, scope, namespace=ns)))
    if minimum is not None:
        conditions.append(PropertyFilter("v", ">=", minimum))
    if len(conditions) == 1:
        flt = conditions[0]
    elif conditions:
        flt = CompositeFilter("AND", conditions)
    return Query(KIND, namespace=ns, filter=flt)


# --- schedules as data -----------------------------------------------------------------


@attrs.frozen
class Op:
    """One step of one actor. ``what`` is begin, lookup, query, put, delete
    or end; ``args`` holds its operands (see ``play_op``)."""

    what: str
    args: tuple[Any, ...] = ()

    def __str__(self) -> str:
        return f"{self.what}{self.args if self.args else ''}"


@attrs.frozen
class Schedule:
    seed: tuple[int | None, ...]  # the value of v per key, None: absent
    read_only: tuple[bool, bool]
    steps: tuple[tuple[int, Op], ...]  # (actor, op) in the order handed out

    def describe(self) -> str:
        lines = [f"seed {self.seed}; read-only A={self.read_only[0]} B={self.read_only[1]}"]
        lines += [f"  {'AB'[actor]}: {op}" for actor, op in self.steps]
        return "\n".join(lines)

    def program(self, actor: int) -> list[Op]:
        return [op for who, op in self.steps if who == actor]


def ops(read_only: bool) -> st.SearchStrategy[Op]:
    lookup = st.lists(st.integers(0, KEY_COUNT - 1), min_size=1, max_size=3, unique=True).map(lambda ks: Op("lookup", tuple(ks)))
    query = st.tuples(st.sampled_from(sorted(SCOPES)), st.one_of(st.none(), st.sampled_from(VALUES[1:]))).map(
        lambda sq: Op("query", sq)
    )
    if read_only:
        return st.one_of(lookup, query)
    put = st.tuples(st.integers(0, KEY_COUNT - 1), st.sampled_from(VALUES)).map(lambda kv: Op("put", kv))
    delete = st.integers(0, KEY_COUNT - 1).map(lambda k: Op("delete", (k,)))
    return st.one_of(lookup, lookup, query, query, put, put, delete)


@st.composite
def schedules(draw: Any) -> Schedule:
    seed = tuple(draw(st.lists(st.one_of(st.none(), st.sampled_from(VALUES)), min_size=KEY_COUNT, max_size=KEY_COUNT)))
    read_only = draw(st.tuples(st.sampled_from((False, False, False, True)), st.sampled_from((False, False, False, True))))
    programs = []
    for actor in (0, 1):
        body = draw(st.lists(ops(read_only[actor]), min_size=1, max_size=4))
        commit = not read_only[actor] and draw(st.sampled_from((True, True, True, False)))
        programs.append([Op("begin", (read_only[actor],)), *body, Op("end", (commit,))])
    # the interleaving: which actor takes the next step, each keeping its own order
    order = draw(st.permutations([0] * len(programs[0]) + [1] * len(programs[1])))
    cursors = [0, 0]
    steps = []
    for actor in order:
        steps.append((actor, programs[actor][cursors[actor]]))
        cursors[actor] += 1
    return Schedule(seed, read_only, tuple(steps))


# --- playing a schedule --------------------------------------------------------------


@attrs.define
class Outcome:
    """What one actor saw: each read's answer in program order, whether it
    asked to commit, and whether it committed (``None``: still running)."""

    reads: list[tuple[Op, Any]] = attrs.field(factory=list)
    asked_commit: bool = False
    committed: bool | None = None
    aborted_at: str | None = None
    error: BaseException | None = None


class Actor:
    """One transaction in a thread of its own, fed one step at a time."""

    def __init__(self, gw: Any, keys: list[Key], ns: str) -> None:
        self.gw, self.keys, self.ns = gw, keys, ns
        self.outcome = Outcome()
        self.inbox: queue.Queue[Op | None] = queue.Queue()
        self.idle = threading.Event()
        self.idle.set()
        self.txn: bytes | None = None
        self.mutations: list[Any] = []
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def hand(self, op: Op) -> None:
        self.idle.clear()
        self.inbox.put(op)

    def _run(self) -> None:
        while True:
            op = self.inbox.get()
            if op is None:
                return
            try:
                if self.outcome.committed is None and self.outcome.error is None:
                    self._play(op)
            except Contention as exc:
                self.outcome.committed = False
                self.outcome.aborted_at = f"{op}: {exc}"[:200]
                self._quiet_rollback()
            except BaseException as exc:  # reported by the test
                self.outcome.error = exc
                self._quiet_rollback()
            finally:
                if self.inbox.empty():
                    self.idle.set()

    def _quiet_rollback(self) -> None:
        if self.txn is not None:
            try:
                self.gw.rollback(self.txn)
            except Exception:  # already ended by the server: nothing to undo
                pass
            self.txn = None

    def _play(self, op: Op) -> None:
        gw, txn = self.gw, self.txn
        if op.what == "begin":
            self.txn = gw.begin_transaction(read_only=op.args[0])
        elif op.what == "lookup":
            found = gw.lookup([self.keys[i] for i in op.args], transaction=txn)
            self.outcome.reads.append((op, tuple(value_of(e) for e in found)))
        elif op.what == "query":
            scope, minimum = op.args
            rows = gw.run_query(query_for(self.ns, scope, minimum), transaction=txn).entities
            self.outcome.reads.append((op, tuple((self.keys.index(e.key), value_of(e)) for e in rows)))
        elif op.what == "put":
            index, value = op.args
            self.mutations.append(Upsert(RawEntity(self.keys[index], {"v": value})))
        elif op.what == "delete":
            self.mutations.append(Delete(self.keys[op.args[0]]))
        elif op.what == "end":
            assert txn is not None
            self.txn = None
            if op.args[0]:
                self.outcome.asked_commit = True
                try:
                    gw.commit(self.mutations, transaction=txn)
                except Contention:
                    self.txn = txn
                    raise
                self.outcome.committed = True
            else:
                gw.rollback(txn)
                self.outcome.committed = False
        else:
            raise AssertionError(f"unknown step {op}")

    def finish(self, timeout: float) -> None:
        self.inbox.put(None)
        self.thread.join(timeout)


def value_of(entity: RawEntity | None) -> int | None:
    return None if entity is None else entity.properties["v"]


@attrs.frozen
class History:
    outcomes: tuple[Outcome, Outcome]
    final: tuple[int | None, ...]
    overran: int  # steps that did not finish within STEP_WAIT (waiting for a lock)


def play(gw: Any, schedule: Schedule) -> History:
    """Seed a fresh namespace, play the schedule, read the final state."""
    ns = f"s-{uuid.uuid4().hex[:12]}"
    keys = keys_for(ns)
    seed = [Upsert(RawEntity(k, {"v": v})) for k, v in zip(keys, schedule.seed) if v is not None]
    if seed:
        gw.commit(seed)
    actors = (Actor(gw, keys, ns), Actor(gw, keys, ns))
    overran = 0
    try:
        for who, op in schedule.steps:
            actor = actors[who]
            actor.hand(op)
            if not actor.idle.wait(STEP_WAIT):
                overran += 1
    finally:
        for actor in actors:
            actor.finish(FINISH_WAIT)
    for actor in actors:
        assert not actor.thread.is_alive(), f"an actor did not finish within {FINISH_WAIT}s\n{schedule.describe()}"
        if actor.outcome.error is not None:
            raise actor.outcome.error
    final = tuple(value_of(e) for e in gw.lookup(keys))
    return History((actors[0].outcome, actors[1].outcome), final, overran)


# --- the model: what a serial order would give ----------------------------------------------

State = tuple[int | None, ...]


def answer(op: Op, state: State) -> Any:
    """A read's answer on ``state`` (query rows compared as sets here; their
    order is compared with the emulator's where it is deterministic)."""
    if op.what == "lookup":
        return tuple(state[i] for i in op.args)
    scope, minimum = op.args
    return tuple(sorted((i, state[i]) for i in SCOPES[scope] if state[i] is not None and (minimum is None or state[i] >= minimum)))


def as_model(op: Op, seen: Any) -> Any:
    return tuple(sorted(seen)) if op.what == "query" else seen


def writes(program: Sequence[Op], state: State) -> State:
    out = list(state)
    for op in program:
        if op.what == "put":
            out[op.args[0]] = op.args[1]
        elif op.what == "delete":
            out[op.args[0]] = None
    return tuple(out)


def reads_fit(outcome: Outcome, state: State) -> bool:
    return all(as_model(op, seen) == answer(op, state) for op, seen in outcome.reads)


def serial_order(schedule: Schedule, history: History) -> tuple[int, ...] | None:
    """An order of the committed actors that explains the history, or None."""
    committed = [i for i in (0, 1) if history.outcomes[i].committed]
    others = [i for i in (0, 1) if not history.outcomes[i].committed]
    for order in itertools.permutations(committed):
        states = [tuple(schedule.seed)]
        fits = True
        for actor in order:
            if not reads_fit(history.outcomes[actor], states[-1]):
                fits = False
                break
            states.append(writes(schedule.program(actor), states[-1]))
        if not fits or states[-1] != history.final:
            continue
        if all(any(reads_fit(history.outcomes[i], s) for s in states) for i in others):
            return order
    return None


def footprint(program: Sequence[Op]) -> tuple[set[int], set[int]]:
    """The keys an actor's program reads (a query: what it locks on the
    emulator, ``QUERY_LOCKS``) and writes."""
    read: set[int] = set()
    written: set[int] = set()
    for op in program:
        if op.what == "lookup":
            read.update(op.args)
        elif op.what == "query":
            read.update(QUERY_LOCKS)
        elif op.what in ("put", "delete"):
            written.add(op.args[0])
    return read, written


def disjoint(schedule: Schedule) -> bool:
    """No key either actor reads or locks is written by the other: the
    emulator then takes no lock the other waits for, and every outcome is
    fixed by the schedule alone."""
    (ra, wa), (rb, wb) = footprint(schedule.program(0)), footprint(schedule.program(1))
    return not (wa & (rb | wb) or wb & (ra | wa))


def fixed_by_schedule(schedule: Schedule, oracle: History, history: History) -> bool:
    """Whether the emulator's outcome follows from the schedule alone, so
    that ``history`` must reproduce it exactly: the actors touch disjoint
    data, or one of them is read-only (it takes no locks, so nothing waits)
    and every step finished at once on both (a slow step would change the
    interleaving). A read-only transaction then reads the state as of its
    begin, the other one the newest committed state."""
    return disjoint(schedule) or (any(schedule.read_only) and oracle.overran == 0 and history.overran == 0)


def check(schedule: Schedule, history: History, backend: str) -> list[str]:
    """Everything wrong with one backend's history, as sentences."""
    problems = []
    if serial_order(schedule, history) is None:
        problems.append(f"{backend}: no serial order explains the history")
    a, b = history.outcomes
    if a.asked_commit and b.asked_commit and not a.committed and not b.committed:
        problems.append(f"{backend}: both read-write transactions aborted ({a.aborted_at}; {b.aborted_at})")
    return problems


def summary(history: History) -> Any:
    """What must be equal across backends when the outcome is fixed."""
    return (
        tuple((o.committed, tuple(o.reads)) for o in history.outcomes),
        history.final,
    )


def show(history: History) -> str:
    lines = []
    for name, o in zip("AB", history.outcomes):
        reads = "; ".join(f"{op} -> {seen}" for op, seen in o.reads)
        lines.append(f"  {name}: committed={o.committed} aborted_at={o.aborted_at} reads: {reads}")
    lines.append(f"  final {history.final}")
    return "\n".join(lines)


#: Found by this suite: B commits between read-only A's begin and its first
#: read; the emulator's A reads as of its begin (the embedded engine then
#: pinned its snapshot at the first read and saw B's write).
READ_ONLY_AFTER_A_COMMIT = Schedule(
    (1, None, 0, 1, None, 2),
    (True, False),
    ((0, Op("begin", (True,))), (1, Op("begin", (False,))), (1, Op("put", (0, 2))), (1, Op("end", (True,))),
     (0, Op("lookup", (0, 1))), (0, Op("query", ("kind", None))), (0, Op("end", (False,)))),
)


def test_the_model_refuses_histories_no_serial_order_explains() -> None:
    """The checker can fail: write skew, a torn read-only read and an
    aborted transaction that wrote are each refused; their serial
    counterparts are accepted."""
    skew = Schedule(
        (1, 1, None, None, None, None),
        (False, False),
        ((0, Op("begin", (False,))), (1, Op("begin", (False,))), (0, Op("lookup", (0, 1))), (1, Op("lookup", (0, 1))),
         (0, Op("put", (0, 0))), (1, Op("put", (1, 0))), (0, Op("end", (True,))), (1, Op("end", (True,)))),
    )
    a, b = Outcome([(Op("lookup", (0, 1)), (1, 1))], True, True), Outcome([(Op("lookup", (0, 1)), (1, 1))], True, True)
    assert serial_order(skew, History((a, b), (0, 0, None, None, None, None), 0)) is None
    b_later = Outcome([(Op("lookup", (0, 1)), (0, 1))], True, True)
    assert serial_order(skew, History((a, b_later), (0, 0, None, None, None, None), 0)) == (0, 1)
    b_aborted = Outcome([(Op("lookup", (0, 1)), (1, 1))], True, False, "commit")
    assert serial_order(skew, History((a, b_aborted), (0, 1, None, None, None, None), 0)) == (0,)
    assert serial_order(skew, History((a, b_aborted), (0, 0, None, None, None, None), 0)) is None  # B's write leaked
    move = Schedule(
        (1, 1, None, None, None, None),
        (True, False),
        ((0, Op("begin", (True,))), (1, Op("begin", (False,))), (0, Op("lookup", (0,))), (1, Op("put", (0, 0))),
         (1, Op("put", (1, 0))), (1, Op("end", (True,))), (0, Op("query", ("g1", 1))), (0, Op("end", (False,)))),
    )
    mover = Outcome([], True, True)
    after = (0, 0, None, None, None, None)
    torn = Outcome([(Op("lookup", (0,)), (1,)), (Op("query", ("g1", 1)), ())], False, False)
    assert serial_order(move, History((torn, mover), after, 0)) is None
    snapshot = Outcome([(Op("lookup", (0,)), (1,)), (Op("query", ("g1", 1)), ((1, 1), (0, 1)))], False, False)
    assert serial_order(move, History((snapshot, mover), after, 0)) == (1,)


def test_disjoint_schedules_take_query_locks_into_account() -> None:
    a_query = [Op("begin", (False,)), Op("query", ("g2", None)), Op("end", (True,))]
    for written, expected in ((4, False), (0, False), (5, True)):  # another namespace, another group, another kind
        b = [Op("begin", (False,)), Op("put", (written, 1)), Op("end", (True,))]
        steps = tuple((0, op) for op in a_query) + tuple((1, op) for op in b)
        assert disjoint(Schedule((None,) * KEY_COUNT, (False, False), steps)) is expected, written


# --- the test ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def backends(firestore_emulator: Any, tmp_path_factory: Any) -> Iterator[dict[str, Any]]:
    path = tmp_path_factory.mktemp("schedules") / "schedules.sqlite3"
    gateways = {
        "firestore": firestore_emulator.gateway(),
        "memory": open_gateway("memory://"),
        "sqlite": open_gateway(f"sqlite:///{path}"),
    }
    try:
        yield gateways
    finally:
        for gw in gateways.values():
            gw.close()


def test_generated_schedules_are_serializable_and_match_the_emulator(backends: dict[str, Any]) -> None:
    problems: list[str] = []
    counts = {"schedules": 0, "compared_exactly": 0, "emulator_waits": 0, "aborts": 0}

    @settings(max_examples=SCHEDULES, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    @given(schedules())
    @example(READ_ONLY_AFTER_A_COMMIT)
    def run(schedule: Schedule) -> None:
        counts["schedules"] += 1
        histories = {name: play(gw, schedule) for name, gw in backends.items()}
        counts["emulator_waits"] += histories["firestore"].overran
        counts["aborts"] += sum(o.aborted_at is not None for h in histories.values() for o in h.outcomes)
        found = [p for name, h in histories.items() for p in check(schedule, h, name)]
        oracle = histories["firestore"]
        fixed = [name for name, h in histories.items() if name != "firestore" and fixed_by_schedule(schedule, oracle, h)]
        counts["compared_exactly"] += bool(fixed)
        found += [f"{name}: differs from the emulator where its outcome is fixed by the schedule"
                  for name in fixed if summary(histories[name]) != summary(oracle)]
        if found:
            problems.append("\n".join([schedule.describe(), *found, *(f"{n}:\n{show(h)}" for n, h in histories.items())]))

    run()
    print(f"transaction schedules: {counts}")
    assert counts["schedules"] >= SCHEDULES
    assert not problems, f"{len(problems)} of {counts['schedules']} schedules failed:\n\n" + "\n\n".join(problems[:10])
