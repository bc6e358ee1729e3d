"""`/v1/platform/...`: what a product's backend does with a platform key (docs/INTEGRATING.md): make an
account for each of its users, change their limits and plans, disable and delete them, grant and take back
their credit, issue their API keys and browser tokens, read their usage and the audit trail. Every handler
goes through `PlatformAccounts`, which names the calling platform in every query."""

from __future__ import annotations

import re
from typing import Any

import msgspec
from aiohttp import web

from vidjobs.common import requestids
from vidjobs.common.credits import Entry
from vidjobs.gateway import cursor, fallbacks
from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode, invalid, not_found
from vidjobs.gateway.bodies import Credits, LedgerPage, LedgerQuery, UsageQuery, UsageReport
from vidjobs.gateway.credentials import bearer_token
from vidjobs.gateway.decoding import read_json, read_optional_json, read_query
from vidjobs.gateway.platform_accounts import (
    ACCOUNT_LIMITS,
    IdempotencyReused,
    NoSuchPlan,
    PlatformAccount,
    ReservedCredit,
)
from vidjobs.gateway.platform_bodies import (
    AuditEntryOut,
    AuditPage,
    AuditQuery,
    CreatePlatformAccount,
    CreditChange,
    CreditChangeOut,
    DeletedAccountOut,
    DisableAccount,
    DisabledOut,
    KeyList,
    KeyOut,
    NewKey,
    NewKeyOut,
    NewToken,
    PatchPlatformAccount,
    Plan,
    PlanList,
    PlanOut,
    PlatformAccountOut,
    PlatformAccountPage,
    PlatformAccountsQuery,
    PlatformLimitsOut,
    PlatformOut,
    TokenOut,
)
from vidjobs.gateway.platformkeys import PlatformKey, Scope
from vidjobs.gateway.routes_account import entry_out, usage_report
from vidjobs.gateway.routes_tokens import minted
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import AUDITED_ACCOUNT, PLATFORM_KEY, gateway
from vidjobs.gateway.tenant import Tenant

_ACCOUNT_ID = "{account_id}"
_PLAN = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
_ID_CHARS = 100


def caller(request: web.Request) -> PlatformKey:
    return request[PLATFORM_KEY]


def account_out(found: PlatformAccount) -> PlatformAccountOut:
    a = found.account
    return PlatformAccountOut(
        id=a.id, external_id=a.external_id, name=a.name, plan=a.plan,
        status="disabled" if a.disabled_at is not None else "active", disabled_at=a.disabled_at,
        created_at=found.created_at,
        credits=Credits(balance=a.credits_balance, reserved=a.credits_reserved,
                        available=a.credits_balance - a.credits_reserved),
        limits=PlatformLimitsOut(concurrent_jobs=a.concurrent_jobs, max_queued_jobs=a.max_queued_jobs,
                                 daily_spend_cap=a.daily_spend_cap, max_job_credits=a.max_job_credits,
                                 requests_per_s=a.requests_per_s, request_burst=a.request_burst,
                                 storage_quota_bytes=a.storage_quota_bytes),
        fallback_models=list(a.fallback_models))


def _account_id(request: web.Request) -> str:
    account_id = request.match_info["account_id"]
    if len(account_id) > _ID_CHARS or not account_id.startswith("acct_"):
        raise not_found("account")
    return account_id


async def _found(request: web.Request) -> PlatformAccount:
    found = await gateway(request).platform_accounts.get(caller(request).platform_id, _account_id(request))
    if found is None:
        raise not_found("account")
    return found


def _limits(request: web.Request, body: msgspec.Struct, account_id: str = "") -> dict[str, Any]:
    """The limits a body sets (those it names), fallbacks checked against the models we offer."""
    gw = gateway(request)
    named = {f: getattr(body, f) for f in ACCOUNT_LIMITS if getattr(body, f, msgspec.UNSET) is not msgspec.UNSET}
    if "fallback_models" in named:
        named["fallback_models"] = fallbacks.account_default(
            gw.adapters, lambda m: gw.routes.route(m, account_id)[0], named["fallback_models"])
    return named


def _no_plan(err: NoSuchPlan) -> ApiError:
    return invalid(str(err))


async def who_am_i(request: web.Request) -> web.Response:
    key = caller(request)
    return json_response(PlatformOut(platform_id=key.platform_id, platform=key.platform_name, key_id=key.id,
                                     scopes=sorted(key.scopes)))


