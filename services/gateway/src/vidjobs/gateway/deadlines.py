"""Every database call a request makes keeps to VIDJOBS_DB_CALL_TIMEOUT_S (vidjobs.common.dbcalls): a database
that stops answering costs a client that long, then a 503 `unavailable` with Retry-After (apierrors), rather
than a request held for as long as the stall lasts and a pool that every other request queues behind."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from vidjobs.common import dbcalls
from vidjobs.gateway.state import SETTINGS


@web.middleware
async def call_bound_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    with dbcalls.bounded(request.app[SETTINGS].db_call_timeout_s):
        return await handler(request)
