"""The Store's contract, checked identically on every gateway.

Each test is a sentence of the specification; the `gateway` fixture runs it
on embedded SQLite (memory and file) and on both official emulators.
"""

from __future__ import annotations

import datetime as dt
import uuid

import pytest

from gds_counter import (
    AlreadyExists,
    BadKeyError,
    BadValueError,
    Contention,
    Entity,
    Geopoint,
    GQLError,
    Key,
    NotFound,
    Schema,
    SchemaError,
    Store,
    TransformsIgnored,
)
from gds_counter.gateway.mutations import Upsert
from gds_counter.gateway.values import RawEntity

UTC = dt.timezone.utc


def book_schema() -> Schema:
    return (
        Schema("Book")
        .add_string("title")
        .add_string("isbn")
        .add_integer("pages")
        .add_datetime("published")
        .add_float("price")
        .add_boolean("in_print")
        .add_string_list("tags")
        .add_geopoint("shop")
        .add_key("author")
        .add_blob("cover")
        .add_entity("publisher")
        .add_list("mixed")
        .add_string("summary", index=False)
    )


@pytest.fixture
def books(gateway) -> Store:
    return Store(book_schema(), gateway)


def make_book(store: Store, name: str, **fields) -> Entity:
    book = store.create_entity(fields)
    book.set_key_name(name)
    return book


# --- every value type round-trips exactly ----------------------------------


def test_every_schema_type_round_trips_with_exact_values(books):
    published = dt.datetime(2014, 3, 1, 9, 30, 20, 123456, tzinfo=UTC)
    author = Key.of("Author", "dickens", namespace=books.namespace)
    book = make_book(
        books,
        "oliver",
        title="Oliver Twist",
        isbn="1853260304",
        pages=624,
        published=published,
        price=4.99,
        in_print=True,
        tags=["classic", "london"],
        shop=Geopoint(51.5072, -0.1276),
        author=author,
        cover=b"\x00\xffPNG",
        publisher=Entity(name="Penguin", founded=1935),
        mixed=[1, "two", 3.0, None],
        summary="x" * 3000,
    )
    books.upsert(book)

    got = books.fetch_by_name("oliver")
    assert got.title == "Oliver Twist"
    assert got.pages == 624 and type(got.pages) is int
    assert got.published == published and got.published.tzinfo is not None
    assert got.published.utcoffset() == dt.timedelta(0)
    assert got.price == 4.99
    assert got.in_print is True
    assert got.tags == ["classic", "london"]
    assert got.shop == Geopoint(51.5072, -0.1276)
    assert got.author == author
    assert got.cover == b"\x00\xffPNG"
    assert isinstance(got.publisher, Entity)
    assert got.publisher.get_data() == {"name": "Penguin", "founded": 1935}
    assert got.mixed == [1, "two", 3.0, None]
    assert got.summary == "x" * 3000


def test_a_datetime_in_another_zone_is_stored_as_the_same_instant_in_utc(books):
    paris = dt.timezone(dt.timedelta(hours=2))
    books.upsert(make_book(books, "b", published=dt.datetime(2020, 6, 1, 12, 0, 0, 7, tzinfo=paris)))
    got = books.fetch_by_name("b").published
    assert got == dt.datetime(2020, 6, 1, 10, 0, 0, 7, tzinfo=UTC)
    assert got.utcoffset() == dt.timedelta(0)


def test_none_is_stored_as_null_and_unset_fields_read_as_none(books, gateway):
    books.upsert(make_book(books, "n", title=None))
    raw = gateway.lookup([Key.of("Book", "n", namespace=books.namespace)])[0]
    assert "title" in raw.properties and raw.properties["title"] is None
    got = books.fetch_by_name("n")
    assert got.title is None
    assert got.never_set is None


