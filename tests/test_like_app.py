"""The like-button example, called as WSGI (no server, no network)."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path
from typing import Any, Iterator
from wsgiref.util import setup_testing_defaults

import pytest

from gds_counter.counter import CounterShardDS
from gds_counter.gateway import open_gateway

APP_PATH = Path(__file__).resolve().parent.parent / "examples" / "like_app" / "app.py"


def _load_module() -> Any:
    spec = importlib.util.spec_from_file_location("like_app_example", APP_PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


like_app = _load_module()


@pytest.fixture
def app() -> Iterator[Any]:
    gateway = open_gateway("memory://")
    yield like_app.LikeApp(gateway)
    gateway.close()


def call(app: Any, method: str, path: str) -> tuple[str, dict[str, str], bytes]:
    environ: dict[str, Any] = {"REQUEST_METHOD": method, "PATH_INFO": path, "wsgi.input": io.BytesIO(b"")}
    setup_testing_defaults(environ)
    seen: dict[str, Any] = {}

    def start_response(status: str, headers: list[tuple[str, str]]) -> None:
        seen["status"], seen["headers"] = status, dict(headers)

    body = b"".join(app(environ, start_response))
    assert seen["headers"]["Content-Length"] == str(len(body))
    return seen["status"], seen["headers"], body


def test_page_lists_every_item_with_zero_likes(app):
    status, headers, body = call(app, "GET", "/")
    assert status == "200 OK"
    assert headers["Content-Type"].startswith("text/html")
    for item in like_app.ITEMS:
        assert f'<b id="likes-{item}">0</b>' in body.decode()


def test_form_like_redirects_and_the_page_shows_it(app):
    for _ in range(3):
        status, headers, _ = call(app, "POST", "/like/tea")
        assert status == "303 See Other" and headers["Location"] == "/"
    page = call(app, "GET", "/")[2].decode()
    assert '<b id="likes-tea">3</b>' in page
    assert '<b id="likes-coffee">0</b>' in page


def test_api_counts_into_the_php_articles_counter(app):
    assert json.loads(call(app, "POST", "/api/likes/coffee")[2]) == {"item": "coffee", "likes": 1}
    assert json.loads(call(app, "POST", "/api/likes/coffee")[2]) == {"item": "coffee", "likes": 2}
    assert json.loads(call(app, "GET", "/api/likes/coffee")[2]) == {"item": "coffee", "likes": 2}
    # The same counter a PHP app would open with new CounterShardDS("like", "coffee"),
    # read with no cache and by the article's query.
    fresh = CounterShardDS("like", "coffee", gateway=app.gateway)
    assert fresh.get_count() == fresh.get_count(method="query") == 2


@pytest.mark.parametrize(
    "method, path, status",
    [
        ("GET", "/nowhere", "404 Not Found"),
        ("GET", "/like/tea", "405 Method Not Allowed"),
        ("DELETE", "/api/likes/tea", "405 Method Not Allowed"),
        ("POST", "/like/bad item!", "400 Bad Request"),
        ("POST", "/api/likes/" + "x" * 65, "400 Bad Request"),
    ],
)
def test_bad_requests_are_refused_and_count_nothing(app, method, path, status):
    assert call(app, method, path)[0] == status
    assert json.loads(call(app, "GET", "/api/likes/tea")[2])["likes"] == 0


def test_contention_is_a_503_and_nothing_is_counted(app, monkeypatch):
    from gds_counter.errors import Contention

    def refuse(self, amount=1):
        raise Contention("still conflicting", attempts=6)

    monkeypatch.setattr(CounterShardDS, "add", refuse)
    status, _, body = call(app, "POST", "/like/tea")
    assert status == "503 Service Unavailable"
    assert b"not counted" in body
