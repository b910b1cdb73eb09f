"""A parent process for test_fork_safety: it opens a counter, forks children
that count into it, and exits (or closes its gateway, then exits) while they
are still counting, as a gunicorn ``--preload`` master or a ``multiprocessing``
parent does.

    python fork_parent.py DB CHILDREN ADDS exit|close

The parent adds 1 before the fork and 1 more once every child has counted
a quarter of its adds (so it has a connection of its own open when it closes
or exits), printing ``parent 1`` after each. The children then wait until
the parent has exited (a pipe only it holds open is closed) and count the
rest: so each run tests the moment that lost increments before the fix. Each child prints ``child <acknowledged>
<raised>`` when it is done (the test reads stdout until every child has
closed it). The parent exits normally, so Python finalises its gateway (a
module global) and its SQLite connections on the way out.
"""

from __future__ import annotations

import os
import sys

from gds_counter.counter import CounterShardDS
from gds_counter.errors import GDSError
from gds_counter.gateway.embedded import EmbeddedGateway


def child(counter: CounterShardDS, adds: int, started: int, resume: int, report: int = 1) -> None:
    """Run in a forked child: ``adds`` adds; after a quarter of them, one
    byte to ``started``, then wait until ``resume`` is closed by every
    process that holds it (the parent closes or exits first), then the rest;
    at the end ``child <acknowledged> <raised>`` to ``report``, and exit
    without running anything of the parent's (``os._exit``)."""
    acknowledged = raised = 0
    code = 1
    try:
        for i in range(adds):
            try:
                counter.add(1)
                acknowledged += 1
            except GDSError as exc:
                raised += 1  # nothing counted (Contention), or the file refused: never acknowledged
                os.write(2, f"child {os.getpid()}: {type(exc).__name__}: {exc}\n".encode())
            if i == adds // 4:
                os.write(started, b"s")
                while os.read(resume, 1):
                    pass
        code = 0
    finally:
        os.write(report, f"child {acknowledged} {raised}\n".encode())
        os._exit(code)


def main() -> EmbeddedGateway:
    db, children, adds, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    gateway = EmbeddedGateway(db)
    counter = CounterShardDS("fork", 1, gateway=gateway)
    counter.add(1)
    print("parent 1", flush=True)
    started_r, started_w = os.pipe()
    resume_r, resume_w = os.pipe()  # the children go on once it is closed: when this process has exited
    for _ in range(children):
        if os.fork() == 0:
            os.close(started_r)
            os.close(resume_w)
            child(counter, adds, started_w, resume_r)
    os.close(started_w)
    os.close(resume_r)
    seen = 0
    while seen < children:  # every child is counting
        chunk = os.read(started_r, children)
        if not chunk:
            break
        seen += len(chunk)
    counter.add(1)
    print("parent 1", flush=True)
    if mode == "close":
        gateway.close()
    # "exit": leave with the gateway open; Python's finalisation closes it.
    return gateway


if __name__ == "__main__":
    GATEWAY = main()
