"""A masked write of plain values onto a remembered stored entity (the
counter's every ``add()``) takes a shortcut (``_storage.masked_plain``)
that must store exactly what the general path stores: the same text, the
same transform results, the same index rows, the same refusals.

Each test runs real SQLite (memory and a file); the general path is the
same engine with the shortcut switched off.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gds_counter.errors import BadValueError
from gds_counter.gateway.embedded import EmbeddedGateway, _encoding, _storage
from gds_counter.gateway.embedded._encoding import dump_entity, key_bytes
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Upsert
from gds_counter.gateway.values import MAX_ENTITY_BYTES, MAX_INDEXED_VALUES, RawEntity, entity_size, index_values


@pytest.fixture(params=["memory", "file"])
def gw(request, tmp_path):
    gateway = EmbeddedGateway(None if request.param == "memory" else str(tmp_path / "db.sqlite3"))
    yield gateway
    gateway.close()


def _add(gw, name: str, amount: int = 1, target: str = "T_1") -> tuple:
    entity = RawEntity(Key.of("Shard", name), {"target": target}, frozenset({"count"}))
    [result] = gw.commit([Upsert(entity, property_mask=("target",), transforms=(Increment("count", amount),))]).mutation_results
    return result.transform_results


def _row(gw, key: Key) -> tuple[str, set]:
    """What SQLite holds for ``key``: its text and its index rows (white box)."""
    with gw._db() as conn:
        text = conn.execute("SELECT data FROM entities WHERE key_bytes = ?", (key_bytes(key),)).fetchone()[0]
        rows = set(conn.execute("SELECT ns, kind, name, value FROM props WHERE key_bytes = ?", (key_bytes(key),)))
    return text, rows


def test_a_counters_add_rebuilds_no_entity_checks_no_limits_and_indexes_only_the_count(gw, monkeypatch):
    """A lone ``add()`` onto the shard text this gateway just wrote used to
    rebuild the entity through the property paths, count it against
    Datastore's limits, compute every index entry and encode every value
    (a third of the engine's commit). None of that runs now, and the
    answer and the stored row are what they were: the increment's result
    indexed (as the Firestore emulator indexes a transform's result, the
    count the entity excluded too), the target's row kept."""
    _add(gw, "s")
    _add(gw, "s")

    def not_called(*args, **kwargs):
        raise AssertionError("the general path ran")

    for name in ("check_entity_limits", "index_entries", "dump_entity", "RawEntity"):
        monkeypatch.setattr(_storage, name, not_called)
    assert _add(gw, "s", 5) == (7,)
    text, rows = _row(gw, Key.of("Shard", "s"))
    assert json.loads(text) == {"k": ["", [["Shard", "s"]]], "p": {"target": "T_1", "count": 7}, "u": []}
    assert rows == {("", "Shard", "target", _encoding.sortable("T_1")), ("", "Shard", "count", _encoding.sortable(7))}


_PLAIN = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
)
_NAMES = st.sampled_from(["a", "b", "target", "count"])


@settings(max_examples=200, deadline=None)
@given(
    stored=st.dictionaries(_NAMES, _PLAIN, max_size=4),
    stored_unindexed=st.sets(_NAMES),
    given_=st.dictionaries(_NAMES, _PLAIN, max_size=3),
    unindexed=st.sets(_NAMES),
    mask=st.lists(_NAMES, unique=True, max_size=3),
    increments=st.lists(st.tuples(_NAMES, st.one_of(st.integers(-5, 5), st.floats(-2, 2))), max_size=2, unique_by=lambda t: t[0]),
)
def test_the_shortcut_stores_what_the_general_path_stores(stored, stored_unindexed, given_, unindexed, mask, increments):
    """Any masked write of plain values (set, dropped, incremented, indexed
    or not, a name both masked and incremented) onto any stored entity of
    plain values: the same text, results and index rows, in memory, with
    the shortcut and without it."""
    key = Key.of("E", "e")
    mutation = Upsert(
        RawEntity(key, given_, frozenset(unindexed) & set(given_)),
        property_mask=tuple(mask), transforms=tuple(Increment(n, a) for n, a in increments),
    )
    found = []
    for shortcut in (True, False):
        gw = EmbeddedGateway(None)
        try:
            gw.commit([Upsert(RawEntity(key, stored, frozenset(stored_unindexed) & set(stored)))])
            if not shortcut:
                real, _storage.masked_plain = _storage.masked_plain, lambda *args: None
            try:
                [result] = gw.commit([mutation]).mutation_results
            finally:
                if not shortcut:
                    _storage.masked_plain = real
            found.append((repr(result.transform_results), _row(gw, key)))
        finally:
            gw.close()
    assert found[0] == found[1]


