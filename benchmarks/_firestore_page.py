"""Firestore's "Distributed counters" page's Python ``Counter``, on
google-cloud-firestore itself: written from the page's Python sample (not
copied), as an app that followed the page runs it.

- ``init_counter(doc_ref)``: ``set({"count": 0})`` on every document
  ``str(num)``, num in ``range(num_shards)``, of ``doc_ref``'s ``shards``;
- ``increment_counter(doc_ref)``: ``update({"count": Increment(1)})`` on the
  shard ``str(random.randint(0, num_shards - 1))`` (an update: a missing
  shard raises ``NotFound``);
- ``get_count(doc_ref)``: for each document reference
  ``list_documents()`` gives in ``shards``, ``get()`` it and add its
  ``count`` (0 when absent).

One definition for two users: the acceptance tests
(``tests/counter/test_distributed_firestore.py``) count with it beside
``DistributedCounter`` on one counter, and ``firestore_counters.py`` times
it against ours. It lives here, with the benchmarks' other baselines,
because the tests already import benchmark helpers by path and a benchmark
must not import from ``tests/``.
"""

from __future__ import annotations

import random
from typing import Any


class PageClientCounter:
    def __init__(self, num_shards: int, rng: random.Random | None = None) -> None:
        self._num_shards = num_shards
        self._rng = rng or random.Random()

    def init_counter(self, doc_ref: Any) -> None:
        shards = doc_ref.collection("shards")
        for num in range(self._num_shards):
            shards.document(str(num)).set({"count": 0})

    def increment_counter(self, doc_ref: Any) -> Any:
        from google.cloud import firestore

        shard = doc_ref.collection("shards").document(str(self._rng.randint(0, self._num_shards - 1)))
        return shard.update({"count": firestore.Increment(1)})

    def get_count(self, doc_ref: Any) -> int:
        total = 0
        for shard in doc_ref.collection("shards").list_documents():
            total += (shard.get().to_dict() or {}).get("count", 0)
        return total
