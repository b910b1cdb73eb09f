"""php-gds, unchanged, counting with the PHP article's algorithm against
``gds-counter serve`` while gds_counter's ``CounterShardDS`` counts into the
same counter: one store, two languages, no Java.

Needs PHP from Debian (php-cli, php-curl, php-mbstring, php-bcmath,
php-guzzlehttp-guzzle) and ``PHP_GDS_SRC`` naming php-gds's ``src`` folder.
Without ``PHP_GDS_SRC`` every test here is skipped (the one skip CI allows);
with it but without a working PHP they fail. With ``PHP_ARTICLE_SRC`` naming
a folder holding the article's ``CounterShardEntity.php``,
``CounterShardDS.php`` and ``counter_test.php``, the PHP side is the
article's own code; otherwise ``tests/server/php/harness_counter.php``.

php-gds reaches the server as it reaches an emulator: its REST gateway
reads ``DATASTORE_EMULATOR_HOST`` and then sends plain HTTP without
credentials (google/auth is never loaded). The scripts' autoloader is
``tests/server/php/bootstrap.php``; no Composer.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Hashable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gds_counter.counter.article import CounterShardDS
from gds_counter.counter.shard_choice import RandomShards
from gds_counter.gateway.datastore import DatastoreGateway
from gds_counter.server import Server, serving

PHP_DIR = Path(__file__).parent / "php"
PROJECT = "php-interop"
PHP_SHARDS = 20  # the article's NUM_SHARDS: PHP writes shards 1..20
ARTICLE_FILES = ("CounterShardEntity.php", "CounterShardDS.php", "counter_test.php")


@pytest.fixture(scope="module")
def php_env() -> dict[str, str]:
    """The environment PHP runs in; skips only when PHP_GDS_SRC is unset."""
    source = os.environ.get("PHP_GDS_SRC", "")
    if not source:
        pytest.skip(
            "PHP_GDS_SRC is not set: set it to php-gds's src folder (github.com/tomwalder/php-gds) "
            "and install Debian's php-cli php-curl php-mbstring php-bcmath php-guzzlehttp-guzzle"
        )
    if not (Path(source) / "GDS" / "Store.php").is_file():
        pytest.fail(f"PHP_GDS_SRC={source!r} is not php-gds's src folder (no GDS/Store.php in it)")
    if shutil.which("php") is None:
        pytest.fail(
            "PHP_GDS_SRC is set but there is no `php` on PATH: "
            "apt-get install php-cli php-curl php-mbstring php-bcmath php-guzzlehttp-guzzle"
        )
    modules = subprocess.run(["php", "-m"], capture_output=True, text=True, check=True).stdout.lower().split()
    missing = [name for name in ("curl", "mbstring", "bcmath", "json") if name not in modules]
    if missing:
        pytest.fail(f"PHP lacks the extension(s) {missing}: apt-get install php-curl php-mbstring php-bcmath")
    guzzle = subprocess.run(
        ["php", "-r", "exit(stream_resolve_include_path('GuzzleHttp/autoload.php') ? 0 : 1);"], check=False
    )
    if guzzle.returncode != 0:
        pytest.fail("PHP cannot find Guzzle (GuzzleHttp/autoload.php): apt-get install php-guzzlehttp-guzzle")
    article = os.environ.get("PHP_ARTICLE_SRC", "")
    if article:
        absent = [name for name in ARTICLE_FILES if not (Path(article) / name).is_file()]
        if absent:
            pytest.fail(f"PHP_ARTICLE_SRC={article!r} lacks the article's {absent}")
    env = {key: value for key, value in os.environ.items() if key != "DATASTORE_EMULATOR_HOST"}
    env["PHP_GDS_SRC"] = source
    return env


@pytest.fixture
def fresh_server(tmp_path: Path, php_env: dict[str, str]) -> Iterator[Server]:
    """A server of the test's own: the article's PHP class always counts in
    the default namespace, so tests cannot share a store."""
    with serving(f"sqlite:///{tmp_path / 'php.sqlite3'}") as server:
        yield server


def run_php(env: dict[str, str], *args: str, timeout: float = 120) -> dict[str, Any]:
    done = subprocess.run(["php", *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)
    assert done.returncode == 0, f"php {' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1, f"php {' '.join(args)} printed {done.stdout!r} (stderr {done.stderr!r})"
    result: dict[str, Any] = json.loads(lines[0])
    return result


def php_count(env: dict[str, str], server: Server) -> int:
    result = run_php(env, str(PHP_DIR / "counter.php"), server.emulator_host, PROJECT, "", "count")
    count: int = result["count"]
    return count


def python_counter(server: Server, **options: Any) -> CounterShardDS:
    gateway = DatastoreGateway("python-app", emulator_host=server.emulator_host)
    return CounterShardDS("Counter Test", 1, gateway=gateway, **options)


class ShardsAbovePhp(RandomShards):
    """Python's writers take shards 21..40 of the counter, which PHP (shards
    1..20) never writes, so what each side's writes left can be told apart."""

    def take(self, counter: Hashable, shards: range) -> int:
        return self.dice.choice([n for n in shards if n > PHP_SHARDS])


