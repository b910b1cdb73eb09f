"""Insert, update and reserve_ids: the same calls on every gateway, and a
generated differential against the Firestore emulator.

What Datastore does, measured on the Firestore emulator (the oracle) and
followed by the embedded engine:

* an insert of an entity that exists fails with ``AlreadyExists``, an
  update of one that does not with ``NotFound``; that entity is not written;
* in a transaction, nothing of the commit is written;
* a commit without a transaction applies its mutations in order and stops
  at the first that fails: the ones before it are written, the rest not (the
  v1 reference: a non-transactional commit "may not apply as all or none");
* ``reserve_ids`` takes complete keys with positive ids.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sizes import sized

from gds_counter import AlreadyExists, BadKeyError, GDSError, NotFound
from gds_counter.gateway import open_gateway
from gds_counter.gateway.base import run_query_all
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Delete, Insert, Update, Upsert
from gds_counter.gateway.query import Query
from gds_counter.gateway.values import RawEntity

KIND = "M"


def entity(gateway: Any, name: str | None, value: int) -> RawEntity:
    return RawEntity(Key.of(KIND, name, namespace=gateway.namespace), {"v": value})


def stored(gateway: Any) -> dict[str, int]:
    """Name -> value of every named entity; ``#ids``: how many have ids."""
    found: dict[str, int] = {"#ids": 0}
    for raw in run_query_all(gateway, Query(KIND, gateway.namespace)):
        if raw.key.name is None:
            found["#ids"] += 1
        else:
            found[raw.key.name] = raw.properties["v"]
    return found


# --- the same calls on every gateway ------------------------------------------------


def test_an_insert_of_an_entity_that_exists_writes_nothing_of_it(gateway):
    gateway.commit([Insert(entity(gateway, "a", 1))])
    with pytest.raises(AlreadyExists):
        gateway.commit([Insert(entity(gateway, "a", 2))])
    assert stored(gateway) == {"#ids": 0, "a": 1}


def test_an_update_of_an_entity_that_does_not_exist_writes_nothing(gateway):
    with pytest.raises(NotFound):
        gateway.commit([Update(entity(gateway, "a", 1))])
    gateway.commit([Upsert(entity(gateway, "a", 1))])
    gateway.commit([Update(entity(gateway, "a", 2))])
    assert stored(gateway) == {"#ids": 0, "a": 2}


def test_an_insert_with_an_incomplete_key_gets_an_id(gateway):
    result = gateway.commit([Insert(entity(gateway, None, 1))])
    key = result.mutation_results[0].key
    assert key is not None and key.id is not None
    assert stored(gateway) == {"#ids": 1}


def test_in_a_transaction_a_failed_insert_writes_nothing_at_all(gateway):
    gateway.commit([Upsert(entity(gateway, "a", 1))])
    token = gateway.begin_transaction()
    with pytest.raises(AlreadyExists):
        gateway.commit([Upsert(entity(gateway, "b", 1)), Insert(entity(gateway, "a", 2))], transaction=token)
    assert stored(gateway) == {"#ids": 0, "a": 1}


def test_without_a_transaction_the_mutations_before_a_failed_insert_are_written(gateway):
    gateway.commit([Upsert(entity(gateway, "a", 1))])
    with pytest.raises(AlreadyExists, match="before it"):
        gateway.commit([Upsert(entity(gateway, "b", 1)), Insert(entity(gateway, "a", 2)), Upsert(entity(gateway, "c", 1))])
    assert stored(gateway) == {"#ids": 0, "a": 1, "b": 1}


def test_an_update_needs_a_complete_key_before_anything_is_sent(gateway):
    with pytest.raises(BadKeyError):
        gateway.commit([Update(entity(gateway, None, 1))])


def test_reserve_ids_takes_complete_keys_with_positive_ids(gateway):
    gateway.reserve_ids([Key.of(KIND, 5, namespace=gateway.namespace), Key.of("P", 1, KIND, 7, namespace=gateway.namespace)])
    for bad in (Key.of(KIND, "name"), Key.of(KIND, None), Key.of(KIND, -5)):
        with pytest.raises(BadKeyError):
            gateway.reserve_ids([bad])


#: The calls above that hold on Firestore in native mode too (the Firestore
#: gateway, ``firestore_native_gateway``): every one but the
#: partly written commit, because a Firestore commit is atomic with or
#: without a transaction (``test_a_firestore_commit_is_all_or_nothing``).
ON_FIRESTORE_NATIVE = [
    test_an_insert_of_an_entity_that_exists_writes_nothing_of_it,
    test_an_update_of_an_entity_that_does_not_exist_writes_nothing,
    test_an_insert_with_an_incomplete_key_gets_an_id,
    test_in_a_transaction_a_failed_insert_writes_nothing_at_all,
    test_an_update_needs_a_complete_key_before_anything_is_sent,
    test_reserve_ids_takes_complete_keys_with_positive_ids,
]


#: The Firestore gateway, and ``AsyncFirestoreGateway`` (the asyncio face's,
#: on google-cloud-firestore's async client) behind the test bridge.
FIRESTORE_NATIVE = ("firestore-native", "firestore-native+aio")


