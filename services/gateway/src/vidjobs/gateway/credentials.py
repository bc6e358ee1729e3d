"""Who may call what: the three credentials and the one rule that admits each.

- An account's API key (`vj_…`) calls the account's routes: everything under /v1 but the platform's.
- A platform key (`vjp_…`) calls the platform routes its scopes allow (a route's `platform_scope`), and,
  with the `act` scope and `Vidjobs-Account: <account id>`, the account routes of one of its own accounts.
- A browser token (`vjt_…`) calls an account route whose `token_scope` it holds, for its own account, and
  sees only the jobs it names (when it names any). It may come as `?access_token=` on a GET, for
  EventSource; nothing else may.

Every refusal is 401 (no credential we know, or one that died) or 403 (a live credential that may not call
this route), and an account or job the credential may not reach answers 404, as if it did not exist.
tests/test_authorization.py walks the route table against every kind of credential.
"""

from __future__ import annotations

import math

from aiohttp import web

from vidjobs.common import logs
from vidjobs.common.errors import ErrorCode
from vidjobs.gateway import browsertokens, platformkeys, ratelimit
from vidjobs.gateway.apierrors import ApiError, GatewayCode, invalid, not_found
from vidjobs.gateway.platformkeys import PlatformKey, Scope
from vidjobs.gateway.processcaps import Bucket
from vidjobs.gateway.routetable import Access
from vidjobs.gateway.state import (
    ACCOUNT,
    API_KEY_ID,
    BROWSER_TOKEN,
    PLATFORM_KEY,
    ROUTE_ACCESS,
    Gateway,
    gateway,
)

ACTING_FOR = "Vidjobs-Account"  # the header naming the account a platform key acts for
QUERY_TOKEN = "access_token"  # a browser token on a GET, for EventSource (RFC 6750 section 2.3)
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="vidjobs"'}
_ANY_ROUTE = Access(platform_scope=None, token_scope="any")  # an unmatched path: 404 for any live credential
_TOKENS_ONLY = "this route shows a browser token its own grant; call it with the token"

# The key's bucket as this request left it, for the RateLimit headers of its answer.
RATE = web.RequestKey("rate", ratelimit.Admission)


def unauthorized(message: str) -> ApiError:
    return ApiError(401, GatewayCode.UNAUTHORIZED, message, headers=_CHALLENGE)


def forbidden(message: str) -> ApiError:
    return ApiError(403, GatewayCode.FORBIDDEN, message)


def rate_limited(rate_per_s: float, burst: int, wait: int, what: str = "API key") -> ApiError:
    return ApiError(
        429, ErrorCode.RATE_LIMITED,
        f"too many requests: this {what} may make {rate_per_s:g} requests per second "
        f"(bursts of {burst}); retry in {wait} s",
        retryable=True, headers={"Retry-After": str(wait)},
    )


def bearer_token(request: web.Request) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def _credential(request: web.Request) -> tuple[str, web.Request]:
    """The credential, and the request as handlers see it (without `access_token` in its query)."""
    header = bearer_token(request)
    query = request.query.getall(QUERY_TOKEN, [])
    if not query:
        if header is None:
            raise unauthorized("send your API key as `Authorization: Bearer <key>`")
        return header, request
    if header is not None or len(query) != 1:
        raise invalid(f"{QUERY_TOKEN}: send one credential, in the Authorization header or in {QUERY_TOKEN}",
                      status=400)
    if request.method not in ("GET", "HEAD") or not browsertokens.is_token(query[0]):
        raise unauthorized(f"{QUERY_TOKEN} carries a browser token on a GET only; send API and platform keys "
                           "as `Authorization: Bearer <key>`")
    return query[0], request.clone(rel_url=request.rel_url.without_query_params(QUERY_TOKEN))


async def admit(request: web.Request) -> web.Request:
    """The request with its caller set (ACCOUNT, API_KEY_ID, and PLATFORM_KEY or BROWSER_TOKEN), or the
    ApiError that refuses it."""
    access = request.app[ROUTE_ACCESS].get(request.match_info.route.name or "", _ANY_ROUTE)
    token, request = _credential(request)
    if not token.isascii():  # our credentials are ASCII; other header bytes cannot even be hashed
        raise unauthorized("unknown or revoked API key")
    if platformkeys.is_platform_key(token):
        await _as_platform(request, token, access)
    elif browsertokens.is_token(token):
        await _as_browser(request, token, access)
    else:
        await _as_account(request, token, access)
    return request


