"""The Datastore gateway's aggregations: the RunAggregationQuery it sends,
the read count it records, and the retry policy it runs under.

Results are compared with the embedded engine in
``tests/conformance/test_aggregation.py``; this file is about the request.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

import pytest
from google.api_core import exceptions as gexc
from google.api_core.retry import Retry
from google.cloud.datastore_v1.types import datastore as _ds

from gds_counter.errors import BadValueError, GatewayError, Unavailable
from gds_counter.gateway.datastore import DatastoreGateway
from gds_counter.gateway.datastore._codec import Codec
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.query import Aggregation, AggregationQuery, PropertyFilter, Query
from gds_counter.gateway.values import RawEntity

COUNT, SUM, AVG, UP_TO = Aggregation.count, Aggregation.sum, Aggregation.avg, Aggregation.count_up_to


def test_every_alias_is_sent_and_count_up_to_zero_is_a_bound() -> None:
    aggregation = AggregationQuery(
        Query(kind="K", filter=PropertyFilter("a", "=", 1), limit=3),
        (COUNT(), UP_TO(0, "none"), SUM("p.q"), AVG("p", "mean")),
    )
    pb = Codec("p", "").aggregation_to_pb(aggregation, "extra")
    assert [a.alias for a in pb.aggregations] == ["property_1", "none", "property_2", "mean", "extra"]
    assert pb.aggregations[1].count.HasField("up_to") and pb.aggregations[1].count.up_to.value == 0
    assert not pb.aggregations[0].count.HasField("up_to")  # COUNT(*): no bound
    assert pb.aggregations[2].sum.property.name == "p.q" and pb.aggregations[3].avg.property.name == "p"
    assert pb.aggregations[4].WhichOneof("operator") == "count"
    assert pb.nested_query.kind[0].name == "K" and pb.nested_query.limit.value == 3


class Spy:
    """Wraps the GAPIC method: records each request and answers with ``answer``."""

    def __init__(self, answer: Callable[[Any], Any]) -> None:
        self.requests: list[Any] = []
        self.answer = answer

    def __call__(self, *, request: Any, retry: Any, timeout: float) -> Any:
        self.requests.append(request._pb)
        return self.answer(request._pb)


def answer_with(values: dict[str, int]) -> Callable[[Any], Any]:
    def answer(request: Any) -> Any:
        response = _ds.RunAggregationQueryResponse.pb()()
        result = response.batch.aggregation_results.add()
        for aggregation in request.aggregation_query.aggregations:
            result.aggregate_properties[aggregation.alias].integer_value = values[aggregation.alias]
        return _ds.RunAggregationQueryResponse(response)

    return answer


@pytest.fixture
def offline() -> Iterator[DatastoreGateway]:
    """A gateway whose RPCs are replaced in each test (nothing listens there)."""
    gateway = DatastoreGateway("p", emulator_host="127.0.0.1:9", timeout=5, retry=Retry(initial=0.001, maximum=0.002))
    yield gateway
    gateway.close()


@pytest.mark.parametrize(
    ("aggregations", "extra", "rows", "reads"),
    [
        ((SUM("p", "s"),), "gds_counter_rows", 2500, 3),  # a count added to learn the rows
        ((SUM("p", "gds_counter_rows"), AVG("p", "a")), "gds_counter_rows_", 1000, 1),
        ((COUNT("c"), SUM("p", "s")), None, 1001, 2),  # the caller's count says it
        ((UP_TO(10, "a"), UP_TO(5000, "b")), None, 4000, 4),  # the largest count-up-to is what was read
        (tuple(SUM(f"p{i}", f"s{i}") for i in range(5)), None, 0, 1),  # no room for a count: the least
    ],
)
def test_the_reads_recorded_follow_the_rows(
    offline: DatastoreGateway, aggregations: tuple[Aggregation, ...], extra: str | None, rows: int, reads: int
) -> None:
    aliases = AggregationQuery(Query(), aggregations).aliases()
    values = {alias: rows for alias in aliases} | ({extra: rows} if extra else {})
    if "a" in values and "b" in values:
        values = {"a": 10, "b": rows}
    spy = Spy(answer_with(values))
    offline._client().run_aggregation_query = spy  # type: ignore[method-assign]
    result = offline.run_aggregation(AggregationQuery(Query(kind="K"), aggregations))
    assert list(result) == list(aliases)  # the added count never shows
    sent = [a.alias for a in spy.requests[0].aggregation_query.aggregations]
    assert sent == list(aliases) + ([extra] if extra else [])
    assert offline.stats["rpc.run_aggregation_query"] == 1 and offline.stats["entity_reads"] == reads


def test_a_transaction_is_sent_as_the_read_option(offline: DatastoreGateway) -> None:
    spy = Spy(answer_with({"c": 1}))
    offline._client().run_aggregation_query = spy  # type: ignore[method-assign]
    begin = _ds.BeginTransactionResponse.pb()(transaction=b"tx-1")
    offline._client().begin_transaction = lambda **_: _ds.BeginTransactionResponse(begin)  # type: ignore[method-assign]
    token = offline.begin_transaction(read_only=True)
    offline.run_aggregation(AggregationQuery(Query(kind="K", namespace="ns"), (COUNT("c"),)), transaction=token)
    assert spy.requests[0].read_options.transaction == b"tx-1"
    assert spy.requests[0].partition_id.namespace_id == "ns"


def test_unavailable_is_retried_as_a_read(offline: DatastoreGateway) -> None:
    failures = [gexc.ServiceUnavailable("try again"), gexc.DeadlineExceeded("slow")]

    def flaky(request: Any) -> Any:
        if failures:
            raise failures.pop(0)
        return answer_with({"c": 7})(request)

    offline._client().run_aggregation_query = Spy(flaky)  # type: ignore[method-assign]
    assert offline.run_aggregation(AggregationQuery(Query(kind="K"), (COUNT("c"),))) == {"c": 7}
    assert offline.stats["retry.run_aggregation_query"] == 2


def test_errors_name_the_aggregation_call(offline: DatastoreGateway) -> None:
    def slow(request: Any) -> Any:
        raise gexc.DeadlineExceeded("slow")

    offline.timeout = 0.05
    offline._client().run_aggregation_query = Spy(slow)  # type: ignore[method-assign]
    with pytest.raises(Unavailable, match="^run_aggregation_query: Datastore did not answer in time"):
        offline.run_aggregation(AggregationQuery(Query(kind="K"), (COUNT("c"),)))

    def refused(request: Any) -> Any:
        raise gexc.InvalidArgument("Aggregations are not supported for the property: x")

    offline._client().run_aggregation_query = Spy(refused)  # type: ignore[method-assign]
    with pytest.raises(BadValueError, match="^run_aggregation_query: rejected by Datastore: Aggregations are not"):
        offline.run_aggregation(AggregationQuery(Query(kind="K"), (SUM("x"),)))


def test_a_missing_value_is_an_error_not_a_none(offline: DatastoreGateway) -> None:
    offline._client().run_aggregation_query = Spy(lambda request: _ds.RunAggregationQueryResponse())  # type: ignore[method-assign]
    with pytest.raises(GatewayError, match=r"sent no value for \['c'\]"):
        offline.run_aggregation(AggregationQuery(Query(kind="K"), (COUNT("c"),)))


def test_the_probe_finds_aggregations_on_each_emulator(datastore_gateway: Any, firestore_gateway: Any) -> None:
    assert datastore_gateway.capabilities.aggregation is False  # UNIMPLEMENTED
    assert firestore_gateway.capabilities.aggregation is True
    assert firestore_gateway.stats["rpcs"] == 0  # the probe's RPCs are probe_rpcs
    key = Key.of("K", "a", namespace=firestore_gateway.namespace)
    firestore_gateway.commit([Upsert(RawEntity(key, {"p": 2}))])
    result = firestore_gateway.run_aggregation(
        AggregationQuery(Query(kind="K", namespace=firestore_gateway.namespace), (SUM("p", "s"), UP_TO(0, "z")))
    )
    assert result == {"s": 2, "z": 0}