def test_index_flags_follow_the_schema_and_fields_without_schema_are_indexed(books, gateway):
    books.upsert(make_book(books, "f", tags=["a", "b"], summary="long", pages=1, extra="detected"))
    raw = gateway.lookup([Key.of("Book", "f", namespace=books.namespace)])[0]
    assert raw.unindexed == {"summary"}
    # Unindexed properties are invisible to filters, indexed ones (each list element) are not.
    assert books.fetch_all("SELECT * FROM Book WHERE summary = 'long'") == []
    assert [b.get_key_name() for b in books.fetch_all("SELECT * FROM Book WHERE tags = 'b'")] == ["f"]
    assert [b.get_key_name() for b in books.fetch_all("SELECT * FROM Book WHERE extra = 'detected'")] == ["f"]


def test_schemaless_store_detects_types(gateway):
    store = Store("Note", gateway)
    note = store.create_entity({"n": 5, "f": 1.5, "s": "x", "b": False, "when": dt.datetime(2021, 1, 1, tzinfo=UTC)})
    store.upsert(note)
    got = store.fetch_by_id(note.get_key_id())
    assert got.get_data() == {"n": 5, "f": 1.5, "s": "x", "b": False, "when": dt.datetime(2021, 1, 1, tzinfo=UTC)}
    assert type(got.n) is int and type(got.f) is float and type(got.b) is bool


# --- keys, ids and lookups ---------------------------------------------------


def test_upsert_writes_allocated_ids_back_and_fetch_by_id_finds_them(books):
    first, second = books.create_entity({"title": "A"}), books.create_entity({"title": "B"})
    books.upsert([first, second])
    assert isinstance(first.get_key_id(), int) and isinstance(second.get_key_id(), int)
    assert first.get_key_id() != second.get_key_id()
    assert books.fetch_by_id(first.get_key_id()).title == "A"
    assert books.fetch_by_id(str(second.get_key_id())).title == "B"  # php-gds passes ids as strings


def test_insert_refuses_an_existing_entity_and_update_a_missing_one(books):
    book = books.create_entity({"title": "A"})
    books.insert(book)  # a new id, written back
    assert isinstance(book.get_key_id(), int)
    with pytest.raises(AlreadyExists):
        books.insert(book)
    book.title = "B"
    books.update(book)
    missing = books.create_entity({"title": "C"})
    missing.set_key_name("nowhere")
    with pytest.raises(NotFound):
        books.update(missing)
    with pytest.raises(BadKeyError):
        books.update(books.create_entity({"title": "D"}))  # no key: nothing to update
    assert books.fetch_by_id(book.get_key_id()).title == "B" and books.fetch_by_name("nowhere") is None


def test_a_batch_insert_that_stops_at_an_existing_entity_gave_ids_to_the_ones_it_wrote(books):
    """Without a transaction the entities before the existing one are
    written; they carry their ids, so inserting the batch again refuses
    them instead of storing them twice (a fresh-eyes finding)."""
    existing = books.create_entity({"title": "there"})
    existing.set_key_name("there")
    books.upsert(existing)
    first, second = books.create_entity({"title": "1"}), books.create_entity({"title": "2"})
    again = books.create_entity({"title": "x"})
    again.set_key_name("there")
    with pytest.raises(AlreadyExists, match="before it"):
        books.insert([first, second, again])
    assert isinstance(first.get_key_id(), int) and books.fetch_by_id(first.get_key_id()).title == "1"
    with pytest.raises(AlreadyExists):
        books.insert([first, second])
    assert sorted(b.title for b in books.fetch_all()) == ["1", "2", "there"]


def test_batch_lookups_keep_input_order_with_none_for_missing(books):
    books.upsert([make_book(books, name, title=name.upper()) for name in ("a", "b", "c")])
    got = books.fetch_by_names(["c", "missing", "a"])
    assert [g.title if g else None for g in got] == ["C", None, "A"]
    ids = [books.create_entity({"title": t}) for t in ("x", "y")]
    books.upsert(ids)
    got = books.fetch_by_ids([ids[1].get_key_id(), 999_999_999, ids[0].get_key_id()])
    assert [g.title if g else None for g in got] == ["y", None, "x"]


