"""`/v1/jobs`: create, read, list, cancel, delete, and the audit trail.

Every read and change goes through the caller's `Tenant`, which scopes it to the caller's account; job
creation runs in a transaction the Tenant opens and names the Tenant's account, never another."""

from __future__ import annotations

from collections.abc import Mapping

import asyncpg
import msgspec
from aiohttp import web

from vidjobs.common import creation, ratecard
from vidjobs.common.errors import ErrorCode, ProviderError, QueueFull, QuotaExhausted
from vidjobs.common.jobs import JobRequest, Lane
from vidjobs.common.settings import Settings
from vidjobs.common.states import JobStatus
from vidjobs.gateway import cursor, fallbacks, idempotency
from vidjobs.gateway.appwebhooks import urls
from vidjobs.gateway.bodies import (
    DEFAULT_JOB_EVENTS,
    CreateJob,
    EstimateOut,
    JobList,
    JobOut,
    ListQuery,
    Metadata,
    Trail,
    TransitionOut,
)
from vidjobs.gateway.decoding import nul_in, read_json, read_query
from vidjobs.gateway.errors import ApiError, ErrorOut, GatewayCode, invalid, not_found
from vidjobs.gateway.owned import found, job_id_of, owned_or_404, view
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import Gateway, gateway
from vidjobs.gateway.tenant import JobFilter, OwnedJob, Tenant, tenant
from vidjobs.providers import rollout
from vidjobs.providers.base import ProviderAdapter
from vidjobs.providers.registry import adapter_for

# What `vidjobs.common.ids` makes. Anything else cannot name a job, and must never reach a NATS subject.
QUEUE_RETRY_AFTER_S = 10  # a full queue: about when a place may have freed


def check_provider(adapters: dict[str, ProviderAdapter], request: JobRequest) -> None:
    try:
        adapter = adapter_for(adapters, request.provider)
    except ProviderError as err:
        known = ", ".join(sorted(adapters)) or "none"
        raise invalid(f"model: unknown provider {request.provider!r} (known: {known})") from err
    try:
        adapter.validate(request)
    except ProviderError as err:
        raise invalid(err.message) from err


async def check_input_image(owner: Tenant, request: JobRequest) -> None:
    """The named upload must be the caller's own and not deleted; anything else reads as "no such upload",
    so another account's upload id cannot even be confirmed to exist."""
    if request.input_image is None:
        return
    if await owner.upload(request.input_image) is None:
        raise invalid(f"input_image: no such upload {request.input_image!r}; upload the image with "
                      "POST /v1/uploads and name the id it answers")


def _job_events(body: CreateJob) -> list[str] | None:
    if body.webhook_url is None:
        return None
    return sorted(set(body.webhook_events or DEFAULT_JOB_EVENTS))


def routed(request: JobRequest, settings: Settings) -> tuple[JobRequest, str | None]:
    """A model alias becomes one of its real models, by the configured shares."""
    model, route = rollout.route(request.model, settings.model_routes)
    return (request if route is None else msgspec.structs.replace(request, model=model)), route


async def _create_once(gw: Gateway, owner: Tenant, checked: Checked, key: str | None) -> tuple[OwnedJob, bool]:
    """(job, created). Credit reservation, the job, and the idempotency key commit together or not at all."""
    body, request = checked.body, checked.request
    body_hash = idempotency.digest(body)
    ttl_s = gw.settings.idempotency_ttl_s
    async with owner.tx() as conn:
        if key is not None and (earlier := await idempotency.previous(conn, owner.account_id, key, body_hash,
                                                                       ttl_s)):
            return await _replayed(conn, owner, earlier), False
        card = await ratecard.current(conn)
        try:
            estimate = ratecard.estimate(card, request)
        except ratecard.Unpriced as err:
            raise invalid(f"model: {err}; choose another model or resolution") from err
        movable = fallbacks.within_quote(card, request, await _fallbacks(gw, owner, conn, checked), estimate,
                                         named=checked.fallbacks is not None)
        try:
            created = await creation.enqueue(conn, account_id=owner.account_id, request=request,
                                         estimated_credits=estimate, recovery_delay_s=gw.settings.recovery_delay_s,
                                         route=checked.route, rate_card_version=card.version,
                                         max_waiting=gw.settings.max_queued_jobs, metadata=body.metadata,
                                         webhook_url=body.webhook_url, webhook_events=_job_events(body),
                                         fallback_models=movable, max_wait_s=body.max_wait_s,
                                         lane=Lane.of(body.priority))
        except QuotaExhausted as err:
            raise ApiError(402, ErrorCode.QUOTA_EXHAUSTED, str(err)) from err
        except QueueFull as err:
            # Waiting helps: every job that starts frees a place.
            raise ApiError(429, GatewayCode.LIMIT_REACHED, str(err), retryable=True,
                           headers={"Retry-After": str(QUEUE_RETRY_AFTER_S)}) from err
        if key is not None:
            await idempotency.remember(conn, owner.account_id, key, body_hash, created.job.id, ttl_s)
        # Its place was counted as it was queued, under the account's lock: no second count.
        at_provider = await owner.place_at_provider(created.job, conn=conn)
        return OwnedJob(created.job, created.waiting_ahead + 1, provider_position=at_provider), True