def count_concurrently(
    env: dict[str, str], server: Server, counter: CounterShardDS, processes: int, threads: int, seconds: float
) -> tuple[int, int]:
    """``processes`` PHP increment loops and ``threads`` Python threads adding
    to one counter for ``seconds``; (PHP's increments, Python's adds)."""
    loops = [
        subprocess.Popen(
            ["php", str(PHP_DIR / "increment_loop.php"), server.emulator_host, PROJECT, "", str(seconds)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(processes)
    ]
    adds = [0] * threads
    errors: list[BaseException] = []
    deadline = time.monotonic() + seconds

    def add(slot: int) -> None:
        try:
            while time.monotonic() < deadline:
                counter.add()
                adds[slot] += 1
        except BaseException as error:  # reported below, with the PHP side's
            errors.append(error)

    workers = [threading.Thread(target=add, args=(slot,)) for slot in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    php_increments = 0
    for loop in loops:
        out, err = loop.communicate(timeout=seconds + 120)
        assert loop.returncode == 0, f"increment_loop.php exited {loop.returncode}:\n{out}\n{err}"
        php_increments += json.loads(out)["increments"]
    assert not errors, f"Python's adds raised: {errors!r}"
    return php_increments, sum(adds)


def test_php_and_python_count_into_one_counter_at_once(
    php_env: dict[str, str], fresh_server: Server, record_property: Any
) -> None:
    counter = python_counter(fresh_server, num_shards=2 * PHP_SHARDS, shards=ShardsAbovePhp())
    php_increments, python_adds = count_concurrently(php_env, fresh_server, counter, processes=3, threads=3, seconds=4)
    assert php_increments > 0 and python_adds > 0

    by_shard = dict(counter.shards("query"))
    on_php_shards = sum(count for number, count in by_shard.items() if number <= PHP_SHARDS)
    on_python_shards = sum(count for number, count in by_shard.items() if number > PHP_SHARDS)
    # Python's adds are transactional or server-side increments: each one
    # counted exactly once, while PHP raced on its own shards.
    assert on_python_shards == python_adds
    # The article's fetch-then-upsert without a transaction can only lose
    # increments, never invent them.
    lost = php_increments - on_php_shards
    assert 0 <= lost
    # Both libraries read the same total, all shards of both.
    total = counter.get_count()
    assert total == on_php_shards + python_adds
    assert php_count(php_env, fresh_server) == total
    record_property("php_increments", php_increments)
    record_property("php_lost", lost)
    record_property("python_adds", python_adds)
    print(f"\nPHP: {php_increments} increments, {lost} lost; Python: {python_adds} adds, 0 lost; total {total}")


def test_php_and_python_share_shards_and_agree_on_the_total(
    php_env: dict[str, str], fresh_server: Server, record_property: Any
) -> None:
    """The migration as it happens: Python's default counter on the article's
    20 shards, beside PHP. PHP's blind upserts may overwrite a Python write
    on a shared shard too, so only the bound and the agreement are exact."""
    counter = python_counter(fresh_server)
    php_increments, python_adds = count_concurrently(php_env, fresh_server, counter, processes=2, threads=2, seconds=3)
    total = counter.get_count()
    assert 0 < total <= php_increments + python_adds
    assert {number for number, count in counter.shards("query") if count} <= set(range(1, PHP_SHARDS + 1))
    assert php_count(php_env, fresh_server) == total
    record_property("lost_on_shared_shards", php_increments + python_adds - total)
    print(f"\nshared shards: PHP {php_increments} + Python {python_adds}, total {total}")


def test_sequential_php_then_python_then_php(php_env: dict[str, str], fresh_server: Server) -> None:
    k, m = 7, 5
    result = run_php(
        php_env, str(PHP_DIR / "counter.php"), fresh_server.emulator_host, PROJECT, "", "increment", str(k)
    )
    assert result["returned"] == list(range(1, k + 1))  # alone, the article's increment returns count + 1
    counter = python_counter(fresh_server, strategy="transactional")
    assert counter.get_count() == k
    for _ in range(m):
        counter.add()
    assert php_count(php_env, fresh_server) == k + m
    # PHP rewrites a shard Python wrote, and Python still reads it.
    run_php(php_env, str(PHP_DIR / "counter.php"), fresh_server.emulator_host, PROJECT, "", "increment", "40")
    assert counter.get_count() == php_count(php_env, fresh_server) == k + m + 40


def test_increment_loop_reports_what_it_did(php_env: dict[str, str], fresh_server: Server) -> None:
    before = php_count(php_env, fresh_server)
    result = run_php(php_env, str(PHP_DIR / "increment_loop.php"), fresh_server.emulator_host, PROJECT, "loop-ns", "1")
    assert set(result) == {"increments", "seconds"}
    assert result["increments"] > 0
    assert 1 <= result["seconds"] < 30
    # The loop counted in its namespace: alone, nothing is lost there, and
    # the default namespace is untouched.
    in_namespace = CounterShardDS(
        "Counter Test", 1, gateway=DatastoreGateway("other", "loop-ns", emulator_host=fresh_server.emulator_host)
    )
    assert 0 < in_namespace.get_count() <= result["increments"]
    assert php_count(php_env, fresh_server) == before


def test_the_articles_counter_test_php_as_the_article_runs_it(
    php_env: dict[str, str], fresh_server: Server, tmp_path: Path
) -> None:
    article = os.environ.get("PHP_ARTICLE_SRC", "")
    if not article:
        pytest.skip("PHP_ARTICLE_SRC is not set: the article's counter_test.php is not here to run")
    # The article's folder, as it expects it: its three files beside
    # vendor/autoload.php (here this project's bootstrap, not Composer's).
    folder = tmp_path / "article"
    (folder / "vendor").mkdir(parents=True)
    for name in ARTICLE_FILES:
        shutil.copy(Path(article) / name, folder / name)
    (folder / "vendor" / "autoload.php").write_text(f"<?php require {json.dumps(str(PHP_DIR / 'bootstrap.php'))};\n")
    env = dict(php_env, DATASTORE_EMULATOR_HOST=fresh_server.emulator_host, DATASTORE_PROJECT_ID=PROJECT)
    counter = python_counter(fresh_server)
    counter.add(3)
    for expected in (3, 4):
        done = subprocess.run(
            ["php", "counter_test.php"], cwd=folder, env=env, capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stderr
        assert f"Current counter value: {expected}" in done.stderr
        assert f"Next counter value: {expected + 1}" in done.stderr
    assert counter.get_count() == 5
