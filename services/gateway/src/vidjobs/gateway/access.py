"""Request ids at the edge: every request gets an id (the client's `X-Request-Id` when it is well-formed, else
a new one), every response carries it, and the work the request causes goes on under it
(vidjobs.common.requestids). The access line per request is written with the request's metrics (requestmetrics.py)."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from vidjobs.common import requestids, tracing

REQUEST_ID = web.RequestKey("request_id", str)


@web.middleware
async def request_id_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    request_id = requestids.accept(request.headers.get(requestids.HEADER))
    request[REQUEST_ID] = request_id
    requestids.use(request_id)  # this request's task and what it starts; aiohttp runs each in its own
    route = request.match_info.route.name or "unmatched"
    with tracing.request_span(f"{request.method} {route}", request_id, **{"http.request.method": request.method,
                              "http.route": route, "vidjobs.request_id": request_id}) as span:
        response = await handler(request)
        if span is not None:
            span.set_attribute("http.response.status_code", response.status)
        return response


async def stamp_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the id goes on every response, streams and errors included."""
    response.headers[requestids.HEADER] = request.get(REQUEST_ID) or requestids.current() or requestids.new()