async def _fallbacks(gw: Gateway, owner: Tenant, conn: asyncpg.Connection, checked: Checked) -> list[str]:
    """What the job names, else its account's default as it is now (read in the create's transaction)."""
    if checked.fallbacks is not None:
        return checked.fallbacks
    default = await owner.fallback_models(conn)
    return fallbacks.checked(gw.adapters, gw.settings, checked.request, None, default)


async def _replayed(conn: asyncpg.Connection, owner: Tenant, job_id: str) -> OwnedJob:
    job = await owner.job(job_id, conn=conn)
    if job is None:
        raise ApiError(409, GatewayCode.CONFLICT,
                       f"the job made with this {idempotency.HEADER} has been deleted; use a new key")
    return job


class Checked(msgspec.Struct, frozen=True):
    body: CreateJob
    request: JobRequest  # what the provider is asked for, an alias resolved
    route: str | None  # the alias it was chosen through
    # the real models it names to move to, each able to take `request` (the quote is checked later); None: it
    # names none, so it takes its account's default
    fallbacks: list[str] | None


async def checked_create(request: web.Request) -> Checked:
    """A create's body with every check a create makes before it writes anything (an estimate makes them too)."""
    gw, owner = gateway(request), tenant(request)
    body = await read_json(request, CreateJob, gw.settings.max_body_bytes)
    job_request, route = routed(body.to_request(), gw.settings)
    check_provider(gw.adapters, job_request)
    await check_input_image(owner, job_request)
    if body.webhook_url is not None:
        await urls.checked_url(body.webhook_url, gw.settings.allowed_webhook_hosts(), "webhook_url")
        # Made on purpose, not here: a secret made silently would be one its owner never saw.
        if not await owner.has_webhook_secret():
            raise invalid("webhook_url: deliveries to it are signed with your account's webhook secret, and the "
                          "account has none yet: make it first with POST /v1/account/webhook-secret (its answer "
                          "shows it, once)")
    named = None if body.fallback_models is None else fallbacks.checked(
        gw.adapters, gw.settings, job_request, body.fallback_models, [])
    return Checked(body, job_request, route, named)


async def create_job(request: web.Request) -> web.Response:
    gw, owner = gateway(request), tenant(request)
    checked = await checked_create(request)
    key = idempotency.key_from(request)
    try:
        job, created = await _create_once(gw, owner, checked, key)
    except idempotency.LostRace:
        # The winner has committed by now: answer as a replay of its request.
        job, created = await _create_once(gw, owner, checked, key)
    if created:
        job = await owner.estimated(job)  # made once the job is committed, from the reads the process shares
    headers = {"Location": f"/v1/jobs/{job.job.id}"}
    if not created:
        headers["Idempotent-Replayed"] = "true"  # the answer of the request that made the job, again
    return json_response(view(gw, job), status=201 if created else 200, headers=headers)


async def estimate_job(request: web.Request) -> web.Response:
    """The create's checks and price, without its writes: nothing is reserved, queued or remembered."""
    owner = tenant(request)
    checked = await checked_create(request)
    job_request = checked.request
    card = await owner.rate_card()
    try:
        price = ratecard.price_of(card, job_request.model, job_request.resolution)
    except ratecard.Unpriced as err:
        raise invalid(f"model: {err}; choose another model or resolution") from err
    estimate = ratecard.estimate(card, job_request)
    if checked.fallbacks is not None:
        fallbacks.within_quote(card, job_request, checked.fallbacks, estimate, named=True)
    state = await owner.account()
    available = 0 if state is None else state.account.credits_balance - state.account.credits_reserved
    return json_response(EstimateOut(
        model=job_request.model, estimated_credits=estimate, credits_per_second=price.credits_per_second,
        rate_card_version=card.version, available_credits=available, affordable=estimate <= available))


async def get_job(request: web.Request) -> web.Response:
    return json_response(view(gateway(request), await owned_or_404(request)))


METADATA_PARAM = "metadata."


