"""RPCs per ``add()`` and per ``increment()``, for each strategy on each
server: the numbers docs/performance.md states (its "RPCs per
call" table). Counted by ``gateway.stats`` (every request sent, as Datastore
bills them), not timed.

* ``auto`` is the server-side increment (one commit, no read) wherever the
  server applies transforms: the embedded engine, the Firestore emulator
  (and production). On the legacy Datastore emulator, which ignores
  transforms, it is a transaction.
* a transaction is begin + lookup + commit;
* ``increment()`` is the write plus one read of the total: for the PHP
  layout, the article's target query (one RPC);
* ``strategy="increment"`` on the Datastore emulator sends nothing and raises.

The first call costs the same: ``CounterShardDS`` is given its shard count,
so it reads no config entity before writing, and a Datastore gateway learns
what its server does with a probe on a throwaway entity, counted as
``probe_rpcs``, not ``rpcs`` (once per gateway).
"""

from __future__ import annotations

import uuid

import pytest

from gds_counter.counter import CounterShardDS
from gds_counter.errors import TransformsIgnored
from gds_counter.testing import GATEWAY_NAMES

CALLS = 5

ONE_COMMIT = {"rpc.commit": 1}
TRANSACTION = {"rpc.begin_transaction": 1, "rpc.lookup": 1, "rpc.commit": 1}
TARGET_QUERY = {"rpc.run_query": 1}

#: strategy -> server -> the RPCs of one add() (None: refused, nothing sent).
ADD: dict[str, dict[str, dict[str, int] | None]] = {
    "auto": {"memory": ONE_COMMIT, "sqlite": ONE_COMMIT, "firestore": ONE_COMMIT, "datastore": TRANSACTION,
             "serve": ONE_COMMIT},
    "auto-grow": {"memory": ONE_COMMIT, "sqlite": ONE_COMMIT, "firestore": ONE_COMMIT, "datastore": TRANSACTION,
                  "serve": ONE_COMMIT},
    "increment": {"memory": ONE_COMMIT, "sqlite": ONE_COMMIT, "firestore": ONE_COMMIT, "datastore": None,
                  "serve": ONE_COMMIT},
    "transactional": {name: TRANSACTION for name in GATEWAY_NAMES},
}

#: docs/performance.md's table, in numbers: (RPCs per add(), RPCs per increment()).
README_TABLE = {
    ("auto", "memory"): (1, 2), ("auto", "sqlite"): (1, 2), ("auto", "firestore"): (1, 2), ("auto", "datastore"): (3, 4),
    ("increment", "memory"): (1, 2), ("increment", "sqlite"): (1, 2), ("increment", "firestore"): (1, 2),
    ("transactional", "memory"): (3, 4), ("transactional", "sqlite"): (3, 4),
    ("transactional", "firestore"): (3, 4), ("transactional", "datastore"): (3, 4),
    # gds-counter serve: the Datastore gateway on the embedded engine
    ("auto", "serve"): (1, 2), ("increment", "serve"): (1, 2), ("transactional", "serve"): (3, 4),
}


def _rpcs(stats: dict[str, int]) -> dict[str, int]:
    return {name: value for name, value in stats.items() if name.startswith("rpc.") and value}


def _times(rpcs: dict[str, int], n: int) -> dict[str, int]:
    return {name: value * n for name, value in rpcs.items()}


def test_the_readme_table_is_what_the_tests_measure():
    for (strategy, server), (per_add, per_increment) in README_TABLE.items():
        add = ADD[strategy][server]
        assert add is not None and sum(add.values()) == per_add
        assert per_increment == per_add + sum(TARGET_QUERY.values())


@pytest.mark.parametrize("server", GATEWAY_NAMES)
@pytest.mark.parametrize("strategy", sorted(ADD))
def test_rpcs_per_add_and_per_increment(make_gateway, server, strategy):
    gateway = make_gateway(server)
    counter = CounterShardDS("Rpc Costs", uuid.uuid4().hex[:8], gateway=gateway, strategy=strategy)
    expected = ADD[strategy][server]
    if expected is None:
        with pytest.raises(TransformsIgnored):
            counter.add()
        assert gateway.stats["rpcs"] == 0  # nothing was sent
        assert counter.get_count() == 0
        return

    counter.add()
    assert gateway.stats["rpcs"] == sum(expected.values())  # the first write costs no more
    gateway.stats.reset()
    for _ in range(CALLS):
        counter.add()
    assert _rpcs(gateway.stats.snapshot()) == _times(expected, CALLS)
    assert gateway.stats["rpcs"] == CALLS * sum(expected.values())
    assert gateway.stats["entity_writes"] == CALLS

    gateway.stats.reset()
    totals = [counter.increment() for _ in range(CALLS)]
    assert totals == list(range(CALLS + 2, 2 * CALLS + 2))
    with_read = dict(expected)
    for name, value in TARGET_QUERY.items():
        with_read[name] = with_read.get(name, 0) + value
    assert _rpcs(gateway.stats.snapshot()) == _times(with_read, CALLS)
    assert gateway.stats["rpcs"] == CALLS * sum(with_read.values())
    assert gateway.stats["rpcs"] == CALLS * README_TABLE[(strategy if strategy != "auto-grow" else "auto", server)][1]


@pytest.mark.parametrize("server", GATEWAY_NAMES)
def test_the_capability_probe_is_not_counted_as_the_callers_rpcs(make_gateway, server):
    gateway = make_gateway(server)
    CounterShardDS("Rpc Costs", uuid.uuid4().hex[:8], gateway=gateway).add()
    expected = 3 if server == "datastore" else 1
    assert gateway.stats["rpcs"] == expected
    # the embedded engine knows; the Datastore gateway asks its server (gds-counter serve's too)
    assert (gateway.stats["probe_rpcs"] > 0) == (server in ("datastore", "firestore", "serve"))