async def create_account(request: web.Request) -> web.Response:
    gw = gateway(request)
    body = await read_json(request, CreatePlatformAccount, gw.settings.max_body_bytes)
    try:
        found, created = await gw.platform_accounts.create(caller(request).platform_id, body.external_id, body.name,
                                                           body.plan, _limits(request, body))
    except NoSuchPlan as err:
        raise _no_plan(err) from err
    request[AUDITED_ACCOUNT] = found.account.id
    return json_response(account_out(found), status=201 if created else 200,
                         headers={"Location": f"/v1/platform/accounts/{found.account.id}"})


async def list_accounts(request: web.Request) -> web.Response:
    query = read_query(request.query, PlatformAccountsQuery)
    position = cursor.decode(query.cursor, cursor.JobPosition) if query.cursor else None
    rows = await gateway(request).platform_accounts.page(
        caller(request).platform_id, query.external_id,
        (position.created_at, position.id) if position else None, query.limit + 1)
    page = rows[: query.limit]
    more = len(rows) > query.limit
    next_cursor = cursor.encode(cursor.JobPosition(page[-1].created_at, page[-1].account.id)) if more else None
    return json_response(PlatformAccountPage(data=[account_out(r) for r in page], next_cursor=next_cursor))


async def get_account(request: web.Request) -> web.Response:
    return json_response(account_out(await _found(request)))


async def update_account(request: web.Request) -> web.Response:
    gw = gateway(request)
    account_id = _account_id(request)
    body = await read_json(request, PatchPlatformAccount, gw.settings.max_body_bytes)
    changes = _limits(request, body, account_id)
    if body.name is not msgspec.UNSET:
        changes["name"] = body.name
    plan = None if body.plan is msgspec.UNSET else body.plan
    try:
        found = await gw.platform_accounts.update(caller(request).platform_id, account_id, changes, plan)
    except NoSuchPlan as err:
        raise _no_plan(err) from err
    if found is None:
        raise not_found("account")
    return json_response(account_out(found))


async def disable_account(request: web.Request) -> web.Response:
    gw = gateway(request)
    body = await read_optional_json(request, DisableAccount, gw.settings.max_body_bytes)
    done = await gw.platform_accounts.set_disabled(caller(request).platform_id, _account_id(request), True,
                                                   stop_running=body.running == "stop", reason=body.reason)
    if done is None:
        raise not_found("account")
    return json_response(DisabledOut(account=account_out(done[0]), jobs_canceled=done[1]))


async def enable_account(request: web.Request) -> web.Response:
    done = await gateway(request).platform_accounts.set_disabled(caller(request).platform_id,
                                                                 _account_id(request), False)
    if done is None:
        raise not_found("account")
    return json_response(account_out(done[0]))


async def delete_account(request: web.Request) -> web.Response:
    """Close the account now; its rows and objects are purged once its jobs have ended (purges.py)."""
    gw = gateway(request)
    account_id = _account_id(request)
    closed = await gw.platform_accounts.close(caller(request).platform_id, account_id)
    if closed is None:
        raise not_found("account")
    gw.poke_purges()
    return json_response(DeletedAccountOut(id=account_id, status="deleting", keys_revoked=closed[0],
                                           jobs_canceled=closed[1]), status=202)


async def change_credit(request: web.Request) -> web.Response:
    gw = gateway(request)
    account_id = _account_id(request)
    body = await read_json(request, CreditChange, gw.settings.max_body_bytes)
    amount = body.amount if body.action == "grant" else -body.amount
    note = body.reason or ("credit granted" if amount > 0 else "credit taken back")
    token = bearer_token(request) or ""  # the key itself: platform_credit checks it
    try:
        done = await gw.platform_accounts.credit(token, account_id, amount, body.idempotency_key, note,
                                                 requestids.current() or "")
    except ReservedCredit as err:
        raise ApiError(409, GatewayCode.CONFLICT, f"amount: cannot take back {body.amount} credits; that would "
                       "leave less than the account has reserved for its running jobs") from err
    except IdempotencyReused as err:
        raise ApiError(409, GatewayCode.CONFLICT, f"idempotency_key: {err}; use a new key for a new change") from err
    if done is None:
        raise not_found("account")
    entry, replayed = done
    found = await _found(request)
    return json_response(CreditChangeOut(entry=entry_out(entry), replayed=replayed,
                                         credits=account_out(found).credits),
                         status=200 if replayed else 201)


