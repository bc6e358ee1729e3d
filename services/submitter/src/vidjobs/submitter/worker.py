"""The submitter: hands out provider slots to queued jobs (`slots` decides whether one may go now, and
`dispatch` which one) and submits them through their provider's adapter.

The submission row is committed before the provider is called, and the provider is asked for an existing
render before any resubmit, so a submitter killed at any point never causes a second render. A submit that
no call got an answer to keeps its attempt and is asked again later under the same key (`unclear`), so a
provider that stops answering and renders what it kept once it runs again renders each attempt once.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial

import aiohttp
import asyncpg
import msgspec
from prometheus_client import Counter

from vidjobs.common import (
    backoff,
    breakers,
    bus,
    estimates,
    events,
    faults,
    jobs,
    logs,
    metrics,
    outbox,
    provider_reports,
    recovery_checks,
    tracing,
    uploads,
    waiting,
)
from vidjobs.common.bus import Delivery
from vidjobs.common.errors import ErrorCode, ProviderError, Redeliver
from vidjobs.common.events import CancelRequested, JobQueued, PollRequested, SlotFreed
from vidjobs.common.jobs import JobRow
from vidjobs.common.outcomes import fail_or_retry
from vidjobs.common.render_deadlines import RenderDeadlines, render_deadline
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import Runtime, consumer, every
from vidjobs.common.states import SQL_PENDING, JobStatus
from vidjobs.common.transitions import Guard, JobUpdate, transition
from vidjobs.providers.base import ProviderAdapter, Submission, SubmitRequest
from vidjobs.providers.http import call_timeout
from vidjobs.providers.registry import adapter_for, build_adapters
from vidjobs.storage.base import Storage
from vidjobs.storage.factory import open_storage
from vidjobs.submitter import capacity, dispatch, failover, provider_gauges, slots, submissions, unclear
from vidjobs.submitter.slots import Wait
from vidjobs.submitter.submissions import Claim

log = logging.getLogger("vidjobs.submitter")

WAITS = Counter("vidjobs_submit_waits_total",
                "Jobs held back by the platform switch, a provider's limits or their account's cap",
                ["provider", "kind"])


@dataclass(frozen=True)
class Context:
    rt: Runtime
    adapters: dict[str, ProviderAdapter]
    policies: Policies
    storage: Storage  # signs the URLs providers fetch input images from
    # When waiting jobs are likely to start, for a move past a job's max_wait_s (failover); None: no such moves.
    estimator: estimates.Estimator | None = None
    # Each accepted render's deadline, from its model's measured renders; None: the fixed render_deadline_s.
    deadlines: RenderDeadlines | None = None


async def main(rt: Runtime) -> None:
    async with contextlib.AsyncExitStack() as stack:
        storage = open_storage(rt.settings)
        stack.push_async_callback(storage.close)
        timeout = call_timeout(rt.settings)
        session = await stack.enter_async_context(
            aiohttp.ClientSession(timeout=timeout, trace_configs=tracing.client_trace_configs()))
        ctx = Context(rt=rt, adapters=build_adapters(rt.settings, session), policies=Policies(rt.settings),
                      storage=storage, estimator=estimates.Estimator(rt.settings),
                      deadlines=RenderDeadlines(rt.settings))
        spec = consumer(rt, events.SUBMIT_DURABLE, events.SUBMIT, partial(handle, ctx),
                        concurrency=rt.settings.submit_concurrency)
        async with asyncio.TaskGroup() as tg:
            tg.create_task(bus.consume(rt.js, spec, rt.stop), name="submit-consumer")
            tg.create_task(provider_gauges.run(rt, ctx.adapters), name="provider-gauges")
            tg.create_task(every(rt, rt.settings.queue_sweep_interval_s, partial(sweep_queues, ctx), "queue sweep"),
                           name="queue-sweep")


async def sweep_queues(ctx: Context) -> None:
    """One look per provider with a waiting job, however many wait: a provider with a slot free hands it out.
    Catches what no event announced: a wake-up lost with its message, a breaker's pause running out, a cap
    raised by a restart with new settings, the switch resumed from another process."""
    ttl = _claim_ttl(ctx)
    for provider in await waiting.waiting_providers(ctx.rt.pool):
        if await slots.has_room(ctx.rt.pool, provider, ctx.rt.settings.limits_for(provider), ttl):
            if (pacing := await fill(ctx, provider)) is not None:
                log.info("queue sweep met the provider's pacing", extra={"provider": provider, "why": pacing.reason})
        await sweep_moves(ctx, provider)


async def sweep_moves(ctx: Context, provider: str) -> None:
    """Move a batch of the provider's waiting jobs that have fallbacks: any of them while its breaker holds
    them back, else those whose estimated start passes their max_wait_s."""
    why = failover.Why.BREAKER if await breakers.pausing(ctx.rt.pool, provider) else failover.Why.MAX_WAIT
    for job_id in await failover.movable(ctx.rt.pool, provider, why):
        job = await jobs.fetch(ctx.rt.pool, job_id)
        if job is not None:
            await _maybe_move(ctx, job, why)


def _move_reason(wait: Wait) -> failover.Why:
    return failover.Why.BREAKER if wait.kind == "breaker" else failover.Why.MAX_WAIT


async def _estimated_start(ctx: Context, job: JobRow) -> datetime | None:
    """When the waiting job is estimated to start where it is (p50); None without an estimate."""
    if ctx.estimator is None:
        return None
    estimate = await ctx.estimator.for_job(ctx.rt.pool, job)
    return None if estimate is None else estimate.start_p50


async def _sooner(ctx: Context, conn: asyncpg.Connection, job: JobRow, model: str, start: datetime | None) -> bool:
    """Whether `model` would start the job before `start`: at once (a slot free and nobody waiting there), or
    by its own estimate for a job joining its queue now."""
    provider = model.split("/", 1)[0]
    free = ctx.rt.settings.limits_for(provider).concurrency
    if await capacity.in_flight(conn, provider, _claim_ttl(ctx)) < free and not await _queued_at(conn, provider):
        return True
    if ctx.estimator is None or start is None:
        return False
    joining = await ctx.estimator.for_joining(conn, model, job.account_id)
    return joining.start_p50 is not None and joining.start_p50 < start


async def _queued_at(conn: asyncpg.Connection, provider: str) -> bool:
    return bool(await conn.fetchval(
        f"SELECT EXISTS (SELECT 1 FROM jobs WHERE provider = $1 AND status = {SQL_PENDING} AND deleted_at IS NULL)",
        provider))


async def _maybe_move(ctx: Context, job: JobRow, why: failover.Why) -> bool:
    """Whether the waiting job moved to one of its fallbacks (failover)."""
    if not job.fallback_models:
        return False
    if why is failover.Why.BREAKER:
        start, detail = None, f"{job.provider} is unavailable and its submissions are paused"
    else:
        if job.max_wait_until is None:
            return False  # no limit to pass: no estimate to make
        start = await _estimated_start(ctx, job)
        if start is None or start <= job.max_wait_until:
            return False
        detail = (f"its estimated start, {start:%H:%M:%S} UTC, is past its max_wait_s of {job.max_wait_s} s "
                  f"({job.max_wait_until:%H:%M:%S} UTC)")
    async with ctx.rt.tx() as conn:
        moved = await failover.consider(conn, job.id, frozenset(ctx.adapters), why, detail,
                                        partial(_sooner, ctx), start)
    return moved is not None


async def submit_request(ctx: Context, job: JobRow, adapter: ProviderAdapter) -> SubmitRequest:
    callback = f"{ctx.rt.settings.gateway_url}/v1/webhooks/{job.provider}" if adapter.supports_callbacks else None
    return msgspec.structs.replace(submissions.request_for(job), callback_url=callback,
                                   input_image_url=await input_image_url(ctx, job))


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
    if not upload.ready:
        # The gateway takes only ready uploads; a job written by an older gateway during a rollout may not.
        raise ProviderError(ErrorCode.INVALID_INPUT, f"input_image: the upload {upload_id!r} is {upload.status}, "
                                                     "not ready; name it once GET /v1/uploads says it is ready")
    url, _ = ctx.storage.signed_url(upload.key, int(ctx.rt.settings.render_deadline_s))
    return url


async def handle(ctx: Context, event: events.SubmitEvent, delivery: Delivery) -> None:
    match event:
        case SlotFreed(provider=provider):
            if (pacing := await fill(ctx, provider)) is not None:
                raise Redeliver(pacing.reason, delay=_look_again_in(pacing))
        case JobQueued(job_id=job_id):
            if (wait := await _serve(ctx, await jobs.fetch(ctx.rt.pool, job_id))) is not None and wait.pacing:
                raise Redeliver(wait.reason, delay=_look_again_in(wait))


def _look_again_in(wait: Wait) -> float:
    return min(max(wait.delay_s, 0.05), waiting.WAIT_LOOK_S)


async def fill(ctx: Context, provider: str) -> Wait | None:
    """Hand the provider's free slots to the fair heads of its queue, one after another, until none is free
    or one must wait; returns that wait when it is only the provider's pacing (a second or so), which the
    caller looks at again. Every other wait parks the head until the next event that frees a slot."""
    for _ in range(ctx.rt.settings.limits_for(provider).concurrency + 1):
        head = await dispatch.fair_head(ctx.rt.pool, provider, _claim_ttl(ctx))
        if head is None:
            return None
        try:
            wait = await _serve(ctx, await jobs.fetch(ctx.rt.pool, head.job_id))
        except Redeliver:
            return None  # another submitter is calling the provider for the head: its answer frees what follows
        except Exception:
            # The head's failure is its own: its claim goes stale, and the sweep hands the slot on.
            log.exception("could not serve the head of the queue", extra={"job_id": head.job_id, "provider": provider})
            return None
        if wait is not None:
            return wait if wait.pacing else None
    return None


def _call_budget(ctx: Context) -> float:
    # The slowest submit makes two provider requests (Veo fetches the input image, then posts), each bounded
    # by the provider timeout; the whole call is cut off here.
    return 2 * ctx.rt.settings.provider_timeout_s


def _claim_ttl(ctx: Context) -> float:
    # A claim outlives the longest provider call, so a live call is never mistaken for a dead one.
    return _call_budget(ctx) + 15


async def _serve(ctx: Context, job: JobRow | None) -> Wait | None:
    """Hand out the next slot of the job's provider, then, while this job still waits, the one after; returns
    why this job waits when it must (parked, unless the wait is the provider's pacing)."""
    fair = True
    while job is not None and not job.finished and job.status is JobStatus.PENDING:
        logs.about_job(job.id, job.account_id)
        try:
            adapter = adapter_for(ctx.adapters, job.provider)
        except ProviderError as err:
            await _refuse(ctx, job, err, Refusal.UNOFFERED)
            return None
        async with ctx.rt.tx() as conn:
            turn = await slots.take(conn, job, ctx.rt.settings.limits_for(job.provider), _claim_ttl(ctx), fair=fair)
        # No turn: this job moved on, or the head moved on or could not be claimed. Then the next slot is
        # offered to this job itself, rather than to a head that may fail again.
        fair = turn is not None
        if isinstance(turn, Wait):
            WAITS.labels(job.provider, turn.kind).inc()
            if not turn.pacing and await _maybe_move(ctx, job, _move_reason(turn)):
                return None  # its message for the fallback went out with the move
            return turn
        if turn is not None:
            if turn.job.id == job.id:
                await _submit(ctx, turn.job, adapter, turn.claimed, handled=job)
                return None
            await _submit_for_another(ctx, turn.job, adapter, turn.claimed, handled=job)
        job = await jobs.fetch(ctx.rt.pool, job.id)
    return None


async def _submit_for_another(
    ctx: Context, job: JobRow, adapter: ProviderAdapter, claimed: submissions.Claimed, *, handled: JobRow,
) -> None:
    """Submit the queue's head on behalf of another job's message. Its failure is its own: logged here, and
    its claim, once stale, is taken over by its own message, which retries or dead-letters it."""
    try:
        await _submit(ctx, job, adapter, claimed, handled=handled)
    except Exception:
        log.exception("submitting the head of the queue failed", extra={"job_id": job.id, "for_message": handled.id})


async def _submit(
    ctx: Context, job: JobRow, adapter: ProviderAdapter, claimed: submissions.Claimed, *, handled: JobRow,
) -> None:
    if claimed.claim is Claim.MOVED_ON:
        return
    if claimed.claim is Claim.BUSY:
        if job.id == handled.id:
            raise Redeliver("another submitter is calling the provider for this attempt", delay=5.0)
        return
    if job.id != handled.id:
        log.info("slot given to the fair head of the queue", extra={"job_id": job.id, "for_message": handled.id})
    try:
        req = await submit_request(ctx, job, adapter)
    except ProviderError as err:
        await _refuse(ctx, job, err, Refusal.BEFORE_CALL)  # its input image is gone
        return
    try:
        accepted = await _call_provider(ctx, adapter, req, claimed)
    except ProviderError as err:
        metrics.PROVIDER_CALLS.labels(job.provider, "submit", err.code.value).inc()
        if err.unclear and await _keep_unclear(ctx, job, req):
            return
        await _refuse(ctx, job, err, Refusal.BY_PROVIDER)
        return
    metrics.PROVIDER_CALLS.labels(job.provider, "submit", "accepted").inc()
    await _record_patiently(ctx, job, adapter, req, accepted)


async def _record_patiently(
    ctx: Context, job: JobRow, adapter: ProviderAdapter, req: SubmitRequest, accepted: Submission,
) -> None:
    """The provider's answer exists only in this process until it commits: a database that is failing over
    is waited out for as long as the claim is ours, rather than leaving the render to be found again."""
    def unrecorded(exc: BaseException, attempt: int, wait_s: float) -> None:
        log.warning("could not record the provider's answer yet; trying again", extra={
            "job_id": job.id, "provider_job_id": accepted.provider_job_id, "error": repr(exc), "delay_s": wait_s})

    patience = backoff.Backoff(on=faults.INFRASTRUCTURE, attempts=None, timeout=_claim_ttl(ctx) - _call_budget(ctx),
                               base=0.5, cap=3.0)
    await backoff.call(patience, lambda _: _accepted(ctx, job, adapter, req, accepted), on_backoff=unrecorded)


async def _call_provider(
    ctx: Context, adapter: ProviderAdapter, req: SubmitRequest, claimed: submissions.Claimed,
) -> Submission:
    """The provider's render for this attempt: the one it already has, or a new one. A call whose outcome is
    unclear is resolved before anything else happens: the render is looked up where the provider allows it,
    and otherwise asked for again under the same idempotency key, so a provider that honours the key renders
    the attempt once. The claim is renewed before each new call."""
    if claimed.claim is Claim.ACCEPTED:
        assert claimed.provider_job_id is not None
        return Submission(provider_job_id=claimed.provider_job_id)

    async def one(attempt: int) -> Submission:
        if attempt > 1:
            async with ctx.rt.tx() as conn:
                await submissions.renew(conn, req)
        return await _one_call(ctx, adapter, req, look_first=attempt > 1 or claimed.claim is not Claim.FRESH)

    def resolving(exc: BaseException, attempt: int, wait_s: float) -> None:
        log.warning("submit outcome unclear; resolving it under the same key", extra={
            "job_id": req.job_id, "attempt": req.attempt, "call": attempt, "error": str(exc), "delay_s": wait_s})
        metrics.PROVIDER_CALLS.labels(adapter.name, "submit", "unclear").inc()

    return await backoff.call(unclear.resolving(claimed.claim), one, on_backoff=resolving)


async def _keep_unclear(ctx: Context, job: JobRow, req: SubmitRequest) -> bool:
    """Keep the attempt whose submit no call of it got an answer to (submitter/unclear.py): its claim held
    until the next look, the job parked with the reason, the breaker told. False when it is past the limit
    (or was answered meanwhile): then it is refused as today, and a new attempt follows."""
    async with ctx.rt.tx() as conn:
        await slots.lock_provider(conn, job.provider)
        look_again_at = await unclear.keep(conn, req, shortest_s=_call_budget(ctx), claim_ttl_s=_claim_ttl(ctx),
                                           limit_s=ctx.rt.settings.unclear_submit_limit_s)
        if look_again_at is None:
            return False
        await breakers.record_answer(conn, job.provider, ErrorCode.TIMEOUT, ctx.rt.settings)
        await waiting.set_wait_reason(conn, job.id, unclear.wait_reason(job.provider, look_again_at), park=True)
    log.warning("submit unanswered; attempt kept, to be asked again under the same key", extra={
        "job_id": job.id, "attempt": job.attempt, "look_again_at": look_again_at.isoformat()})
    return True


async def _one_call(ctx: Context, adapter: ProviderAdapter, req: SubmitRequest, *, look_first: bool) -> Submission:
    """One look-up-then-submit, cut off at the call budget so it can never outlive its claim."""
    budget = _call_budget(ctx)
    try:
        async with asyncio.timeout(budget):
            if look_first and (existing := await adapter.find(req)) is not None:
                log.info("provider already had this attempt; not resubmitting", extra={"job_id": req.job_id})
                return existing
            return await adapter.submit(req)
    except TimeoutError as exc:
        raise ProviderError(ErrorCode.TIMEOUT, f"{adapter.name} did not answer the submit within {budget:.0f} s.",
                            unclear=True) from exc


async def _accepted(
    ctx: Context, job: JobRow, adapter: ProviderAdapter, req: SubmitRequest, accepted: Submission,
) -> None:
    deadline = await render_deadline(ctx.deadlines, ctx.rt.pool, ctx.rt.settings, job.model)
    now = datetime.now(UTC)
    emit = [] if adapter.supports_callbacks else [PollRequested(job_id=job.id, reason="submitted")]
    async with ctx.rt.tx() as conn:
        await slots.lock_provider(conn, job.provider)
        await submissions.record_accepted(conn, req, accepted.provider_job_id)
        await breakers.record_answer(conn, job.provider, None, ctx.rt.settings)
        moved = await transition(
            conn, job.id, JobStatus.SUBMITTED, reason=f"accepted by {job.provider} as {accepted.provider_job_id}",
            # Only onto the attempt it renders: its callbacks may have failed that attempt, and the job moved on
            # to the next, while this answer was on its way.
            expect=[JobStatus.PENDING], emit=emit, guard=Guard(attempt=req.attempt),
            update=JobUpdate(
                provider_job_id=accepted.provider_job_id, submitted_at=now, error=None, retry_at=None,
                deadline_at=deadline.at(now),
            ),
        )
        if moved is not None:
            await recovery_checks.first_render_check(conn, moved.job, deadline.expected_s, ctx.rt.settings)
        if moved is not None and accepted.queue_position is not None:
            await provider_reports.record_queue_position(conn, job.id, accepted.queue_position)
        if moved is None and await _orphaned(conn, job.id, accepted.provider_job_id):
            # Canceled, deleted or retried while the provider was answering: this render is nobody's; stop it.
            await outbox.add(conn, [CancelRequested(job_id=job.id, provider=job.provider,
                                                    provider_job_id=accepted.provider_job_id,
                                                    model_name=req.request.model_name)])
    log.info("submitted", extra={"job_id": job.id, "provider_job_id": accepted.provider_job_id,
                                 "attempt": job.attempt, "deadline_s": deadline.seconds,
                                 "deadline_samples": deadline.samples})


async def _orphaned(conn: asyncpg.Connection, job_id: str, provider_job_id: str) -> bool:
    """The provider accepted a render the job no longer wants: it ended, was deleted, or moved on to
    another attempt (a callback that adopted this very render is not an orphan)."""
    current = await jobs.fetch(conn, job_id)
    return current is None or current.finished or current.provider_job_id != provider_job_id


class Refusal(enum.Enum):
    """Where a submission was refused, which says what else its refusal writes."""

    UNOFFERED = "unoffered"  # its provider is not offered here: nothing was claimed
    BEFORE_CALL = "before_call"  # claimed, then refused before the provider was asked (its input is gone)
    BY_PROVIDER = "by_provider"  # the provider's own answer, which the breaker hears too


async def _refuse(ctx: Context, job: JobRow, err: ProviderError, where: Refusal) -> None:
    """Fail or retry the job for `err` and, once it was claimed, answer its claim and hand the slot the claim
    held to the next job. The refusal and the job's move away from pending commit together: a refused claim
    is never up for takeover while its job still looks like it is waiting for this attempt."""
    async with ctx.rt.tx() as conn:
        await slots.lock_provider(conn, job.provider)
        await _refused(ctx, conn, job, err)
        if where is Refusal.UNOFFERED:
            return
        await submissions.record_refused(conn, submissions.request_for(job), err.to_job_error())
        if where is Refusal.BY_PROVIDER:
            await breakers.record_answer(conn, job.provider, err.code, ctx.rt.settings)
        await outbox.add(conn, await waiting.slot_wakeup(conn, job.provider, job.account_id))


async def _refused(ctx: Context, conn: asyncpg.Connection, job: JobRow, err: ProviderError) -> None:
    """The refused job's move: a new attempt after a backoff, or its failure (common/outcomes.py)."""
    error = err.to_job_error()
    # A refusal of our account itself (no credit, our key refused) is an operator's to fix: it fails the job at
    # once (not retryable) and opens the provider's breaker (`_refuse`).
    said = log.error if err.code in breakers.REFUSALS else log.warning
    said("submission refused", extra={"job_id": job.id, "code": error.code.value, "error": err.message})
    await fail_or_retry(conn, job, error, policies=ctx.policies, reason=f"submit refused: {error.code.value}",
                        expect=[JobStatus.PENDING], retry_after=err.retry_after,
                        guard=Guard(attempt=job.attempt))
