"""The PHP call shapes ported code keeps: ``CounterShardEntity``'s array
constructor, php-gds's ``beginTransaction($bol_cross_group)`` flag, and
``PropertyType`` at the package's top level."""

from __future__ import annotations

import inspect

import pytest

import gds_counter
from gds_counter import BadValueError, CounterShardDS, CounterShardEntity, Store
from gds_counter.gds.schema import PropertyType

KIND = "IK_CounterShardEntity"


def test_the_php_array_form_builds_the_same_shard_as_the_python_form():
    php = CounterShardEntity({"target": "Counter Test_1", "shardNum": 7, "count": 0})
    python = CounterShardEntity("Counter Test_1", 7, 0)
    for shard in (php, python):
        assert shard.get_kind() == KIND
        assert shard.get_key_name() == "Counter Test_1_7"
        assert shard.get_data() == {"target": "Counter Test_1", "count": 0}
    assert php == python
    assert CounterShardEntity({"target": "t", "shardNum": 2}).count == 0  # count left out: 0


@pytest.mark.parametrize("empty", [(), (None,), ({},)])
def test_no_params_builds_an_empty_entity_as_php_does_with_null(empty):
    shard = CounterShardEntity(*empty)
    assert shard.get_kind() == KIND
    assert shard.get_key_name() is None and shard.get_key_id() is None
    assert shard.get_data() == {}


@pytest.mark.parametrize(
    "args, named",
    [
        (({"target": "t", "shardnum": 1, "count": 0},), "shardnum"),  # misspelt key
        (({"target": "t", "count": 0},), "shardNum"),
        (({"shardNum": 1},), "target"),
        (({"target": "t", "shardNum": 1}, 3), "shard_num=3"),  # both forms at once
        (({"target": "t", "shardNum": "1"},), "'1'"),
        (({"target": "t", "shardNum": 1, "count": 1.5},), "1.5"),
        (("t",), "shard number"),
        ((None, 4), "shard_num=4"),
        ((7, 1), "7"),
    ],
)
def test_bad_forms_are_refused_naming_the_value(args, named):
    with pytest.raises(BadValueError, match=named.replace(".", r"\.").replace("(", r"\(")):
        CounterShardEntity(*args)


def test_the_array_form_honours_kind_pfx(memory_gateway):
    class DevShard(CounterShardEntity):
        KIND_PFX = "dev_"

    shard = DevShard({"target": "Counter Test_1", "shardNum": 3, "count": 5})
    assert shard.get_kind() == "dev_IK_CounterShardEntity"
    store = Store(DevShard, memory_gateway)
    store.upsert(shard)
    # the counter on that store (the documented KIND_PFX wiring) sees it
    assert CounterShardDS("Counter Test", 1, store=store).get_count() == 5
    assert CounterShardDS("Counter Test", 1, gateway=memory_gateway).get_count() == 0


def test_a_store_reads_shards_back_as_the_entity_class(memory_gateway):
    store = Store(CounterShardEntity, memory_gateway)
    store.upsert(CounterShardEntity({"target": "a_1", "shardNum": 1, "count": 4}))
    shard = store.fetch_by_name("a_1_1")
    assert isinstance(shard, CounterShardEntity)
    assert (shard.target, shard.count) == ("a_1", 4)
    assert isinstance(store.create_entity(), CounterShardEntity)


# --- begin_transaction(cross_group) ---------------------------------------------------


def test_begin_transaction_takes_phps_cross_group_flag_positionally(memory_gateway):
    store = Store(CounterShardEntity, memory_gateway)
    store.begin_transaction(True)  # php-gds: beginTransaction(TRUE)
    shard = store.fetch_by_name("a_1_1") or CounterShardEntity("a_1", 1)
    shard.count += 1
    store.upsert(shard)  # commits and uses the transaction up
    store.begin_transaction(False)
    store.upsert(CounterShardEntity("a_1", 2, 3))
    assert CounterShardDS("a", 1, gateway=memory_gateway).get_count() == 4


def test_read_only_is_keyword_only_and_cross_group_must_be_a_bool(memory_gateway):
    store = Store(CounterShardEntity, memory_gateway)
    for method in (Store.begin_transaction, Store.transaction):
        parameter = inspect.signature(method).parameters["read_only"]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY
    with pytest.raises(TypeError):
        store.transaction(True)  # type: ignore[misc]
    with pytest.raises(BadValueError, match="'yes'"):
        store.begin_transaction("yes")  # type: ignore[arg-type]
    with store.transaction(read_only=True):
        assert store.fetch_by_name("a_1_1") is None


def test_property_type_is_exported_at_the_top_level():
    assert gds_counter.PropertyType is PropertyType
    assert "PropertyType" in gds_counter.__all__
    schema = gds_counter.Schema("Book").add_property("pages", gds_counter.PropertyType.INTEGER, False)
    assert not schema.is_indexed("pages")


# --- the migration guide names every public PHP name -----------------------------------

#: Every public method of php-gds 6.1's Store, Entity and Schema (read from
#: src/GDS/*.php), Store's protected buildSchema (the subclassing pattern),
#: Schema's type constants, and every name of the article's two classes.
PHP_NAMES = {
    "Store": ["new Store(", "buildSchema()", "upsert(", "delete(", "fetchById(", "fetchByIds(", "fetchByName(",
              "fetchByNames(", "query(", "fetchOne(", "fetchAll(", "fetchPage(", "fetchEntityGroup(", "getCursor()",
              "setCursor(", "createEntity(", "setEntityClass(", "beginTransaction("],
    "Entity": ["new Entity()", "__set", "__get", "__isset", "getData()", "getKind()", "setKind(", "getKeyId()",
               "setKeyId(", "getKeyName()", "setKeyName(", "setAncestry(", "getAncestry()", "getSchema()",
               "setSchema("],
    "Schema": ["new Schema(", "addProperty(", "addString(", "addInteger(", "addDatetime(", "addFloat(",
               "addBoolean(", "addGeopoint(", "addStringList(", "getKind()", "getProperties()", "setEntityClass(",
               "createEntity()", "PROPERTY_STRING", "PROPERTY_INTEGER", "PROPERTY_DATETIME", "PROPERTY_DOUBLE",
               "PROPERTY_FLOAT", "PROPERTY_BLOB", "PROPERTY_GEOPOINT", "PROPERTY_BOOLEAN", "PROPERTY_STRING_LIST",
               "PROPERTY_INTEGER_LIST", "PROPERTY_ENTITY", "PROPERTY_KEY", "PROPERTY_DETECT"],
    "CounterShardEntity": ["KIND_PFX", "new CounterShardEntity(", "CounterShardEntity::kind()",
                           "CounterShardEntity::schema()"],
    "CounterShardDS": ["NUM_SHARDS", "new CounterShardDS(", "$target", "$data", "getCount()", "increment()"],
}


def test_the_migration_guide_has_a_row_for_every_php_name():
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "docs" / "migrating-from-php.md").read_text()
    rows = [line for line in guide.splitlines() if line.startswith("| ")]
    missing = [f"{cls}: {name}" for cls, names in PHP_NAMES.items() for name in names
               if not any(name in row.split(" | ")[0] for row in rows)]
    assert missing == []
