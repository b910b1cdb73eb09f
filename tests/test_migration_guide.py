"""docs/migrating-from-php.md is checked against the code (issue 23, item 13).

A migration guide that contradicts the code misleads exactly the readers who
trust it most. It once said the default strategy uses transactions and keeps
``count`` unindexed, while the code used the server-side increment. So the
statements that can be checked are checked here, read from the guide itself
where they are data (its tables of names and signatures), and run against
the embedded engine and the official emulators where they are behaviour
(strategies and index flags, kinds written, value quirks).
"""

from __future__ import annotations

import ast
import datetime as dt
import inspect
import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

import gds_counter
from gds_counter import (
    CounterShardDS,
    CounterShardEntity,
    Entity,
    GeneralCounter,
    Schema,
    Store,
    open_gateway,
)
from gds_counter.counter import PHP_ARTICLE
from gds_counter.errors import BadValueError, CorruptDataError
from gds_counter.gateway.keys import Key
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity
from gds_counter.gds import schema as gds_schema

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "migrating-from-php.md").read_text()


def section(title_start: str) -> str:
    """The text of the guide's section (## or ###) whose title starts so."""
    match = re.search(rf"^(#+) {re.escape(title_start)}.*$", GUIDE, re.M)
    assert match, title_start
    level = len(match.group(1))
    rest = GUIDE[match.end():]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.M)
    return rest[: end.start()] if end else rest


def table_rows(text: str) -> list[list[str]]:
    rows = []
    for line in text.splitlines():
        if line.startswith("|") and not re.match(r"^\|\s*-+", line):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows[1:]  # without the header


# --- section 1: every Python name and signature the tables give exists as written ------------

TYPES = "php-gds's type constants"
#: Which object a name in each table's second column belongs to, by the
#: title of the section that holds the table (and which part of it).
TABLES = {
    ("`GDS\\Store`", 0): Store,
    ("`GDS\\Entity`", 0): Entity,
    ("`GDS\\Schema`", 0): Schema,
    ("`GDS\\Schema`", 1): gds_counter.PropertyType,
    ("Other php-gds names", 0): gds_counter,
    ("The counter article", 0): CounterShardDS,
}
#: The variables the tables write before a dot.
VARIABLES = {"store": Store, "schema": Schema, "counter": CounterShardDS,
             "gds_counter": gds_counter, "CounterShardDS": CounterShardDS,
             "CounterShardEntity": CounterShardEntity}
#: Names the tables use as examples of the reader's own code.
EXAMPLES = {"Book", "MyEntity", "book"}
#: Where else a name may live: classmethods every entity class has, and the
#: schema module's ``Property`` (what ``get_properties()`` returns).
ELSEWHERE = (Entity, CounterShardEntity, Schema, gds_schema)
SPAN = re.compile(r"`([^`]+)`")
CALL = re.compile(r"^(?:(\w+)\.)?(\w+)(\(.*\))?$")


def named_spans() -> Iterator[tuple[str, Any, str, str | None]]:
    """(table, owner, name, argument text or None) of each code span in the
    tables' Python column that names something."""
    for (title, part), owner in TABLES.items():
        for row in table_rows(section(title).split(TYPES)[part]):
            if len(row) < 2:
                continue
            for span in SPAN.findall(row[1]):
                for part in span.split(" / "):
                    match = CALL.match(part.strip())
                    if not match or match.group(2)[0].isdigit() or match.group(2) in ("None", "in"):
                        continue
                    prefix, name, args = match.groups()
                    if name in EXAMPLES or prefix in EXAMPLES:
                        continue
                    where = VARIABLES.get(prefix, owner) if prefix else owner
                    if prefix and prefix not in VARIABLES:
                        continue  # an expression such as `f"{...}"`
                    yield title, where, name, args


def lookup(where: Any, name: str) -> Any:
    for place in (where, gds_counter, *ELSEWHERE):
        if hasattr(place, name):
            return getattr(place, name)
    raise AssertionError(f"{name} is in the guide but not on {getattr(where, '__name__', where)} or gds_counter")


