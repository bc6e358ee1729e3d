"""`Authorization: Bearer <key>` on every /v1 route except the ones the route table marks public, and the
key's request rate: a request over it is answered 429 with `Retry-After` (see `ratelimit`)."""

from __future__ import annotations

import math

from aiohttp import web
from aiohttp.typedefs import Handler

from vidjobs.common import logs
from vidjobs.common.errors import ErrorCode
from vidjobs.gateway import ratelimit
from vidjobs.gateway.apierrors import ApiError, GatewayCode
from vidjobs.gateway.state import ACCOUNT, API_KEY_ID, PUBLIC_ROUTES, gateway

_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="vidjobs"'}


def bearer_token(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def could_be_a_key(token: str) -> bool:
    # Keys are ASCII. Other header bytes arrive as text that cannot be encoded again to be hashed.
    return token.isascii()


def rate_limited(rate_per_s: float, burst: int, wait: int) -> ApiError:
    return ApiError(
        429, ErrorCode.RATE_LIMITED,
        f"too many requests: this API key may make {rate_per_s:g} requests per second "
        f"(bursts of {burst}); retry in {wait} s",
        retryable=True, headers={"Retry-After": str(wait)},
    )


async def authenticate(request: web.Request) -> ratelimit.Admission:
    """The key and its account, once one of the key's request tokens is spent (from memory, see
    `ratelimit`)."""
    token = bearer_token(request)
    if token is None:
        raise ApiError(401, GatewayCode.UNAUTHORIZED, "send your API key as `Authorization: Bearer <key>`",
                       headers=_CHALLENGE)
    admission = await gateway(request).buckets.admit(token) if could_be_a_key(token) else None
    if admission is None:
        raise ApiError(401, GatewayCode.UNAUTHORIZED, "unknown or revoked API key", headers=_CHALLENGE)
    request[RATE] = admission
    if not admission.admitted:
        raise rate_limited(admission.rate_per_s, admission.burst, admission.retry_after_s)
    return admission


# The key's bucket as this request left it, for the RateLimit headers of its answer.
RATE = web.RequestKey("rate", ratelimit.Admission)
_POLICY = '"per-key"'


async def stamp_rate_limit(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the IETF RateLimit headers on every answer to a request made with a key. The
    policy is the key's bucket: `q` requests at once, refilled in full over `w` seconds; `r` are left now,
    and all `q` again after `t` seconds."""
    admission = request.get(RATE)
    if admission is None:
        return
    window = max(1, math.ceil(admission.burst / admission.rate_per_s))
    response.headers["RateLimit-Policy"] = f"{_POLICY};q={admission.burst};w={window}"
    response.headers["RateLimit"] = f"{_POLICY};r={admission.remaining};t={admission.full_in_s}"


def needs_key(request: web.Request) -> bool:
    # Unmatched /v1 paths need a key too, so probing without one learns nothing about which routes exist.
    return request.path.startswith("/v1/") and request.match_info.route.name not in request.app[PUBLIC_ROUTES]


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if needs_key(request):
        admission = await authenticate(request)
        request[ACCOUNT] = admission.account
        logs.about_account(admission.account.id)
        request[API_KEY_ID] = admission.key_id
    return await handler(request)
