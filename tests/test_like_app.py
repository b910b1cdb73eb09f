"""The like-button example (examples/like_app), called as an ASGI app over
HTTP in this process (Starlette's TestClient). The real server in a real
browser, and 200 concurrent likes, are in tests/browser/."""

from __future__ import annotations

import asyncio
import importlib.util
import re
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote

import pytest
from starlette.testclient import TestClient

from gds_counter import aio
from gds_counter.counter import CounterShardDS
from gds_counter.errors import CommitUnknown, Contention, TotalUnavailable, Unavailable
from gds_counter.gateway import Gateway, open_gateway
from gds_counter.gateway.query import Query

APP_PATH = Path(__file__).resolve().parent.parent / "examples" / "like_app" / "app.py"


def _load_module() -> Any:
    spec = importlib.util.spec_from_file_location("like_app_example", APP_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


like_app = _load_module()


@pytest.fixture
def url(tmp_path: Path) -> str:
    """The app's storage: a SQLite file, so the test can read what was
    stored through a gateway of its own, as another process would."""
    return f"sqlite:///{tmp_path / 'likes.sqlite3'}"


@pytest.fixture
def client(url: str) -> Iterator[TestClient]:
    with TestClient(like_app.create_app(url), follow_redirects=False) as client:
        yield client


@pytest.fixture
def storage(url: str) -> Iterator[Gateway]:
    gateway = open_gateway(url)
    yield gateway
    gateway.close()


def stored_likes(storage: Gateway, item: str) -> int:
    """The total as a PHP app reads it: the article's query over every shard."""
    return CounterShardDS("like", item, gateway=storage).get_count(method="query")


def every_stored_key(storage: Gateway) -> list[Any]:
    return [entity.key for entity in storage.run_query(Query(keys_only=True)).entities]


def shown_likes(page: str, item: str) -> int:
    match = re.search(rf'<span class="count" id="likes-{item}" data-count="(\d+)">(\d+)</span>', page)
    assert match is not None, f"no count for {item!r} on the page"
    assert match.group(1) == match.group(2)
    return int(match.group(2))


def test_page_lists_every_item_with_its_form_and_zero_likes(client):
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    for item, label in like_app.ITEMS.items():
        assert shown_likes(response.text, item) == 0
        assert f'<form method="post" action="/like/{item}"' in response.text
        assert f'data-api="/api/likes/{item}"' in response.text
        assert f'<h2 id="label-{item}">{label}</h2>' in response.text


def test_page_serves_its_script_and_stylesheet(client):
    page = client.get("/").text
    for asset, kind in (("like.js", "javascript"), ("style.css", "text/css")):
        assert f"/static/{asset}" in page
        response = client.get(f"/static/{asset}")
        assert response.status_code == 200 and kind in response.headers["content-type"]


def test_form_like_redirects_to_the_item_and_the_page_shows_it(client, storage):
    for _ in range(3):
        response = client.post("/like/tea")
        assert response.status_code == 303
        assert response.headers["location"] == "/#tea"
    page = client.get("/").text
    assert shown_likes(page, "tea") == 3
    assert shown_likes(page, "coffee") == 0
    assert re.search(r'id="likes-tea"[^>]*>3</span>\s*<span class="unit">likes</span>', page)
    assert stored_likes(storage, "tea") == 3


def test_api_counts_into_the_php_articles_counter(client, storage):
    assert client.post("/api/likes/coffee").json() == {"item": "coffee", "likes": 1}
    assert client.post("/api/likes/coffee").json() == {"item": "coffee", "likes": 2}
    assert client.get("/api/likes/coffee").json() == {"item": "coffee", "likes": 2}
    assert client.get("/api/likes").json() == {"tea": 0, "coffee": 2, "cocoa": 0}
    # The very counter a PHP app opens with new CounterShardDS("like", "coffee").
    assert stored_likes(storage, "coffee") == 2
    assert {key.kind for key in every_stored_key(storage)} <= {"IK_CounterShardEntity", "IK_CounterShardConfig"}


def test_likes_stored_by_another_writer_show_on_the_page(url, storage):
    CounterShardDS("like", "cocoa", gateway=storage).add(7)
    with TestClient(like_app.create_app(url, cache_ttl=None)) as client:
        assert client.get("/api/likes/cocoa").json()["likes"] == 7
        assert shown_likes(client.get("/").text, "cocoa") == 7
        CounterShardDS("like", "cocoa", gateway=storage).add(2)
        assert shown_likes(client.get("/").text, "cocoa") == 9


def test_a_page_shown_often_is_served_from_the_cache(url):
    gateway = aio.open_gateway(url)
    try:
        with TestClient(like_app.create_app(gateway=gateway, cache_ttl=60)) as client:
            client.get("/")
            assert client.post("/api/likes/tea").json()["likes"] == 1
            rpcs = gateway.stats["rpcs"]
            pages = [client.get("/").text for _ in range(5)]
            assert gateway.stats["rpcs"] == rpcs  # no read: this process's like updated the cache
            assert {shown_likes(page, "tea") for page in pages} == {1}
    finally:
        asyncio.run(gateway.close())


@pytest.mark.parametrize("item", ["anything-i-want", "Tea", "tea2", "__x__", "x" * 2000, "caf%C3%A9", "t%00a"])
@pytest.mark.parametrize("method, path", [("POST", "/like/{}"), ("POST", "/api/likes/{}"), ("GET", "/api/likes/{}")])
def test_an_unlisted_item_is_a_404_that_writes_nothing(client, storage, method, path, item):
    response = client.request(method, path.format(item))
    assert response.status_code == 404
    if path.startswith("/api/"):
        assert response.json()["detail"] == f"There is no item {unquote(item)!r} to like."
    assert every_stored_key(storage) == []


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("GET", "/nowhere", 404),
        ("GET", "/like/tea", 405),
        ("POST", "/", 405),
        ("DELETE", "/api/likes/tea", 405),
        ("PUT", "/api/likes", 405),
    ],
)
def test_other_requests_are_refused_and_count_nothing(client, storage, method, path, status):
    response = client.request(method, path)
    assert response.status_code == status
    if status == 405:
        assert method not in response.headers["allow"]
    assert every_stored_key(storage) == []


