"""A credential on every /v1 route except the ones the route table marks public (credentials.py says which
credential may call what), the RateLimit headers of an API key's answers, and the audit line of every
change a platform key makes."""

from __future__ import annotations

import math

from aiohttp import web
from aiohttp.typedefs import Handler

from vidjobs.gateway import audit, credentials
from vidjobs.gateway.apierrors import ApiError
from vidjobs.gateway.state import ACCOUNT, AUDITED_ACCOUNT, PLATFORM_KEY, PUBLIC_ROUTES, gateway

_POLICY = '"per-key"'


async def stamp_rate_limit(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: the IETF RateLimit headers on every answer to a request made with a key. The
    policy is the key's bucket: `q` requests at once, refilled in full over `w` seconds; `r` are left now,
    and all `q` again after `t` seconds."""
    admission = request.get(credentials.RATE)
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
    """Who is asking (an account's API key, a platform key, a browser token), and whether the route lets that
    credential in (credentials.py). A platform key's changes are written to its audit trail as answered."""
    if not needs_key(request):
        return await handler(request)
    request = await credentials.admit(request)
    caller = request.get(PLATFORM_KEY)
    if caller is None or request.method in ("GET", "HEAD"):
        return await handler(request)
    status = 500
    try:
        response = await handler(request)
        status = response.status
        return response
    except ApiError as err:
        status = err.status
        raise
    except web.HTTPException as exc:
        status = exc.status
        raise
    finally:
        account = request.get(ACCOUNT)
        await audit.record(gateway(request).rt.pool, caller, action=request.match_info.route.name or "unmatched",
                           account_id=account.id if account is not None
                           else request.get(AUDITED_ACCOUNT) or request.match_info.get("account_id"),
                           target=f"{request.method} {request.path}", status=status)