def test_one_lookup_rpc_for_a_batch(books, gateway):
    books.upsert([make_book(books, str(i)) for i in range(30)])
    before = gateway.stats.snapshot()
    books.fetch_by_names([str(i) for i in range(30)])
    after = gateway.stats.snapshot()
    assert after["rpc.lookup"] - before.get("rpc.lookup", 0) == 1
    assert after["entity_reads"] - before["entity_reads"] == 30


def test_delete_by_entity_and_by_key(books):
    a, b = make_book(books, "a"), make_book(books, "b")
    books.upsert([a, b])
    books.delete(a)
    books.delete(Key.of("Book", "b", namespace=books.namespace))
    assert books.fetch_by_names(["a", "b"]) == [None, None]


def test_fetched_entities_carry_kind_key_and_namespace(books):
    books.upsert(make_book(books, "k"))
    got = books.fetch_by_name("k")
    assert got.get_kind() == "Book"
    assert got.get_key_name() == "k" and got.get_key_id() is None
    assert got.get_namespace() == books.namespace


def test_entity_class_from_schema_is_used_for_fetched_entities(gateway):
    class Book(Entity):
        def shout(self) -> str:
            return self.title.upper()

    store = Store(Schema("Book").add_string("title").set_entity_class(Book), gateway)
    store.upsert(store.create_entity({"title": "quiet"}))
    got = store.fetch_one()
    assert isinstance(got, Book) and got.shout() == "QUIET"


# --- namespaces and ancestors ----------------------------------------------------


def test_namespaces_are_isolated(gateway, books):
    other = Store(book_schema(), gateway, namespace=books.namespace + "-other")
    books.upsert(make_book(books, "same", title="here"))
    other.upsert(make_book(other, "same", title="there"))
    assert books.fetch_by_name("same").title == "here"
    assert other.fetch_by_name("same").title == "there"
    assert [b.title for b in other.fetch_all()] == ["there"]


def test_negative_ids_are_stored_and_sort_below_positive_ones(gateway, books):
    """The Firestore emulator stores negative ids (the API reference only
    discourages them) and refuses 0; keys sort by id numerically."""
    for key_id in (7, -3, 1, -(2**63), 2**63 - 1, -1):
        book = books.create_entity({"title": f"id {key_id}"})
        book.set_key_id(key_id)
        books.upsert(book)
    assert books.fetch_by_id(-3).title == "id -3"
    assert [b.get_key_id() for b in books.fetch_all()] == [-(2**63), -3, -1, 1, 7, 2**63 - 1]
    with pytest.raises(BadKeyError, match="other than 0"):
        Entity().set_key_id(0)


@pytest.mark.parametrize("namespace, refused", [
    ("a/b", "not allowed"), ("été", "not allowed"), (" a", "not allowed"), ("x" * 101, "not allowed"),
    ("__x__", "reserved"), ("__kind__", "reserved"),
])
def test_namespaces_datastore_refuses_are_refused_before_anything_is_sent(gateway, namespace, refused):
    with pytest.raises(BadKeyError, match=refused):
        Store("Book", gateway, namespace=namespace)


@pytest.mark.parametrize("namespace", ["a.b", "a-b_c", "A9", "_x", "x__", "__", "-", "x" * 100])
def test_every_namespace_datastore_takes_is_taken(gateway, namespace):
    store = Store("Book", gateway, namespace=namespace)
    name = uuid.uuid4().hex  # (an emulator's namespaces outlive a test)
    store.upsert(make_book(store, name, title=namespace))
    got = store.fetch_by_name(name)
    assert got.title == namespace and got.get_key().namespace == namespace


def test_children_are_found_by_parent_and_by_entity_group(gateway, books):
    author_store = Store("Author", gateway)
    dickens = author_store.create_entity({"name": "Dickens"})
    dickens.set_key_name("dickens")
    author_store.upsert(dickens)
    child = make_book(books, "oliver", title="Oliver Twist")
    child.set_ancestry(dickens)
    orphan = make_book(books, "orphan", title="Other")
    books.upsert([child, orphan])

    assert books.fetch_by_name("oliver") is None  # a different key without the parent
    got = books.fetch_by_name("oliver", parent=dickens)
    assert got.title == "Oliver Twist"
    assert got.get_ancestry() == dickens.get_key()
    assert [b.title for b in books.fetch_entity_group(dickens)] == ["Oliver Twist"]
    php_style = [{"kind": "Author", "name": "dickens"}]
    assert books.fetch_by_name("oliver", parent=Entity().set_ancestry(php_style).get_ancestry()).title == "Oliver Twist"


