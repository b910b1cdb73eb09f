"""The seeded decisions of fault injection, and the record of what was
injected: which fault (if any) falls on each call, drawn from a seeded
``random.Random`` (or from a script, first) so a failing run replays
exactly, and counted so a test can reconcile what it saw with what was
stored. Both kinds of wrapper draw from it: the gateways of ``faults`` and
``async_faults``, and the RPC clients of ``_rpc_faults``.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections import Counter
from typing import Iterator, Mapping, Sequence

from gds_counter.errors import BadValueError

ABORTED = "ABORTED"
UNAVAILABLE = "UNAVAILABLE"
UNAVAILABLE_AFTER = "UNAVAILABLE_AFTER"
DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"

#: The calls of the Gateway protocol (and the GAPIC methods of the same names).
CALLS = ("lookup", "run_query", "begin_transaction", "commit", "rollback", "allocate_ids")

GATEWAY_FAULTS = (ABORTED, UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED)
RPC_FAULTS = (ABORTED, UNAVAILABLE, UNAVAILABLE_AFTER, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED)


class FaultInjector:
    """Seeded decisions and a record of what was injected. Thread-safe.

    ``rates`` maps a call name to ``{fault: probability}``; the
    probabilities of one call must add up to at most 1. ``script`` maps a
    call name to faults to inject on its next calls, in order, before the
    random draws (to force one sequence, such as an applied commit whose
    resend is then aborted).
    """

    def __init__(
        self,
        rates: Mapping[str, Mapping[str, float]] | None = None,
        *,
        seed: int | None = 0,
        allowed: Sequence[str] = GATEWAY_FAULTS,
        script: Mapping[str, Sequence[str | None]] | None = None,
    ) -> None:
        self.seed = seed
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._enabled = True
        self.rates: dict[str, dict[str, float]] = {}
        for call, faults in (rates or {}).items():
            if call not in CALLS:
                raise BadValueError(f"unknown call {call!r} in fault rates; expected one of {', '.join(CALLS)}")
            table: dict[str, float] = {}
            for fault, rate in faults.items():
                if fault not in allowed:
                    raise BadValueError(f"unknown fault {fault!r} for {call}; expected one of {', '.join(allowed)}")
                if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
                    raise BadValueError(f"rate of {fault} on {call} must be between 0 and 1, got {rate!r}")
                table[fault] = float(rate)
            if sum(table.values()) > 1.0 + 1e-9:
                raise BadValueError(f"fault rates on {call} add up to {sum(table.values())}, over 1")
            self.rates[call] = table
        #: Faults to inject first, in order, per call (None: no fault that
        #: time); random draws resume once a call's script is used up.
        self.script: dict[str, list[str | None]] = {}
        for call, sequence in (script or {}).items():
            if call not in CALLS:
                raise BadValueError(f"unknown call {call!r} in fault script; expected one of {', '.join(CALLS)}")
            for step in sequence:
                if step is not None and step not in allowed:
                    raise BadValueError(f"unknown fault {step!r} for {call}; expected one of {', '.join(allowed)}")
            self.script[call] = list(sequence)
        #: (call, fault) -> how many times it was injected.
        self.injected: Counter[tuple[str, str]] = Counter()
        #: calls seen per name, injected or not.
        self.calls: Counter[str] = Counter()

    def draw(self, call: str) -> str | None:
        """The fault to inject on this call, or None; records it."""
        with self._lock:
            self.calls[call] += 1
            if not self._enabled:
                return None
            scripted = self.script.get(call)
            if scripted:
                fault = scripted.pop(0)
                if fault is not None:
                    self.injected[(call, fault)] += 1
                return fault
            table = self.rates.get(call)
            if not table:
                return None
            roll = self._random.random()
            for fault, rate in table.items():
                if roll < rate:
                    self.injected[(call, fault)] += 1
                    return fault
                roll -= rate
            return None

    def forget(self, call: str, fault: str) -> None:
        """Un-record a fault that was drawn but could not be injected."""
        with self._lock:
            self.injected[(call, fault)] -= 1

    def counts(self) -> dict[str, int]:
        """Faults injected, per fault, over every call."""
        with self._lock:
            out: Counter[str] = Counter()
            for (_, fault), n in self.injected.items():
                out[fault] += n
            return {fault: n for fault, n in out.items() if n}

    @property
    def total(self) -> int:
        return sum(self.counts().values())

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No faults inside the block (e.g. while a test reads the total)."""
        with self._lock:
            before, self._enabled = self._enabled, False
        try:
            yield
        finally:
            with self._lock:
                self._enabled = before

    def __repr__(self) -> str:
        return f"FaultInjector(seed={self.seed!r}, injected={self.counts()})"
