"""A like button as an ASGI app: Starlette, counted with gds_counter.aio.

    pip install -e ".[web]"
    python examples/like_app/app.py [--port 8000] [--url sqlite:///likes.sqlite3]
    # or, with uvicorn's own options:
    uvicorn app:create_app --factory --app-dir examples/like_app

Then open http://127.0.0.1:8000/ and press the buttons. Storage is chosen as
everywhere else in gds_counter (``--url``, else ``GDS_URL``, else the
emulator in ``DATASTORE_EMULATOR_HOST``, else ./gds_counter.sqlite3), so the
same app counts into Cloud Datastore with ``--url datastore://PROJECT``, into
the very entities a PHP app using the article's CounterShardDS reads.

Routes (only the listed ITEMS can be liked; any other item is a 404 that
writes nothing, so nobody can make the app create counters without bound):

  GET  /                   the page: every item with its likes (one batched read)
  POST /like/ITEM          the form's target without JavaScript: add a like, 303 back to the page
  GET  /api/likes          {"tea": N, "coffee": N, ...}
  GET  /api/likes/ITEM     {"item": ITEM, "likes": N}
  POST /api/likes/ITEM     add a like; {"item": ITEM, "likes": N} with the new total

The handlers await the counter, so one event loop serves many likes at once
and never blocks on storage.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from pathlib import Path
from typing import AsyncIterator, Mapping

import uvicorn
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates

from gds_counter import aio
from gds_counter.counter import CountCache
from gds_counter.errors import CommitUnknown, GDSError, TotalUnavailable

log = logging.getLogger("like_app")

#: The counter's target type: PHP would count the same likes with
#: ``new CounterShardDS("like", $item)``.
TARGET_TYPE = "like"
#: The items that can be liked: slug (in URLs and the counter's id) to label.
ITEMS: Mapping[str, str] = {"tea": "Tea", "coffee": "Coffee", "cocoa": "Cocoa"}

HERE = Path(__file__).resolve().parent
templates = Jinja2Templates(directory=HERE / "templates")


class Likes:
    """The app's counters: one async ``CounterShardDS`` per listed item, on
    one gateway. Asking for any other item is a 404 before anything is read
    or written.

    With ``cache_ttl`` (seconds) totals are cached: a page shown often costs
    one batched read per TTL, not one per view, and likes counted by this
    process update the cached totals at once. Likes counted by other
    processes show up within the TTL. ``None`` reads storage every time.
    """

    def __init__(self, gateway: aio.AsyncGateway, items: Mapping[str, str] = ITEMS,
                 cache_ttl: float | None = 5.0) -> None:
        self.gateway = gateway
        self.items = dict(items)
        cache = CountCache(ttl=cache_ttl) if cache_ttl is not None else None
        self.counters = {
            slug: aio.CounterShardDS(TARGET_TYPE, slug, gateway=gateway, cache=cache) for slug in self.items
        }

    def counter(self, item: str) -> aio.CounterShardDS:
        counter = self.counters.get(item)
        if counter is None:
            raise HTTPException(404, f"There is no item {item!r} to like.")
        return counter

    async def totals(self) -> dict[str, int]:
        """Every item's likes, in one batched read."""
        totals = await aio.get_counts(list(self.counters.values()))
        return dict(zip(self.counters, totals))


def likes_of(request: Request) -> Likes:
    likes: Likes = request.app.state.likes
    return likes


async def page(request: Request) -> Response:
    likes = likes_of(request)
    totals = await likes.totals()
    path = request.app.url_path_for
    items = [
        {"slug": slug, "label": label, "likes": totals[slug],
         "form": path("like_form", item=slug), "api": path("like_api", item=slug)}
        for slug, label in likes.items.items()
    ]
    context = {"items": items, "target_type": TARGET_TYPE, "shards": aio.CounterShardDS.NUM_SHARDS,
               "css": path("static", path="style.css"), "js": path("static", path="like.js")}
    return templates.TemplateResponse(request, "index.html", context)


async def like_form(request: Request) -> Response:
    """The form's target, for browsers without JavaScript: count, then show the page again."""
    item = request.path_params["item"]
    await likes_of(request).counter(item).add()  # no read: the page that follows reads every total
    return RedirectResponse(f"{request.app.url_path_for('page')}#{item}", status_code=303)


async def like_api(request: Request) -> Response:
    item = request.path_params["item"]
    counter = likes_of(request).counter(item)
    if request.method == "GET":
        return JSONResponse({"item": item, "likes": await counter.get_count()})
    try:
        total = await counter.increment()
    except TotalUnavailable:  # the like WAS counted; only reading the new total failed
        return JSONResponse({"item": item, "likes": None, "detail": "Your like was counted."}, status_code=202)
    return JSONResponse({"item": item, "likes": total})


async def all_likes(request: Request) -> Response:
    return JSONResponse(await likes_of(request).totals())


async def storage_failed(request: Request, exc: Exception) -> Response:
    """Contention after every retry, or storage unreachable: a 503 that says
    whether the like was counted, as JSON for the API and text for the form."""
    log.warning("%s %s failed: %s", request.method, request.url.path, exc)
    if request.method != "POST":
        detail = "The likes could not be read; please try again."
    elif isinstance(exc, CommitUnknown):
        detail = "Storage did not confirm the like; it may have been counted."
    else:
        detail = "The like was not counted; please try again."
    if request.url.path.startswith("/api/"):
        return JSONResponse({"detail": detail}, status_code=503)
    return PlainTextResponse(f"{detail}\n", status_code=503)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if request.url.path.startswith("/api/"):
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=exc.headers)
    return PlainTextResponse(f"{exc.detail}\n", status_code=exc.status_code, headers=exc.headers)


def create_app(
    url: str | None = None,
    *,
    gateway: aio.AsyncGateway | None = None,
    items: Mapping[str, str] = ITEMS,
    cache_ttl: float | None = 5.0,
) -> Starlette:
    """The app. It opens the storage ``url`` names (see the module docstring)
    on startup and closes it on shutdown; a ``gateway`` passed in is used as
    it is and left open, for its owner to close. ``items`` and ``cache_ttl``:
    see ``Likes``."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        storage = gateway if gateway is not None else aio.open_gateway(url)
        app.state.likes = Likes(storage, items, cache_ttl)
        try:
            yield
        finally:
            if gateway is None:  # opened here, so closed here
                await storage.close()

    routes = [
        Route("/", page, name="page"),
        Route("/like/{item}", like_form, methods=["POST"], name="like_form"),
        Route("/api/likes", all_likes, name="all_likes"),
        Route("/api/likes/{item}", like_api, methods=["GET", "POST"], name="like_api"),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    handlers = {HTTPException: http_error, GDSError: storage_failed}
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a like button counted with gds_counter's async CounterShardDS")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed at startup)")
    parser.add_argument("--url", help="storage URL (default: $GDS_URL, the emulator, or ./gds_counter.sqlite3)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(name)s: %(message)s")
    uvicorn.run(create_app(args.url), host=args.host, port=args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
