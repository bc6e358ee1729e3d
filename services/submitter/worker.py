"""The submitter: takes queued jobs and submits them to their provider through its adapter.

The submission row is committed before the provider is called, and the provider is asked for an existing
render before any resubmit, so a submitter killed at any point never causes a second render.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial

import aiohttp
import asyncpg
from prometheus_client import Counter

from libs.common import bus, events, jobs, metrics, outbox, uploads
from libs.common.bus import Delivery
from libs.common.errors import ErrorCode, ProviderError, Redeliver
from libs.common.events import CancelRequested, JobQueued, PollRequested
from libs.common.jobs import JobRow
from libs.common.outcomes import fail_or_retry
from libs.common.retry import Policies
from libs.common.runtime import Runtime, consumer
from libs.common.states import JobStatus
from libs.common.transitions import Guard, JobUpdate, transition
from libs.providers.base import ProviderAdapter, Submission, SubmitRequest
from libs.providers.registry import adapter_for, build_adapters
from libs.storage.base import Storage
from libs.storage.factory import open_storage
from services.submitter import limits, submissions
from services.submitter.submissions import Claim

log = logging.getLogger("vidjobs.submitter")

WAITS = Counter("vidjobs_submit_waits_total", "Submissions held back by a provider's limits", ["provider", "kind"])


@dataclass(frozen=True)
class Context:
    rt: Runtime
    adapters: dict[str, ProviderAdapter]
    policies: Policies
    storage: Storage  # signs the URLs providers fetch input images from


async def main(rt: Runtime) -> None:
    async with contextlib.AsyncExitStack() as stack:
        storage = open_storage(rt.settings)
        stack.push_async_callback(storage.close)
        session = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=rt.settings.provider_timeout_s)))
        ctx = Context(rt=rt, adapters=build_adapters(rt.settings, session),
                      policies=Policies(rt.settings), storage=storage)
        # Jobs held back by a provider's limits wait in the stream (a delayed nak each), so allow many.
        spec = consumer(rt, "submitter", events.SUBMIT, partial(handle, ctx),
                        concurrency=rt.settings.submit_concurrency, max_ack_pending=1_000_000)
        await bus.consume(rt.js, spec, rt.stop)


async def submit_request(ctx: Context, job: JobRow, adapter: ProviderAdapter) -> SubmitRequest:
    callback = f"{ctx.rt.settings.gateway_url}/v1/webhooks/{job.provider}" if adapter.supports_callbacks else None
    return SubmitRequest(
        job_id=job.id, attempt=job.attempt, idempotency_key=f"{job.id}-a{job.attempt}",
        request=job.request, callback_url=callback, input_image_url=await input_image_url(ctx, job),
    )


async def input_image_url(ctx: Context, job: JobRow) -> str | None:
    """A signed URL the provider can fetch the job's uploaded image from, for as long as a render may take
    (a provider may queue the job and fetch the image only when it starts)."""
    upload_id = job.request.input_image
    if upload_id is None:
        return None
    upload = await uploads.owned(ctx.rt.pool, job.account_id, upload_id)
    if upload is None:
        raise ProviderError(ErrorCode.INVALID_INPUT,
                            f"input_image: the upload {upload_id!r} no longer exists; upload the image again")
    url, _ = ctx.storage.signed_url(upload.key, int(ctx.rt.settings.render_deadline_s))
    return url


async def handle(ctx: Context, event: events.Event, delivery: Delivery) -> None:
    assert isinstance(event, JobQueued)
    job = await jobs.fetch(ctx.rt.pool, event.job_id)
    if job is None or job.finished or job.status is not JobStatus.PENDING:
        return
    try:
        adapter = adapter_for(ctx.adapters, job.provider)
        req = await submit_request(ctx, job, adapter)
    except ProviderError as err:
        async with ctx.rt.tx() as conn:
            await _refused(ctx, conn, job, err)
        return
    claimed = await _admit_and_claim(ctx, job, req)
    if claimed.claim is Claim.MOVED_ON:
        return
    if claimed.claim is Claim.BUSY:
        raise Redeliver("another submitter is calling the provider for this attempt", delay=5.0)
    try:
        accepted = await _call_provider(adapter, req, claimed)
    except ProviderError as err:
        metrics.PROVIDER_CALLS.labels(job.provider, "submit", err.code.value).inc()
        # The refusal and the job's move away from pending commit together: a refused claim is never up for
        # takeover while its job still looks like it is waiting for this attempt.
        async with ctx.rt.tx() as conn:
            await limits.lock_provider(conn, job.provider)
            await _refused(ctx, conn, job, err)
            await submissions.record_refused(conn, req, err.to_job_error())
            await limits.record_answer(conn, job.provider, err.code, ctx.rt.settings)
        return
    metrics.PROVIDER_CALLS.labels(job.provider, "submit", "accepted").inc()
    await _accepted(ctx, job, adapter, req, accepted)


async def _admit_and_claim(ctx: Context, job: JobRow, req: SubmitRequest) -> submissions.Claimed:
    """Claim this attempt's submission if the provider's breaker, cap and pace allow it now; otherwise say
    why on the job and have the message come back when it may."""
    # A claim outlives the longest provider call, so a live call is never mistaken for a dead one.
    ttl = ctx.rt.settings.provider_timeout_s + 15
    async with ctx.rt.tx() as conn:
        await limits.lock_provider(conn, job.provider)
        if not await _still_waiting(conn, job):
            return submissions.Claimed(Claim.MOVED_ON)
        admission = await limits.admit(conn, job.provider, job.id, limits.limits_for(ctx.rt.settings, job.provider),
                                       claim_ttl_s=ttl)
        if admission.wait_s is None:
            return await submissions.claim(conn, req, job.provider, ttl_s=ttl)
        await jobs.set_wait_reason(conn, job.id, admission.reason or "waiting for the provider")
    WAITS.labels(job.provider, admission.kind).inc()
    raise Redeliver(admission.reason or "provider limit", delay=max(admission.wait_s, 0.05))


async def _call_provider(adapter: ProviderAdapter, req: SubmitRequest, claimed: submissions.Claimed) -> Submission:
    if claimed.claim is Claim.ACCEPTED:
        assert claimed.provider_job_id is not None
        return Submission(provider_job_id=claimed.provider_job_id)
    if claimed.claim is Claim.TAKEN_OVER:
        existing = await adapter.find(req)
        if existing is not None:
            log.info("provider already had this attempt; not resubmitting", extra={"job_id": req.job_id})
            return existing
    return await adapter.submit(req)


async def _accepted(
    ctx: Context, job: JobRow, adapter: ProviderAdapter, req: SubmitRequest, accepted: Submission,
) -> None:
    now = datetime.now(UTC)
    emit = [] if adapter.supports_callbacks else [PollRequested(job_id=job.id, reason="submitted")]
    async with ctx.rt.tx() as conn:
        await limits.lock_provider(conn, job.provider)
        await submissions.record_accepted(conn, req, accepted.provider_job_id)
        await limits.record_answer(conn, job.provider, None, ctx.rt.settings)
        moved = await transition(
            conn, job.id, JobStatus.SUBMITTED, reason=f"accepted by {job.provider} as {accepted.provider_job_id}",
            expect=[JobStatus.PENDING], emit=emit,
            update=JobUpdate(
                provider_job_id=accepted.provider_job_id, submitted_at=now, error=None, retry_at=None,
                deadline_at=now + timedelta(seconds=ctx.rt.settings.render_deadline_s),
            ),
        )
        if moved is not None and accepted.queue_position is not None:
            await jobs.record_queue_position(conn, job.id, accepted.queue_position)
        if moved is None and await _orphaned(conn, job.id, accepted.provider_job_id):
            # Canceled, deleted or retried while the provider was answering: this render is nobody's; stop it.
            await outbox.add(conn, [CancelRequested(job_id=job.id, provider=job.provider,
                                                    provider_job_id=accepted.provider_job_id)])
    log.info("submitted", extra={"job_id": job.id, "provider_job_id": accepted.provider_job_id,
                                 "attempt": job.attempt})


async def _still_waiting(conn: asyncpg.Connection, job: JobRow) -> bool:
    """Whether the job is still pending at the attempt we read; holds its row until the claim commits."""
    row = await conn.fetchrow(
        "SELECT status, attempt FROM jobs WHERE id = $1 AND deleted_at IS NULL FOR SHARE", job.id)
    return row is not None and row["status"] == JobStatus.PENDING and row["attempt"] == job.attempt


async def _orphaned(conn: asyncpg.Connection, job_id: str, provider_job_id: str) -> bool:
    """The provider accepted a render the job no longer wants: it ended, was deleted, or moved on to
    another attempt (a callback that adopted this very render is not an orphan)."""
    current = await jobs.fetch(conn, job_id)
    return current is None or current.finished or current.provider_job_id != provider_job_id


async def _refused(ctx: Context, conn: asyncpg.Connection, job: JobRow, err: ProviderError) -> None:
    error = err.to_job_error()
    log.warning("submission refused", extra={"job_id": job.id, "code": error.code.value, "error": err.message})
    await fail_or_retry(conn, job, error, policies=ctx.policies, reason=f"submit refused: {error.code.value}",
                        expect=[JobStatus.PENDING], retry_after=err.retry_after,
                        guard=Guard(attempt=job.attempt))

