"""`POST /v1/account/tokens`: a browser token the account mints for one of its people's browsers
(browsertokens.py); its platform mints one with `POST /v1/platform/accounts/{account_id}/tokens`. Both are
checked here: the jobs a token names must be the account's, and `create` with a ceiling."""

from __future__ import annotations

from aiohttp import web

from vidjobs.gateway.apierrors import ErrorOut, invalid
from vidjobs.gateway.browsertokens import Grant, TokenScope
from vidjobs.gateway.decoding import read_optional_json
from vidjobs.gateway.platform_bodies import NewToken, TokenGrantOut, TokenOut
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import API_KEY_ID, BROWSER_TOKEN, PLATFORM_KEY, gateway
from vidjobs.gateway.tenant import tenant


async def minted(request: web.Request, account_id: str, body: NewToken, *, issuer_kind: str,
                 issuer_key_id: str) -> web.Response:
    gw = gateway(request)
    scopes = sorted(set(body.scopes))
    if body.credit_ceiling is not None and TokenScope.CREATE not in scopes:
        raise invalid("credit_ceiling: a ceiling limits what the token's creates reserve; add `create` to scopes")
    jobs = None if body.jobs is None else sorted(set(body.jobs))
    if jobs:
        owned = await gw.platform_accounts.owned_jobs(account_id, jobs)
        if missing := [j for j in jobs if j not in owned]:
            raise invalid(f"jobs: {', '.join(missing[:5])} {'is' if len(missing) == 1 else 'are'} not a job of "
                          "this account")
    grant = Grant(scopes=scopes, job_ids=jobs, credit_ceiling=body.credit_ceiling, ttl_s=body.ttl_s)
    token_id, token, expires_at = await gw.platform_accounts.mint_token(account_id, grant, issuer_kind=issuer_kind,
                                                                        issuer_key_id=issuer_key_id)
    return json_response(TokenOut(id=token_id, token=token, account_id=account_id, scopes=[s.value for s in scopes],
                                  jobs=jobs, credit_ceiling=body.credit_ceiling, expires_at=expires_at),
                         status=201, headers={"Cache-Control": "no-store"})


async def create_token(request: web.Request) -> web.Response:
    gw = gateway(request)
    body = await read_optional_json(request, NewToken, gw.settings.max_body_bytes)
    owner = tenant(request)
    # A platform acting for the account issues it as the platform: it dies with the platform's key.
    platform = request.get(PLATFORM_KEY)
    return await minted(request, owner.account_id, body,
                        issuer_kind="api_key" if platform is None else "platform_key",
                        issuer_key_id=request[API_KEY_ID])


async def get_token(request: web.Request) -> web.Response:
    """The calling token's own grant: what a page may offer (create, upload) and until when."""
    grant = request[BROWSER_TOKEN]
    used = await gateway(request).platform_accounts.token_credits_used(grant.id)
    return json_response(TokenGrantOut(
        id=grant.id, account_id=grant.account.id, scopes=sorted(s.value for s in grant.scopes),
        jobs=None if grant.job_ids is None else sorted(grant.job_ids), credit_ceiling=grant.credit_ceiling,
        credits_used=used, expires_at=grant.expires_at))


ROUTES = [
    Route("GET", "/v1/token", get_token, "get_token",
          "The calling browser token's own grant: its scopes, jobs, credit ceiling and what its creates used, "
          "and its expiry", token_scope="any", account=False,
          responses={200: TokenGrantOut, 401: ErrorOut, 403: ErrorOut}),
    Route("POST", "/v1/account/tokens", create_token, "create_account_token",
          "A short-lived browser token for this account: read and stream its jobs (or some), optionally create "
          "jobs within a credit ceiling and upload images", body=NewToken, body_required=False,
          responses={201: TokenOut, 400: ErrorOut, 401: ErrorOut, 403: ErrorOut, 413: ErrorOut, 415: ErrorOut,
                     422: ErrorOut}),
]
