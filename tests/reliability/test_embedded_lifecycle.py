"""The embedded engine's file and connections, from open to close.

Each test is a failure seen before the fix, and checks that every error a
caller can see is a ``GDSError`` naming the file, and that no increment a
caller was told was counted goes missing:

* a relative path was resolved again by each new thread, so after
  ``os.chdir`` new threads wrote to a second database;
* each thread's connection lived until ``close()``: short-lived threads ran
  the process out of file descriptors (a raw ``sqlite3.OperationalError``);
* opening ran schema set-up that needed the write lock, so a reader, or a
  new thread's first read, failed while a writer held it, and a read-only
  file could not be read at all;
* garbage, truncated, non-SQLite files, directories and unusable paths
  raised raw ``sqlite3`` errors;
* a database file deleted while open kept acknowledging writes that no
  other process would ever see.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from gds_counter.counter import CounterShardDS
from gds_counter.errors import GatewayError, GDSError
from gds_counter.gateway import open_gateway
from gds_counter.gateway.base import run_query_all
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.query import Query
from gds_counter.gateway.values import RawEntity

NOBODY = 65534


def count(db: Path | str, **kwargs: Any) -> int:
    gateway = EmbeddedGateway(db, **kwargs)
    try:
        return CounterShardDS("life", 1, gateway=gateway).get_count()
    finally:
        gateway.close()


def add(db: Path | str, n: int) -> None:
    gateway = EmbeddedGateway(db)
    try:
        counter = CounterShardDS("life", 1, gateway=gateway)
        for _ in range(n):
            counter.add(1)
    finally:
        gateway.close()


def in_threads(target: Callable[[], None], n: int) -> list[BaseException]:
    """Run ``target`` in ``n`` new threads at once; the errors they raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


# --- a relative path names one file --------------------------------------------------------


def test_a_relative_path_names_one_file_after_chdir(tmp_path, monkeypatch, tally):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    gateway = open_gateway("sqlite:///life.sqlite3")  # relative, as the default URL is
    counter = CounterShardDS("life", 1, gateway=gateway)
    counter.add(1)
    monkeypatch.chdir(second)
    errors = in_threads(lambda: counter.add(1), 11)  # new threads, after the chdir
    assert errors == []
    assert counter.get_count() == 12
    assert isinstance(gateway, EmbeddedGateway) and Path(gateway.path or "").resolve() == (first / "life.sqlite3").resolve()
    gateway.close()
    assert not (second / "life.sqlite3").exists()
    stored = count(first / "life.sqlite3")
    tally.add("embedded: relative path, os.chdir, then new threads", operations=12, faults_injected=1,
              increments_lost=12 - stored)
    assert stored == 12


# --- connections do not outlive their use -------------------------------------------------------

