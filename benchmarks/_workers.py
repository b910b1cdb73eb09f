"""Writer processes for the benchmarks, started once and reused.

``WorkerPool(n, prepare)`` starts ``n`` processes with the ``spawn`` context
(each imports what it needs and opens its own gateway or client; nothing is
inherited). ``pool.run(jobs)`` gives job ``i`` to process ``i``; each
process calls ``prepare(job)`` (open the storage, build its writers' ops,
warm up: all off the clock) and reports ready; once every process is ready
they are all told to go at the same moment, so the parts of one run
overlap exactly; each returns ``prepared.run()`` and then
``prepared.close()``. A part that fails raises ``WorkerError`` in the
parent with the child's traceback.
"""

from __future__ import annotations

import multiprocessing
import traceback
from multiprocessing.connection import Connection
from typing import Any, Callable, Protocol, Sequence

__all__ = ["Prepared", "WorkerError", "WorkerPool"]


class Prepared(Protocol):
    def run(self) -> Any: ...

    def close(self) -> None: ...


class WorkerError(RuntimeError):
    """A part of a run failed in a writer process (the message carries its traceback)."""


def _serve(conn: Connection, prepare: Callable[[Any], Prepared]) -> None:
    while True:
        try:
            job = conn.recv()
        except EOFError:
            return
        if job is None:
            return
        prepared = None
        try:
            prepared = prepare(job)
            conn.send(("ready", None))
            if conn.recv() == "go":
                conn.send(("done", prepared.run()))
        except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
            conn.send(("error", traceback.format_exc()))
        finally:
            if prepared is not None:
                try:
                    prepared.close()
                except Exception:  # noqa: BLE001 - the part's result is already sent
                    traceback.print_exc()


class WorkerPool:
    def __init__(self, size: int, prepare: Callable[[Any], Prepared]) -> None:
        context = multiprocessing.get_context("spawn")
        self._conns: list[Connection] = []
        self._processes: list[Any] = []
        for i in range(size):
            parent, child = context.Pipe()
            process = context.Process(target=_serve, args=(child, prepare), name=f"bench-writer-{i}", daemon=True)
            process.start()
            child.close()
            self._conns.append(parent)
            self._processes.append(process)

    @property
    def size(self) -> int:
        return len(self._processes)

    def _receive(self, conn: Connection, i: int) -> tuple[str, Any]:
        try:
            message: tuple[str, Any] = conn.recv()
        except EOFError:
            raise WorkerError(f"writer process {i} exited (code {self._processes[i].exitcode})") from None
        return message

    def run(self, jobs: Sequence[Any]) -> list[Any]:
        """Run ``jobs[i]`` in process ``i``, all starting together; their results in order."""
        if not 0 < len(jobs) <= self.size:
            raise ValueError(f"{len(jobs)} jobs for {self.size} writer processes")
        conns = self._conns[: len(jobs)]
        for conn, job in zip(conns, jobs):
            conn.send(job)
        replies = [self._receive(conn, i) for i, conn in enumerate(conns)]
        failed = [text for state, text in replies if state == "error"]
        if failed:
            for conn, (state, _) in zip(conns, replies):
                if state == "ready":
                    conn.send("abort")
            raise WorkerError(f"a writer process could not prepare its part:\n{failed[0]}")
        for conn in conns:
            conn.send("go")
        results = [self._receive(conn, i) for i, conn in enumerate(conns)]
        failed = [text for state, text in results if state == "error"]
        if failed:
            raise WorkerError(f"a writer process failed during the run:\n{failed[0]}")
        return [value for _, value in results]

    def close(self) -> None:
        for conn in self._conns:
            try:
                conn.send(None)
            except OSError:
                pass
        for process in self._processes:
            process.join(10)
            if process.is_alive():
                process.terminate()
                process.join(5)
        for conn in self._conns:
            conn.close()

    def __enter__(self) -> "WorkerPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
