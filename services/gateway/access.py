"""Request ids at the edge and the access log: every request gets an id (the client's `X-Request-Id` when it
is well-formed, else a new one), every response carries it, the work the request causes goes on under it
(libs/common/requestids.py), and one line per request says who asked what and how it was answered."""

from __future__ import annotations

import logging
import time

from aiohttp import web

from libs.common import requestids
from services.gateway.observe import route_label
from services.gateway.state import ACCOUNT

log = logging.getLogger("vidjobs.access")

REQUEST_ID = web.RequestKey("request_id", str)


@web.middleware
async def request_id_middleware(request: web.Request, handler) -> web.StreamResponse:
    request_id = requestids.accept(request.headers.get(requestids.HEADER))
    request[REQUEST_ID] = request_id
    requestids.use(request_id)  # this request's task and what it starts; aiohttp runs each in its own
    started = time.perf_counter()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        account = request.get(ACCOUNT)
        log.info("request", extra={
            "method": request.method, "route": route_label(request), "path": request.path, "status": status,
            "ms": round((time.perf_counter() - started) * 1000, 1),
            "account_id": account.id if account is not None else None,
        })


async def stamp_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the id goes on every response, streams and errors included."""
    response.headers[requestids.HEADER] = request.get(REQUEST_ID) or requestids.current() or requestids.new()
