"""Evidence: the Firestore emulator itself sometimes lets a read-only
transaction see a commit made between two of its lookups.

    python tests/conformance/emulator_read_only_snapshots.py [READS]

No gds_counter between the client and the emulator: google-cloud-datastore's
own ``Client`` moves one unit from ``x`` to ``y`` in read-write
transactions in a thread, while the main thread reads ``x`` then ``y`` in
read-only transactions (begun, two ``get``s, rolled back). Every sum must be
1000; the script prints how many were not (measured: 2 of 1,500, each 1001,
``y`` read after a move that ``x`` was read before). It starts the emulator
(gcloud) with the project's own launcher and exits 1 when any sum was torn.
``tests/conformance/test_transactions.py::test_read_only_transactions_see_one_snapshot``
allows the emulator that many, and the project's own backends none.
"""

from __future__ import annotations

import os
import sys
import threading
import time


def main(reads: int) -> int:
    from gds_counter.emulators import start_emulator

    with start_emulator("firestore") as emulator:
        os.environ["DATASTORE_EMULATOR_HOST"] = emulator.host
        from google.api_core import exceptions
        from google.cloud import datastore

        client = datastore.Client(project=emulator.project)
        x, y = client.key("Balance", "x"), client.key("Balance", "y")
        start_x, start_y = datastore.Entity(x), datastore.Entity(y)
        start_x["n"], start_y["n"] = 1000, 0
        client.put_multi([start_x, start_y])
        stop, moves = threading.Event(), [0]

        def mover() -> None:
            while not stop.is_set():
                try:
                    with client.transaction() as txn:
                        ex, ey = client.get(x, transaction=txn), client.get(y, transaction=txn)
                        ex["n"], ey["n"] = ex["n"] - 1, ey["n"] + 1
                        txn.put(ex)
                        txn.put(ey)
                    moves[0] += 1
                except exceptions.Aborted:
                    pass

        thread = threading.Thread(target=mover, daemon=True)
        thread.start()
        torn = []
        try:
            for _ in range(reads):
                txn = client.transaction(read_only=True)
                txn.begin()
                ex = client.get(x, transaction=txn)
                time.sleep(0)  # let the mover in between the two reads
                ey = client.get(y, transaction=txn)
                txn.rollback()
                if ex["n"] + ey["n"] != 1000:
                    torn.append((ex["n"], ey["n"]))
        finally:
            stop.set()
            thread.join()
    print(f"{moves[0]} moves; {len(torn)} of {reads} read-only transactions saw a torn sum: {torn[:10]}")
    return 1 if torn else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1500))