def statuses_of(raw: str | None) -> list[JobStatus] | None:
    if raw is None:
        return None
    try:
        return sorted({JobStatus(part.strip()) for part in raw.split(",")})
    except ValueError:
        raise invalid(f"status: each of {raw!r} must be one of {', '.join(JobStatus)}, comma-separated") from None


def metadata_filter(query: Mapping[str, str]) -> dict[str, str]:
    """`metadata.<key>=<value>` parameters: the jobs must carry every one of these pairs."""
    wanted = {name.removeprefix(METADATA_PARAM): value for name, value in query.items()
              if name.startswith(METADATA_PARAM)}
    if (where := nul_in(wanted)) is not None:
        raise invalid(f"metadata.{where}: contains a NUL character (%00), which no parameter may hold", status=400)
    try:
        return msgspec.convert(wanted, Metadata)
    except msgspec.ValidationError as exc:
        raise invalid(f"metadata filter: {exc}; name it as metadata.<key>=<value>") from exc


async def list_jobs(request: web.Request) -> web.Response:
    gw = gateway(request)
    query = read_query({k: v for k, v in request.query.items() if not k.startswith(METADATA_PARAM)}, ListQuery)
    position = cursor.decode(query.cursor, cursor.JobPosition) if query.cursor else None
    wanted = JobFilter(statuses=statuses_of(query.status), model=query.model, metadata=metadata_filter(request.query),
                       created_after=query.created_after, created_before=query.created_before)
    rows = await tenant(request).jobs(wanted, after=(position.created_at, position.id) if position else None,
                                      limit=query.limit + 1)
    page = rows[: query.limit]
    last = page[-1].job if page else None
    more = len(rows) > query.limit
    next_cursor = cursor.encode(cursor.JobPosition(last.created_at, last.id)) if last and more else None
    return json_response(JobList(data=[view(gw, job) for job in page], next_cursor=next_cursor, has_more=more))


async def cancel_job(request: web.Request) -> web.Response:
    job = found(await tenant(request).cancel(job_id_of(request)))
    return json_response(view(gateway(request), job))


async def delete_job(request: web.Request) -> web.Response:
    if not await tenant(request).delete(job_id_of(request)):
        raise not_found()
    return web.Response(status=204)


async def job_events(request: web.Request) -> web.Response:
    rows = await tenant(request).trail(job_id_of(request))
    if rows is None:
        raise not_found()
    moves = [TransitionOut(from_=r["from_status"], to=r["to_status"], at=r["at"], reason=r["reason"]) for r in rows]
    return json_response(Trail(data=moves))


_JOB = "/v1/jobs/{job_id}"
_ERRORS: dict[int, type] = {401: ErrorOut, 404: ErrorOut}

ROUTES = [
    Route("POST", "/v1/estimates", estimate_job, "estimate_job",
          "What creating this job would reserve, checked as a create is, without creating anything",
          body=CreateJob, responses={200: EstimateOut, 400: ErrorOut, 401: ErrorOut, 413: ErrorOut, 415: ErrorOut,
                                     422: ErrorOut}),
    Route("POST", "/v1/jobs", create_job, "create_job", "Create a render job", body=CreateJob,
          headers={idempotency.HEADER: "repeat a request safely: same key and body answer the same job"},
          response_headers={
              200: {"Idempotent-Replayed": {"description": "`true`: the answer of the earlier request with this "
                                                           f"{idempotency.HEADER}", "schema": {"type": "string"}}},
              201: {"Location": {"description": "the new job", "schema": {"type": "string"}}}},
          responses={201: JobOut, 200: JobOut, 400: ErrorOut, 401: ErrorOut, 402: ErrorOut, 409: ErrorOut,
                     413: ErrorOut, 415: ErrorOut, 422: ErrorOut, 429: ErrorOut}),
    Route("GET", "/v1/jobs", list_jobs, "list_jobs", "The account's jobs, newest first", query=ListQuery,
          responses={200: JobList, 400: ErrorOut, 401: ErrorOut, 422: ErrorOut}),
    Route("GET", _JOB, get_job, "get_job", "One job", responses={200: JobOut, **_ERRORS}),
    Route("POST", f"{_JOB}/cancel", cancel_job, "cancel_job", "Cancel a job (unchanged if already finished)",
          responses={200: JobOut, **_ERRORS}),
    Route("DELETE", _JOB, delete_job, "delete_job", "Delete a job; its assets are removed in the background",
          responses={204: None, **_ERRORS}),
    Route("GET", f"{_JOB}/events", job_events, "job_events", "The job's audit trail",
          responses={200: Trail, **_ERRORS}),
]