async def get_ledger(request: web.Request) -> web.Response:
    found = await _found(request)
    query = read_query(request.query, LedgerQuery)
    before_id = cursor.decode(query.cursor, cursor.LedgerPosition).id if query.cursor else None
    entries: list[Entry] = await gateway(request).platform_accounts.ledger(found.account.id, before_id=before_id,
                                                                           limit=query.limit + 1)
    page = entries[: query.limit]
    next_cursor = cursor.encode(cursor.LedgerPosition(page[-1].id)) if len(entries) > query.limit else None
    return json_response(LedgerPage(data=[entry_out(e) for e in page], next_cursor=next_cursor))


async def get_usage(request: web.Request) -> web.Response:
    found = await _found(request)
    gw = gateway(request)
    return await usage_report(request, Tenant(gw.rt, found.account.id, gw.estimator, gw.adapters, gw.routes))


def _key_out(info: Any) -> dict[str, Any]:
    return {"id": info.id, "name": info.name, "prefix": info.prefix, "created_at": info.created_at,
            "last_used_at": info.last_used_at, "revoked_at": info.revoked_at}


async def create_key(request: web.Request) -> web.Response:
    gw = gateway(request)
    found = await _found(request)
    body = await read_optional_json(request, NewKey, gw.settings.max_body_bytes)
    info, key = await gw.platform_accounts.create_key(found.account.id, body.name)
    return json_response(NewKeyOut(key=key, **_key_out(info)), status=201)


async def list_keys(request: web.Request) -> web.Response:
    found = await _found(request)
    keys = await gateway(request).platform_accounts.keys(found.account.id)
    return json_response(KeyList(data=[KeyOut(**_key_out(k)) for k in keys]))


async def revoke_key(request: web.Request) -> web.Response:
    found = await _found(request)
    key_id = request.match_info["key_id"]
    if len(key_id) > _ID_CHARS or not await gateway(request).platform_accounts.revoke_key(found.account.id, key_id):
        raise not_found("API key")
    return web.Response(status=204)


async def create_token(request: web.Request) -> web.Response:
    gw = gateway(request)
    found = await _found(request)
    body = await read_optional_json(request, NewToken, gw.settings.max_body_bytes)
    return await minted(request, found.account.id, body, issuer_kind="platform_key", issuer_key_id=caller(request).id)


async def put_plan(request: web.Request) -> web.Response:
    gw = gateway(request)
    name = request.match_info["plan"]
    if not _PLAN.match(name):
        raise invalid("plan: a plan's name is 1-40 of a-z, 0-9, `_` and `-`, starting with a letter or digit")
    body = await read_json(request, Plan, gw.settings.max_body_bytes)
    limits = msgspec.structs.asdict(body)
    limits["fallback_models"] = fallbacks.account_default(gw.adapters, lambda m: gw.routes.route(m, "")[0],
                                                          body.fallback_models)
    plan = await gw.platform_accounts.put_plan(caller(request).platform_id, name, limits)
    return json_response(PlanOut(**msgspec.structs.asdict(plan)))


async def list_plans(request: web.Request) -> web.Response:
    plans = await gateway(request).platform_accounts.plans(caller(request).platform_id)
    return json_response(PlanList(data=[PlanOut(**msgspec.structs.asdict(p)) for p in plans]))


async def get_audit(request: web.Request) -> web.Response:
    query = read_query(request.query, AuditQuery)
    before_id = cursor.decode(query.cursor, cursor.LedgerPosition).id if query.cursor else None
    lines = await gateway(request).platform_accounts.audit_trail(
        caller(request).platform_id, account_id=query.account_id, before_id=before_id, limit=query.limit + 1)
    page = lines[: query.limit]
    next_cursor = cursor.encode(cursor.LedgerPosition(page[-1].id)) if len(lines) > query.limit else None
    return json_response(AuditPage(data=[AuditEntryOut(**msgspec.structs.asdict(line)) for line in page],
                                   next_cursor=next_cursor))


_ERRORS = {400: ErrorOut, 401: ErrorOut, 403: ErrorOut}
_BODY_ERRORS = {**_ERRORS, 413: ErrorOut, 415: ErrorOut, 422: ErrorOut}
_A = f"/v1/platform/accounts/{_ACCOUNT_ID}"


def _route(method: str, path: str, handler: Any, name: str, summary: str, scope: Scope | str, *,
           responses: dict[int, Any], **more: Any) -> Route:
    return Route(method, path, handler, name, summary, platform_scope=str(scope), responses=responses, **more)


