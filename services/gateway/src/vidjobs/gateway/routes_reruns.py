"""`POST /v1/jobs/{id}/rerun`: render a job's request again, as a new job linked to it by `rerun_of`.

The new job is the original's request made again by its own account: the same model (through the same
rollout alias, chosen afresh), prompt, format, seed, input image, params, labels, webhook, priority and wait
limit; its fallbacks are the account's default as it stands (the original's list has been spent as it moved).
It is checked as a create is, against what the deployment offers now, and made by the same transaction: its
credit is reserved at today's price and it queues like any new job. An `Idempotency-Key` makes a retried
rerun answer the same new job; the key is bound to the original job, so reusing it for a create (or a rerun
of another job) answers 409.

Nothing restricts which of the account's jobs may be rerun: a person decides whether another paid render is
worth it (after a `render_timeout`, say). A deleted job is refused with 409: its request is gone from the API,
and its files with it.
"""

from __future__ import annotations

import hashlib

import msgspec
from aiohttp import web

from vidjobs.common import ratecard
from vidjobs.common.errors import QueueFull, QuotaExhausted
from vidjobs.common.jobs import JobRow
from vidjobs.gateway import idempotency
from vidjobs.gateway.apierrors import ApiError, ErrorOut, GatewayCode, not_found
from vidjobs.gateway.appwebhooks import urls
from vidjobs.gateway.bodies import JobOut
from vidjobs.gateway.owned import job_id_of, view
from vidjobs.gateway.routes_jobs import check_input_image, check_provider, refused, routed
from vidjobs.gateway.routetable import Route, json_response
from vidjobs.gateway.state import gateway
from vidjobs.gateway.tenant import CreateRefused, JobOrder, tenant


def rerun_digest(original_id: str) -> bytes:
    """What an Idempotency-Key of a rerun is bound to: the job it reruns (a create's key is bound to its body)."""
    return hashlib.sha256(b"rerun:" + original_id.encode()).digest()


async def rerun_order(request: web.Request, original: JobRow) -> JobOrder:
    """The original's request as a create of today: its alias routed again, and every check a create makes."""
    gw = gateway(request)
    asked = original.request if original.route is None else msgspec.structs.replace(original.request,
                                                                                   model=original.route)
    job_request, route = routed(asked, gw.routes, original.account_id)
    check_provider(gw.adapters, job_request)
    await check_input_image(tenant(request), job_request)
    if original.webhook_url is not None:
        await urls.checked_url(original.webhook_url, gw.settings.allowed_webhook_hosts(), "webhook_url")
    return JobOrder(request=job_request, route=route, fallbacks=None, metadata=original.metadata,
                    webhook_url=original.webhook_url, webhook_events=original.webhook_events,
                    max_wait_s=original.max_wait_s, lane=original.lane, body_hash=rerun_digest(original.id),
                    rerun_of=original.id)


async def rerun_job(request: web.Request) -> web.Response:
    owner = tenant(request)
    original = await owner.original(job_id_of(request))
    if original is None:
        raise not_found()
    if original.deleted_at is not None:
        raise ApiError(409, GatewayCode.CONFLICT, f"job {original.id} was deleted, and its request with it; it "
                       "cannot be rendered again: create a new job with POST /v1/jobs")
    order = await rerun_order(request, original)
    try:
        made = await owner.create(order, idempotency.key_from(request))
    except (QuotaExhausted, QueueFull, ratecard.Unpriced, CreateRefused) as err:
        raise refused(err) from err
    headers = {"Location": f"/v1/jobs/{made.job.job.id}"}
    if not made.created:
        headers["Idempotent-Replayed"] = "true"
    return json_response(view(gateway(request), made.job), status=201 if made.created else 200, headers=headers)


ROUTES = [
    Route("POST", "/v1/jobs/{job_id}/rerun", rerun_job, "rerun_job",
          "Render a job's request again as a new job (`rerun_of` names the original)",
          headers={idempotency.HEADER: "repeat a rerun safely: the same key answers the same new job"},
          response_headers={
              200: {"Idempotent-Replayed": {"description": "`true`: the answer of the earlier rerun with this "
                                                           f"{idempotency.HEADER}", "schema": {"type": "string"}}},
              201: {"Location": {"description": "the new job", "schema": {"type": "string"}}}},
          responses={201: JobOut, 200: JobOut, 400: ErrorOut, 401: ErrorOut, 402: ErrorOut, 404: ErrorOut,
                     409: ErrorOut, 422: ErrorOut, 429: ErrorOut}),
]
