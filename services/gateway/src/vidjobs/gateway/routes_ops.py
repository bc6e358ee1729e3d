"""Operations: liveness, readiness (database and NATS reachable) and Prometheus metrics."""

from __future__ import annotations

import logging

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode
from vidjobs.gateway.bodies import Health
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import gateway

log = logging.getLogger("vidjobs.gateway")


async def healthz(_: web.Request) -> web.Response:
    return json_response(Health(status="ok"))


async def readyz(request: web.Request) -> web.Response:
    # The API keeps serving while its app-webhook consumer is down (a watched task: its death still fails
    # the process); the consumers are in /readyz on the metrics port.
    why = await gateway(request).rt.readiness(pulls=False)
    if why is not None:
        log.warning("not ready", extra={"why": why})
        raise ApiError(503, GatewayCode.NOT_READY, why, retryable=True)
    return json_response(Health(status="ready"))


async def metrics(_: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


ROUTES = [
    Route("GET", "/healthz", healthz, "healthz", "The process is up", auth=False, responses={200: Health}),
    Route("GET", "/readyz", readyz, "readyz", "Database and NATS are reachable", auth=False,
          responses={200: Health, 503: ErrorOut}),
    Route("GET", "/metrics", metrics, "metrics", "Prometheus metrics", auth=False,
          responses={200: "text/plain"}),
]
