"""Firestore's "Distributed counters" page's Python ``Counter``, written
from the page's sample (not copied) over a gateway, so that the page's
algorithm and ours can count into one counter on any backend.

What the page does, step by step:
- ``init_counter`` sets every shard document ``str(num)``, num in
  ``range(num_shards)``, of the counter document's ``shards`` collection to
  ``{"count": 0}``;
- ``increment_counter`` picks ``random.randint(0, num_shards - 1)`` and
  ``update``s that shard with ``Increment(1)``: an update, so a missing shard
  is an error (NOT_FOUND), never created;
- ``get_count`` lists the documents of ``shards`` (``list_documents``) and
  sums ``count`` (0 when absent) over each, fetched one by one.
"""

from __future__ import annotations

import random

from gds_counter.gateway.base import run_query_all
from gds_counter.gateway.keys import Key, document_key
from gds_counter.gateway.mutations import Increment, Update, Upsert
from gds_counter.gateway.query import PropertyFilter, Query
from gds_counter.gateway.values import RawEntity


class PageCounter:
    def __init__(self, num_shards: int, rng: random.Random | None = None) -> None:
        self.num_shards = num_shards
        self._rng = rng or random.Random()

    @staticmethod
    def _shard(doc: Key, num: int) -> Key:
        return doc.child("shards", str(num))

    def init_counter(self, gateway, path: str) -> None:
        doc = document_key(path)
        for num in range(self.num_shards):
            gateway.commit([Upsert(RawEntity(self._shard(doc, num), {"count": 0}))])

    def increment_counter(self, gateway, path: str) -> None:
        shard = self._shard(document_key(path), self._rng.randint(0, self.num_shards - 1))
        gateway.commit([Update(RawEntity(shard, {}), property_mask=(), transforms=(Increment("count", 1),))])

    def get_count(self, gateway, path: str) -> int:
        doc = document_key(path)
        query = Query("shards", filter=PropertyFilter("__key__", "HAS_ANCESTOR", doc), keys_only=True)
        listed = [row.key for row in run_query_all(gateway, query) if row.key is not None and row.key.parent == doc]
        total = 0
        for key in listed:
            [shard] = gateway.lookup([key])
            total += (shard.properties.get("count", 0) if shard is not None else 0)
        return total
