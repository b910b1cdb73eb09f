"""A "like" button counted with CounterShardDS, on the standard library only.

    python examples/like_app/app.py [--port 8000] [--url sqlite:///likes.sqlite3]

Then open http://127.0.0.1:8000/ and press the buttons. Storage is chosen as
everywhere else in gds_counter (``--url``, else ``GDS_URL``, else the
emulator in ``DATASTORE_EMULATOR_HOST``, else ./gds_counter.sqlite3), so the
same app counts into Cloud Datastore with ``--url datastore://PROJECT``, into
the very entities a PHP app using the article's CounterShardDS reads.

Routes:
  GET  /                   the page: every item with its likes (one batched read)
  POST /like/ITEM          add a like, then redirect to the page (303)
  GET  /api/likes/ITEM     {"item": ITEM, "likes": N}
  POST /api/likes/ITEM     add a like; {"item": ITEM, "likes": N} with the new total

Flask or FastAPI would do the same in fewer lines; this uses wsgiref so that
the example needs nothing beyond gds_counter.
"""

from __future__ import annotations

import argparse
import html
import json
import logging
import re
import sys
from typing import Any, Callable, Iterable, Sequence
from urllib.parse import unquote

from gds_counter.counter import CountCache, CounterShardDS, get_counts
from gds_counter.errors import BadValueError, GDSError
from gds_counter.gateway import Gateway, open_gateway

log = logging.getLogger("like_app")

#: The counter's target type: PHP would build the same counter with
#: ``new CounterShardDS("like", $item)``.
TARGET_TYPE = "like"
ITEMS = ("tea", "coffee", "cocoa")
_ITEM = re.compile(r"^[A-Za-z0-9-]{1,64}$")

StartResponse = Callable[[str, list[tuple[str, str]]], Any]

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>Likes</title></head>
<body><h1>Likes</h1>
<ul>
{rows}
</ul>
<p>Counted with gds_counter's CounterShardDS: {shards} shards per item.</p>
</body></html>
"""
ROW = (
    '<li><form method="post" action="/like/{item}">{label}: <b id="likes-{item}">{likes}</b> '
    '<button type="submit">Like</button></form></li>'
)


class LikeApp:
    """The WSGI application. One gateway and one count cache for the
    process; counters are cheap objects made per request."""

    def __init__(self, gateway: Gateway, items: Sequence[str] = ITEMS, *, cache_ttl: float = 5.0) -> None:
        for item in items:
            _check_item(item)
        self.gateway = gateway
        self.items = tuple(items)
        # A page shown often costs one batched read per TTL, not one per view.
        # Likes made by this process update the cached totals at once.
        self.cache = CountCache(ttl=cache_ttl)

    def counter(self, item: str) -> CounterShardDS:
        return CounterShardDS(TARGET_TYPE, _check_item(item), gateway=self.gateway, cache=self.cache)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method = environ.get("REQUEST_METHOD", "GET")
        path = unquote(environ.get("PATH_INFO", "/") or "/")
        try:
            if path == "/" and method in ("GET", "HEAD"):
                return self._page(start_response)
            match = re.fullmatch(r"/like/([^/]+)", path)
            if match and method == "POST":
                self.counter(match.group(1)).add()
                return _respond(start_response, "303 See Other", b"", "text/plain", [("Location", "/")])
            match = re.fullmatch(r"/api/likes/([^/]+)", path)
            if match and method in ("GET", "POST"):
                counter = self.counter(match.group(1))
                likes = counter.increment() if method == "POST" else counter.get_count()
                body = json.dumps({"item": match.group(1), "likes": likes}).encode()
                return _respond(start_response, "200 OK", body, "application/json")
            if match or path == "/" or path.startswith("/like/"):
                return _respond(start_response, "405 Method Not Allowed", b"method not allowed\n", "text/plain")
            return _respond(start_response, "404 Not Found", b"not found\n", "text/plain")
        except BadValueError as exc:
            return _respond(start_response, "400 Bad Request", f"{exc}\n".encode(), "text/plain")
        except GDSError as exc:  # contention after retries, storage down: the like was NOT counted
            log.warning("like failed: %s", exc)
            return _respond(start_response, "503 Service Unavailable",
                            b"the like was not counted; please try again\n", "text/plain")

    def _page(self, start_response: StartResponse) -> Iterable[bytes]:
        counters = [self.counter(item) for item in self.items]
        totals = get_counts(counters)  # one batch lookup for every item (or none, when cached)
        rows = "\n".join(
            ROW.format(item=html.escape(item), label=html.escape(item.capitalize()), likes=total)
            for item, total in zip(self.items, totals)
        )
        body = PAGE.format(rows=rows, shards=CounterShardDS.NUM_SHARDS).encode()
        return _respond(start_response, "200 OK", body, "text/html; charset=utf-8")


def _check_item(item: str) -> str:
    if not isinstance(item, str) or not _ITEM.match(item):
        raise BadValueError(f"item must be 1 to 64 letters, digits or '-', got {item!r}")
    return item


def _respond(start_response: StartResponse, status: str, body: bytes, content_type: str,
             headers: list[tuple[str, str]] | None = None) -> list[bytes]:
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body))), *(headers or [])])
    return [body]


def make_app(url: str | None = None, items: Sequence[str] = ITEMS) -> LikeApp:
    return LikeApp(open_gateway(url), items)


def main(argv: Sequence[str] | None = None) -> int:
    from wsgiref.simple_server import make_server

    parser = argparse.ArgumentParser(description="a like button counted with CounterShardDS")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--url", help="storage URL (default: $GDS_URL, the emulator, or ./gds_counter.sqlite3)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    app = make_app(args.url)
    with make_server(args.host, args.port, app) as server:
        print(f"serving on http://{args.host}:{args.port}/ (Ctrl-C to stop)")
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            app.gateway.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
