"""`/v1/jobs`: create, read, list, cancel, delete, and the audit trail.

Every read and change goes through the caller's `Tenant`, which scopes it to the caller's account. A create
is read and checked here, made by one call of `Tenant.create` (its whole transaction, for the Tenant's
account and no other), and rendered."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from aiohttp import web

from vidjobs.common import ratecard
from vidjobs.common.errors import ErrorCode, ProviderError, QueueFull, QuotaExhausted
from vidjobs.common.jobs import JobRequest, Lane
from vidjobs.common.states import JobStatus
from vidjobs.common.uploads import UploadStatus
from vidjobs.gateway import cursor, fallbacks, idempotency
from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode, account_disabled, invalid, not_found
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
)
from vidjobs.gateway.decoding import nul_in, read_json, read_query
from vidjobs.gateway.liveroutes import LiveRoutes
from vidjobs.gateway.owned import found, job_id_of, owned_or_404, view
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import gateway
from vidjobs.gateway.tenant import (
    AccountDisabled,
    CreateRefused,
    JobFilter,
    JobOrder,
    KeyedJobDeleted,
    NoWebhookSecret,
    OverTokenCeiling,
    Tenant,
    tenant,
)
from vidjobs.gateway.views import trail_out
from vidjobs.providers.base import ProviderAdapter
from vidjobs.providers.registry import adapter_for

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


UPLOAD_RETRY_AFTER_S = 1  # an image is decoded within about a second of its upload


async def check_input_image(owner: Tenant, request: JobRequest) -> None:
    """The named upload must be the caller's own and not deleted; anything else reads as "no such upload",
    so another account's upload id cannot even be confirmed to exist. It must also be ready: one still being
    decoded is a 409 worth retrying, a rejected one a 422 that never will be."""
    upload_id = request.input_image
    if upload_id is None:
        return
    upload = await owner.upload(upload_id)
    if upload is None:
        raise invalid(f"input_image: no such upload {upload_id!r}; upload the image with "
                      "POST /v1/uploads and name the id it answers")
    if upload.status is UploadStatus.PROCESSING:
        raise ApiError(409, GatewayCode.UPLOAD_NOT_READY,
                       f"input_image: the upload {upload_id!r} is still being processed; send this request "
                       f"again once GET /v1/uploads/{upload_id} says its status is `ready`", retryable=True,
                       headers={"Retry-After": str(UPLOAD_RETRY_AFTER_S)})
    if upload.status is UploadStatus.REJECTED:
        raise ApiError(422, GatewayCode.UPLOAD_REJECTED,
                       f"input_image: the upload {upload_id!r} was rejected ({upload.reason}: {upload.message}); "
                       "upload another image")


def _job_events(body: CreateJob) -> list[str] | None:
    if body.webhook_url is None:
        return None
    return sorted(set(body.webhook_events or DEFAULT_JOB_EVENTS))


def routed(request: JobRequest, routes: LiveRoutes, account_id: str) -> tuple[JobRequest, str | None]:
    """A model alias becomes the real model its routes give this account (sticky until they change)."""
    model, route = routes.route(request.model, account_id)
    return (request if route is None else msgspec.structs.replace(request, model=model)), route


NO_WEBHOOK_SECRET = ("webhook_url: deliveries to it are signed with your account's webhook secret, and the account "
                     "has none yet: make it first with POST /v1/account/webhook-secret (its answer shows it, once)")


async def checked_create(request: web.Request) -> JobOrder:
    """A create's body with every check a create makes before its transaction (an estimate makes them too);
    what depends on the account's state as the job is written is checked in it (Tenant.create)."""
    gw, owner = gateway(request), tenant(request)
    body = await read_json(request, CreateJob, gw.settings.max_body_bytes)
    job_request, route = routed(body.to_request(), gw.routes, owner.account_id)
    check_provider(gw.adapters, job_request)
    await check_input_image(owner, job_request)
    if body.webhook_url is not None:
        await urls.checked_url(body.webhook_url, gw.settings.allowed_webhook_hosts(), "webhook_url")
    named = None if body.fallback_models is None else fallbacks.checked(
        gw.adapters, owner.resolve, job_request, body.fallback_models, [])
    return JobOrder(request=job_request, route=route, fallbacks=named, metadata=body.metadata,
                    webhook_url=body.webhook_url, webhook_events=_job_events(body), max_wait_s=body.max_wait_s,
                    lane=Lane.of(body.priority), body_hash=idempotency.digest(body))


