"""Evidence: the Firestore emulator in native mode, like the same emulator
in Datastore mode (``emulator_read_only_snapshots.py``), sometimes lets a
read-only transaction see a commit made between two of its reads.

    python tests/conformance/emulator_native_read_only_snapshots.py [READS]

No gds_counter between the client and the emulator: google-cloud-firestore's
own ``Client`` moves one unit from ``Balance/x`` to ``Balance/y`` in
read-write transactions in a thread, while the main thread reads ``x`` then
``y`` in read-only transactions (``client.transaction(read_only=True)``,
two ``get``s, then its end). Every sum must be 1000; the script prints how
many were not, and exits 1 when any was torn (measured: 0 of 1,500 in
one run, 6 of 4,000 in the next, each 999 or 1001). It starts the emulator
(gcloud) in native mode with the project's own launcher.
``tests/conformance/test_transactions.py::test_read_only_transactions_see_one_snapshot``
allows the emulator in either mode two torn sums, the project's own
backends none.
"""

from __future__ import annotations

import os
import sys
import threading


def main(reads: int) -> int:
    from gds_counter.emulators import start_emulator

    with start_emulator("firestore-native") as emulator:
        os.environ["FIRESTORE_EMULATOR_HOST"] = emulator.host
        from google.api_core import exceptions
        from google.cloud import firestore

        client = firestore.Client(project=emulator.project)
        x, y = client.document("Balance/x"), client.document("Balance/y")
        x.set({"n": 1000})
        y.set({"n": 0})
        stop, moves = threading.Event(), [0]

        @firestore.transactional
        def move(transaction: firestore.Transaction) -> None:
            nx = x.get(transaction=transaction).to_dict()["n"]
            ny = y.get(transaction=transaction).to_dict()["n"]
            transaction.update(x, {"n": nx - 1})
            transaction.update(y, {"n": ny + 1})

        def mover() -> None:
            while not stop.is_set():
                try:
                    move(client.transaction())
                    moves[0] += 1
                except (exceptions.Aborted, ValueError):
                    pass

        thread = threading.Thread(target=mover, daemon=True)
        thread.start()
        torn = []
        try:
            for _ in range(reads):
                transaction = client.transaction(read_only=True)
                transaction._begin()
                try:
                    nx = x.get(transaction=transaction).to_dict()["n"]
                    ny = y.get(transaction=transaction).to_dict()["n"]
                finally:
                    transaction._rollback()
                if nx + ny != 1000:
                    torn.append(nx + ny)
        finally:
            stop.set()
            thread.join()
        print(f"{len(torn)} of {reads} read-only transactions saw a torn sum {torn} ({moves[0]} moves)")
        return 1 if torn else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1500))