def test_a_float_indexed_in_an_older_encoding_is_rewritten_by_a_masked_write(tmp_path):
    """The shortcut never tells a float's index rows unchanged: a file
    written before -0.0 had its own encoding may hold it as 0.0, and a
    masked write of another property replaces that row, as any rewrite does."""
    import sqlite3

    path = str(tmp_path / "db.sqlite3")
    gw = EmbeddedGateway(path)
    try:
        key = Key.of("Shard", "s")
        gw.commit([Upsert(RawEntity(key, {"v": -0.0, "target": "T"}, frozenset({"count"})))])
        with sqlite3.connect(path) as raw:  # as an older release indexed it
            raw.execute("UPDATE props SET value = ? WHERE key_bytes = ? AND name = 'v'", (_encoding.sortable(0.0), key_bytes(key)))
        _add(gw, "s", target="T")
        assert {(name, value) for _, _, name, value in _row(gw, key)[1]} == {
            ("target", _encoding.sortable("T")), ("v", _encoding.sortable(-0.0)), ("count", _encoding.sortable(1))}
    finally:
        gw.close()


def test_a_masked_write_past_the_entity_limit_is_still_refused_before_anything_is_written(gw):
    """The shortcut counts no limits only for texts far inside them; a
    stored entity near the size limit, masked with a longer value, is
    refused as before, and the row keeps what it held."""
    key = Key.of("Shard", "big")
    gw.commit([Upsert(RawEntity(key, {"target": "T", "pad": "x" * (MAX_ENTITY_BYTES - 200)}, frozenset({"pad", "count"})))])
    before = _row(gw, key)
    entity = RawEntity(key, {"more": "y" * 300}, frozenset({"more"}))
    with pytest.raises(BadValueError, match="entity limit"):
        gw.commit([Upsert(entity, property_mask=("more",), transforms=(Increment("count", 1),))])
    assert _row(gw, key) == before


def test_the_plain_text_limit_is_inside_datastores_limits():
    """The bound ``PLAIN_TEXT_LIMIT``'s note derives: an entity of plain
    values is at most 48 + 5 x its text's length in ``entity_size`` and
    has at most a quarter of its text's length in indexed values."""
    assert 48 + 5 * _storage.PLAIN_TEXT_LIMIT < MAX_ENTITY_BYTES
    assert _storage.PLAIN_TEXT_LIMIT // 4 < MAX_INDEXED_VALUES


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.text(min_size=1, max_size=3).filter(lambda n: not n.startswith("__")), _PLAIN, max_size=12),
    st.one_of(st.integers(1, 2**63 - 1), st.text(min_size=1, max_size=3)),
)
def test_an_entity_of_plain_values_is_within_the_bound_of_its_text(properties, ident):
    key = Key.of("K", ident) if isinstance(ident, str) else Key.of("K", ident)
    entity = RawEntity(key, properties)
    text = dump_entity(entity)
    assert entity_size(entity) <= 48 + 5 * len(text)
    assert sum(1 for _ in index_values(entity)) <= len(text) // 4


@settings(max_examples=300, deadline=None)
@given(st.recursive(_PLAIN, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)))
def test_the_encoder_built_once_writes_what_json_dumps_writes(value):
    assert _encoding._encode(value) == json.dumps(value, separators=(",", ":"))
