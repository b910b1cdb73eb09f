"""Value meanings: what is written with a meaning is read back with it, on
every gateway, as the Firestore emulator in Datastore mode keeps it.

Measured on the emulator with the raw client (``gateway._meanings`` has the
table): a string, integer or blob keeps the meanings it takes, each list
element keeps its own, an embedded entity's values (in a list too) keep
theirs, a user (an embedded entity of unindexed strings) keeps 20; meaning
16 on an indexed blob is dropped. A meaning changes nothing
of how the value is filtered, sorted or projected, and a projection's values
come back without their meanings (the wire marks them 18, which the codec
reads as no meaning). The meanings the emulator refuses are refused before
anything is written.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sizes import sized

from gds_counter import BadValueError
from gds_counter.gateway._meanings import ALLOWED
from gds_counter.gateway.base import run_query_all
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Upsert
from gds_counter.gateway.query import Order, PropertyFilter, Query
from gds_counter.gateway.values import RawEntity

KIND = "Meant"


def key(gateway: Any, name: str) -> Key:
    return Key.of(KIND, name, namespace=gateway.namespace)


def meant(gateway: Any, name: str) -> RawEntity:
    """An entity with a meaning of every shape ndb and the raw client send."""
    return RawEntity(
        key(gateway, name),
        {
            "zipped": b"x\x9c+\xc9\xc8,\x06\x00\x04\xf1\x01\xd8",  # ndb's compressed BlobProperty: 22, unindexed
            "text": "long text",  # a legacy TextProperty: 15, unindexed
            "link": "http://example.com",  # 2 (ATOM_LINK), indexed
            "rating": 42,  # 13 (GD_RATING), indexed
            "plain": "no meaning",
            "parts": [b"a", b"b", b"c"],  # one meaning per element, None for none
            "inner": RawEntity(None, {"z": b"y", "c": "cat"}, frozenset({"z"}), {"z": 22, "c": 1}),
            "many": [RawEntity(None, {"z": b"w"}, frozenset({"z"}), {"z": 22}), RawEntity(None, {"n": 1})],
            "author": RawEntity(None, {"email": "a@example.com", "auth_domain": "example.com"}, frozenset({"email", "auth_domain"})),
        },
        frozenset({"zipped", "text", "parts"}),
        {"zipped": 22, "text": 15, "link": 2, "rating": 13, "parts": (22, None, 16), "author": 20},
    )


def test_meanings_are_read_back_as_written(gateway: Any, backend: str) -> None:
    """By key and by query, every meaning comes back where it was put:
    on scalars, per list element, inside embedded entities (in lists too)."""
    entity = meant(gateway, "a")
    gateway.commit([Upsert(entity)])
    read = [*gateway.lookup([entity.key]), *run_query_all(gateway, Query(KIND, gateway.namespace))]
    if backend == "datastore":  # the legacy Datastore emulator makes up a user id for a user
        for got in read:
            author = got.properties["author"]
            assert author.properties.pop("user_id")
            author.unindexed -= {"user_id"}
    assert read == [entity, entity]


def test_a_meaning_changes_no_filter_order_or_projection(gateway: Any) -> None:
    """The value with a meaning is found, sorted and projected as the same
    value without one; projected values carry no meaning."""
    with_meaning = meant(gateway, "a")
    without = RawEntity(key(gateway, "b"), {"link": "http://example.com", "rating": 41})
    gateway.commit([Upsert(with_meaning), Upsert(without)])
    ns = gateway.namespace
    found = list(run_query_all(gateway, Query(KIND, ns, filter=PropertyFilter("link", "=", "http://example.com"))))
    assert [e.key.name for e in found] == ["a", "b"]
    ordered = list(run_query_all(gateway, Query(KIND, ns, order=(Order("rating", descending=True),))))
    assert [e.key.name for e in ordered] == ["a", "b"]
    projected = list(run_query_all(gateway, Query(KIND, ns, projection=("rating",), order=(Order("rating"),))))
    assert [(e.key.name, e.properties, dict(e.meanings)) for e in projected] == [("b", {"rating": 41}, {}), ("a", {"rating": 42}, {})]


def test_a_masked_write_keeps_the_meanings_of_the_properties_it_leaves(transforming_gateway: Any) -> None:
    """A property mask replaces the named values with their meanings (or
    none) and leaves the others' meanings as they were, nested ones too."""
    gateway = transforming_gateway
    entity = meant(gateway, "a")
    gateway.commit([Upsert(entity)])
    change = RawEntity(entity.key, {"link": "http://other.example", "inner": RawEntity(None, {"c": "dog"})}, meanings={"link": 6})
    gateway.commit([Upsert(change, property_mask=("link", "rating", "inner.c"))])
    (got,) = gateway.lookup([entity.key])
    assert got.meanings == {"zipped": 22, "text": 15, "link": 6, "parts": (22, None, 16), "author": 20}
    assert got.properties["inner"].meanings == {"z": 22}
    assert got.properties["inner"].properties == {"z": b"y", "c": "dog"}


