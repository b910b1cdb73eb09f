"""How a gateway learns what its server can do: one probe, on a throwaway
entity of its own kind (``PROBE_KIND``) that it deletes again.

A server that ignores increment transforms also ignores property masks and
would replace the entity, so this is never tried on real data. The probe is
a plan of the gateway's public calls, run by the gateway itself
(``BaseGateway.capabilities``, ``AsyncDatastoreGateway.learn_capabilities``)
while its RPCs count as ``probe_rpcs``.
"""

from __future__ import annotations

import uuid

from gds_counter.errors import BadValueError, CommitUnknown, GatewayError, Unavailable
from gds_counter.gateway._calls import commit, lookup, run_aggregation, run_query
from gds_counter.gateway._effects import Plan
from gds_counter.gateway.capabilities import Capabilities
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Increment, Upsert
from gds_counter.gateway.query import Aggregation, AggregationQuery, PropertyFilter, Query
from gds_counter.gateway.values import RawEntity

__all__ = ["PROBE_KIND", "probe"]

#: The kind of the throwaway entity a gateway writes (and deletes) once to
#: learn how its server treats increment transforms.
PROBE_KIND = "GdsCounterProbe"


def probe(namespace: str) -> Plan[Capabilities]:
    """``_probe``, run before the caller's own request is sent: a probe
    commit whose outcome is unknown (``CommitUnknown``, about the throwaway
    entity) is ``Unavailable`` for the caller, whose request was not sent
    (told "unknown", a counter would not retry, and its amount would be
    lost; told ``Unavailable``, it retries, and the next attempt probes
    again)."""
    try:
        return (yield from _probe(namespace))
    except CommitUnknown as exc:
        raise Unavailable(f"learning what the server can do failed ({exc}): the call that needed it was not "
                          "sent, so nothing of it was written") from exc


def _probe(namespace: str) -> Plan[Capabilities]:
    """Ask the server of the gateway that runs this plan, on a throwaway entity that is deleted after.

    A server-side increment with a property mask, then a read: does the
    server apply both, and does it index the result of a property sent
    unindexed? A server that ignores transforms also ignores the mask and
    replaces the entity, which is why this is never tried on real data.
    Then one ``!=`` query: the legacy Datastore emulator refuses it. Then
    one ``COUNT(*)``: the legacy emulator does not implement aggregations.
    These RPCs count as ``probe_rpcs``, not as the caller's ``rpcs``.
    """
    key = Key.of(PROBE_KIND, f"probe-{uuid.uuid4().hex}", namespace=namespace)
    yield from commit([Upsert(RawEntity(key, {"keep": True, "n": 1}, frozenset({"n"})))])
    try:
        mask = Upsert(
            RawEntity(key, {"keep": True}, frozenset({"n"})), property_mask=("keep",), transforms=(Increment("n", 1),)
        )
        [sent] = (yield from commit([mask])).mutation_results
        [after] = yield from lookup([key])
        try:
            yield from run_query(
                Query(PROBE_KIND, namespace=namespace, filter=PropertyFilter("n", "!=", 0), keys_only=True, limit=1)
            )
            not_equal = True
        except Unavailable:
            raise  # says nothing about the server, only that it was not reached
        except (BadValueError, GatewayError):
            not_equal = False  # the legacy emulator answers UNKNOWN
        try:
            yield from run_aggregation(
                AggregationQuery(
                    Query(PROBE_KIND, namespace=namespace, filter=PropertyFilter("__key__", "=", key)),
                    (Aggregation.count(),),
                )
            )
            aggregation = True
        except Unavailable:
            raise
        except (BadValueError, GatewayError):
            aggregation = False  # the legacy emulator answers UNIMPLEMENTED
    finally:
        yield from commit([Delete(key)])
    applied = (
        sent.transform_results == (2,)
        and after is not None
        and after.properties.get("n") == 2
        and after.properties.get("keep") is True
    )
    return Capabilities(
        applies_transforms=applied,
        indexes_transformed=applied and after is not None and "n" not in after.unindexed,
        not_equal_in_or=not_equal,
        aggregation=aggregation,
    )
