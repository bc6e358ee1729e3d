"""`Authorization: Bearer <key>` on every /v1 route except the ones the route table marks public."""

from __future__ import annotations

from aiohttp import web

from services.gateway import accounts
from services.gateway.accounts import Account
from services.gateway.errors import ApiError, GatewayCode
from services.gateway.state import ACCOUNT, PUBLIC_ROUTES, gateway

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="vidjobs"'}


def bearer_token(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


async def authenticate(request: web.Request) -> Account:
    token = bearer_token(request)
    if token is None:
        raise ApiError(401, GatewayCode.UNAUTHORIZED, "send your API key as `Authorization: Bearer <key>`",
                       headers=_CHALLENGE)
    found = await accounts.by_key(gateway(request).rt.pool, token)
    if found is None:
        raise ApiError(401, GatewayCode.UNAUTHORIZED, "unknown or revoked API key", headers=_CHALLENGE)
    return found


def needs_key(request: web.Request) -> bool:
    # Unmatched /v1 paths need a key too, so probing without one learns nothing about which routes exist.
    return request.path.startswith("/v1/") and request.match_info.route.name not in request.app[PUBLIC_ROUTES]


@web.middleware
async def auth_middleware(request: web.Request, handler) -> web.StreamResponse:
    if needs_key(request):
        request[ACCOUNT] = await authenticate(request)
    return await handler(request)