def test_a_transform_drops_the_meaning_of_the_value_it_changes(transforming_gateway: Any) -> None:
    """An increment leaves a value without its meaning (a rating, 13, on
    the emulator) and the other values with theirs."""
    gateway = transforming_gateway
    entity = RawEntity(key(gateway, "a"), {"rating": 50, "link": "x"}, meanings={"rating": 13, "link": 2})
    gateway.commit([Upsert(entity)])
    gateway.commit([Upsert(RawEntity(entity.key), property_mask=(), transforms=(Increment("rating", 1),))])
    (got,) = gateway.lookup([entity.key])
    assert (got.properties, dict(got.meanings)) == ({"rating": 51, "link": "x"}, {"link": 2})


@pytest.mark.parametrize(
    ("properties", "unindexed", "meanings"),
    [
        ({"p": "abc"}, (), {"p": 15}),  # text must be unindexed
        ({"p": b"abc"}, (), {"p": 22}),  # so must a compressed blob
        ({"p": 5}, (), {"p": 1}),  # a string's meaning on an integer
        ({"p": 101}, (), {"p": 13}),  # a rating is 0..100
        ({"p": 1.5}, ("p",), {"p": 13}),  # doubles take none
        ({"p": "abc"}, ("p",), {"p": 18}),  # a projection's mark
        ({"p": "abc"}, ("p",), {"p": 99}),  # unknown
        ({"p": ["a", "b"]}, (), {"p": 1}),  # a list takes one per element
        ({"p": "abc"}, (), {"q": 1}),  # no such property
        ({"p": RawEntity(None, {"email": "a", "auth_domain": "b"})}, (), {"p": 20}),  # a user's strings are unindexed
        ({"p": RawEntity(None, {"email": "a"}, frozenset({"email"}))}, (), {"p": 20}),  # and hold an auth_domain
        ({"p": RawEntity(None, {"n": 1})}, (), {"p": 21}),  # an entity takes no other meaning
    ],
)
def test_a_meaning_datastore_refuses_is_refused_before_anything_is_written(
    gateway: Any, properties: dict[str, Any], unindexed: tuple[str, ...], meanings: dict[str, Any]
) -> None:
    k = key(gateway, "refused")
    with pytest.raises(BadValueError):
        gateway.commit([Upsert(RawEntity(k, properties, frozenset(unindexed), meanings))])
    assert gateway.lookup([k]) == [None]


#: Values of each type that takes meanings, and the meanings it may take.
_VALUES = {
    str: st.text(max_size=20),
    int: st.one_of(st.integers(-1, 101), st.integers(-(2**63), 2**63 - 1)),
    bytes: st.binary(max_size=20),
}


@st.composite
def _property(draw: Any) -> tuple[Any, bool, Any]:
    """(value, indexed, meaning): a scalar or a list of one type, with
    meanings the emulator takes on it (None: no meaning; a rating, 13,
    only on 0..100)."""
    kind = draw(st.sampled_from(sorted(_VALUES, key=lambda t: t.__name__)))
    indexed = draw(st.booleans())

    def meaning(value: Any) -> Any:
        allowed = ALLOWED[(kind, indexed)] - ({13} if kind is int and not 0 <= value <= 100 else set())
        return draw(st.one_of(st.none(), st.sampled_from(sorted(allowed))))

    if draw(st.booleans()):
        value = draw(_VALUES[kind])
        return value, indexed, meaning(value)
    values = draw(st.lists(_VALUES[kind], min_size=1, max_size=4))
    return values, indexed, tuple(meaning(value) for value in values)


@settings(max_examples=sized("meanings", 10, 40), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from("abcdef"), _property(), min_size=1, max_size=4))
def test_generated_meanings_round_trip(gateway: Any, drawn: dict[str, tuple[Any, bool, Any]]) -> None:
    """Any value with any meaning the emulator takes is read back with the
    meaning the emulator keeps (``meanings.kept``: the same, less 16 on an
    indexed blob)."""
    from gds_counter.gateway._meanings import kept

    properties = {name: value for name, (value, _, _) in drawn.items()}
    unindexed = frozenset(name for name, (_, indexed, _) in drawn.items() if not indexed)
    meanings = {name: m for name, (_, _, m) in drawn.items() if m is not None and (type(m) is int or any(one is not None for one in m))}
    k = key(gateway, "generated")
    gateway.commit([Upsert(RawEntity(k, properties, unindexed, meanings))])
    expected = {}
    for name, meaning in meanings.items():
        stored = kept(properties[name], meaning, name not in unindexed)
        if stored is not None:
            expected[name] = stored
    (got,) = gateway.lookup([k])
    assert (got.properties, dict(got.meanings)) == (properties, expected)