async def _as_account(request: web.Request, token: str, access: Access) -> None:
    gw = gateway(request)
    admission = await gw.buckets.admit(token)
    if admission is None:
        raise unauthorized("unknown or revoked API key")
    request[RATE] = admission
    if not admission.admitted:
        raise rate_limited(admission.rate_per_s, admission.burst, admission.retry_after_s)
    if access.platform_scope is not None:
        raise forbidden("this route is for a platform key (vjp_…); an account's API key may not call it")
    if not access.account:
        raise forbidden(_TOKENS_ONLY)
    named = request.headers.get(ACTING_FOR)
    if named is not None and named != admission.account.id:
        raise forbidden(f"{ACTING_FOR} names another account; an API key acts only for its own")
    request[ACCOUNT] = admission.account
    request[API_KEY_ID] = admission.key_id
    logs.about_account(admission.account.id)


def _spend(gw: Gateway, credential_id: str, rate_per_s: float, burst: int, what: str) -> None:
    bucket = gw.credential_rates.get(credential_id)
    if bucket is None:
        if len(gw.credential_rates) > 50_000:
            gw.credential_rates.clear()  # buckets of credentials gone quiet; a full one is what a new key gets
        bucket = gw.credential_rates[credential_id] = Bucket(rate_per_s, burst)
    if wait := bucket.take():
        raise rate_limited(rate_per_s, burst, wait, what)


async def _as_platform(request: web.Request, token: str, access: Access) -> None:
    gw = gateway(request)
    key = await gw.platform_keys.find(token)
    if key is None:
        raise unauthorized("unknown, expired or revoked platform key")
    _spend(gw, key.id, gw.settings.platform_rate_per_s, gw.settings.platform_rate_burst, "platform key")
    request[PLATFORM_KEY] = key
    if access is _ANY_ROUTE:
        return  # no such route (404), or not with this method (405): the same answer for every live credential
    if access.platform_scope is not None:
        if request.headers.get(ACTING_FOR) is not None:
            raise invalid(f"{ACTING_FOR}: a platform route names its account in its path", status=400)
        if access.platform_scope and access.platform_scope not in key.scopes:
            raise forbidden(f"this platform key lacks the `{access.platform_scope}` scope this route needs")
        logs.about_platform(key.id)
        return
    await _acting_for(request, key, access)


async def _acting_for(request: web.Request, key: PlatformKey, access: Access) -> None:
    named = request.headers.get(ACTING_FOR)
    if named is None:
        raise forbidden(f"a platform key calls an account's routes only for one of its accounts, named in "
                        f"`{ACTING_FOR}: <account id>`")
    if Scope.ACT not in key.scopes:
        raise forbidden(f"this platform key lacks the `{Scope.ACT}` scope acting for an account needs")
    if not access.account:
        raise forbidden(_TOKENS_ONLY)
    if len(named) > 100 or not named.isascii():
        raise not_found("account")
    account = await gateway(request).platform_accounts.account(key.platform_id, named)
    if account is None:
        raise not_found("account")  # another platform's account looks like none at all
    request[ACCOUNT] = account
    request[API_KEY_ID] = key.id
    logs.about_account(account.id, platform_key_id=key.id)


async def _as_browser(request: web.Request, token: str, access: Access) -> None:
    gw = gateway(request)
    try:
        claims = browsertokens.verify(gw.settings, token)
    except browsertokens.Refused as refused:
        raise unauthorized(str(refused)) from None
    grant = await gw.tokens.find(claims)
    if grant is None:
        raise unauthorized("this browser token is no longer valid (its issuer's key was revoked, or the account "
                           "closed); ask the app for a new one")
    rate, burst = ratelimit.limits_of(grant.account, gw.settings)
    _spend(gw, grant.id, rate, max(1, math.floor(burst)), "browser token")
    if access.platform_scope is not None or access.token_scope is None:
        raise forbidden("a browser token may not call this route")
    if access.token_scope != "any" and access.token_scope not in grant.scopes:
        raise forbidden(f"this browser token lacks the `{access.token_scope}` scope")
    job_id = request.match_info.get("job_id")
    if grant.job_ids is not None:
        if job_id is None and request.match_info.route.name == "list_jobs":
            raise forbidden("this browser token reads only the jobs it names; ask for each by its id")
        if job_id is not None and not grant.may_see(job_id):
            grant = await gw.tokens.find(claims, fresh=True)  # a job it made on another gateway a moment ago
            if grant is None or not grant.may_see(job_id):
                raise not_found()
    request[ACCOUNT] = grant.account
    request[API_KEY_ID] = grant.id
    request[BROWSER_TOKEN] = grant
    logs.about_account(grant.account.id, browser_token_id=grant.id)
