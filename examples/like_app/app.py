"""A like button as an ASGI app: Starlette, counted with gds_counter.aio.

    pip install -e ".[web]"
    python examples/like_app/app.py [--port 8000] [--url sqlite:///likes.sqlite3]
    # or, with uvicorn's own options (as deployed: Dockerfile, app.yaml):
    uvicorn app:create_app --factory --app-dir examples/like_app --workers 4

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

Only POST counts: GET and HEAD (which Starlette answers through the GET
route) read. A POST that a browser sends on behalf of another site (its
page's form or script) is refused with a 403 before anything is counted:
see ``cross_site``.

The handlers await the counter, so one event loop serves many likes at once
and never blocks on storage.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import AsyncIterator, Mapping
from urllib.parse import urlsplit

import uvicorn
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Receive, Scope, Send

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

#: Methods that only read: never counted, never refused as cross-site.
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: The port an origin leaves out, per scheme (``http://host`` is port 80).
DEFAULT_PORTS = {"http": 80, "https": 443}


def _origin_host(url: str) -> str | None:
    """``host[:port]`` of an origin or a URL, as a Host header names it (the
    scheme's default port left out), or None when it names no host."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a malformed port or IPv6 address
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    host = parts.netloc.rpartition("@")[2].lower()
    if port is not None and port == DEFAULT_PORTS[parts.scheme]:
        host = host.rpartition(":")[0]
    return host


def cross_site(headers: Headers) -> str | None:
    """Why a request that changes state must be refused as sent by another
    site, or None when it may count.

    A page on any site can make its visitors' browsers POST here (a form,
    or ``fetch`` with ``mode: "no-cors"``); the browser, not the page, says
    where the request comes from, so that is what is checked, most
    trustworthy first:

    * ``Sec-Fetch-Site`` (every current browser): only ``same-origin`` and
      ``none`` (the user's own action, such as a bookmark) count.
      ``same-site`` is refused too: another subdomain may be someone else's.
    * Else ``Origin`` (every browser sends it on a POST, the no-JavaScript
      form's included): its host must be the Host the request was sent to.
      ``null`` (a sandboxed frame, a redirect from elsewhere) is refused.
    * Else ``Referer`` (an old browser): the same test on its host.
    * Else it is not a browser (curl, a script, a server), which no other
      site can steer: it counts.

    Host, not a fixed name: the app then works on any address it is served
    at, and behind a proxy that passes the browser's Host header on. The
    scheme is not compared, so that a proxy that ends TLS in front of the
    plain-HTTP app still works.
    """
    fetch_site = headers.get("sec-fetch-site")
    if fetch_site is not None:
        if fetch_site.strip().lower() in ("same-origin", "none"):
            return None
        return f"the browser says it is sent from another site (Sec-Fetch-Site: {fetch_site})"
    host = headers.get("host", "").strip().lower()
    for header in ("origin", "referer"):
        source = headers.get(header)
        if source is None:
            continue
        if _origin_host(source.strip()) != host:
            return f"it is sent from another site ({header.title()}: {source})"
        return None
    return None


class RefuseCrossSite:
    """ASGI middleware: a request that would change state and that
    ``cross_site`` refuses gets a 403, before any route (so before any
    count) runs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] not in READ_METHODS:
            why = cross_site(Headers(scope=scope))
            if why is not None:
                log.warning("refused %s %s: %s", scope["method"], scope["path"], why)
                response = refusal(scope["path"], 403, f"A like from a cross-site request is refused: {why}.")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def refusal(path: str, status: int, detail: str, headers: Mapping[str, str] | None = None) -> Response:
    """An error answer: JSON ``{"detail": ...}`` for the API, text for the page."""
    if path.startswith("/api/"):
        return JSONResponse({"detail": detail}, status_code=status, headers=headers)
    return PlainTextResponse(f"{detail}\n", status_code=status, headers=headers)


class Likes:
    """The app's counters: one async ``CounterShardDS`` per listed item, on
    one gateway. Asking for any other item is a 404 before anything is read
    or written.

    With ``cache_ttl`` (seconds) totals are cached: a page shown often costs
    one batched read per TTL, not one per view, and likes counted by this
    process update the cached totals at once. Likes counted by other
    processes show up within the TTL. ``None`` reads storage every time.
    With ``cache_url`` (``redis://host:port/db``) the cache is the one every
    worker process shares instead (the ``redis`` extra): a like counted by
    any worker shows in every worker's page at once.
    """

    def __init__(self, gateway: aio.AsyncGateway, items: Mapping[str, str] = ITEMS,
                 cache_ttl: float | None = 5.0, cache_url: str | None = None) -> None:
        self.gateway = gateway
        self.items = dict(items)
        cache: CountCache | str | None = cache_url or (CountCache(ttl=cache_ttl) if cache_ttl is not None else None)
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
    if request.method != "POST":  # GET, and HEAD (answered through this route): a read, never a like
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
    return refusal(request.url.path, 503, detail)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return refusal(request.url.path, exc.status_code, exc.detail, exc.headers)


def create_app(
    url: str | None = None,
    *,
    gateway: aio.AsyncGateway | None = None,
    items: Mapping[str, str] = ITEMS,
    cache_ttl: float | None = 5.0,
    cache_url: str | None = None,
) -> Starlette:
    """The app. It opens the storage ``url`` names (see the module docstring)
    on startup and closes it on shutdown; a ``gateway`` passed in is used as
    it is and left open, for its owner to close. ``items``, ``cache_ttl`` and
    ``cache_url`` (default: the ``GDS_CACHE_URL`` environment variable, as a
    deployment sets it for every worker): see ``Likes``."""
    cache_url = cache_url or os.environ.get("GDS_CACHE_URL") or None

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        storage = gateway if gateway is not None else aio.open_gateway(url)
        app.state.likes = Likes(storage, items, cache_ttl, cache_url)
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
    return Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers,
                     middleware=[Middleware(RefuseCrossSite)])


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
