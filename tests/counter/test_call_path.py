"""A lone call goes straight through: one warm ``add()`` or ``get_count()``
with nothing else of its counter in flight runs no code of the combined
writes, the shared reads or their rounds, on either face.

Those mechanisms exist for callers that overlap (``counter._lone`` lets the
first caller through and hands a second one, arriving meanwhile, to them).
A call alone paid for them all the same: 26 of the library's files for one
``add()`` on a SQLite file and 23 for one ``get_count()``. The files are
counted by ``benchmarks/call_path_files.py`` (a profile function notes each
file whose code runs during the call); the bounds below are the counts after
the change, so a hop added to the lone path fails here and has to be argued
for.

The lone path went from 26 and 23 files to 25 and 22 when it stopped
entering the contention machinery, and then to 32 and 27 when issue 37
split modules by idea: the typed effects (``gateway/_effects.py``,
``_calls.py``, ``_hooks.py``, ``_rules.py``, out of ``base.py`` and
``plan.py``), the embedded engine's commit writes and connection life
(``_commit_writes.py``, ``_connection_life.py``, out of ``_engine.py`` and
``_connections.py``) and the one fork check (``_process/forks.py``). Each is
a hop a reader takes on purpose; none is machinery for callers that overlap.
Issue 40 added one to ``add()``: the six property transforms are
``gateway/embedded/_transforms.py``, the increment an add applies among
them (33 and 31 files).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from call_path_files import measure  # noqa: E402

#: The contention machinery a lone call must not enter.
MACHINERY = (
    "gds_counter/counter/_combined.py",
    "gds_counter/counter/_shared_reads.py",
    "gds_counter/counter/_rounds.py",
)

#: At most this many files per call (storage, call), as measured once the
#: lone call went straight through and the modules were split by idea.
MOST = {
    ("sqlite", "add"): 33,
    ("sqlite", "get_count"): 27,
    ("sqlite", "aio add"): 20,
    ("sqlite", "aio get_count"): 18,
    ("memory", "add"): 31,
    ("memory", "get_count"): 27,
    ("memory", "aio add"): 20,
    ("memory", "aio get_count"): 18,
}


@pytest.fixture(scope="module", params=["sqlite", "memory"])
def crossed(request, tmp_path_factory):
    storage = request.param
    url = "memory://" if storage == "memory" else "sqlite:///" + str(tmp_path_factory.mktemp("path") / "path.db")
    return storage, measure(url)


@pytest.mark.parametrize("call", ["add", "get_count", "aio add", "aio get_count"])
def test_a_lone_warm_call_enters_no_contention_machinery(crossed, call):
    storage, files = crossed
    entered = [path for path in files[call] if path in MACHINERY]
    assert not entered, f"a lone {call}() on {storage} ran {entered}"


@pytest.mark.parametrize("call", ["add", "get_count", "aio add", "aio get_count"])
def test_a_lone_warm_call_crosses_no_more_files_than_it_did(crossed, call):
    storage, files = crossed
    most = MOST[(storage, call)]
    assert len(files[call]) <= most, f"a lone {call}() on {storage} crosses {len(files[call])} files: {files[call]}"
