"""Value meanings in the embedded engine's files, and in the Firestore
gateway, which has none.

The engine stores an entity's meanings as one more member of its stored
JSON, and only when it has some: an entity without meanings is stored as
every earlier release stored it, so older files read as before and newer
files written without meanings read in older releases.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from gds_counter.errors import BadValueError
from gds_counter.gateway import open_gateway
from gds_counter.gateway.embedded._encoding import dump_entity, load_entity
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity


def test_an_entity_without_meanings_is_stored_as_before() -> None:
    """The stored text of an entity without meanings is the one earlier
    releases wrote, and that text reads back as the entity."""
    entity = RawEntity(Key.of("K", "a"), {"n": 1, "s": "x"}, frozenset({"s"}))
    text = '{"k":["",[["K","a"]]],"p":{"n":1,"s":"x"},"u":["s"]}'
    assert dump_entity(entity) == text
    assert load_entity(text) == entity and not load_entity(text).meanings


def test_meanings_are_in_the_file(tmp_path: Any) -> None:
    """Written, closed and opened again: the meanings are read from the
    file (nested and per element too), not from a memory of the write."""
    path = tmp_path / "meanings.sqlite3"
    key = Key.of("K", "a")
    entity = RawEntity(
        key,
        {"z": b"x", "l": ["a", "b"], "e": RawEntity(None, {"t": "text"}, frozenset({"t"}), {"t": 15})},
        frozenset({"z"}),
        {"z": 22, "l": (None, 1)},
    )
    with open_gateway(f"sqlite:///{path}") as gateway:
        gateway.commit([Upsert(entity)])
    with open_gateway(f"sqlite:///{path}") as gateway:
        assert gateway.lookup([key]) == [entity]
    (text,) = sqlite3.connect(path).execute("SELECT data FROM entities").fetchone()
    assert '"m":{"z":22,"l":[null,1]}' in text


def test_the_firestore_gateway_refuses_meanings_before_writing(make_gateway: Any) -> None:
    """Firestore has no value meanings: an entity with one, at the top or
    nested, is refused before anything is sent, rather than stored without it."""
    gateway = make_gateway("firestore-native")
    key = Key.of("K", "a")
    for entity in (
        RawEntity(key, {"z": b"x"}, frozenset({"z"}), {"z": 22}),
        RawEntity(key, {"e": RawEntity(None, {"z": b"x"}, frozenset({"z"}), {"z": 22})}),
    ):
        with pytest.raises(BadValueError, match="no value meanings"):
            gateway.commit([Upsert(entity)])
    assert gateway.lookup([key]) == [None]