FD_SCRIPT = textwrap.dedent("""
    import json, os, resource, sys, threading
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
    from gds_counter.counter import CounterShardDS
    from gds_counter.gateway.embedded import EmbeddedGateway

    gateway = EmbeddedGateway(sys.argv[1])
    counter = CounterShardDS("life", 1, gateway=gateway)
    lock = threading.Lock()
    acknowledged, errors, most_fds = [0], [], [0]

    def one():
        try:
            counter.add(1)
            with lock:
                acknowledged[0] += 1
        except Exception as exc:
            with lock:
                errors.append(f"{type(exc).__module__}.{type(exc).__name__}: {exc}")
        with lock:
            most_fds[0] = max(most_fds[0], len(os.listdir("/proc/self/fd")))

    waves = [25] * 32 + [200]  # 1,000 short-lived threads; the last 200 all at once
    for size in waves:
        threads = [threading.Thread(target=one) for _ in range(size)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    gateway.close()
    print(json.dumps({"threads": sum(waves), "acknowledged": acknowledged[0], "errors": errors[:5],
                      "raised": len(errors), "most_fds": most_fds[0]}))
""")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors in /proc/self/fd")
def test_a_thousand_short_lived_threads_fit_in_256_descriptors(tmp_path, tally):
    db = tmp_path / "threads.sqlite3"
    proc = subprocess.run([sys.executable, "-c", FD_SCRIPT, str(db)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    stored = count(db)
    tally.add("embedded: 1,000 short-lived threads, 256 descriptors", operations=result["threads"],
              increments_lost=max(0, result["acknowledged"] - stored),
              double_counts=max(0, stored - result["acknowledged"]))
    assert result["errors"] == [] and result["acknowledged"] == 1000, result
    assert stored == 1000
    assert result["most_fds"] < 128, result  # bounded by the pool, not by the threads ever started


# --- opening reads before it writes ------------------------------------------------------------

READER_SCRIPT = textwrap.dedent("""
    import sys
    from gds_counter.counter import CounterShardDS
    from gds_counter.gateway.embedded import EmbeddedGateway
    print(CounterShardDS("life", 1, gateway=EmbeddedGateway(sys.argv[1])).get_count())
""")


@pytest.fixture
def write_locked(tmp_path) -> Iterator[Path]:
    """A database holding 5, whose write lock another connection holds."""
    db = tmp_path / "locked.sqlite3"
    add(db, 5)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, held until the test is done
    yield db
    holder.execute("ROLLBACK")
    holder.close()


def test_a_reader_opens_while_a_writer_holds_the_lock(write_locked, tally):
    # a new gateway in this process, a new thread on an open one, and a reading process
    assert count(write_locked) == 5
    gateway = EmbeddedGateway(write_locked)
    counter = CounterShardDS("life", 1, gateway=gateway)
    seen: list[int] = []
    errors = in_threads(lambda: seen.append(counter.get_count()), 3)
    gateway.close()
    assert errors == [] and seen == [5, 5, 5]
    proc = subprocess.run([sys.executable, "-c", READER_SCRIPT, str(write_locked)], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout.strip()) == (0, "5"), proc.stderr
    tally.add("embedded: readers open while a writer holds the lock", operations=5)


def test_a_read_only_open_reads_and_refuses_writes(tmp_path, tally):
    db = tmp_path / "ro.sqlite3"
    add(db, 3)
    assert not Path(f"{db}-wal").exists()  # a clean close removed the log: the usual state
    gateway = EmbeddedGateway(db, read_only=True)
    counter = CounterShardDS("life", 1, gateway=gateway)
    assert counter.get_count() == 3
    with pytest.raises(GatewayError, match=str(db)):
        counter.add(1)
    gateway.close()
    assert count(db) == 3
    tally.add("embedded: read-only files (mode=ro, chmod 444): reads work, writes raise", operations=2)


def run_as_other_user(action: Callable[[], str]) -> str:
    """``action()``'s result, run in a forked child as ``nobody`` when this
    process is root (root ignores file permissions), else as this user."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child's side
        code = 1
        try:
            os.close(read_fd)
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
            try:
                result = action()
            except GDSError as exc:
                result = f"{type(exc).__name__}: {exc}"
            except Exception as exc:  # noqa: BLE001 - a raw error is what the test looks for
                result = f"RAW {type(exc).__module__}.{type(exc).__name__}: {exc}"
            os.write(write_fd, result.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    out = b""
    while chunk := os.read(read_fd, 4096):
        out += chunk
    os.close(read_fd)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
    return out.decode()


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="gds-life-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() to drop privileges")
def test_a_write_protected_file_can_be_read(shared_dir, tally):
    db = shared_dir / "ro.sqlite3"
    add(db, 3)
    db.chmod(0o444)
    shared_dir.chmod(0o1777)  # SQLite may create the -wal and -shm files next to it

    def read_then_write() -> str:
        gateway = EmbeddedGateway(db)
        counter = CounterShardDS("life", 1, gateway=gateway)
        total = counter.get_count()
        try:
            counter.add(1)
            return f"{total} and the write was acknowledged"
        except GDSError as exc:
            return f"{total} {type(exc).__name__}: {exc}"

    result = run_as_other_user(read_then_write)
    assert result.startswith("3 GatewayError: ") and str(db) in result, result
    assert count(db) == 3
    # a directory where the -wal and -shm files cannot be created: a clear error naming the file
    for extra in shared_dir.glob("ro.sqlite3-*"):
        extra.unlink()
    shared_dir.chmod(0o755)
    result = run_as_other_user(lambda: str(count(db)))
    assert result.startswith("GatewayError: ") and str(db) in result and "not writable" in result, result
    tally.add("embedded: read-only files (mode=ro, chmod 444): reads work, writes raise", operations=3)


# --- files that are not a usable database -----------------------------------------------------------


def _good_database(path: Path) -> bytes:
    """A database whose rows fill many pages after the schema's own."""
    add(path, 20)
    gateway = EmbeddedGateway(path)
    for start in range(0, 1500, 500):
        gateway.commit([Upsert(RawEntity(Key.of("Big", n + 1), {"text": f"{n:08d}" * 25})) for n in range(start, start + 500)])
    gateway.close()
    return path.read_bytes()


def _use(gateway: EmbeddedGateway) -> None:
    """Read and write a little, then read every page of entities."""
    counter = CounterShardDS("life", 1, gateway=gateway)
    counter.get_count()
    counter.add(1)
    assert len(list(run_query_all(gateway, Query("Big")))) == 1500


BAD_FILES: dict[str, Callable[[Path, bytes], Path]] = {
    "garbage": lambda d, good: _write(d / "garbage.sqlite3", os.urandom(16384)),
    "truncated to half": lambda d, good: _write(d / "half.sqlite3", good[: len(good) // 2]),
    "truncated in its last pages": lambda d, good: _write(d / "tail.sqlite3", good[: len(good) - 3 * 4096]),
    "truncated after the first page": lambda d, good: _write(d / "first.sqlite3", good[:4096 + 100]),
    "truncated inside the header": lambda d, good: _write(d / "header.sqlite3", good[:50]),
    "data pages overwritten": lambda d, good: _write(d / "noise.sqlite3", _overwrite_pages(good, 0.4, 0.9)),
    "a text file": lambda d, good: _write(d / "text.sqlite3", b"this is not a database\n" * 300),
    "a directory": lambda d, good: _mkdir(d / "dir.sqlite3"),
    "a path under a regular file": lambda d, good: _write(d / "plain", b"x") / "db.sqlite3",
    "a path under a missing directory": lambda d, good: d / "missing" / "db.sqlite3",
}


def _overwrite_pages(data: bytes, start: float, end: float) -> bytes:
    """``data`` with its 4 KiB pages from fraction ``start`` to ``end`` replaced by noise."""
    first, last = int(len(data) * start) // 4096, int(len(data) * end) // 4096
    return data[: first * 4096] + bytes(range(256)) * 16 * (last - first) + data[last * 4096:]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _mkdir(path: Path) -> Path:
    path.mkdir()
    return path


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_a_file_that_is_not_a_usable_database_raises_a_gds_error_naming_it(tmp_path, case, tally):
    good = tmp_path / "good.sqlite3"
    data = _good_database(good)
    gateway = EmbeddedGateway(good)
    _use(gateway)  # the intact file works
    gateway.close()
    path = BAD_FILES[case](tmp_path, data)
    gateway = None
    with pytest.raises(GDSError) as info:
        gateway = EmbeddedGateway(path)
        _use(gateway)
    if gateway is not None:
        gateway.close()
    assert isinstance(info.value, GatewayError)
    assert str(path) in str(info.value), info.value
    tally.add("embedded: unusable files (garbage, truncated, text, directory, bad parent, no permission)",
              hostile_inputs=1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork() to drop privileges")
def test_a_path_without_permission_raises_a_gds_error_naming_it(shared_dir, tally):
    private = shared_dir / "private"
    private.mkdir(mode=0o700)
    add(private / "db.sqlite3", 1)
    for path in (private / "db.sqlite3", shared_dir / "db.sqlite3"):
        if path.parent == shared_dir:
            shared_dir.chmod(0o555)  # nobody may create a file here
        result = run_as_other_user(lambda: str(count(path)))
        assert result.startswith("GatewayError: ") and str(path) in result and "permission" in result, result
    tally.add("embedded: unusable files (garbage, truncated, text, directory, bad parent, no permission)",
              hostile_inputs=2)


# --- a file deleted or replaced while open ---------------------------------------------------------


def _three_adds(counter: CounterShardDS) -> tuple[int, list[BaseException]]:
    """Three adds: how many were acknowledged, and the errors of the others."""
    acknowledged = 0
    errors: list[BaseException] = []
    for _ in range(3):
        try:
            counter.add(1)
            acknowledged += 1
        except GDSError as exc:
            errors.append(exc)
    return acknowledged, errors


@pytest.mark.parametrize("removed", [("",), ("", "-wal", "-shm"), ("-wal", "-shm"), ("replaced",)])
def test_a_database_deleted_while_open_acknowledges_nothing_more(tmp_path, removed, tally):
    db = tmp_path / "gone.sqlite3"
    gateway = EmbeddedGateway(db)
    counter = CounterShardDS("life", 1, gateway=gateway)
    for _ in range(3):
        counter.add(1)
    if removed == ("replaced",):
        add(tmp_path / "other.sqlite3", 1)
        os.replace(tmp_path / "other.sqlite3", db)
    else:
        for suffix in removed:
            Path(f"{db}{suffix}").unlink()
    acknowledged, errors = _three_adds(counter)
    errors += in_threads(lambda: counter.add(1), 3)  # new threads do not start a new database either
    gateway.close()
    tally.add("embedded: database file deleted or replaced while open", operations=6, faults_injected=1,
              increments_lost=acknowledged)
    assert acknowledged == 0
    assert len(errors) == 6 and all(isinstance(e, GatewayError) and str(db) in str(e) for e in errors), errors
    if removed in (("",), ("", "-wal", "-shm")):
        assert not db.exists()  # nothing quietly created an empty one



def test_a_database_opened_through_a_symlink_notices_its_log_deleted(tmp_path, tally):
    """SQLite keeps the log beside the file a symbolic link resolves to
    (``real.sqlite3-wal``), not beside the link: the check before each
    commit looked for ``link.sqlite3-wal``, found none, and so checked
    nothing; after the real log was deleted, every add was acknowledged
    into it (5 of 5 in the fresh user's run)."""
    real = tmp_path / "real.sqlite3"
    link = tmp_path / "link.sqlite3"
    link.symlink_to(real)
    gateway = EmbeddedGateway(link)
    counter = CounterShardDS("life", 1, gateway=gateway)
    for _ in range(3):
        counter.add(1)
    assert Path(f"{real}-wal").exists() and not Path(f"{link}-wal").exists()
    for suffix in ("-wal", "-shm"):
        Path(f"{real}{suffix}").unlink()
    acknowledged, errors = _three_adds(counter)
    gateway.close()
    tally.add("embedded: database file deleted or replaced while open", operations=3, faults_injected=1,
              increments_lost=acknowledged)
    assert acknowledged == 0
    assert len(errors) == 3 and all(isinstance(e, GatewayError) and f"{real}-wal" in str(e) for e in errors), errors


def test_a_new_file_another_connection_holds_is_opened_once_it_is_let_go(tmp_path):
    """SQLite answers a journal mode change with "database is locked" at
    once, without waiting, while another connection holds the file: a
    process creating a file that another process was creating too failed
    with Contention at once (seen as two benchmark writers opening one new
    file). Now the change waits like any locked write."""
    import sqlite3
    import threading

    from gds_counter.gateway.embedded import EmbeddedGateway

    path = tmp_path / "held.sqlite3"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process, midway through making the file
    holder.execute("CREATE TABLE other_app (x)")
    opened: list[object] = []

    def open_it() -> None:
        try:
            gateway = EmbeddedGateway(str(path))
            opened.append(gateway.lookup([]))
            gateway.close()
        except Exception as exc:  # noqa: BLE001 - the failure is the finding
            opened.append(exc)

    opener = threading.Thread(target=open_it)
    opener.start()
    opener.join(0.5)
    assert not opened, opened  # still waiting for the holder, not failed
    holder.execute("COMMIT")
    holder.close()
    opener.join(30)
    assert opened == [[]]
