"""Entity, Schema, Key and Geopoint on their own: no storage involved."""

from __future__ import annotations

import datetime as dt

import attrs
import pytest

from gds_counter import BadKeyError, BadValueError, CorruptDataError, Entity, Geopoint, Key, Schema, SchemaError
from gds_counter.gds.schema import PropertyType


def test_entity_data_is_read_and_written_as_attributes():
    book = Entity()
    book.title = "Oliver Twist"
    assert book.title == "Oliver Twist"
    assert book.get_data() == {"title": "Oliver Twist"}


def test_unset_fields_read_as_none():
    assert Entity().anything is None


def test_fields_that_clash_with_methods_are_reachable_by_index():
    entity = Entity({"kind": "a field", "get_data": 1})
    assert entity["kind"] == "a field"
    assert entity.get_data() == {"kind": "a field", "get_data": 1}


@pytest.mark.parametrize("name", ["kind", "schema", "get_data", "set_kind", "get_key"])
def test_a_field_named_like_a_method_is_refused_as_an_attribute_not_dropped(name):
    entity = Entity()
    with pytest.raises(BadValueError, match=rf"entity\[{name!r}\] = 'novel'"):
        setattr(entity, name, "novel")
    assert entity.get_data() == {}
    assert callable(getattr(entity, name))  # the method is still there
    entity[name] = "novel"
    assert entity.get_data() == {name: "novel"}


def test_a_subclass_property_with_a_setter_is_still_an_attribute():
    class Book(Entity):
        @property
        def title_upper(self):
            return (self.title or "").upper()

        @title_upper.setter
        def title_upper(self, value):
            self.title = value.lower()

    book = Book()
    book.title_upper = "OLIVER"
    assert book.get_data() == {"title": "oliver"}


def test_get_data_is_a_copy():
    entity = Entity(a=1)
    entity.get_data()["a"] = 2
    assert entity.a == 1


def test_key_accessors_follow_php_gds():
    entity = Entity().set_kind("Book").set_key_name("oliver")
    assert (entity.get_kind(), entity.get_key_name(), entity.get_key_id()) == ("Book", "oliver", None)
    entity.set_key_id("42")  # php-gds ids arrive as strings
    assert (entity.get_key_id(), entity.get_key_name()) == (42, None)
    assert entity.get_key() == Key.of("Book", 42)


def test_ancestry_accepts_an_entity_a_key_or_php_gds_arrays():
    parent = Entity().set_kind("Author").set_key_name("dickens")
    by_entity = Entity().set_kind("Book").set_ancestry(parent)
    by_key = Entity().set_kind("Book").set_ancestry(Key.of("Author", "dickens"))
    by_array = Entity().set_kind("Book").set_ancestry([{"kind": "Author", "name": "dickens"}])
    assert by_entity.get_ancestry() == by_key.get_ancestry() == by_array.get_ancestry() == Key.of("Author", "dickens")
    assert by_entity.set_key_name("oliver").get_key() == Key.of("Author", "dickens", "Book", "oliver")


def test_an_unsaved_parent_is_refused():
    with pytest.raises(BadKeyError, match="no complete key"):
        Entity().set_ancestry(Entity().set_kind("Author"))


def test_subclasses_declare_kind_and_schema():
    class Book(Entity):
        @classmethod
        def kind(cls) -> str:
            return "Book"

        @classmethod
        def schema(cls) -> Schema:
            return Schema("Book").add_string("title")

    book = Book(title="x")
    assert book.get_kind() == "Book"
    assert book.get_schema().get_property("title").type is PropertyType.STRING


@pytest.mark.parametrize(
    "bad, message",
    [("", "must not be empty"), ("__x__", "reserved"), ("a" * 1501, "over the 1500-byte limit")],
)
def test_bad_key_names(bad, message):
    with pytest.raises(BadKeyError, match=message):
        Entity().set_key_name(bad)


def test_a_key_built_like_its_printed_form_says_how_to_build_it():
    """Keys print as ``Key('Item', 'k03')``; calling that raised
    AttributeError from deep inside (a fresh-eyes finding)."""
    with pytest.raises(BadKeyError, match=r"write Key.of\('Kind', 'name'\)"):
        Key("Item", "k03")


@pytest.mark.parametrize("bad", [0, 2**63, -(2**63) - 1, True, "abc"])
def test_bad_key_ids(bad):
    with pytest.raises(BadKeyError):
        Entity().set_key_id(bad)


def test_keys_are_immutable_hashable_values():
    key = Key.of("A", "x", "B", 3, namespace="ns")
    assert key == Key.of("A", "x", "B", 3, namespace="ns")
    assert {key: 1}[Key.of("A", "x", "B", 3, namespace="ns")] == 1
    assert (key.kind, key.id, key.parent) == ("B", 3, Key.of("A", "x", namespace="ns"))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        key.namespace = "other"  # type: ignore[misc]


def test_geopoints_are_immutable_hashable_and_checked():
    assert hash(Geopoint(1, 2)) == hash(Geopoint(1.0, 2.0))
    with pytest.raises(BadValueError, match="latitude 91"):
        Geopoint(91, 0)
    with pytest.raises(BadValueError, match="longitude -181"):
        Geopoint(0, -181)


def test_schema_is_chainable_and_records_index_flags():
    schema = (
        Schema("Everything")
        .add_string("s")
        .add_integer("i", index=False)
        .add_datetime("d")
        .add_float("f")
        .add_boolean("b")
        .add_string_list("sl")
        .add_geopoint("g")
        .add_key("k")
        .add_blob("bl")
        .add_entity("e")
        .add_list("l")
    )
    assert schema.get_kind() == "Everything"
    assert [p.type for p in schema.get_properties().values()] == list(PropertyType)
    assert not schema.is_indexed("i") and schema.is_indexed("s")
    assert schema.is_indexed("not in schema")  # detected fields are indexed, as php-gds


@pytest.mark.parametrize(
    "adder, value",
    [
        ("add_string", 5),
        ("add_integer", "5"),
        ("add_integer", True),
        ("add_float", "1.5"),
        ("add_boolean", 1),
        ("add_string_list", ["a", 2]),
        ("add_geopoint", (1, 2)),
        ("add_key", "Book:1"),
        ("add_blob", "text"),
        ("add_datetime", "2020-01-01"),
    ],
)
def test_schema_rejects_wrong_types_naming_property_and_value(adder, value):
    schema = getattr(Schema("K"), adder)("p")
    with pytest.raises(SchemaError, match=rf"K\.p is declared .*; got {type(value).__name__}"):
        schema.to_storage("p", value)


def test_schema_normalises_ints_to_float_and_datetimes_to_utc():
    schema = Schema("K").add_float("f").add_datetime("d")
    assert schema.to_storage("f", 3) == 3.0 and type(schema.to_storage("f", 3)) is float
    cet = dt.timezone(dt.timedelta(hours=1))
    assert schema.to_storage("d", dt.datetime(2020, 1, 1, 1, tzinfo=cet)) == dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc)
    with pytest.raises(SchemaError, match="naive datetime"):
        schema.to_storage("d", dt.datetime(2020, 1, 1))


def test_legacy_integer_strings_are_coerced_only_where_the_schema_says_integer():
    schema = Schema("K").add_integer("n").add_string("s")
    assert schema.from_storage("n", "17", "K('x')") == 17
    assert schema.from_storage("n", "", "K('x')") is None
    assert schema.from_storage("s", "17", "K('x')") == "17"
    with pytest.raises(CorruptDataError, match=r"K\('x'\)\.n should be an integer but holds the string 'abc'"):
        schema.from_storage("n", "abc", "K('x')")
