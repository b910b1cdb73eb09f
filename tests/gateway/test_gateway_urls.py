"""GDS URLs given to the API: what ``gateway=`` and ``open_gateway`` take.

``None`` means the default storage (``GDS_URL``, the emulator, the
embedded file); an empty string is not None, and was quietly taken as it
(``CounterShardDS(..., gateway="")`` counted in ./gds_counter.sqlite3,
where the command's ``--url ""`` is refused). A fragment (``#frag``), an
empty ``project=`` or ``database=`` were accepted or failed later for
another reason (a file named ``h.db#frag``; "no credentials"). Each is now
a ``BadValueError`` naming the URL, raised before anything is created.
"""

from __future__ import annotations

import asyncio

import pytest

from gds_counter import BadValueError, CounterShardDS, Schema, Store, aio, open_gateway

CHOOSERS = ("GDS_URL", "DATASTORE_EMULATOR_HOST", "DATASTORE_PROJECT_ID", "GOOGLE_CLOUD_PROJECT")


@pytest.fixture(autouse=True)
def _in_an_empty_directory(monkeypatch, tmp_path):
    for name in CHOOSERS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def test_an_empty_url_is_refused_not_taken_as_the_default(tmp_path):
    with pytest.raises(BadValueError, match="empty"):
        open_gateway("")
    with pytest.raises(BadValueError, match="empty"):
        CounterShardDS("a", 1, gateway="").increment()
    with pytest.raises(BadValueError, match="empty"):
        Store(Schema("K"), gateway="")
    with pytest.raises(BadValueError, match="empty"):
        aio.open_gateway("")
    assert list(tmp_path.iterdir()) == []  # no ./gds_counter.sqlite3


def test_an_empty_url_is_refused_by_the_async_face_too(tmp_path):
    async def increment() -> int:
        return await aio.CounterShardDS("a", 1, gateway="").increment()

    with pytest.raises(BadValueError, match="empty"):
        asyncio.run(increment())
    assert list(tmp_path.iterdir()) == []


def test_none_is_still_the_default(tmp_path):
    with open_gateway(None) as gateway:
        assert gateway.path == str(tmp_path / "gds_counter.sqlite3")
    assert (tmp_path / "gds_counter.sqlite3").exists()


@pytest.mark.parametrize(
    "url, why",
    [
        ("sqlite:///h.db#frag", "fragment"),
        ("sqlite:///h.db#", "fragment"),
        ("sqlite:///h.db?namespace=a#frag", "fragment"),
        ("memory://#frag", "fragment"),
        ("memory://?project=", "project is empty"),
        ("sqlite:///h.db?project=", "project is empty"),
        ("datastore://p?database=", "database is empty"),
        ("datastore://p?namespace=a&database=", "database is empty"),
        ("datastore://p#frag", "fragment"),
    ],
)
def test_a_url_with_a_fragment_or_an_empty_parameter_is_refused_naming_it(tmp_path, url, why):
    """Refused before any file is created or any credentials are looked up
    (``datastore://p?database=`` once failed with "no credentials")."""
    with pytest.raises(BadValueError, match=why) as raised:
        open_gateway(url)
    assert repr(url) in str(raised.value)
    assert list(tmp_path.iterdir()) == []


def test_the_forms_that_name_a_default_are_still_taken(tmp_path):
    """What the refusals must not catch: ``namespace=`` (the default
    namespace), no parameters at all, and a project named."""
    with open_gateway("memory://?namespace=") as gateway:
        assert gateway.namespace == ""
    with open_gateway("sqlite:///h.db?project=p-1") as gateway:
        assert gateway.projects.home == "p-1"
    assert (tmp_path / "h.db").exists()


@pytest.mark.parametrize("url", ["datastore://user:s3cret@p", "datastore://s3cret@p", "sqlite://u:s3cret@/x.db",
                                 "memory://u:s3cret@"])
def test_a_url_with_a_user_or_password_is_refused_without_repeating_the_secret(url, tmp_path, capfd):
    """No GDS URL takes credentials (Datastore's come from the environment).
    Such a URL was refused for another reason, or taken, and its error
    repeated the password on the terminal; now it is refused for what it
    is, with the user part hidden, before anything is created."""
    with pytest.raises(BadValueError, match=r"names a user or a password") as caught:
        CounterShardDS("a", 1, gateway=url).add(1)
    assert "s3cret" not in str(caught.value) and "***@" in str(caught.value)
    assert "s3cret" not in capfd.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_emulator_host_with_a_user_or_password_is_refused_without_repeating_it(monkeypatch, capfd):
    """``DATASTORE_EMULATOR_HOST=u:pw@host:port`` was tried as a host name,
    and the resolver's error printed the password twice."""
    monkeypatch.setenv("DATASTORE_EMULATOR_HOST", "u:s3cret@127.0.0.1:9")
    with pytest.raises(BadValueError, match=r"'\*\*\*@127\.0\.0\.1:9'.*names a user or a password") as caught:
        CounterShardDS("a", 1).add(1)
    assert "s3cret" not in str(caught.value) and "s3cret" not in capfd.readouterr().err
