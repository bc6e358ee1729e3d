"""`GET /v1/account`: credit, limits and how many jobs are running."""

from __future__ import annotations

from aiohttp import web

from services.gateway import accounts
from services.gateway.bodies import AccountOut, Credits, Limits
from services.gateway.errors import ErrorOut, not_found
from services.gateway.routing import Route, json_response
from services.gateway.state import account, gateway


async def get_account(request: web.Request) -> web.Response:
    pool = gateway(request).rt.pool
    # Reread rather than reuse the row auth loaded: credit may have moved since.
    found = await accounts.fetch(pool, account(request).id)
    if found is None:
        raise not_found("account")
    return json_response(AccountOut(
        id=found.id,
        credits=Credits(balance=found.credits_balance, reserved=found.credits_reserved),
        limits=Limits(concurrent_jobs=found.concurrent_jobs),
        active_jobs=await accounts.active_jobs(pool, found.id),
    ))


ROUTES = [
    Route("GET", "/v1/account", get_account, "get_account", "The caller's account",
          responses={200: AccountOut, 401: ErrorOut}),
]
