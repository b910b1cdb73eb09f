"""Counters on gRPC gateways across ``fork()``: a child that goes on using
the gateway it inherited counts, or is told why it cannot, and never hangs.

A gRPC channel does not survive ``fork()``: a child that sent on its
parent's channel, forked while the parent's threads were inside gRPC calls,
hung in about one call in three before each gateway made its own client in
a child (``gateway._grpc_clients``), and about one child in 12 to 24 still
did until each fork waited for the calls in flight (``RpcGate``). After a process has used gRPC asyncio,
no child of it can use gRPC: such a child is refused before anything is
sent. Each scenario runs in a parent process of its own
(``grpc_fork_parent.py``), not in the test run's, whose own channels would
otherwise cross the forks too; the stored total is then read here, and must
be what the parent and the children were told was counted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from sizes import size

from gds_counter import CounterShardDS, DistributedCounter
from gds_counter.gateway.datastore import DatastoreGateway
from gds_counter.gateway.firestore import FirestoreGateway

pytestmark = [pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() (POSIX)"), pytest.mark.emulator]

PARENT = Path(__file__).with_name("grpc_fork_parent.py")
CHILDREN = size(6, 12)
ADDS = size(10, 20)


def run_parent(*args: object) -> dict[str, Any]:
    """Run ``grpc_fork_parent.py`` with ``args``; its report."""
    done = subprocess.run([sys.executable, str(PARENT), *map(str, args)], capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    report["stderr"] = done.stderr
    return report


def told(report: dict[str, Any]) -> tuple[int, int]:
    """(acknowledged, unknown) adds of the parent and every child."""
    tallies = [report["parent"], *report["children"]]
    return sum(t["acked"] for t in tallies), sum(t["unknown"] for t in tallies)


@pytest.fixture(params=["firestore-datastore-mode", "serve", "firestore-native"])
def target(request: pytest.FixtureRequest) -> tuple[str, str, str, Any]:
    """(gateway kind, host, project, a reader of the counter's stored total)."""
    if request.param == "firestore-native":
        emulator = request.getfixturevalue("firestore_native_emulator")
        return "firestore", emulator.host, emulator.project, lambda name: DistributedCounter(
            f"GrpcFork/{name}", 4, gateway=FirestoreGateway(emulator.project, emulator_host=emulator.host))
    if request.param == "serve":
        host, project = request.getfixturevalue("serve_server").emulator_host, "grpc-fork"
    else:
        emulator = request.getfixturevalue("firestore_emulator")
        host, project = emulator.host, emulator.project
    return "datastore", host, project, lambda name: CounterShardDS(
        "GrpcFork", name, 4, gateway=DatastoreGateway(project, emulator_host=host))


def test_children_forked_while_the_parents_threads_send_count_through_the_gateway_they_inherited(target):
    kind, host, project, reader = target
    name = f"threads-{uuid.uuid4().hex[:12]}"
    report = run_parent("threads", kind, host, project, name, CHILDREN, ADDS)

    assert report["hung"] == 0, report
    assert report["statuses"] == [0] * CHILDREN, report
    # No thread was inside gRPC at a fork (the gateways' RpcGate), so gRPC ran its own fork handlers:
    # without them a child's calls hung now and then, even on a channel of its own.
    assert "skipping fork() handlers" not in report["stderr"], report["stderr"][-2000:]
    acked, unknown = told(report)
    stored = reader(name).get_count(method="lookup")
    assert acked <= stored <= acked + unknown, report
    children_acked = sum(child["acked"] for child in report["children"])
    assert children_acked >= CHILDREN * ADDS // 2, report  # they counted, not only raised


def test_children_forked_while_a_parents_thread_learns_the_servers_capabilities_learn_them_again(firestore_emulator):
    """The probe holds the gateway's capabilities lock across its RPCs; a
    child forked meanwhile, where that thread does not exist, used to wait
    for the lock for ever."""
    name = f"probe-{uuid.uuid4().hex[:12]}"
    report = run_parent("during-probe", "datastore", firestore_emulator.host, firestore_emulator.project, name,
                        2, ADDS)

    assert report["hung"] == 0, report
    assert report["statuses"] == [0, 0], report
    acked, unknown = told(report)
    assert acked >= ADDS, report
    stored = CounterShardDS("GrpcFork", name, 4, gateway=firestore_emulator.gateway()).get_count(method="lookup")
    assert acked <= stored <= acked + unknown, report


@pytest.mark.parametrize("server", ["firestore-datastore-mode", "serve"])
def test_a_transaction_open_at_a_fork_is_refused_on_both_sides_and_nothing_of_it_is_applied(request, server):
    """Both processes hold the transaction after the fork, and each would
    commit the same mutations: on the code before, the first commit was
    applied and the second process was told "nothing of it was applied"
    (so it redid the work: applied twice). Now each is refused
    (``Contention``, nothing applied), as the embedded engine refuses it."""
    if server == "serve":
        host, project = request.getfixturevalue("serve_server").emulator_host, "grpc-fork"
    else:
        emulator = request.getfixturevalue("firestore_emulator")
        host, project = emulator.host, emulator.project
    report = run_parent("transaction", "datastore", host, project, f"tx-{uuid.uuid4().hex[:12]}", 1, 1)

    assert report["hung"] == 0 and report["statuses"] == [0], report
    for tally in [report["parent"], *report["children"]]:
        assert tally["acked"] == tally["unknown"] == 0, report
        [refusal] = tally["refused"]
        assert refusal.startswith("Contention: ") and "was open when the process forked" in refusal, refusal
    assert report["stored_n"] == 0, report


def test_a_child_of_a_process_that_used_grpc_asyncio_is_refused_before_anything_is_sent(firestore_emulator):
    """And closing the inherited asyncio gateway there is harmless: it used
    to finalize the parent's channel in the child, which hung or crashed."""
    name = f"asyncio-{uuid.uuid4().hex[:12]}"
    report = run_parent("after-asyncio", "datastore", firestore_emulator.host, firestore_emulator.project, name,
                        4, ADDS)

    assert report["hung"] == 0, report
    assert report["statuses"] == [0] * 4, report
    for child in report["children"]:  # through the inherited asyncio gateway, or a new blocking one
        assert child["acked"] == child["unknown"] == 0, report
        [refusal] = child["refused"]
        assert refusal.startswith("GatewayError: ") and "forked from one that had used gRPC asyncio" in refusal
        assert "'spawn'" in refusal and refusal.endswith("Nothing was sent"), refusal
    stored = CounterShardDS("GrpcFork", name, 4, gateway=firestore_emulator.gateway()).get_count(method="lookup")
    assert stored == report["parent"]["acked"] == ADDS
