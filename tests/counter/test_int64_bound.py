"""A shard that reaches a 64-bit bound: what each strategy tells its caller.

Datastore's increment transform does not fail at the 64-bit bounds, it
saturates (the stored value stops at 2**63-1 or -2**63). So a server-side
increment that comes back holding a bound WAS written, but its amount may
have been cut short: ``CountSaturated``, an error that says "written", never
``BadValueError`` (which promises that nothing was written, so that the
caller, or the combined writes of several callers, may send it again and
count it twice). A transaction reads the shard and computes the sum itself,
so reaching the bound exactly is an exact, ordinary success; only a sum
past the bound is refused, before anything is written.
"""

from __future__ import annotations

import io
import threading
import time
import uuid

import pytest

from gds_counter.cli import main
from gds_counter.counter import CounterShardDS, Shard
from gds_counter.counter.strategy import AUTO, TRANSACTIONAL
from gds_counter.errors import BadValueError, CountSaturated, GDSError

INT64_MAX = 2**63 - 1
INT64_MIN = -(2**63)


def one_shard(gateway, strategy: str) -> CounterShardDS:
    return CounterShardDS(f"big-{uuid.uuid4().hex[:8]}", 1, 1, gateway=gateway, strategy=strategy)


@pytest.mark.parametrize("sign", [1, -1], ids=["max", "min"])
@pytest.mark.parametrize("strategy", ["transactional", "increment", "auto"])
@pytest.mark.parametrize("name", ["memory", "memory+aio", "firestore", "firestore+aio"])
def test_reaching_a_bound_exactly_is_stored_and_never_called_not_written(make_gateway, name, strategy, sign):
    """Both gateways apply transforms, so ``increment`` and ``auto`` send a
    server-side increment: it is stored, and since the value it returns
    sits at the bound (where Datastore saturates) the caller is told it
    WAS written and may have been cut short. ``transactional`` computed
    the exact sum itself: plain success."""
    counter = one_shard(make_gateway(name), strategy)
    bound = INT64_MAX if sign > 0 else INT64_MIN
    counter.add(bound - 3 * sign)
    if strategy == "transactional":
        counter.add(3 * sign)
    else:
        with pytest.raises(CountSaturated) as info:
            counter.add(3 * sign)
        assert not isinstance(info.value, BadValueError)
        message = str(info.value)
        assert "WAS written" in message and str(bound) in message and counter.name in message
    assert counter.get_count() == bound


@pytest.mark.parametrize("name", ["memory", "firestore"])
def test_past_the_bound_a_transaction_refuses_before_writing(make_gateway, name):
    counter = one_shard(make_gateway(name), "transactional")
    counter.add(INT64_MAX - 1)
    with pytest.raises(BadValueError, match="nothing was written"):
        counter.add(5)
    assert counter.get_count() == INT64_MAX - 1


def test_past_the_bound_firestore_saturates_and_the_caller_is_told_it_was_written(firestore_gateway):
    counter = one_shard(firestore_gateway, "increment")
    counter.add(INT64_MAX - 1)
    with pytest.raises(CountSaturated, match="WAS written"):
        counter.add(5)
    assert counter.get_count() == INT64_MAX  # saturated: 1 of the 5 was counted


class SlowAuto:
    """``auto`` (a server-side increment on memory://), each attempt held
    long enough that the next callers combine into one write."""

    name = "slow-auto"

    def add(self, shard: Shard, amount: int) -> None:
        time.sleep(0.05)
        AUTO.add(shard, amount)


@pytest.mark.parametrize("trial", range(8))
def test_four_threads_at_the_bound_keep_exact_accounting(memory_gateway, trial):
    """The issue's repro: both shards of a 2-shard counter at 2**63-4, a
    slow write, four threads each add 1, so that some of them are combined.
    Every amount that came back counted is stored once, every
    ``CountSaturated`` one was written but may have been cut short at the
    bound (as Datastore saturates), and every ``BadValueError`` is an
    amount not stored. (Once, a refused sum made each caller write its
    amount again, and a write that reached 2**63-1 said ``BadValueError``:
    the total grew by 5.)"""
    name = f"big-{trial}"
    setup = CounterShardDS(name, 1, 2, gateway=memory_gateway, strategy="transactional")
    for number in setup.layout.shard_numbers(2):  # each shard to 2**63-4
        TRANSACTIONAL.add(setup._shard(number), INT64_MAX - 3)
    before = setup.get_count()
    counter = CounterShardDS(name, 1, 2, gateway=memory_gateway, strategy=SlowAuto())
    outcomes: list[object] = []
    lock = threading.Lock()

    def add_one() -> None:
        try:
            counter.add(1)
            outcome: object = "counted"
        except GDSError as exc:
            outcome = exc
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=add_one) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(outcomes) == 4
    counted = outcomes.count("counted")
    saturated = sum(isinstance(o, CountSaturated) for o in outcomes)
    assert all(o == "counted" or isinstance(o, (CountSaturated, BadValueError)) for o in outcomes), outcomes
    assert counted <= setup.get_count() - before <= counted + saturated, outcomes


def test_cli_increment_to_the_bound_exits_1_and_says_it_was_written(firestore_emulator, monkeypatch):
    """Exit 2 means bad input, nothing written; this value WAS written, so
    the command fails (1) with an error that says so."""
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", firestore_emulator.host)
    url = f"datastore://{firestore_emulator.project}?namespace=t-{uuid.uuid4().hex}"
    out, err = io.StringIO(), io.StringIO()
    code = main(["--url", url, "increment", "big", "1", "-n", str(INT64_MAX)], out=out, err=err, stdin=io.StringIO())
    assert code == 1, err.getvalue()
    assert "CountSaturated" in err.getvalue() and "WAS written" in err.getvalue()
    out, err = io.StringIO(), io.StringIO()
    assert main(["--url", url, "count", "big", "1"], out=out, err=err, stdin=io.StringIO()) == 0
    assert out.getvalue() == f"{INT64_MAX}\n"