# --- queries, cursors and GQL ------------------------------------------------------


@pytest.fixture
def shelf(books):
    books.upsert([make_book(books, f"b{i:02}", title=f"T{i}", pages=i * 10, tags=["even" if i % 2 == 0 else "odd"]) for i in range(12)])
    return books


def names(entities) -> list[str]:
    return [e.get_key_name() for e in entities]


def test_default_query_is_all_of_the_kind_ordered_by_key(shelf):
    assert names(shelf.fetch_all()) == [f"b{i:02}" for i in range(12)]
    assert shelf.fetch_one().get_key_name() == "b00"


def test_gql_with_named_and_positional_bindings(shelf):
    got = shelf.fetch_all("SELECT * FROM Book WHERE pages >= @min AND tags = @tag ORDER BY pages DESC", {"min": 60, "tag": "even"})
    assert names(got) == ["b10", "b08", "b06"]
    got = shelf.fetch_one("SELECT * FROM Book WHERE title = @1", ["T3"])
    assert got.get_key_name() == "b03"


def test_query_then_fetch_one_adds_limit_one(shelf):
    shelf.query("SELECT * FROM Book WHERE tags = @t ORDER BY pages DESC", {"t": "odd"})
    assert shelf.fetch_one().get_key_name() == "b11"


def test_fetch_page_follows_the_cursor_page_by_page(shelf):
    shelf.query("SELECT * FROM Book ORDER BY pages ASC")
    pages = [names(shelf.fetch_page(5)) for _ in range(3)]
    assert pages == [[f"b{i:02}" for i in range(5)], [f"b{i:02}" for i in range(5, 10)], ["b10", "b11"]]
    assert shelf.fetch_page(5) == []


def test_a_cursor_resumes_in_another_store(shelf, gateway):
    shelf.query("SELECT * FROM Book ORDER BY pages DESC")
    shelf.fetch_page(4)
    cursor = shelf.cursor
    assert isinstance(cursor, str)
    fresh = Store(book_schema(), gateway, namespace=shelf.namespace)
    fresh.query("SELECT * FROM Book ORDER BY pages DESC").set_cursor(cursor)
    assert names(fresh.fetch_page(3)) == ["b07", "b06", "b05"]


def test_fetch_page_with_an_integer_offset(shelf):
    assert names(shelf.fetch_page(2, 3)) == ["b03", "b04"]


def test_a_user_limit_with_fetch_page_is_an_error_not_an_empty_page(shelf):
    shelf.query("SELECT * FROM Book LIMIT 3")
    with pytest.raises(GQLError, match="LIMIT 3"):
        shelf.fetch_page(5)


def test_fetch_all_follows_every_batch(gateway):
    store = Store("Many", gateway)
    store.upsert([store.create_entity({"i": i}) for i in range(450)])
    got = store.fetch_all("SELECT * FROM Many ORDER BY i")
    assert [e.i for e in got] == list(range(450))


def test_keys_only_and_projection_queries(shelf):
    keys = shelf.fetch_all("SELECT __key__ FROM Book WHERE pages < 30")
    assert names(keys) == ["b00", "b01", "b02"]
    assert all(k.get_data() == {} for k in keys)
    projected = shelf.fetch_all("SELECT title FROM Book WHERE pages = 50")
    assert [p.get_data() for p in projected] == [{"title": "T5"}]


def test_bad_gql_says_where(books):
    with pytest.raises(GQLError, match="column 10"):
        books.fetch_all("SELECT * FORM Book")


# --- transactions and contention ---------------------------------------------------------