def test_storage_comes_from_gds_url_when_no_url_is_given(monkeypatch, url, storage):
    monkeypatch.setenv("GDS_URL", url)
    with TestClient(like_app.create_app()) as client:
        assert client.post("/api/likes/tea").json()["likes"] == 1
    assert stored_likes(storage, "tea") == 1


def test_a_gateway_passed_in_is_used_and_left_open(url):
    gateway = aio.open_gateway(url)
    try:
        with TestClient(like_app.create_app(gateway=gateway)) as client:
            assert client.post("/api/likes/tea").json()["likes"] == 1
        # The app has shut down; the gateway it was handed still works.
        assert asyncio.run(aio.CounterShardDS("like", "tea", gateway=gateway).get_count()) == 1
    finally:
        asyncio.run(gateway.close())


@pytest.mark.parametrize(
    "error, status, says",
    [
        (Contention("still conflicting", attempts=6), 503, "not counted"),
        (Unavailable("storage down"), 503, "not counted"),
        (CommitUnknown("deadline after the commit was sent"), 503, "may have been counted"),
    ],
)
def test_a_failed_like_is_a_503_that_says_whether_it_counted(client, monkeypatch, error, status, says):
    async def fail(self: Any, amount: int = 1) -> Any:
        raise error

    monkeypatch.setattr(aio.CounterShardDS, "add", fail)
    monkeypatch.setattr(aio.CounterShardDS, "increment", fail)
    form = client.post("/like/tea")
    assert form.status_code == status and says in form.text
    api = client.post("/api/likes/tea")
    assert api.status_code == status and says in api.json()["detail"]


@pytest.mark.parametrize("path", ["/", "/api/likes", "/api/likes/tea"])
def test_a_failed_read_is_a_503_that_says_so(url, monkeypatch, path):
    async def fail(*args: Any, **kwargs: Any) -> Any:
        raise Unavailable("storage down")

    monkeypatch.setattr(aio.CounterShardDS, "get_count", fail)
    monkeypatch.setattr(like_app.aio, "get_counts", fail)
    with TestClient(like_app.create_app(url, cache_ttl=None)) as client:
        response = client.get(path)
    assert response.status_code == 503 and "could not be read" in response.text


