"""Failure-point tests: one harness that injects interrupts, cancellations,
forks, stalls and crashes at named points of every concurrency mechanism
and checks the counter's promise after each (see ``harness``)."""
