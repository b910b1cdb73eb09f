"""A writer for the crash tests: run as a script, killed with SIGKILL.

    python crash_writer.py DB_PATH STRATEGY

Loops forever on the SQLite file DB_PATH. Each round it

* adds 1 to the counter named STRATEGY (written with that strategy) and,
  once ``add`` has returned, prints ``c``;
* in one transaction, adds 1 to both entities of a pair (``Pair/a`` and
  ``Pair/b``, which must always be equal) and, once committed, prints ``p``.

Every line is flushed as soon as the call returns, so the lines a killed
writer left behind are exactly the writes it saw succeed; at most one more
(in flight when it was killed) may have committed without being printed.
"""

from __future__ import annotations

import sys

from gds_counter.counter import CounterShardDS
from gds_counter.gateway.embedded import EmbeddedGateway
from gds_counter.gds import RetryPolicy, Store


def main() -> None:
    path, strategy = sys.argv[1], sys.argv[2]
    gateway = EmbeddedGateway(path)
    counter = CounterShardDS("crash", strategy, gateway=gateway, strategy=strategy,
                             retry=RetryPolicy(attempts=50, initial=0.001, maximum=0.01))
    pairs = Store("Pair", gateway)
    out = sys.stdout
    print("ready", flush=True)

    def bump_pair(tx: Store) -> None:
        a, b = tx.fetch_by_names(["a", "b"])
        n = 0 if a is None else a["n"]
        tx.upsert([tx.create_entity({"n": n + 1}).set_key_name(name) for name in ("a", "b")])

    while True:
        counter.add(1)
        out.write("c\n")
        out.flush()
        pairs.run_in_transaction(bump_pair, retry=RetryPolicy(attempts=50, initial=0.001, maximum=0.01))
        out.write("p\n")
        out.flush()


if __name__ == "__main__":
    main()