def test_a_like_whose_total_cannot_be_read_is_accepted_without_a_total(client, monkeypatch, storage):
    real_add = aio.CounterShardDS.add

    async def counted_but_unread(self: Any, amount: int = 1) -> int:
        await real_add(self, amount)
        raise TotalUnavailable("counted; reading the total failed")

    monkeypatch.setattr(aio.CounterShardDS, "increment", counted_but_unread)
    response = client.post("/api/likes/tea")
    assert response.status_code == 202
    assert response.json()["likes"] is None
    assert stored_likes(storage, "tea") == 1


def test_labels_are_escaped_on_the_page(url):
    with TestClient(like_app.create_app(url, items={"cake": "Tea & <Cake>"})) as client:
        page = client.get("/").text
    assert "Tea &amp; &lt;Cake&gt;" in page and "<Cake>" not in page


# --- requests that must not count a like ----------------------------------------------
#
# Only a POST from the app's own page (or from a client that is not a browser,
# such as curl or a PHP backend, which sends neither Origin nor Sec-Fetch-Site)
# counts a like. A browser tells the server where a request comes from: modern
# ones with Sec-Fetch-Site, and every one with Origin on a POST, the plain
# no-JavaScript form included. A request another site makes a visitor's browser
# send must be refused before anything is counted (403), or any page on the web
# could like items on its visitors' behalf.

SAME_ORIGIN = "http://testserver"  # TestClient's base URL: the page's own origin


def test_head_reads_and_never_counts_a_like(client, storage):
    """Starlette answers HEAD through the GET route; HEAD is a read (a
    link checker or a proxy sends it), so it must not count."""
    for _ in range(3):
        response = client.head("/api/likes/tea")
        assert response.status_code == 200
    assert stored_likes(storage, "tea") == 0
    assert client.get("/api/likes/tea").json()["likes"] == 0


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "http://evil.example", "Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site", "Origin": "http://other.testserver"},
        {"Origin": "null"},  # a sandboxed frame, or a page that hides where it is
        {"Origin": "https://testserver.evil.example"},
        {"Origin": f"{SAME_ORIGIN}.evil.example"},
        {"Referer": "http://evil.example/page"},  # no Origin (an old browser): the Referer tells
        {"Origin": SAME_ORIGIN, "Sec-Fetch-Site": "cross-site"},  # Sec-Fetch-Site is set by the browser itself
    ],
    ids=["origin", "origin-and-fetch-site", "fetch-site", "same-site", "null-origin", "lookalike-host",
         "suffix-host", "referer-only", "fetch-site-wins"],
)
@pytest.mark.parametrize("path", ["/api/likes/tea", "/like/tea"], ids=["api", "form"])
def test_a_cross_site_like_is_refused_and_counts_nothing(client, storage, path, headers):
    response = client.post(path, headers=headers)
    assert response.status_code == 403
    if path.startswith("/api/"):
        assert "cross-site" in response.json()["detail"]
    else:
        assert "cross-site" in response.text
    assert stored_likes(storage, "tea") == 0
    assert every_stored_key(storage) == []


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": SAME_ORIGIN, "Sec-Fetch-Site": "same-origin"},  # fetch() from the page, or its form
        {"Origin": SAME_ORIGIN},  # a browser without Sec-Fetch-Site
        {"Referer": f"{SAME_ORIGIN}/"},  # an old browser without Origin
        {"Sec-Fetch-Site": "none"},  # the user's own action: typed, bookmarked
        {},  # not a browser: curl, a script, a server
    ],
    ids=["browser", "origin-only", "referer-only", "user-initiated", "no-browser"],
)
@pytest.mark.parametrize("path, status", [("/api/likes/tea", 200), ("/like/tea", 303)], ids=["api", "form"])
def test_a_like_from_the_page_itself_still_counts(client, storage, path, status, headers):
    response = client.post(path, headers=headers)
    assert response.status_code == status
    assert stored_likes(storage, "tea") == 1


def test_the_page_is_compared_by_the_host_the_browser_asked_for(url, storage):
    """Same origin means the Host the request was sent to, whatever it is
    (a LAN address, a name behind a proxy), not one fixed name."""
    with TestClient(like_app.create_app(url), base_url="http://likes.lan:8123") as client:
        ours = client.post("/api/likes/tea", headers={"Origin": "http://likes.lan:8123"})
        other_port = client.post("/api/likes/tea", headers={"Origin": "http://likes.lan:9999"})
    assert ours.status_code == 200 and other_port.status_code == 403
    assert stored_likes(storage, "tea") == 1
