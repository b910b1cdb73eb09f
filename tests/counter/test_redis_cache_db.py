"""Which Redis database a shared cache uses (``redis://host:port/DB`` or
``?db=DB``): every process meant to share totals must land in the same one,
so a spelling redis-py would read as another db (or silently as db 0) is
refused when the counter is made, naming the URL and the value; and a db
past the server's ``databases`` (only the server knows it) turns the cache
off at its first call, with one clear warning, instead of retrying for
ever. Reads then come from storage: never a wrong total."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from gds_counter.counter import CounterShardDS
from gds_counter.errors import BadValueError
from gds_counter.gateway import open_gateway


@pytest.mark.parametrize("url, value", [
    ("redis://h:1/abc", "abc"),  # redis-py: db 0
    ("redis://h:1/1.5", "1.5"),  # redis-py: db 0
    ("redis://h:1/0/1", "0/1"),  # redis-py: db 1
    ("redis://h:1/ 1", " 1"),  # redis-py: db 1
    ("redis://h:1/%31", "%31"),  # redis-py: db 1
    ("redis://h:1/-1", "-1"),
    ("redis://h:1/+1", "+1"),
    ("redis://h:1/1_0", "1_0"),  # int() reads 10
    ("redis://h:1/99999999999", "99999999999"),  # past any server's databases (a C int)
    ("redis://h:1/0?db=x", "x"),
    ("redis://h:1/0?db=-1", "-1"),
    ("redis://h:1/0?db=", "''"),
    ("unix:///tmp/redis.sock?db=%201", " 1"),
    ("redis://h:1/0?db=3", "3"),  # two dbs: redis-py takes the query's
    ("redis://h:1?db=1&db=2", "2"),  # two dbs: redis-py takes the first
])
def test_a_db_that_is_not_one_plain_number_is_refused_naming_the_url_and_value(url, value, memory_gateway):
    """Each of these was accepted, and used a db its writer may not have
    meant (``/abc`` and ``/1.5`` db 0, ``/0/1`` and ``/ 1`` db 1): two apps
    meant to share totals could each cache its own, and read stale ones."""
    with pytest.raises(BadValueError) as raised:
        CounterShardDS("Counter Test", 1, gateway=memory_gateway, cache=url)
    assert repr(url) in str(raised.value) and "db" in str(raised.value) and value in str(raised.value)
    assert memory_gateway.stats.snapshot()["rpcs"] == 0


@pytest.mark.parametrize("url", ["redis://h:1", "redis://h:1/", "redis://h:1/0", "redis://h:1/15", "redis://h:1/00",
                                 "redis://h:1?db=7", "redis://h:1/7?db=7", "unix:///tmp/redis.sock?db=2"])
def test_plain_dbs_and_no_db_are_accepted(url, memory_gateway):
    """``/`` or no path is db 0, as redis-py reads it; a plain decimal,
    in the path or in ``db=`` (the same in both), is that db."""
    assert CounterShardDS("Counter Test", 1, gateway=memory_gateway, cache=url)._cache is not None


def test_the_cache_keeps_its_totals_in_the_db_its_url_names(redis_server, tmp_path):
    gateway = open_gateway(f"sqlite:///{tmp_path / 'db3.sqlite3'}")
    try:
        counter = CounterShardDS("Counter Test", 1, gateway=gateway, cache=redis_server.url.rpartition("/")[0] + "/3")
        counter.add(2)
        assert counter.get_count() == 2  # cached
        in_db = [redis.Redis(port=redis_server.port, db=db).keys("*:total") for db in (0, 3)]
        assert in_db[0] == [] and len(in_db[1]) == 1
    finally:
        gateway.close()


def test_a_db_past_the_servers_databases_turns_the_cache_off_loudly_at_its_first_call(redis_server, tmp_path,
                                                                                       caplog):
    """``/16`` on a server with the default 16 databases: only the server
    can tell, so the counter is made; its first Redis call is refused, and
    from then on the cache is off for this process (one warning naming the
    URL and the db; no new connection tried every ``timeout``): increments
    count, reads come from storage."""
    url = redis_server.url.rpartition("/")[0] + "/16?timeout=0.05"
    watcher = redis.Redis(port=redis_server.port)
    gateway = open_gateway(f"sqlite:///{tmp_path / 'db16.sqlite3'}")
    try:
        counter = CounterShardDS("Counter Test", 1, gateway=gateway, cache=url)
        with caplog.at_level(logging.WARNING, logger="gds_counter.counter.redis_cache"):
            counter.add(3)
            assert counter.get_count() == 3
            tried = watcher.info("stats")["total_connections_received"]
            for total in (4, 5):
                time.sleep(0.15)  # past the timeout: a cache that is only "down" would try Redis again here
                counter.add(1)
                assert counter.get_count() == total
            assert watcher.info("stats")["total_connections_received"] == tried  # off: Redis not asked again
        warnings = [record.getMessage() for record in caplog.records if record.name == "gds_counter.counter.redis_cache"]
        assert len(warnings) == 1 and url in warnings[0] and "16" in warnings[0] and "off" in warnings[0]
    finally:
        gateway.close()