@pytest.mark.parametrize("name", FIRESTORE_NATIVE)
@pytest.mark.parametrize("same", ON_FIRESTORE_NATIVE, ids=lambda test: test.__name__.removeprefix("test_"))
def test_the_same_calls_on_firestore_native(same, name, make_gateway):
    same(make_gateway(name))


@pytest.mark.parametrize("name", FIRESTORE_NATIVE)
def test_a_firestore_commit_is_all_or_nothing(name, make_gateway):
    """The difference: without a transaction Datastore writes the mutations
    before a failed insert; Firestore's commit is atomic, so nothing."""
    gateway = make_gateway(name)
    gateway.commit([Upsert(entity(gateway, "a", 1))])
    with pytest.raises(AlreadyExists, match="nothing of this commit"):
        gateway.commit([Upsert(entity(gateway, "b", 1)), Insert(entity(gateway, "a", 2)), Upsert(entity(gateway, "c", 1))])
    assert stored(gateway) == {"#ids": 0, "a": 1}


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_the_embedded_allocator_never_hands_out_a_reserved_id(url, tmp_path):
    """The ids a fresh gateway would allocate next, reserved first, are
    skipped (and the ones after them handed out)."""
    def fresh() -> Any:
        return open_gateway("memory://" if url == "memory://" else f"sqlite:///{tmp_path / uuid.uuid4().hex}.db")

    probe = fresh()
    upcoming = [key.id for key in probe.allocate_ids([Key.of(KIND, None)] * 6)]
    probe.close()
    gateway = fresh()
    gateway.reserve_ids([Key.of(KIND, i) for i in upcoming[:3]])
    handed = [key.id for key in gateway.allocate_ids([Key.of(KIND, None)] * 3)]
    assert handed == upcoming[3:]
    gateway.close()


# --- generated: the emulator decides ---------------------------------------------------

NAMES = ("a", "b", "c")
CASES = sized("GDS_DIFFERENTIAL_MUTATION_SCRIPTS", 20, 150)


@st.composite
def commits(draw: Any) -> list[tuple[bool, list[tuple[str, str | None, int]]]]:
    """1 to 4 commits, each in a transaction or not, of 1 to 3 mutations
    (operation, key name or None for an incomplete key, value)."""
    out = []
    for _ in range(draw(st.integers(1, 4))):
        transactional = draw(st.booleans())
        ops = draw(st.lists(st.tuples(
            st.sampled_from(("upsert", "insert", "update", "delete")),
            st.one_of(st.sampled_from(NAMES), st.none()),
            st.integers(0, 9),
        ), min_size=1, max_size=3))
        out.append((transactional, ops))
    return out


def mutation(gateway: Any, op: str, name: str | None, value: int) -> Any:
    if op == "delete":
        return Delete(Key.of(KIND, name or "a", namespace=gateway.namespace))
    if op == "update" and name is None:
        name = "a"  # (an update needs a complete key: refused before sending, tested above)
    return {"upsert": Upsert, "insert": Insert, "update": Update}[op](entity(gateway, name, value))


def play(gateway: Any, script: list[tuple[bool, list[tuple[str, str | None, int]]]]) -> list[Any]:
    """Each commit's outcome (ok, or its error's class) and what is stored after it."""
    seen = []
    for transactional, ops in script:
        mutations = [mutation(gateway, *op) for op in ops]
        try:
            token = gateway.begin_transaction() if transactional else None
            gateway.commit(mutations, transaction=token)
            outcome = "ok"
        except GDSError as exc:
            outcome = type(exc).__name__
        seen.append((outcome, stored(gateway)))
    return seen


def test_inserts_updates_upserts_and_deletes_as_the_firestore_emulator(firestore_emulator: Any, tmp_path) -> None:
    """Scripts of commits, each outcome and the state after it compared on
    the emulator and on the embedded engine (memory and a file)."""
    differences: list[str] = []
    reached = {"AlreadyExists": 0, "NotFound": 0, "ok": 0, "partly written": 0}

    @settings(max_examples=CASES, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(commits())
    def check(script: Any) -> None:
        ns = f"mut-{uuid.uuid4().hex[:10]}"
        urls = [f"memory://?namespace={ns}", f"sqlite:///{tmp_path / (ns + '.db')}?namespace={ns}"]
        gateways = [firestore_emulator.gateway(namespace=ns)] + [open_gateway(url) for url in urls]
        try:
            theirs, *ours = [play(gateway, script) for gateway in gateways]
        finally:
            for gateway in gateways:
                gateway.close()
        for (transactional, ops), (outcome, _) in zip(script, theirs):
            reached[outcome] = reached.get(outcome, 0) + 1
            if outcome in ("AlreadyExists", "NotFound") and not transactional and len(ops) > 1:
                reached["partly written"] += 1
        for url, answer in zip(urls, ours):
            if answer != theirs:
                differences.append(f"{script} on {url.split(':')[0]}\n    emulator: {theirs}\n    embedded: {answer}")

    check()
    print(f"mutations differential: {reached}")
    assert reached["AlreadyExists"] and reached["NotFound"] and reached["ok"] and reached["partly written"], reached
    assert not differences, f"{len(differences)} scripts differ:\n" + "\n".join(differences[:20])
