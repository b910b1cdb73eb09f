"""A file's identity, as the engine checks it before every commit.

``file_id`` must name the same file ``os.stat`` names (the shared cache and
the pool compare ids taken either way), and asking it must not read the
file's times: on kernels with multigrain timestamps that made the next
write of the ``-wal`` file update its inode, a journal write per commit.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gateway.embedded._file_ids import _STATX, file_id


def test_a_file_is_named_as_os_stat_names_it(tmp_path):
    paths = [tmp_path, tmp_path / "a file", tmp_path / "é ünïcode"]
    paths[1].write_text("x")
    paths[2].write_text("y")
    os.link(paths[1], tmp_path / "hard link")
    for path in [*paths, tmp_path / "hard link"]:
        st = os.stat(path)
        assert file_id(str(path)) == (st.st_dev, st.st_ino), path
    assert file_id(str(tmp_path / "hard link")) == file_id(str(paths[1]))  # one file, two names


def test_nothing_there_is_none_and_other_failures_name_the_path(tmp_path):
    assert file_id(str(tmp_path / "missing")) is None
    (tmp_path / "plain").write_text("x")
    with pytest.raises(NotADirectoryError) as caught:
        file_id(str(tmp_path / "plain" / "below"))
    assert caught.value.filename == str(tmp_path / "plain" / "below")


def test_a_replaced_file_gets_another_id(tmp_path):
    path = tmp_path / "f"
    path.write_text("first")
    first = file_id(str(path))
    (tmp_path / "g").write_text("second")
    os.replace(tmp_path / "g", path)
    assert file_id(str(path)) not in (None, first)


def _times_queried_by(ask: Callable[[str], object], path: Path) -> int:
    """Of ten tries: how often asking about ``path`` between two writes made
    the second write take a fresh change time. A write normally takes the
    coarse clock's time, later than the file's only once the clock ticks;
    but once the time was read, the next write takes a fine-grained one
    (multigrain timestamps): so a second write stamped after the moment
    just before it means ``ask`` read the time."""
    fresh = 0
    with open(path, "ab", buffering=0) as f:
        for _ in range(10):
            f.write(b"a")
            os.stat(path)  # read: the next write is stamped finely, after the coarse clock
            f.write(b"b")
            ask(str(path))
            just_before = time.time_ns()
            f.write(b"c")
            fresh += os.stat(path).st_ctime_ns >= just_before
            time.sleep(0.01)
    return fresh


@pytest.mark.skipif(_STATX is None, reason="no statx in this C library (file_id uses os.stat)")
def test_asking_for_a_files_id_does_not_read_its_times(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"")
    if _times_queried_by(os.stat, path) < 10 or _times_queried_by(lambda _: None, path) > 5:
        pytest.skip("this file system's times do not show whether they were read (no multigrain timestamps)")
    assert _times_queried_by(file_id, path) <= 5  # (the coarse clock may tick between two writes now and then)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="statx is Linux's")
def test_on_linux_the_id_is_asked_through_statx():
    assert _STATX is not None


def test_a_commit_still_refuses_a_deleted_log(tmp_path):
    """The check the ids are for: a ``-wal`` file deleted under an open
    connection is noticed before the commit is acknowledged."""
    db = tmp_path / "c.sqlite3"
    gateway = EmbeddedGateway(str(db))
    from gds_counter import CounterShardDS
    from gds_counter.errors import GatewayError

    counter = CounterShardDS("ids", 1, gateway=gateway)
    counter.add(1)
    Path(f"{db}-wal").unlink()
    with pytest.raises(GatewayError, match="-wal"):
        counter.add(1)
    gateway.close()
