"""The like app as it is deployed (the Dockerfile's uvicorn command, 4
worker processes) on the Firestore emulator: 2,000 likes sent at once are
all counted, exactly, in the entities the PHP article reads (200 in the
quick run, ``tests/sizes.py``).
``benchmarks/like_app_load.py`` runs it and prints the latencies (no speed
is asserted here)."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import like_app_load  # noqa: E402
from sizes import size  # noqa: E402

pytestmark = pytest.mark.slow

#: Likes sent at once to the four workers.
LIKES = size(200, 2000)


def test_the_dockerfile_runs_uvicorn_with_several_workers():
    command = like_app_load.deployed_command(8123, 4)
    assert command[1:4] == ["-m", "uvicorn", "app:create_app"] and "--factory" in command
    assert command[command.index("--workers") + 1] == "4" and command[command.index("--port") + 1] == "8123"


def test_two_thousand_concurrent_likes_on_four_workers_are_counted_exactly(firestore_emulator):
    url = f"datastore://{firestore_emulator.project}?namespace=likes-{uuid.uuid4().hex[:8]}"
    result = like_app_load.run(url, dict(firestore_emulator.env), likes=LIKES, connections=50, workers=4, cache=None)
    print(result)
    assert result["exact"], result
    assert sum(result["counted"].values()) == sum(result["stored"].values())
    assert set(result["statuses"]) <= {"200", "202", "503"}
    assert sum(result["counted"].values()) >= LIKES - LIKES // 200, result  # a 503 is allowed (it says not counted), not many
    assert result["server_exit"] == 0  # SIGTERM: a clean shutdown


def test_with_the_shared_cache_every_worker_sees_every_like(redis_server, tmp_path):
    result = like_app_load.run(f"sqlite:///{tmp_path / 'likes.sqlite3'}", {}, likes=300, connections=50, workers=4,
                               cache=redis_server.url)
    assert result["exact"] and sum(result["stored"].values()) == 300, result
