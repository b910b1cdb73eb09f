"""Firestore documents as keys (``keys.document_key``, ``document_path``,
``key_of_document``): a collection id is a kind, a document id a key name;
what cannot name a document is refused before anything is sent."""

from __future__ import annotations

import pytest

from gds_counter.errors import BadKeyError
from gds_counter.gateway.keys import Key


@pytest.mark.parametrize("key", [
    Key.of("Book", "a/b"), Key.of("Bo/ok", "x"), Key.of("Book", "."), Key.of("Book", ".."), Key.of("A", "p", "B", "../x"),
])
def test_a_key_that_cannot_name_a_firestore_document_is_refused(key):
    """``document_path``: a ``/`` inside a kind or name would make more path
    segments (another document); ``.`` and ``..`` are not ids there."""
    from gds_counter.gateway.keys import document_path

    with pytest.raises(BadKeyError, match="cannot name a Firestore document"):
        document_path(key)


def test_document_paths_round_trip():
    from gds_counter.gateway.keys import document_key, document_path, key_of_document

    for key in (Key.of("counters", "likes"), Key.of("a", 7, "shards", "0"), Key.of("a", "b", "c", "d.e")):
        assert key_of_document(document_path(key)) == key
    assert document_key("counters/likes/shards/3") == Key.of("counters", "likes", "shards", "3")