def refused(err: Exception) -> ApiError:
    """What a create the Tenant refused answers."""
    match err:
        case QuotaExhausted():
            return ApiError(402, ErrorCode.QUOTA_EXHAUSTED, str(err))
        case QueueFull():
            # Waiting helps: every job that starts frees a place.
            return ApiError(429, GatewayCode.LIMIT_REACHED, str(err), retryable=True,
                            headers={"Retry-After": str(QUEUE_RETRY_AFTER_S)})
        case ratecard.Unpriced():
            return invalid(f"model: {err}; choose another model or resolution")
        case NoWebhookSecret():
            return invalid(NO_WEBHOOK_SECRET)
        case AccountDisabled():
            return account_disabled()
        case OverTokenCeiling():
            return ApiError(402, ErrorCode.QUOTA_EXHAUSTED, str(err))
        case KeyedJobDeleted():
            return ApiError(409, GatewayCode.CONFLICT,
                            f"the job made with this {idempotency.HEADER} has been deleted; use a new key")
    raise TypeError(f"not a create refusal: {err!r}")


async def create_job(request: web.Request) -> web.Response:
    order = await checked_create(request)
    key = idempotency.key_from(request)
    try:
        made = await tenant(request).create(order, key)
    except (QuotaExhausted, QueueFull, ratecard.Unpriced, CreateRefused) as err:
        raise refused(err) from err
    headers = {"Location": f"/v1/jobs/{made.job.job.id}"}
    if not made.created:
        headers["Idempotent-Replayed"] = "true"  # the answer of the request that made the job, again
    return json_response(view(gateway(request), made.job), status=201 if made.created else 200, headers=headers)


async def estimate_job(request: web.Request) -> web.Response:
    """The create's checks and price, without its writes: nothing is reserved, queued or remembered."""
    owner = tenant(request)
    order = await checked_create(request)
    if order.webhook_url is not None and not await owner.has_webhook_secret():
        raise invalid(NO_WEBHOOK_SECRET)
    job_request = order.request
    card = await owner.rate_card()
    try:
        price = ratecard.price_of(card, job_request.model, job_request.resolution)
    except ratecard.Unpriced as err:
        raise invalid(f"model: {err}; choose another model or resolution") from err
    estimate = ratecard.estimate(card, job_request)
    if order.fallbacks is not None:
        fallbacks.within_quote(card, job_request, order.fallbacks, estimate, named=True)
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
    return json_response(Trail(data=trail_out(rows)))


_JOB = "/v1/jobs/{job_id}"
_ERRORS: dict[int, type] = {401: ErrorOut, 404: ErrorOut}

ROUTES = [
    Route("POST", "/v1/estimates", estimate_job, "estimate_job",
          "What creating this job would reserve, checked as a create is, without creating anything",
          body=CreateJob, token_scope="any",
          responses={200: EstimateOut, 400: ErrorOut, 401: ErrorOut, 413: ErrorOut, 415: ErrorOut, 422: ErrorOut}),
    Route("POST", "/v1/jobs", create_job, "create_job", "Create a render job", body=CreateJob,
          headers={idempotency.HEADER: "repeat a request safely: same key and body answer the same job"},
          response_headers={
              200: {"Idempotent-Replayed": {"description": "`true`: the answer of the earlier request with this "
                                                           f"{idempotency.HEADER}", "schema": {"type": "string"}}},
              201: {"Location": {"description": "the new job", "schema": {"type": "string"}}}},
          token_scope="create",
          responses={201: JobOut, 200: JobOut, 400: ErrorOut, 401: ErrorOut, 402: ErrorOut, 409: ErrorOut,
                     413: ErrorOut, 415: ErrorOut, 422: ErrorOut, 429: ErrorOut}),
    Route("GET", "/v1/jobs", list_jobs, "list_jobs", "The account's jobs, newest first", query=ListQuery,
          token_scope="read", responses={200: JobList, 400: ErrorOut, 401: ErrorOut, 422: ErrorOut}),
    Route("GET", _JOB, get_job, "get_job", "One job", token_scope="read", responses={200: JobOut, **_ERRORS}),
    Route("POST", f"{_JOB}/cancel", cancel_job, "cancel_job", "Cancel a job (unchanged if already finished)",
          responses={200: JobOut, **_ERRORS}),
    Route("DELETE", _JOB, delete_job, "delete_job", "Delete a job; its assets are removed in the background",
          responses={204: None, **_ERRORS}),
    Route("GET", f"{_JOB}/events", job_events, "job_events", "The job's audit trail",
          token_scope="read", responses={200: Trail, **_ERRORS}),
]
