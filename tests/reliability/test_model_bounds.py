"""The model of ``test_counter_model.py`` can fail: each check rejects a
total the docs do not allow (so a green model run means something)."""

from __future__ import annotations

from model_bounds import CounterModel


def test_an_exact_read_must_equal_the_acknowledged_sum_within_the_unknowns():
    model = CounterModel("c")
    model.write(5, "stored", 1.0, 1.1)
    model.write(3, "unknown", 2.0, 2.1)
    model.write(-2, "unknown", 3.0, 3.1)
    model.write(7, "not", 4.0, 4.1)
    assert model.bounds() == (3, 8)
    assert model.exact(3, lookup=False) is None and model.exact(8, lookup=False) is None
    assert model.exact(2, lookup=False) and model.exact(9, lookup=False) and model.exact(15, lookup=False)


def test_a_lookup_may_miss_only_what_php_wrote_past_the_recorded_shards():
    model = CounterModel("c")
    model.php_write(30, 1.0, 1.1)
    model.php_write(3, 2.0, 2.1)
    assert model.exact(1, lookup=True) is None and model.exact(1, lookup=False)
    model.grown(40)
    assert model.exact(1, lookup=True)  # the config entity now covers shard 30


def test_an_acknowledged_reset_is_zero_and_a_partial_one_anything():
    model = CounterModel("c")
    model.write(5, "stored", 1.0, 1.1)
    model.reset("stored", 2.0, 2.1)
    assert model.exact(5, lookup=False) and model.exact(0, lookup=False) is None
    model.write(4, "stored", 3.0, 3.1)
    model.reset("not", 4.0, 4.1)
    assert model.exact(0, lookup=False) and model.exact(4, lookup=False) is None
    model.reset("partial", 5.0, 5.1)
    assert model.exact(-12345, lookup=False) is None


def test_a_rollup_read_must_be_true_at_a_moment_within_max_age():
    model = CounterModel("c")
    model.write(1, "stored", 10.0, 10.1)
    model.write(1, "stored", 20.0, 20.1)
    assert model.as_of(1, 25.0, 10.0) is None  # true until 20.1, within 10 s of 25
    assert model.as_of(1, 40.0, 10.0)  # 1 was last true at 20.1, more than 10 s before 40
    assert model.as_of(0, 25.0, 10.0)


def test_a_cached_total_must_include_every_write_that_cache_saw_since():
    model = CounterModel("c")
    model.write(1, "stored", 1.0, 1.1, ("local",))
    model.php_write(2, 2.0, 2.1)  # unseen by the cache: may be missing within ttl
    model.write(10, "stored", 3.0, 3.1, ("local",))
    assert model.cached(11, 4.0, 60.0, "local") is None  # filled at 1 then +10 seen
    assert model.cached(12, 4.0, 60.0, "local") is None  # filled after PHP's write
    assert model.cached(1, 4.0, 60.0, "local")  # misses the seen +10
    assert model.cached(11, 100.0, 60.0, "local")  # older than its ttl
    model.write(5, "unknown", 5.0, 5.1, ("local",))  # dropped: nothing from before it
    assert model.cached(11, 6.0, 60.0, "local")
    assert model.cached(12, 6.0, 60.0, "local") is None and model.cached(17, 6.0, 60.0, "local") is None


def test_a_restored_cache_may_show_what_it_held_at_its_snapshot_but_no_less():
    model = CounterModel("c")
    model.write(1, "stored", 1.0, 1.1, ("redis",))
    model.cache_saved("redis")
    model.write(2, "stored", 2.0, 2.1)  # not through the cache
    model.cache_lost("redis")
    assert model.cached(1, 3.0, 60.0, "redis")  # emptied: read now
    model.cache_restored("redis")
    assert model.cached(1, 3.0, 60.0, "redis") is None  # the snapshot's total, unseen write missing
    model.write(4, "stored", 4.0, 4.1, ("redis",))
    assert model.cached(1, 5.0, 60.0, "redis")  # misses the +4 its own writer made
    assert model.cached(5, 5.0, 60.0, "redis") is None
