"""A second process on the same storage, for ``test_counter_model.py``.

    python model_child.py SPEC_JSON

``SPEC_JSON`` names the storage: ``{"url": "sqlite:///..."}`` or
``{"project": ..., "namespace": ..., "host": ...}`` (a Datastore API
server: the Firestore emulator or ``gds-counter serve``). It then reads
one JSON command per line from stdin and answers one JSON line on stdout:

* ``{"op": "add", "type": T, "id": I, "amount": N}`` -> ``{"ok": true}`` or
  ``{"error": "ClassName", "message": ...}``
* ``{"op": "count", "type": T, "id": I, "method": "query"|"lookup"}`` ->
  ``{"ok": true, "total": N}`` or an error as above.

One counter object per target is kept for the life of the process, as a
server's worker keeps them.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from gds_counter import CounterShardDS, RetryPolicy, open_gateway
from gds_counter.errors import GDSError


def storage(spec: dict[str, Any]) -> Any:
    if "url" in spec:
        return open_gateway(spec["url"])
    from gds_counter.gateway.datastore import DatastoreGateway

    return DatastoreGateway(spec["project"], namespace=spec["namespace"], emulator_host=spec["host"])


def main() -> None:
    gateway = storage(json.loads(sys.argv[1]))
    counters: dict[tuple[str, int], CounterShardDS] = {}
    retry = RetryPolicy(deadline=10.0)
    for line in sys.stdin:
        command = json.loads(line)
        target = (command["type"], command["id"])
        counter = counters.get(target)
        if counter is None:
            counter = counters[target] = CounterShardDS(*target, gateway=gateway, retry=retry)
        try:
            if command["op"] == "add":
                counter.add(command["amount"])
                answer: dict[str, Any] = {"ok": True}
            else:
                answer = {"ok": True, "total": counter.get_count(method=command["method"])}
        except GDSError as exc:
            answer = {"error": type(exc).__name__, "message": str(exc)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()
    gateway.close()


if __name__ == "__main__":
    main()
