"""``SharedReads``: callers of one query that arrive together share a read,
and never one that began before they arrived (that is what keeps an
increment's total strongly consistent)."""

from __future__ import annotations

import threading

import pytest

from gds_counter.gateway.embedded._shared_reads import SharedReads


class Reads:
    """A read function whose runs block until released, numbered in order."""

    def __init__(self) -> None:
        self.started: list[threading.Event] = [threading.Event() for _ in range(4)]
        self.release: list[threading.Event] = [threading.Event() for _ in range(4)]
        self.fail: set[int] = set()
        self.runs = 0
        self.lock = threading.Lock()

    def __call__(self) -> int:
        with self.lock:
            n = self.runs
            self.runs += 1
        self.started[n].set()
        assert self.release[n].wait(10)
        if n in self.fail:
            raise RuntimeError(f"read {n} failed")
        return n


def call(shared: SharedReads[int], read: Reads, out: dict[str, object], name: str) -> threading.Thread:
    def run() -> None:
        try:
            out[name] = shared.run("q", read)
        except RuntimeError as exc:
            out[name] = exc

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def joined(shared: SharedReads[int], count: int) -> None:
    """Wait until ``count`` callers wait for the next round (white box: the
    round's waiters are not observable otherwise without timing)."""
    import time

    for _ in range(1000):
        line = shared._lines.get("q")
        if line is not None and line.next is not None:
            waiting = getattr(line.next.done, "_cond")._waiters
            if len(waiting) >= count:
                return
        time.sleep(0.005)
    raise AssertionError("callers did not join")


def test_callers_arriving_during_a_read_share_the_next_one_not_the_running_one():
    shared: SharedReads[int] = SharedReads()
    read, out = Reads(), {}
    first = call(shared, read, out, "first")
    assert read.started[0].wait(10)
    second = call(shared, read, out, "second")  # arrives while read 0 runs: must not get read 0
    third = call(shared, read, out, "third")
    joined(shared, 1)  # "third" waits for the round "second" will run
    read.release[0].set()
    first.join(10)
    assert out["first"] == (0, False)
    assert read.started[1].wait(10)
    read.release[1].set()
    for thread in (second, third):
        thread.join(10)
    assert sorted([out["second"], out["third"]]) == [(1, False), (1, True)]
    assert read.runs == 2


def test_a_failed_shared_read_lets_each_joined_caller_read_alone():
    shared: SharedReads[int] = SharedReads()
    read, out = Reads(), {}
    read.fail.add(1)
    first = call(shared, read, out, "first")
    assert read.started[0].wait(10)
    second = call(shared, read, out, "second")
    third = call(shared, read, out, "third")
    joined(shared, 1)
    read.release[0].set()
    assert read.started[1].wait(10)
    read.release[1].set()  # the shared read fails: its runner raises, the other reads itself
    assert read.started[2].wait(10)
    read.release[2].set()
    for thread in (first, second, third):
        thread.join(10)
    results = sorted([out["second"], out["third"]], key=str)
    assert isinstance(results[1], RuntimeError) and str(results[1]) == "read 1 failed"
    assert results[0] == (2, False)


def test_alone_a_caller_reads_at_once_and_nothing_is_kept():
    shared: SharedReads[int] = SharedReads()
    assert shared.run("q", lambda: 7) == (7, False)
    assert shared.run("q", lambda: 8) == (8, False)
    with pytest.raises(ZeroDivisionError):
        shared.run("q", lambda: 1 // 0)
    assert shared._lines == {}


def test_a_shared_answer_is_handed_out_as_each_callers_own_copy():
    from gds_counter.gateway.embedded._engine import _own
    from gds_counter.gateway.keys import Key
    from gds_counter.gateway.values import RawEntity

    inner = RawEntity(None, {"tags": ["a"]})
    original = RawEntity(Key.of("K", "k"), {"n": 1, "tags": ["x", inner], "inner": inner}, frozenset({"n"}))
    copy = _own(original)
    assert copy == original
    copy.properties["n"] = 2
    copy.properties["tags"][0] = "y"
    copy.properties["tags"][1].properties["tags"].append("b")
    copy.properties["inner"].properties["tags"].append("c")
    assert original == RawEntity(Key.of("K", "k"), {"n": 1, "tags": ["x", inner], "inner": inner}, frozenset({"n"}))
    assert inner.properties == {"tags": ["a"]}
