"""The like-button example as a person uses it: the real server (uvicorn, in
a process of its own, started by the example's own command), a real
browser (Chromium) clicking the buttons, and many people liking at once.

Each test runs on the embedded SQLite engine and on the official Firestore
emulator in Datastore mode, and checks what the storage holds afterwards
through a blocking gateway of its own, as a PHP app would read it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import httpx
import pytest

from gds_counter.counter import CounterShardDS
from gds_counter.gateway import Gateway, open_gateway
from gds_counter.gateway.query import Query

CONCURRENT_LIKES = 200


class Storage(NamedTuple):
    """Where the app counts (its --url and environment), and a gateway of
    the test's own onto the same data."""

    url: str
    env: dict[str, str]
    gateway: Gateway

    def likes(self, item: str) -> int:
        """The stored total, by the PHP article's query over every shard."""
        return CounterShardDS("like", item, gateway=self.gateway).get_count(method="query")

    def kinds(self) -> set[str]:
        """The kinds of every entity stored (a kindless keys-only query)."""
        keys: list[Any] = [entity.key for entity in self.gateway.run_query(Query(keys_only=True)).entities]
        return {key.kind for key in keys}


@pytest.fixture(params=["sqlite", "firestore"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    if request.param == "sqlite":
        url, env = f"sqlite:///{tmp_path / 'likes.sqlite3'}", {}
        gateway = open_gateway(url)
    else:
        emulator = request.getfixturevalue("firestore_emulator")
        namespace = f"t-{uuid.uuid4().hex}"
        url, env = f"datastore://{emulator.project}?namespace={namespace}", emulator.env
        gateway = emulator.gateway(namespace=namespace)
    try:
        yield Storage(url, env, gateway)
    finally:
        gateway.close()


def count_on_page(page: Any, item: str) -> int:
    return int(page.locator(f"#likes-{item}").text_content())


def test_clicking_like_updates_the_count_without_a_reload(page, serve_like_app, storage):
    app = serve_like_app(storage.url, storage.env)
    page.goto(app.base_url)
    assert page.title() == "Likes"
    assert [count_on_page(page, item) for item in ("tea", "coffee", "cocoa")] == [0, 0, 0]
    # Survives only as long as the document does: a full reload would drop it.
    page.evaluate("window.sameDocument = true")

    like_tea = page.get_by_role("button", name="Like Tea")
    for expected in (1, 2, 3):
        with page.expect_response(lambda response: response.url.endswith("/api/likes/tea")) as answer:
            like_tea.click()
        assert answer.value.status == 200 and answer.value.json() == {"item": "tea", "likes": expected}
        page.wait_for_function("n => document.querySelector('#likes-tea').textContent === String(n)",
                               arg=expected)

    assert page.evaluate("window.sameDocument") is True
    assert page.locator("#likes-tea + .unit").text_content() == "likes"
    assert page.get_by_role("status").text_content() == "Tea: 3 likes"
    assert count_on_page(page, "coffee") == 0
    assert storage.likes("tea") == 3 and storage.likes("coffee") == 0
    page.reload()
    assert count_on_page(page, "tea") == 3


def test_the_form_still_works_without_javascript(browser, serve_like_app, storage):
    app = serve_like_app(storage.url, storage.env)
    context = browser.new_context(java_script_enabled=False)
    try:
        page = context.new_page()
        page.goto(app.base_url)
        page.get_by_role("button", name="Like Cocoa").click()
        page.wait_for_url(f"{app.base_url}/#cocoa")
        assert count_on_page(page, "cocoa") == 1
        assert page.locator("#likes-cocoa + .unit").text_content() == "like"
    finally:
        context.close()
    assert storage.likes("cocoa") == 1


def test_concurrent_likes_leave_the_exact_count(serve_like_app, storage):
    app = serve_like_app(storage.url, storage.env)

    async def like_at_once() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=CONCURRENT_LIKES)
        async with httpx.AsyncClient(base_url=app.base_url, limits=limits, timeout=120) as client:
            likes = [client.post("/api/likes/coffee") for _ in range(CONCURRENT_LIKES)]
            likes.append(client.post("/api/likes/not-on-the-list"))
            return await asyncio.gather(*likes)

    # A loop of its own, in a thread: Playwright's sync API keeps an event
    # loop running in this thread while the session's browser is open.
    with ThreadPoolExecutor(1) as thread:
        *answers, unlisted = thread.submit(asyncio.run, like_at_once()).result()
    assert Counter(answer.status_code for answer in answers) == {200: CONCURRENT_LIKES}, app.log
    totals = [answer.json()["likes"] for answer in answers]
    # Each total is read after its own like committed; the last like to
    # commit reads every other one.
    assert min(totals) >= 1 and max(totals) == CONCURRENT_LIKES
    assert unlisted.status_code == 404
    assert storage.likes("coffee") == CONCURRENT_LIKES
    assert storage.likes("not-on-the-list") == 0
    assert httpx.get(f"{app.base_url}/api/likes").json() == {"tea": 0, "coffee": CONCURRENT_LIKES, "cocoa": 0}
    assert storage.kinds() <= {"IK_CounterShardEntity", "IK_CounterShardConfig"}


@pytest.mark.parametrize(
    "answer, says",
    [
        ({"status": 503, "json": {"detail": "The like was not counted; please try again."}},
         "The like was not counted; please try again."),
        ({"status": 502, "body": "<html>bad gateway</html>"}, "The server answered 502."),
    ],
)
def test_a_refused_like_says_why_and_leaves_the_count(page, serve_like_app, tmp_path, answer, says):
    app = serve_like_app(f"sqlite:///{tmp_path / 'likes.sqlite3'}")
    # The server answers as a failing one would: a 503 from the app (storage
    # down), or an HTML error page from a proxy in front of it.
    page.route("**/api/likes/tea", lambda route: route.fulfill(**answer))
    page.goto(app.base_url)
    page.get_by_role("button", name="Like Tea").click()
    status = page.get_by_role("status")
    status.filter(has_text=says).wait_for()
    assert status.text_content() == says
    assert count_on_page(page, "tea") == 0