def test_begin_transaction_is_used_up_by_the_next_write(books, gateway):
    books.upsert(make_book(books, "t", pages=1))
    books.begin_transaction()
    book = books.fetch_by_name("t")
    book.pages += 1
    before = gateway.stats.snapshot()
    books.upsert(book)  # commits the transaction
    assert gateway.stats["rpc.commit"] - before.get("rpc.commit", 0) == 1
    books.upsert(make_book(books, "u"))  # no transaction left: a plain write
    assert books.fetch_by_name("t").pages == 2


def test_transaction_block_commits_on_exit(books):
    with books.transaction():
        books.upsert(make_book(books, "a", pages=1))
        fresh = books.create_entity({"title": "new"})
        books.upsert(fresh)
        assert fresh.get_key_id() is not None  # allocated at once, written on exit
    assert books.fetch_by_name("a").pages == 1
    assert books.fetch_by_id(fresh.get_key_id()).title == "new"


def test_transaction_block_rolls_back_on_error(books):
    with pytest.raises(RuntimeError):
        with books.transaction():
            books.upsert(make_book(books, "ghost"))
            raise RuntimeError("boom")
    assert books.fetch_by_name("ghost") is None


def test_run_in_transaction_returns_the_work_result(books):
    books.upsert(make_book(books, "c", pages=0))

    def bump(store: Store) -> int:
        book = store.fetch_by_name("c")
        book.pages += 5
        store.upsert(book)
        return book.pages

    assert books.run_in_transaction(bump) == 5
    assert books.fetch_by_name("c").pages == 5


# --- bad input fails before anything is written -------------------------------------------


@pytest.mark.parametrize(
    "name, message",
    [
        ("", "must not be empty"),
        ("__x__", "reserved"),
        ("k" * 1501, "1501 bytes"),
    ],
    ids=["empty", "reserved", "over-1500-bytes"],
)
def test_bad_key_names_are_rejected_with_the_name(books, gateway, name, message):
    before = gateway.stats.snapshot()
    with pytest.raises(BadKeyError, match=message):
        make_book(books, name)
    with pytest.raises(BadKeyError, match=message):
        books.fetch_by_name(name)
    assert gateway.stats.snapshot()["rpcs"] == before["rpcs"]


def test_a_1500_byte_key_name_is_fine(books):
    books.upsert(make_book(books, "é" * 750))
    assert books.fetch_by_name("é" * 750) is not None


def test_an_over_long_indexed_string_is_rejected_before_any_write(books, gateway):
    good = make_book(books, "good", title="fine")
    bad = make_book(books, "bad", title="x" * 1501)
    with pytest.raises(BadValueError, match="'title'.*1501 bytes"):
        books.upsert([good, bad])
    assert books.fetch_by_names(["good", "bad"]) == [None, None]


def test_an_entity_of_another_kind_is_rejected_by_a_typed_store(books):
    author = Entity(name="Dickens").set_kind("Author")
    with pytest.raises(SchemaError, match="'Author'.*'Book'"):
        books.upsert(author)


def test_a_wrong_type_for_a_schema_property_names_it(books):
    with pytest.raises(SchemaError, match=r"Book\.pages is declared integer; got str '12'"):
        books.upsert(make_book(books, "w", pages="12"))
    assert books.fetch_by_name("w") is None


# --- legacy php-gds data ----------------------------------------------------------------


def test_legacy_php_values_are_read_where_the_schema_says(books, gateway):
    key = Key.of("Book", "legacy", namespace=books.namespace)
    gateway.commit([Upsert(RawEntity(key, {"pages": "42", "published": "", "title": ""}))])
    got = books.fetch_by_name("legacy")
    assert got.pages == 42  # integer written as a string by PHP
    assert got.published is None  # "" meant null before php-gds 6.0
    assert got.title == ""  # a string property keeps its empty string


