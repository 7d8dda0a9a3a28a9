"""The memory inspector page (``/inspector``): static files served by the worker.

The page holds no data and no secret. It is one HTML page, a few small ES modules and one
style sheet, shipped inside the package (no build step, no CDN: machines may be offline).
Every datum it shows comes from the JSON API, called by the browser with the key the person
types in, so the page is "behind the API key" exactly as the API is: serving the files
needs no key, reading a memory does.

Memory text is hostile data, so the page is sent with a strict Content-Security-Policy
(``default-src 'self'``, no inline script or style, no framing), ``nosniff`` and no
referrer; its script inserts user content as text only. The files are read once, at the
first request, and answered from memory with an ETag (a worker serves a handful of people).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

from memstream.contract.http_api import paths
from memstream.web.http_base import Handler, PageRoute, Route

PACKAGE = "memstream.web"
FOLDER = "inspector"
PAGE_PATH = paths.INSPECTOR

# 'self' only: scripts and styles from files of this origin, API calls to this origin.
# No 'unsafe-inline': an injected <script> or onerror= handler cannot run even if a bug ever
# inserted memory text as HTML. form-action / base-uri close the remaining injection doors.
CSP = "; ".join([
    "default-src 'self'", "script-src 'self'", "style-src 'self'", "img-src 'self'",
    "connect-src 'self'", "object-src 'none'", "base-uri 'none'", "form-action 'none'",
    "frame-ancestors 'none'",
])
SECURITY_HEADERS: dict[str, str] = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",  # frame-ancestors for browsers that predate CSP 2
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Permissions-Policy": "camera=(), microphone=(), geolocation=()",
    "Cache-Control": "no-cache",  # revalidate (ETag): a new release shows at once
}


@dataclass(frozen=True)
class Asset:
    name: str  # file name in the package folder
    media_type: str  # with charset: answered as the Content-Type


ASSETS: dict[str, Asset] = {
    paths.INSPECTOR: Asset("index.html", "text/html; charset=utf-8"),
    paths.INSPECTOR_APP: Asset("app.js", "text/javascript; charset=utf-8"),
    paths.INSPECTOR_LOGIC: Asset("logic.js", "text/javascript; charset=utf-8"),
    paths.INSPECTOR_CHARTS: Asset("charts.js", "text/javascript; charset=utf-8"),
    paths.INSPECTOR_DOM: Asset("dom.js", "text/javascript; charset=utf-8"),
    paths.INSPECTOR_METRICS: Asset("metrics.js", "text/javascript; charset=utf-8"),
    paths.INSPECTOR_STYLE: Asset("style.css", "text/css; charset=utf-8"),
}


def load(name: str) -> bytes:
    """One of the page's files, from the installed package (wheel or source tree)."""
    return (resources.files(PACKAGE) / FOLDER / name).read_bytes()


def etag_of(body: bytes) -> str:
    return '"' + hashlib.sha256(body).hexdigest()[:20] + '"'


def headers_for(asset: Asset, etag: str) -> dict[str, str]:
    return {**SECURITY_HEADERS, "Content-Type": asset.media_type, "ETag": etag}


def _file(path: str) -> Handler:
    """The handler of one file: read once, then answered from memory (304 on a match)."""
    asset = ASSETS[path]
    cached: list[tuple[bytes, str]] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        if not cached:
            body = load(asset.name)
            cached.append((body, etag_of(body)))
        body, etag = cached[0]
        headers = headers_for(asset, etag)
        if etag in request.headers.get("If-None-Match", ""):
            return web.Response(status=304, headers=headers)
        return web.Response(body=body, headers=headers)

    return handle


def _page_route(path: str, name: str, summary: str) -> PageRoute:
    return PageRoute("GET", path, name, summary, _file(path), None, keyed=False,
                     media_type=ASSETS[path].media_type.split(";")[0])


INSPECTOR_ROUTES: tuple[Route, ...] = (
    _page_route(paths.INSPECTOR, "inspector", "The memory inspector page (its data: this API, "
                "with the key typed into it)"),
    _page_route(paths.INSPECTOR_APP, "inspector_app", "The inspector's script"),
    _page_route(paths.INSPECTOR_LOGIC, "inspector_logic", "The inspector's pure functions"),
    _page_route(paths.INSPECTOR_CHARTS, "inspector_charts", "The inspector's SVG charts"),
    _page_route(paths.INSPECTOR_DOM, "inspector_dom", "The inspector's DOM helpers"),
    _page_route(paths.INSPECTOR_METRICS, "inspector_metrics", "The inspector's metrics view"),
    _page_route(paths.INSPECTOR_STYLE, "inspector_style", "The inspector's style sheet"),
)
