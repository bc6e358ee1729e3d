"""`GET /v1/account`: credit, limits, today's spend and the account's jobs in flight; and
`GET /v1/account/ledger`: every change of its credit, newest first. Both through the caller's Tenant."""

from __future__ import annotations

from aiohttp import web

from vidjobs.common.credits import Entry
from vidjobs.gateway import cursor, fallbacks, ratelimit
from vidjobs.gateway.apierrors import ErrorOut, not_found
from vidjobs.gateway.bodies import AccountOut, AccountPatch, Credits, LedgerEntryOut, LedgerPage, LedgerQuery, Limits
from vidjobs.gateway.decoding import read_json, read_query
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import gateway
from vidjobs.gateway.tenant import tenant


async def get_account(request: web.Request) -> web.Response:
    # Reread rather than reuse the row auth loaded: credit may have moved since.
    state = await tenant(request).account()
    if state is None:
        raise not_found("account")
    found = state.account
    settings = gateway(request).settings
    rate, burst = ratelimit.limits_of(found, settings)
    return json_response(AccountOut(
        id=found.id,
        name=found.name,
        credits=Credits(balance=found.credits_balance, reserved=found.credits_reserved,
                        available=found.credits_balance - found.credits_reserved),
        limits=Limits(concurrent_jobs=found.concurrent_jobs, daily_spend_cap=found.daily_spend_cap,
                      max_job_credits=found.max_job_credits, requests_per_s=rate, request_burst=burst,
                      max_queued_jobs=settings.max_queued_jobs, max_open_streams=settings.max_streams_per_account,
                      max_open_streams_per_key=settings.max_streams_per_key,
                      max_uploads_per_day=settings.max_uploads_per_day, max_body_bytes=settings.max_body_bytes,
                      max_upload_bytes=settings.upload_max_bytes,
                      max_webhook_endpoints=settings.max_webhook_endpoints,
                      webhook_deliveries_in_flight=settings.webhook_deliveries_in_flight,
                      webhook_deliveries_per_minute=settings.webhook_deliveries_per_minute,
                      max_webhook_manual_retries=settings.max_webhook_manual_retries),
        spent_today=state.spent_today,
        active_jobs=state.active_jobs,
        queued_jobs=state.queued_jobs,
        uploads_today=state.uploads_today,
        fallback_models=found.fallback_models,
    ))


async def patch_account(request: web.Request) -> web.Response:
    """The settings an account keeps for itself; answers the account as GET does."""
    gw = gateway(request)
    patch = await read_json(request, AccountPatch, gw.settings.max_body_bytes)
    if patch.fallback_models is not None:
        await tenant(request).set_fallback_models(fallbacks.account_default(gw.adapters, gw.settings,
                                                                            patch.fallback_models))
    return await get_account(request)


def _entry_out(entry: Entry) -> LedgerEntryOut:
    return LedgerEntryOut(id=entry.id, kind=entry.kind, job_id=entry.job_id, balance_change=entry.balance_change,
                          reserved_change=entry.reserved_change, balance_after=entry.balance_after,
                          reserved_after=entry.reserved_after, note=entry.note, at=entry.at,
                          absorbed=entry.absorbed)


async def get_ledger(request: web.Request) -> web.Response:
    query = read_query(request.query, LedgerQuery)
    before_id = cursor.decode(query.cursor, cursor.LedgerPosition).id if query.cursor else None
    entries = await tenant(request).ledger(before_id=before_id, limit=query.limit + 1)
    page = entries[: query.limit]
    next_cursor = cursor.encode(cursor.LedgerPosition(page[-1].id)) if len(entries) > query.limit else None
    return json_response(LedgerPage(data=[_entry_out(e) for e in page], next_cursor=next_cursor))


ROUTES = [
    Route("GET", "/v1/account", get_account, "get_account", "The caller's account",
          responses={200: AccountOut, 401: ErrorOut}),
    Route("PATCH", "/v1/account", patch_account, "update_account",
          "Change the account's own settings: its default fallback models", body=AccountPatch,
          responses={200: AccountOut, 400: ErrorOut, 401: ErrorOut, 413: ErrorOut, 415: ErrorOut, 422: ErrorOut}),
    Route("GET", "/v1/account/ledger", get_ledger, "get_ledger",
          "The account's credit ledger, newest first, keyset pagination", query=LedgerQuery,
          responses={200: LedgerPage, 400: ErrorOut, 401: ErrorOut, 422: ErrorOut}),
]
