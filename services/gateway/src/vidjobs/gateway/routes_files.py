"""`GET /files/{key}`: objects of the filesystem backend, served to whoever holds an unexpired signed URL.

Only mounted when storage is the filesystem backend; an S3 backend signs its own URLs.
"""

from __future__ import annotations

from aiohttp import web

from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode, not_found
from vidjobs.gateway.routetable import ResponseSpec, Route
from vidjobs.gateway.state import gateway
from vidjobs.storage import signing
from vidjobs.storage.base import StorageError
from vidjobs.storage.filesystem import FileStorage

_REFUSED = "this link is invalid or has expired; ask the API for the job again to get a fresh one"


async def serve_file(request: web.Request) -> web.StreamResponse:
    gw = gateway(request)
    storage = gw.storage
    assert isinstance(storage, FileStorage)  # the route is mounted only for this backend
    key = request.match_info["key"]
    query = request.query
    if not signing.verify(gw.settings.signing_secret, key, query.get("expires", ""), query.get("sig", ""),
                          method=request.method):
        raise ApiError(403, GatewayCode.FORBIDDEN, _REFUSED)
    try:
        path = storage.path_for(key)
    except StorageError as exc:
        raise ApiError(403, GatewayCode.FORBIDDEN, _REFUSED) from exc
    if not path.is_file():
        raise not_found("file")
    # FileResponse answers Range requests, so a browser can seek in a video without fetching all of it.
    return web.FileResponse(path, headers={
        "Content-Type": storage.content_type(key),
        "Cache-Control": "private, max-age=300",
        "X-Content-Type-Options": "nosniff",
    })


_RESPONSES: dict[int, ResponseSpec] = {200: "application/octet-stream", 206: "application/octet-stream",
                                       403: ErrorOut, 404: ErrorOut}

ROUTES = [
    Route("GET", "/files/{key:.+}", serve_file, "get_file", "An object, by signed URL (filesystem storage)",
          auth=False, responses=_RESPONSES),
    Route("HEAD", "/files/{key:.+}", serve_file, "head_file", "An object's headers, by signed URL",
          auth=False, responses=_RESPONSES, documented=False),
]
