"""`GET /`: the web page, and its few static files (a fixed list; nothing else on disk is reachable)."""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from vidjobs.gateway.apierrors import ErrorOut, not_found
from vidjobs.gateway.routetable import Route

PAGE_DIR = Path(__file__).parent / "page"
_ASSETS = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
# Only our own scripts and styles run; media may come from signed URLs on another host (an S3 bucket).
_CSP = ("default-src 'self'; img-src 'self' https: http: data:; media-src 'self' https: http:; "
        "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
_SECURITY = {"Content-Security-Policy": _CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"}


async def index(_: web.Request) -> web.FileResponse:
    return web.FileResponse(PAGE_DIR / "index.html",
                            headers={"Content-Type": "text/html; charset=utf-8", "Cache-Control": "no-cache",
                                     **_SECURITY})


async def asset(request: web.Request) -> web.FileResponse:
    name = request.match_info["name"]
    if name not in _ASSETS:
        raise not_found("file")
    return web.FileResponse(PAGE_DIR / name,
                            headers={"Content-Type": _ASSETS[name], "Cache-Control": "no-cache", **_SECURITY})


ROUTES = [
    Route("GET", "/", index, "page", "The web page", auth=False, responses={200: "text/html"}),
    Route("GET", "/static/{name}", asset, "page_asset", "The web page's script and style", auth=False,
          responses={200: "text/plain", 404: ErrorOut}, documented=False),
]
