"""Request metrics and the access log: one line per request (who asked what, how it was answered, how long it
took) and counters whose labels are bounded: the route's name from the table (never the raw path, which holds
job ids), the method, and the status code."""

from __future__ import annotations

import logging
import time

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import Counter, Histogram

from vidjobs.gateway.state import ACCOUNT

log = logging.getLogger("vidjobs.access")

REQUESTS = Counter("vidjobs_http_requests_total", "HTTP requests answered by the gateway",
                   ["route", "method", "status"])
LATENCY = Histogram(
    "vidjobs_http_request_seconds", "Time to answer an HTTP request (a stream counts until it closes)",
    ["route", "method"], buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 60, 600),
)

_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def route_label(request: web.Request) -> str:
    return request.match_info.route.name or "unmatched"


@web.middleware
async def metrics_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
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
        method = request.method if request.method in _METHODS else "other"
        route = route_label(request)
        took = time.perf_counter() - started
        REQUESTS.labels(route, method, str(status)).inc()
        LATENCY.labels(route, method).observe(took)
        account = request.get(ACCOUNT)
        log.info("request", extra={"method": request.method, "route": route, "path": request.path,
                                   "status": status, "ms": round(took * 1000, 1),
                                   "account_id": account.id if account is not None else None})
