"""`GET /v1/account`: credit, limits, today's spend, the account's jobs in flight and what its kept clips hold;
`GET /v1/account/ledger`: every change of its credit, newest first; and `GET /v1/account/usage`: its jobs in
a time range, grouped. All through the caller's Tenant."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from aiohttp import web

from vidjobs.common.credits import Entry
from vidjobs.gateway import cursor, fallbacks, ratelimit
from vidjobs.gateway.account_usage import Grouping
from vidjobs.gateway.apierrors import ErrorOut, invalid, not_found
from vidjobs.gateway.bodies import (
    MAX_USAGE_RANGE_DAYS,
    AccountOut,
    AccountPatch,
    Credits,
    LedgerEntryOut,
    LedgerPage,
    LedgerQuery,
    Limits,
    StorageOut,
    UsageGroup,
    UsageQuery,
    UsageReport,
)
from vidjobs.gateway.decoding import read_json, read_query
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import gateway
from vidjobs.gateway.tenant import Tenant, tenant


async def get_account(request: web.Request) -> web.Response:
    # Reread rather than reuse the row auth loaded: credit may have moved since.
    owner = tenant(request)
    state = await owner.account()
    if state is None:
        raise not_found("account")
    use = await owner.storage_use()
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
                      max_queued_jobs=_own(found.max_queued_jobs, settings.max_queued_jobs),
                      max_open_streams=settings.max_streams_per_account,
                      max_open_streams_per_key=settings.max_streams_per_key,
                      max_uploads_per_day=settings.max_uploads_per_day, max_body_bytes=settings.max_body_bytes,
                      max_upload_bytes=settings.upload_max_bytes,
                      max_webhook_endpoints=settings.max_webhook_endpoints,
                      webhook_deliveries_in_flight=settings.webhook_deliveries_in_flight,
                      webhook_deliveries_per_minute=settings.webhook_deliveries_per_minute,
                      max_webhook_manual_retries=settings.max_webhook_manual_retries,
                      max_exports_in_flight=settings.max_exports_in_flight),
        spent_today=state.spent_today,
        active_jobs=state.active_jobs,
        queued_jobs=state.queued_jobs,
        uploads_today=state.uploads_today,
        fallback_models=found.fallback_models,
        storage=StorageOut(used_bytes=use.used_bytes, limit_bytes=use.limit_bytes, kept_jobs=use.kept_jobs),
    ))


async def patch_account(request: web.Request) -> web.Response:
    """The settings an account keeps for itself; answers the account as GET does."""
    gw = gateway(request)
    patch = await read_json(request, AccountPatch, gw.settings.max_body_bytes)
    if patch.fallback_models is not None:
        owner = tenant(request)
        await owner.set_fallback_models(fallbacks.account_default(gw.adapters, owner.resolve, patch.fallback_models))
    return await get_account(request)


def _own(value: int | None, default: int) -> int:
    return default if value is None else value


def entry_out(entry: Entry) -> LedgerEntryOut:
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
    return json_response(LedgerPage(data=[entry_out(e) for e in page], next_cursor=next_cursor))


DEFAULT_USAGE_DAYS = 30


def usage_range(query: UsageQuery) -> tuple[datetime, datetime]:
    """[from, to) as asked, defaults filled in; 422 naming the parameter when it is backwards or too long."""
    end = (query.to or datetime.now(UTC)).astimezone(UTC)
    start = (query.from_ or end - timedelta(days=DEFAULT_USAGE_DAYS)).astimezone(UTC)
    if start >= end:
        raise invalid(f"from: must be before to ({end.isoformat()})")
    if end - start > timedelta(days=MAX_USAGE_RANGE_DAYS):
        raise invalid(f"from: the range may span at most {MAX_USAGE_RANGE_DAYS} days; ask for it in parts")
    return start, end


# A time as text: the query's lenient conversion would otherwise read a bare number as seconds since 1970.
_ISO_TIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


async def get_usage(request: web.Request) -> web.Response:
    return await usage_report(request, tenant(request))


async def usage_report(request: web.Request, owner: Tenant) -> web.Response:
    """The usage report of `owner` as the request's query asks (its account's own, or one its platform reads)."""
    for name in ("from", "to"):
        if name in request.query and not _ISO_TIME.match(request.query[name]):
            raise invalid(f"{name}: must be an ISO-8601 time with its offset, such as 2026-01-31T00:00:00Z")
    query = read_query(request.query, UsageQuery)
    start, end = usage_range(query)
    groups, truncated = await owner.usage(Grouping.parse(query.group_by), start, end)
    return json_response(UsageReport(
        group_by=query.group_by, from_=start, to=end, truncated=truncated,
        data=[UsageGroup(key=g.key, jobs=g.jobs, by_status=g.by_status, credits_charged=g.credits_charged,
                         credits_reserved=g.credits_reserved, seconds_delivered=g.seconds_delivered)
              for g in groups]))


ROUTES = [
    Route("GET", "/v1/account", get_account, "get_account", "The caller's account",
          responses={200: AccountOut, 401: ErrorOut}),
    Route("PATCH", "/v1/account", patch_account, "update_account",
          "Change the account's own settings: its default fallback models", body=AccountPatch,
          responses={200: AccountOut, 400: ErrorOut, 401: ErrorOut, 413: ErrorOut, 415: ErrorOut, 422: ErrorOut}),
    Route("GET", "/v1/account/ledger", get_ledger, "get_ledger",
          "The account's credit ledger, newest first, keyset pagination", query=LedgerQuery,
          responses={200: LedgerPage, 400: ErrorOut, 401: ErrorOut, 422: ErrorOut}),
    Route("GET", "/v1/account/usage", get_usage, "get_usage",
          "The account's jobs created in a time range, grouped by model, UTC day or a metadata key: jobs by status, "
          "credits charged and held, seconds delivered", query=UsageQuery,
          responses={200: UsageReport, 400: ErrorOut, 401: ErrorOut, 422: ErrorOut}),
]