def guide_parameters(args: str) -> inspect.Signature | None:
    """The guide's argument list as a signature (None: prose, not Python).
    A trailing ``...`` means "and more": only what is written is compared."""
    text = re.sub(r",\s*\.\.\.\s*\)$", ")", args)
    try:
        tree = ast.parse(f"def f{text}: pass")
    except SyntaxError:
        return None
    fn = tree.body[0]
    assert isinstance(fn, ast.FunctionDef)
    a = fn.args
    params: list[inspect.Parameter] = []
    positional = [*a.posonlyargs, *a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for i, (arg, default) in enumerate(zip(positional, defaults)):
        kind = inspect.Parameter.POSITIONAL_ONLY if i < len(a.posonlyargs) else inspect.Parameter.POSITIONAL_OR_KEYWORD
        params.append(inspect.Parameter(arg.arg, kind, default=_literal(default)))
    if a.vararg:
        params.append(inspect.Parameter(a.vararg.arg, inspect.Parameter.VAR_POSITIONAL))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        params.append(inspect.Parameter(arg.arg, inspect.Parameter.KEYWORD_ONLY, default=_literal(default)))
    if a.kwarg:
        params.append(inspect.Parameter(a.kwarg.arg, inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


def _literal(node: ast.expr | None) -> Any:
    if node is None:
        return inspect.Parameter.empty
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ...  # not a literal (DEFAULT_RETRY): the name is checked, not the value


SPANS = list(named_spans())


def test_the_tables_name_many_python_names():
    assert len(SPANS) > 60  # the parser reads the tables (a broken parser would check nothing)


@pytest.mark.parametrize("title,where,name,args", SPANS, ids=[f"{s[2]}{'()' if s[3] else ''}" for s in SPANS])
def test_each_python_name_in_the_tables_exists_with_the_arguments_shown(title, where, name, args):
    """Names exist where the table puts them; an argument list shown is the
    real one: the same positional parameters in the same order, keyword-only
    ones keyword-only, and the same literal defaults."""
    found = lookup(where, name)
    if args is None or args == "()":
        return
    shown = guide_parameters(args)
    if shown is None:
        return
    real = [p for p in inspect.signature(found).parameters.values() if p.name not in ("self", "cls")]
    real_positional = [p for p in real if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    real_by_name = {p.name: p for p in real}
    shown_positional = [p for p in shown.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if any(p.name not in real_by_name for p in shown_positional):
        # a call with placeholders (`CounterShardDS(type, id, num_shards=N)`):
        # only the keywords it passes are compared
        shown = inspect.Signature([p for p in shown.parameters.values() if p.kind == p.KEYWORD_ONLY
                                   or (p.name in real_by_name and p.default is not inspect.Parameter.empty)])
        shown_positional = []
    assert [p.name for p in shown_positional] == [p.name for p in real_positional][: len(shown_positional)], (
        f"{name}{args}: positional parameters differ from {inspect.signature(found)}")
    for p in shown.parameters.values():
        assert p.name in real_by_name, f"{name}{args}: no parameter {p.name!r} in {inspect.signature(found)}"
        actual = real_by_name[p.name]
        assert (p.kind == p.KEYWORD_ONLY) == (actual.kind == actual.KEYWORD_ONLY), (
            f"{name}{args}: {p.name!r} is {actual.kind.description} in {inspect.signature(found)}")
        if p.default is not inspect.Parameter.empty and p.default is not ...:
            assert actual.default == p.default, f"{name}{args}: {p.name}={actual.default!r} in the code"


def test_property_type_constants_map_to_members():
    rows = table_rows(section("`GDS\\Schema`").split(TYPES)[1])
    members = [SPAN.findall(row[1])[0] for row in rows if SPAN.findall(row[1])]
    assert len(members) >= 10
    for member in members:
        assert hasattr(gds_counter.PropertyType, member), member


def test_the_example_the_counter_table_names_exists():
    assert "`examples/counter_test.py`" in GUIDE and (ROOT / "examples" / "counter_test.py").exists()


# --- section 2 and 5: strategies and the index flag on count ---------------------------------


def shard_after(gateway: Any, strategy: str, name: str = "Guide") -> RawEntity:
    """The one shard of a fresh 1-shard counter after ``add(2)`` with ``strategy``."""
    counter = CounterShardDS(name, strategy, gateway=gateway, strategy=strategy, num_shards=1)
    counter.add(2)
    [shard] = gateway.lookup([PHP_ARTICLE.shard_key(counter.target, 1, gateway.namespace)])
    assert shard is not None and shard.properties["count"] == 2 and shard.properties["target"] == counter.target
    return shard


def test_the_guide_no_longer_says_auto_uses_transactions():
    """The contradiction issue 23 found, gone from every section."""
    assert not re.search(r'"auto"`?\s+uses\s+\*{0,2}transactions', GUIDE)
    assert "keeps `count` unindexed exactly as\n   PHP wrote it" not in GUIDE


def test_on_the_embedded_engine_auto_indexes_count_as_the_emulator_does():
    """Section 5: 'The embedded engine does the same' as the Firestore
    emulator: a server-side increment ("auto", "increment") leaves
    ``count`` indexed, "transactional" keeps php-gds's flag."""
    assert "The embedded engine does the\nsame" in section("5.")
    gateway = open_gateway("memory://")
    try:
        assert gateway.capabilities.applies_transforms and gateway.capabilities.indexes_transformed
        for strategy in ("auto", "increment"):
            assert "count" not in shard_after(gateway, strategy).unindexed, strategy
        assert "count" in shard_after(gateway, "transactional").unindexed
    finally:
        gateway.close()


@pytest.mark.emulator
def test_on_the_firestore_emulator_auto_indexes_count_and_transactional_does_not(firestore_gateway):
    """Section 5: the Firestore emulator indexes what a server-side increment
    wrote; "auto" uses that increment there; "transactional" writes php-gds's
    flags; a whole write (as PHP's upsert) makes count unindexed again."""
    caps = firestore_gateway.capabilities
    assert caps.applies_transforms and caps.indexes_transformed
    assert "count" not in shard_after(firestore_gateway, "auto").unindexed
    assert "count" not in shard_after(firestore_gateway, "increment").unindexed
    shard = shard_after(firestore_gateway, "transactional")
    assert "count" in shard.unindexed
    # PHP's upsert writes the whole entity with its schema's flags
    indexed = shard_after(firestore_gateway, "auto", name="Rewritten")
    firestore_gateway.commit([Upsert(RawEntity(indexed.key, dict(indexed.properties), frozenset({"count"})))])
    [again] = firestore_gateway.lookup([indexed.key])
    assert again is not None and "count" in again.unindexed
    # section 4: the probe that learned all this left nothing behind
    from gds_counter.gateway.base import PROBE_KIND
    from gds_counter.gateway.query import Query

    assert "`GdsCounterProbe`" in section("4.") and PROBE_KIND == "GdsCounterProbe"
    assert firestore_gateway.run_query(Query(PROBE_KIND, namespace=firestore_gateway.namespace)).entities == ()


@pytest.mark.emulator
def test_on_the_legacy_datastore_emulator_auto_falls_back_to_transactions(datastore_gateway):
    """Section 5: where transforms are ignored "auto" uses transactions
    (count unindexed) and "increment" raises TransformsIgnored."""
    from gds_counter.errors import TransformsIgnored

    assert not datastore_gateway.capabilities.applies_transforms
    assert "count" in shard_after(datastore_gateway, "auto").unindexed
    with pytest.raises(TransformsIgnored):
        CounterShardDS("Guide", "x", gateway=datastore_gateway, strategy="increment").add(1)


def test_auto_is_the_default_of_both_counters():
    gateway = open_gateway("memory://")
    try:
        for counter in (CounterShardDS("a", 1, gateway=gateway), GeneralCounter("a", gateway=gateway)):
            assert counter.options.strategy == "auto"
    finally:
        gateway.close()


def test_the_committed_benchmark_says_what_the_guide_quotes():
    """Section 4: the PHP algorithm lost about 1 increment in 5; section 5:
    transactional made fewer increments per second than the default, in
    both layouts."""
    assert "about 1 increment in 5, in both layouts" in section("4.")
    run = json.loads((ROOT / "docs" / "benchmarks" / "contention.json").read_text())
    assert (run["settings"]["writers"], run["settings"]["shards"]) == (16, 20)
    series = {(s["series"], s["layout"]): s for s in run["series"]}
    layouts = {layout for _, layout in series}
    assert len(layouts) == 2
    for layout in layouts:
        php = series[("php-article", layout)]
        assert 1 / 6 < php["lost"] / php["acked"] < 1 / 4, php
        assert series[("transactional", layout)]["per_s"] < series[("increment", layout)]["per_s"]


# --- sections 1 to 4: behaviour the guide states -----------------------------------------------


@pytest.fixture
def gateway() -> Iterator[Any]:
    gw = open_gateway("memory://")
    yield gw
    gw.close()


def test_a_grown_counter_records_its_shards_in_the_config_kind(gateway):
    """Section 2: growing past 20 records the count in IK_CounterShardConfig;
    the shards stay in IK_CounterShardEntity with PHP's key names."""
    counter = CounterShardDS("Counter Test", 1, gateway=gateway)
    counter.add(1)
    assert counter.increase_shards(40) == 40
    [config] = gateway.lookup([Key.of("IK_CounterShardConfig", "Counter Test_1")])
    assert config is not None and config.properties["num_shards"] == 40
    assert "`IK_CounterShardConfig`" in section("2.")


def test_the_kind_prefix_both_ways(gateway):
    """'The kind prefix': a subclass's store, or the class constant set at start-up."""

    class DevShard(CounterShardEntity):
        KIND_PFX = "dev_"

    counter = CounterShardDS("Counter Test", 1, store=Store(DevShard, gateway))
    counter.increase_shards(21)
    assert gateway.lookup([Key.of("dev_IK_CounterShardConfig", "Counter Test_1")])[0] is not None
    saved = CounterShardEntity.KIND_PFX
    try:
        CounterShardEntity.KIND_PFX = "dev_"
        CounterShardDS("Other", 1, gateway=gateway).add(1)
    finally:
        CounterShardEntity.KIND_PFX = saved
    from gds_counter.gateway.query import Query

    assert len(gateway.run_query(Query("dev_IK_CounterShardEntity")).entities) == 1


def test_value_quirks_of_section_3(gateway):
    """'' for an integer or datetime reads as None; '42' where the schema says
    integer reads as 42; a non-number there is CorruptDataError; a naive
    datetime is refused on write; a shard count that is not a number is
    CorruptDataError."""
    schema = Schema("Legacy").add_integer("n").add_datetime("when").add_string("s")
    gateway.commit([Upsert(RawEntity(Key.of("Legacy", "a"), {"n": "", "when": "", "s": ""})),
                    Upsert(RawEntity(Key.of("Legacy", "b"), {"n": "42"})),
                    Upsert(RawEntity(Key.of("Legacy", "c"), {"n": "many"}))])
    store = Store(schema, gateway)
    a = store.fetch_by_name("a")
    assert a is not None and (a.n, a.when, a.s) == (None, None, "")
    b = store.fetch_by_name("b")
    assert b is not None and b.n == 42
    with pytest.raises(CorruptDataError):
        store.fetch_by_name("c")
    with pytest.raises(BadValueError):
        store.upsert(store.create_entity({"when": dt.datetime(2024, 1, 1)}))
    shard = RawEntity(PHP_ARTICLE.shard_key("bad_1", 1), {"target": "bad_1", "count": "x"}, frozenset({"count"}))
    gateway.commit([Upsert(shard)])
    with pytest.raises(CorruptDataError, match="bad_1"):
        CounterShardDS("bad", 1, gateway=gateway).get_count()


def test_list_describes_what_the_command_prints():
    """Section 4 step 1 names the columns gds-counter list prints."""
    import io

    from gds_counter.cli import main

    out = io.StringIO()
    assert main(["--url", "memory://", "list"], out=out, err=io.StringIO()) == 0
    assert out.getvalue().split() == ["count", "shards", "written", "target"]
    step = section("4.")
    assert "the shards it is configured for" in step and "the\n   shard entities written" in step


def test_schema_statements_of_section_1():
    """'add_blob defaults to unindexed'; 'An empty kind is refused'."""
    assert not Schema("K").add_blob("b").is_indexed("b")
    with pytest.raises(BadValueError):
        Schema("")


def test_entity_and_store_statements_of_section_1(gateway):
    """The notes column's claims about behaviour, each as the table states it."""
    book = Entity()
    with pytest.raises(BadValueError):
        book.kind = "x"  # a field named like a method: only book["kind"] = ... sets it
    book["kind"] = "x"
    assert book["kind"] == "x"
    book.title = None
    assert "title" in book and book.missing is None  # `in` is true for None; unset reads as None
    book.set_key_name("n")
    book.set_key_id("5")
    assert book.get_key_id() == 5 and book.get_key_name() is None  # an id clears the name
    book.set_schema(Schema("Book"))
    assert book.get_kind() is None  # set_schema does not set the kind
    assert not hasattr(Store, "set_entity_class") and not hasattr(Schema, "create_entity")
    shard = CounterShardEntity({"target": "t", "shardNum": 3})
    assert (shard.get_key_name(), shard.count) == ("t_3", 0)
    with pytest.raises(BadValueError):
        CounterShardEntity({"target": "t", "shardnum": 3})
    assert CounterShardEntity().get_key_name() is None
    store = Store("Book", gateway)
    with pytest.raises(gds_counter.GDSError):
        store.query("SELECT * FROM Book LIMIT 3").fetch_page(2)
    assert store.begin_transaction(True) is store  # cross_group accepted positionally
    assert CounterShardDS("Counter Test", 1, gateway=gateway).target == "Counter Test_1"
    assert CounterShardDS.NUM_SHARDS == 20 and CounterShardEntity.KIND_PFX == ""