def test_two_transactions_that_read_the_same_entity_cannot_both_commit(books, gateway, backend):
    books.upsert(make_book(books, "hot", pages=0))
    first = Store(book_schema(), gateway, namespace=books.namespace)
    second = Store(book_schema(), gateway, namespace=books.namespace)
    first.begin_transaction()
    second.begin_transaction()
    mine, theirs = first.fetch_by_name("hot"), second.fetch_by_name("hot")
    mine.pages, theirs.pages = 1, 2
    if backend == "firestore":
        # Pessimistic locks: the first commit waits for the second reader's
        # lock, times out (about 2 s) and aborts; then the second commit wins.
        with pytest.raises(Contention) as lost:
            first.upsert(mine)
        second.upsert(theirs)
        winner = 2
    else:
        # Optimistic (SQLite, Datastore emulator): the first commit wins, the
        # second sees that what it read has changed.
        first.upsert(mine)
        with pytest.raises(Contention) as lost:
            second.upsert(theirs)
        winner = 1
    assert lost.value.attempts == 1
    assert books.fetch_by_name("hot").pages == winner  # the loser wrote nothing


def test_projected_datetimes_read_back_as_datetimes(books):
    when = dt.datetime(2019, 5, 4, 3, 2, 1, 987654, tzinfo=UTC)
    books.upsert(make_book(books, "p", published=when, title="T"))
    got = books.fetch_one("SELECT published FROM Book WHERE title = 'T'")
    assert got.published == when


# --- server-side increment ------------------------------------------------------------


def test_server_side_increment_keeps_other_properties_or_refuses_untouched(books, backend):
    books.upsert(make_book(books, "liked", title="Kept", pages=10, isbn="x"))
    partial = make_book(books, "liked", isbn="x")  # carries only isbn; title is not sent
    if backend == "datastore":
        # The legacy Datastore emulator ignores transforms and property masks:
        # the Store refuses before sending, so the stored entity is untouched.
        with pytest.raises(TransformsIgnored):
            books.increment(partial, "pages", 5)
        expected_pages = 10
    else:
        assert books.increment(partial, "pages", 5) == 15
        assert books.increment(make_book(books, "new-one"), "pages", 3) == 3  # missing counts as 0
        expected_pages = 15
    got = books.fetch_by_name("liked")
    assert (got.title, got.pages, got.isbn) == ("Kept", expected_pages, "x")


# --- php-gds Store semantics (src/GDS/Store.php) -------------------------------------------


def test_fetch_all_and_fetch_one_leave_the_paging_cursor_alone(shelf):
    """php-gds: only fetchPage (and fetchEntityGroup) set the last cursor."""
    shelf.query("SELECT * FROM Book ORDER BY pages")
    assert len(shelf.fetch_all()) == 12
    assert shelf.fetch_one().get_key_name() == "b00"
    assert names(shelf.fetch_page(5)) == ["b00", "b01", "b02", "b03", "b04"]
    assert names(shelf.fetch_page(5)) == ["b05", "b06", "b07", "b08", "b09"]


def test_fetch_entity_group_keeps_the_remembered_query(books, gateway):
    parent = make_book(books, "shelf-1", title="parent", pages=1)
    books.upsert(parent)
    child = books.create_entity({"title": "child", "pages": 2}).set_ancestry(parent)
    child.set_key_name("c1")
    books.upsert(child)
    books.upsert(make_book(books, "other", title="other", pages=3))
    books.query("SELECT * FROM Book WHERE pages >= @p ORDER BY pages", {"p": 3})
    assert sorted(names(books.fetch_entity_group(parent))) == ["c1", "shelf-1"]
    assert names(books.fetch_all()) == ["other"]  # the query of before, not the group's


def test_begin_transaction_again_replaces_the_pending_one(books, gateway):
    books.upsert(make_book(books, "t", title="t", pages=1))
    books.begin_transaction()
    books.fetch_by_name("t")
    books.begin_transaction()  # php-gds replaces it; the old one is rolled back
    book = books.fetch_by_name("t")
    book.pages = 2
    books.upsert(book)  # commits the new transaction
    assert books.fetch_by_name("t").pages == 2
    assert gateway.stats["rpc.rollback"] == 1  # the replaced one, so a locking server frees its locks
