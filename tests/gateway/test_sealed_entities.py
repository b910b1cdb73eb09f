"""Sealed entities: checked once, written many times, never changed.

A counter writes the same shard entity (key and target) at every
increment; checking it in full at every commit was a tenth of the library's
CPU in a lone ``add()`` (issue 38). ``values.seal`` checks it once and makes
its properties unchangeable, and the gateway's checks pass it at once while
it is still exactly what was checked. Anything else is checked as before,
before anything is written.
"""

from __future__ import annotations

import copy
import pickle

import attrs
import pytest

from gds_counter import CounterShardDS
from gds_counter.errors import BadKeyError, BadValueError
from gds_counter.gateway import values
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Increment, Upsert
from gds_counter.gateway.values import RawEntity, SealedProperties, seal


def _key(gateway: object, name: str = "one") -> Key:
    return Key.of("Sealed", name, namespace=getattr(gateway, "namespace", ""))


def test_an_entity_is_checked_when_it_is_sealed():
    """A sealed entity was checked in full: a bad one is refused by ``seal``."""
    with pytest.raises(BadValueError, match="reserved"):
        seal(RawEntity(Key.of("Sealed", "one"), {"__x__": 1}))
    with pytest.raises(BadKeyError, match="metadata"):
        seal(RawEntity(Key.of("__kind__", "Sealed"), {"a": 1}))
    with pytest.raises(BadValueError, match="64 bits"):
        seal(RawEntity(Key.of("Sealed", "one"), {"a": 2**63}))


def test_an_entity_with_a_list_is_not_sealed_and_is_checked_at_each_write(make_gateway):
    """A list (or an embedded entity) could change after the check: such an
    entity comes back a plain copy, and a change to it is refused at the
    write, before anything is written."""
    gateway = make_gateway("memory")
    copied = seal(RawEntity(_key(gateway), {"a": [1]}))
    assert type(copied.properties) is dict and copied.properties == {"a": [1]}
    copied.properties["a"].append(2**63)
    with pytest.raises(BadValueError, match="64 bits"):
        gateway.commit([Upsert(copied)])
    assert gateway.lookup([copied.key]) == [None]


def test_sealed_properties_refuse_every_change_and_equal_the_plain_entity():
    """Nothing checked can change behind the check's back, and a sealed
    entity is the same value as the entity it was made from."""
    plain = RawEntity(Key.of("Sealed", "one"), {"a": 1, "b": "x"}, frozenset({"b"}))
    sealed = seal(plain)
    assert sealed == plain and type(sealed.properties) is SealedProperties
    props = sealed.properties
    changes = [
        lambda: props.__setitem__("a", 2), lambda: props.__delitem__("a"), lambda: props.update(a=2),
        lambda: props.pop("a"), lambda: props.popitem(), lambda: props.setdefault("c", 1), props.clear,
    ]
    for change in changes:
        with pytest.raises(TypeError, match="cannot change"):
            change()
    with pytest.raises(TypeError, match="cannot change"):
        props |= {"a": 2}
    assert sealed.properties == {"a": 1, "b": "x"}


def test_a_sealed_entity_is_written_as_it_was_checked(make_gateway):
    """The gateway passes a sealed entity without checking it again, and
    stores it like any other."""
    gateway = make_gateway("memory")
    sealed = seal(RawEntity(_key(gateway), {"target": "t"}))
    for amount in (1, 2):
        gateway.commit([Upsert(sealed, property_mask=("target",), transforms=(Increment("count", amount),))])
    [stored] = gateway.lookup([sealed.key])
    assert stored is not None and stored.properties == {"target": "t", "count": 3}


@pytest.mark.parametrize("how", ["evolved", "key reassigned", "flags reassigned", "rebuilt"])
def test_sealed_properties_under_another_key_or_flags_are_checked_again(make_gateway, how):
    """The seal holds only for the key and index flags it was made with
    (a ``RawEntity``'s key may be reassigned): under a metadata key, or with
    a long string made indexed, the entity is refused before anything is
    written."""
    gateway = make_gateway("memory")
    sealed = seal(RawEntity(_key(gateway), {"s": "x" * 1501}, frozenset({"s"})))
    bad_key = Key.of("__kind__", "Sealed", namespace=gateway.namespace)
    if how == "evolved":
        entity = attrs.evolve(sealed, key=bad_key)
    elif how == "key reassigned":
        entity = sealed
        entity.key = bad_key
    elif how == "flags reassigned":
        entity = sealed
        entity.unindexed = frozenset()
    else:
        entity = RawEntity(bad_key, sealed.properties, sealed.unindexed)
    error = BadValueError if how == "flags reassigned" else BadKeyError
    with pytest.raises(error):
        gateway.commit([Upsert(entity)])
    assert gateway.lookup([_key(gateway)]) == [None]


def test_a_copy_of_a_sealed_entity_is_a_plain_one():
    """Pickled or deep-copied, the properties are a plain dict (checked
    again wherever the copy is written), equal to the sealed ones."""
    sealed = seal(RawEntity(Key.of("Sealed", "one"), {"a": 1}))
    for copied in (pickle.loads(pickle.dumps(sealed)), copy.deepcopy(sealed)):
        assert copied == sealed and type(copied.properties) is dict
        copied.properties["a"] = 2  # a plain entity again: its owner may change it


def test_a_counter_checks_its_shard_entity_once_per_shard_not_per_write(make_gateway, monkeypatch):
    """The shard entity of a lone ``add()`` is built by the library from its
    checked counter name: it is checked in full once per shard, and each
    write checks only its amount (issue 38: the check at every commit was
    a tenth of a lone add's library CPU)."""
    checked: list[str] = []
    real = values.check_value

    def counting(name: str, value: object, indexed: bool, depth: int = 0) -> None:
        checked.append(name)
        real(name, value, indexed, depth)

    monkeypatch.setattr(values, "check_value", counting)
    counter = CounterShardDS("Sealed", "Counter", 2, gateway=make_gateway("memory"))
    for _ in range(6):
        counter.add(1)
    assert counter.get_count() == 6
    written = [number for number, count in counter.shards() if count]
    assert checked.count("target") == len(written)  # once for each shard written


def test_sealed_properties_are_made_only_by_seal_which_checks_first():
    """Built directly (or re-initialised with other values), SealedProperties
    passed an unchecked entity as checked: a reserved name, an oversized
    indexed string, a metadata key were written unchecked (a fresh user's
    attack). Only ``seal`` may make them, after its check."""
    bad = {"__evil__": 1}
    with pytest.raises(TypeError, match="made by seal"):
        SealedProperties(bad, Key.of("K", "a"), frozenset())
    sealed = seal(RawEntity(Key.of("K", "a"), {"n": 1}))
    with pytest.raises(TypeError, match="made by seal"):
        sealed.properties.__init__(bad, sealed.key, sealed.unindexed)
    assert dict(sealed.properties) == {"n": 1}