ROUTES = [
    _route("GET", "/v1/platform", who_am_i, "get_platform", "The platform key's platform and scopes", "",
           responses={200: PlatformOut, **_ERRORS}),
    _route("POST", "/v1/platform/accounts", create_account, "create_platform_account",
           "Make the account of one of your users (201), or answer the one made for its external_id (200)",
           Scope.ACCOUNTS, body=CreatePlatformAccount,
           responses={201: PlatformAccountOut, 200: PlatformAccountOut, **_BODY_ERRORS}),
    _route("GET", "/v1/platform/accounts", list_accounts, "list_platform_accounts",
           "Your accounts, oldest first, keyset pagination; `external_id` finds one user's", Scope.ACCOUNTS,
           query=PlatformAccountsQuery, responses={200: PlatformAccountPage, **_ERRORS, 422: ErrorOut}),
    _route("GET", _A, get_account, "get_platform_account", "One of your accounts", Scope.ACCOUNTS,
           responses={200: PlatformAccountOut, **_ERRORS, 404: ErrorOut}),
    _route("PATCH", _A, update_account, "update_platform_account",
           "Change an account's name, limits or plan", Scope.ACCOUNTS, body=PatchPlatformAccount,
           responses={200: PlatformAccountOut, **_BODY_ERRORS, 404: ErrorOut}),
    _route("POST", f"{_A}/disable", disable_account, "disable_platform_account",
           "Disable an account: its waiting jobs are canceled and their credit released; running ones finish or "
           "are stopped", Scope.ACCOUNTS, body=DisableAccount, body_required=False,
           responses={200: DisabledOut, **_BODY_ERRORS, 404: ErrorOut}),
    _route("POST", f"{_A}/enable", enable_account, "enable_platform_account", "Enable a disabled account again",
           Scope.ACCOUNTS, responses={200: PlatformAccountOut, **_ERRORS, 404: ErrorOut}),
    _route("DELETE", _A, delete_account, "delete_platform_account",
           "Delete an account: closed now (keys revoked, live jobs canceled), then its rows and stored objects "
           "are purged", Scope.ACCOUNTS, responses={202: DeletedAccountOut, **_ERRORS, 404: ErrorOut}),
    _route("POST", f"{_A}/credits", change_credit, "change_platform_account_credit",
           "Grant or take back credit, once per idempotency_key", Scope.CREDITS, body=CreditChange,
           responses={201: CreditChangeOut, 200: CreditChangeOut, **_BODY_ERRORS, 404: ErrorOut, 409: ErrorOut}),
    _route("GET", f"{_A}/ledger", get_ledger, "get_platform_account_ledger",
           "An account's credit ledger, newest first", Scope.CREDITS, query=LedgerQuery,
           responses={200: LedgerPage, **_ERRORS, 404: ErrorOut, 422: ErrorOut}),
    _route("GET", f"{_A}/usage", get_usage, "get_platform_account_usage",
           "An account's jobs in a time range, grouped (as GET /v1/account/usage)", Scope.USAGE, query=UsageQuery,
           responses={200: UsageReport, **_ERRORS, 404: ErrorOut, 422: ErrorOut}),
    _route("POST", f"{_A}/keys", create_key, "create_platform_account_key",
           "Issue an API key for an account; shown once", Scope.KEYS, body=NewKey, body_required=False,
           responses={201: NewKeyOut, **_BODY_ERRORS, 404: ErrorOut}),
    _route("GET", f"{_A}/keys", list_keys, "list_platform_account_keys", "An account's API keys (never the keys)",
           Scope.KEYS, responses={200: KeyList, **_ERRORS, 404: ErrorOut}),
    _route("DELETE", f"{_A}/keys/{{key_id}}", revoke_key, "revoke_platform_account_key",
           "Revoke one of an account's API keys (its browser tokens die with it)", Scope.KEYS,
           responses={204: None, **_ERRORS, 404: ErrorOut}),
    _route("POST", f"{_A}/tokens", create_token, "create_platform_account_token",
           "A short-lived browser token for one of your accounts", Scope.TOKENS, body=NewToken,
           body_required=False, responses={201: TokenOut, **_BODY_ERRORS, 404: ErrorOut}),
    _route("PUT", "/v1/platform/plans/{plan}", put_plan, "put_platform_plan",
           "Make or change a plan; every account on it takes its limits at once", Scope.ACCOUNTS, body=Plan,
           responses={200: PlanOut, **_BODY_ERRORS}),
    _route("GET", "/v1/platform/plans", list_plans, "list_platform_plans", "Your plans", Scope.ACCOUNTS,
           responses={200: PlanList, **_ERRORS}),
    _route("GET", "/v1/platform/audit", get_audit, "get_platform_audit",
           "Every change your platform keys made, newest first", "", query=AuditQuery,
           responses={200: AuditPage, **_ERRORS, 422: ErrorOut}),
]
