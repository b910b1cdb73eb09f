"""Accounting that cannot be fooled: which calls were stored, and how often.

Every call of a scenario adds a distinct power of four (call ``i`` adds
``4**i``), so the stored total, read in base four, says for each call how
many times it was stored: digit 0 (not stored), 1 (once), 2 or 3 (counted
twice or three times; with powers of two a double count would look like
another call stored once). Thirty-one calls fit below 2**63 even if each
were stored three times.

Each call is then classified from what its caller saw and that digit:

* returned, stored once: ``ok``; returned, stored 0 times: ``lost``;
* stored twice or more, whatever the caller saw: ``double``;
* an error that says "not stored" (``Contention``, ``Unavailable``,
  ``BadValueError``, ``TransformsIgnored``, a plain ``GatewayError``) but
  stored, or one that says "stored" (``TotalUnavailable``,
  ``CountSaturated``) but not: ``untruthful``; so is any error that is not
  a ``GDSError`` and was not the injected interrupt or cancellation;
* ``CommitUnknown``, the injected interrupt, a cancellation, a killed
  process: "maybe", either digit 0 or 1 is truthful;
* not finished within its bound: ``hung`` (counted once, whatever its digit).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable

__all__ = ["MAX_CALLS", "Call", "Summary", "amount_of", "classify", "classify_forked", "stored_times", "truth_of"]

MAX_CALLS = 31

#: What an error class says about whether the amount was stored.
NOT_STORED = ("Contention", "Unavailable", "BadValueError", "BadKeyError", "SchemaError", "TransformsIgnored", "GatewayError")
MAYBE = ("CommitUnknown",)
STORED = ("TotalUnavailable", "CountSaturated")
#: Outcomes the harness itself caused: nothing can be promised about them but "once at most".
INJECTED = ("Interrupted", "Cancelled", "Killed")


def amount_of(index: int) -> int:
    if not 0 <= index < MAX_CALLS:
        raise ValueError(f"call index {index} out of range: at most {MAX_CALLS} calls per counter")
    return 4**index


def stored_times(total: int, index: int) -> int:
    """How many times call ``index`` is in ``total`` (its base-4 digit)."""
    return (total >> (2 * index)) & 3


@dataclass
class Call:
    """One increment a scenario made, and what its caller saw."""

    index: int
    #: "ok", an error class name, "Interrupted", "Cancelled", "Killed", or "hung".
    outcome: str = "hung"
    #: For ``increment()``: the total it returned (must contain this call once).
    returned_total: int | None = None
    seconds: float = 0.0
    #: Where it ran: "thread", "task", "child" (a fork's child), "process".
    where: str = "thread"
    #: True when the harness's fault struck this very call.
    victim: bool = False

    @property
    def amount(self) -> int:
        return amount_of(self.index)


def truth_of(outcome: str) -> str:
    """"stored", "not stored", "maybe" or "unknown error" for an outcome."""
    if outcome == "ok" or outcome in STORED:
        return "stored"
    if outcome in NOT_STORED:
        return "not stored"
    if outcome in MAYBE or outcome in INJECTED or outcome == "hung":
        return "maybe"
    return "unknown error"


def classify(call: Call, total: int) -> str:
    """``ok``, ``lost``, ``double``, ``untruthful``, ``stale`` or ``hung``."""
    times = stored_times(total, call.index)
    if times > 1:
        return "double"
    if call.outcome == "hung":
        return "hung"
    truth = truth_of(call.outcome)
    if truth == "unknown error":
        return "untruthful"
    if call.outcome == "ok" and times == 0:
        return "lost"
    if truth == "stored" and times == 0:
        return "untruthful"
    if truth == "not stored" and times == 1:
        return "untruthful"
    if call.returned_total is not None and stored_times(call.returned_total, call.index) != 1:
        return "stale"  # increment() returned a total without its own amount in it exactly once
    return "ok"


def classify_forked(call: Call, child: Call, total: int) -> str:
    """One call that a fork made inside it (``Point.fork_here``) split in
    two, ``call`` in the parent and ``child`` in the forked child, which
    went on with it. Stored once at most (a child that stored it beside
    the parent counted it twice); a side that says "stored" needs it
    stored, and "not stored" on both sides needs it not stored. (Which
    side stored it the total cannot tell: a fork after the write leaves
    both sides truthfully saying "stored" of one write.)"""
    times = stored_times(total, call.index)
    if times > 1:
        return "double"
    if "hung" in (call.outcome, child.outcome):
        return "hung"
    truths = [truth_of(call.outcome), truth_of(child.outcome)]
    if "unknown error" in truths:
        return "untruthful"
    if "stored" in truths and times == 0:
        return "lost" if "ok" in (call.outcome, child.outcome) else "untruthful"
    if truths == ["not stored", "not stored"] and times == 1:
        return "untruthful"
    if call.returned_total is not None and stored_times(call.returned_total, call.index) != 1:
        return "stale"
    return "ok"


@dataclass
class Summary:
    """Per mechanism: what was injected and what was found."""

    points: set[str] = field(default_factory=set)
    injections: int = 0
    calls: int = 0
    lost: int = 0
    double: int = 0
    untruthful: int = 0
    stale: int = 0
    hung: int = 0
    unreached: list[str] = field(default_factory=list)
    failures: list[dict[str, Any]] = field(default_factory=list)

    def add(self, other: "Summary") -> None:
        self.points |= other.points
        for name in ("injections", "calls", "lost", "double", "untruthful", "stale", "hung"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.unreached += other.unreached
        self.failures += other.failures

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["points"] = len(self.points)
        data["point_names"] = sorted(self.points)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Summary":
        summary = cls()
        summary.points = set(data.get("point_names", ()))
        for name in ("injections", "calls", "lost", "double", "untruthful", "stale", "hung"):
            setattr(summary, name, int(data.get(name, 0)))
        summary.unreached = list(data.get("unreached", ()))
        summary.failures = list(data.get("failures", ()))
        return summary


def tally(calls: Iterable[Call], total: int) -> dict[str, int]:
    """How many calls fell in each class."""
    counts: dict[str, int] = {}
    for call in calls:
        verdict = classify(call, total)
        counts[verdict] = counts.get(verdict, 0) + 1
    return counts
