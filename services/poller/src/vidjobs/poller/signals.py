"""The one code path from a provider signal (callback or poll) to a job transition."""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from vidjobs.common import attempt_costs, changes, jobs, metrics, outbox, provider_reports, ratecard, recovery_checks
from vidjobs.common.errors import ErrorCode, JobError, Redeliver
from vidjobs.common.events import CancelRequested, DownloadRequested
from vidjobs.common.jobs import JobRow
from vidjobs.common.outcomes import fail_or_retry
from vidjobs.common.render_deadlines import RenderDeadlines, render_deadline
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import Runtime
from vidjobs.common.states import RENDERING, JobStatus
from vidjobs.common.transitions import Guard, JobUpdate, transition
from vidjobs.providers.base import ProviderSignal, ProviderState

log = logging.getLogger("vidjobs.poller")



class LearnedBy(enum.StrEnum):
    """How a signal reached us: what `vidjobs_completions_total` counts a finished render by."""

    CALLBACK = "callback"  # the provider's callback (an unsigned one confirmed by a status poll included)
    SCHEDULED_POLL = "scheduled_poll"  # the poll schedule of a provider without callbacks
    RECOVERY_POLL = "recovery_poll"  # the delayed recovery check: the callback was lost or is late
    REQUESTED_POLL = "requested_poll"  # a poll asked for otherwise


# Signals the provider sent of its own accord, or on its poll schedule: each may move the render's next recovery
# check (vidjobs.common.recovery_checks.heard_from: out once the render is past its expected end, never past that
# end before it). A recovery poll's answer does not: the check that asked it has already set the next one.
UNASKED = frozenset({LearnedBy.CALLBACK, LearnedBy.SCHEDULED_POLL})


@dataclass(frozen=True)
class SignalContext:
    rt: Runtime
    policies: Policies
    # A render adopted here gets its deadline from its model's measured renders; None: the fixed one.
    deadlines: RenderDeadlines | None = None


def is_stale(job: JobRow, sig: ProviderSignal) -> bool:
    """A signal about an earlier attempt (or another provider job) must not move the current one."""
    if sig.attempt is not None and sig.attempt != job.attempt:
        return True
    return job.provider_job_id is not None and sig.provider_job_id != job.provider_job_id


def is_stray(job: JobRow, sig: ProviderSignal) -> bool:
    """A render still going at the provider that the job does not use (an attempt given up on, or a second
    render after an unclear submit): nobody will ever download it, so it only costs money."""
    return (sig.verified and sig.state in (ProviderState.QUEUED, ProviderState.RUNNING)
            and sig.provider_job_id != job.provider_job_id and (job.finished or is_stale(job, sig)))


async def apply_signal(ctx: SignalContext, job: JobRow, sig: ProviderSignal, *, source: str,
                       learned_by: LearnedBy) -> None:
    if is_stray(job, sig):
        await _stop_stray(ctx, job, sig, source)
        return
    if job.finished:
        return
    if is_stale(job, sig):
        log.info("stale provider signal ignored", extra={"job_id": job.id, "source": source,
                                                           "provider_job_id": sig.provider_job_id})
        return
    async with ctx.rt.tx() as conn:
        if job.status is JobStatus.PENDING:
            job = await _adopt(ctx, conn, job, sig, source)
            if job.finished or is_stale(job, sig):
                return
        await _apply(ctx, conn, job, sig, source, learned_by)
        if learned_by in UNASKED and sig.state in (ProviderState.QUEUED, ProviderState.RUNNING):
            # When the render should end, read as the reaper reads it (through this process's per-model cache).
            expected = await render_deadline(ctx.deadlines, conn, ctx.rt.settings, job.model)
            await recovery_checks.heard_from(conn, job, expected.expected_s, ctx.rt.settings)


async def _stop_stray(ctx: SignalContext, job: JobRow, sig: ProviderSignal, source: str) -> None:
    log.warning("a render this job does not use is still going; stopping it", extra={
        "job_id": job.id, "source": source, "provider_job_id": sig.provider_job_id, "attempt": sig.attempt})
    # A job moves to another model only before its attempt is submitted (vidjobs.submitter.failover), so a
    # render of its current attempt was made with its model; one of an earlier attempt (or of none it names)
    # may have been made with a model it has since left, so the provider looks that render up itself.
    model_name = job.request.model_name if sig.attempt == job.attempt else None
    async with ctx.rt.tx() as conn:
        await outbox.add(conn, [CancelRequested(job_id=job.id, provider=job.provider,
                                                provider_job_id=sig.provider_job_id, model_name=model_name)])


def _same_render(job: JobRow) -> Guard:
    """Every move below was decided from `job` as read: it applies only while the row is still on that
    attempt and that render, however long the provider took to answer."""
    return Guard(attempt=job.attempt, provider_job_id=job.provider_job_id)


async def _adopt(
    ctx: SignalContext, conn: asyncpg.Connection, job: JobRow, sig: ProviderSignal, source: str,
) -> JobRow:
    """The provider answered through another door before the submitter recorded its answer."""
    if sig.attempt != job.attempt:
        raise Redeliver("signal for a job whose submission is not recorded yet", delay=0.5)
    deadline = await render_deadline(ctx.deadlines, conn, ctx.rt.settings, job.model)
    now = datetime.now(UTC)
    moved = await transition(
        conn, job.id, JobStatus.SUBMITTED, reason=f"{source} arrived before the submit answer",
        expect=[JobStatus.PENDING], guard=Guard(attempt=sig.attempt, provider_job_id=None),
        update=JobUpdate(provider_job_id=sig.provider_job_id, submitted_at=now,
                         deadline_at=deadline.at(now)),
    )
    if moved is not None:
        await recovery_checks.first_render_check(conn, moved.job, deadline.expected_s, ctx.rt.settings)
        return moved.job
    current = await jobs.fetch(conn, job.id)
    assert current is not None
    return current


async def _apply(
    ctx: SignalContext, conn: asyncpg.Connection, job: JobRow, sig: ProviderSignal, source: str,
    learned_by: LearnedBy,
) -> None:
    if sig.cost is not None:
        # Before the move it comes with, so the charge at the end of the job can read it.
        cost = await ratecard.provider_cost_credits(conn, job.rate_card_version, sig.cost)
        await attempt_costs.record(conn, job, credits=cost, usd=sig.cost)
    match sig.state:
        case ProviderState.QUEUED:
            if sig.queue_position is not None and job.status is JobStatus.SUBMITTED:
                await provider_reports.record_queue_position(conn, job.id, sig.queue_position)
        case ProviderState.RUNNING:
            await _running(conn, job, sig, source)
        case ProviderState.SUCCEEDED:
            if await _succeeded(ctx, conn, job, sig, source):
                # Counted once the move commits: a redelivered or late signal moves nothing and counts nothing.
                changes.on_commit(metrics.COMPLETIONS.labels(job.provider, learned_by.value).inc)
        case ProviderState.FAILED | ProviderState.CANCELED:
            error = sig.error or JobError.of(ErrorCode.PROVIDER_UNAVAILABLE, "The provider stopped the render.")
            await fail_or_retry(conn, job, error, policies=ctx.policies, expect=RENDERING, guard=_same_render(job),
                                reason=f"{source}: provider reported {sig.state.value} ({error.code.value})")


async def _running(conn: asyncpg.Connection, job: JobRow, sig: ProviderSignal, source: str) -> None:
    if job.status is JobStatus.SUBMITTED:
        await transition(conn, job.id, JobStatus.PROCESSING, reason=f"{source}: rendering started",
                         expect=[JobStatus.SUBMITTED], update=JobUpdate(progress=sig.progress),
                         guard=_same_render(job))
    elif sig.progress is not None:
        await provider_reports.record_progress(conn, job.id, sig.progress)


async def _succeeded(
    ctx: SignalContext, conn: asyncpg.Connection, job: JobRow, sig: ProviderSignal, source: str,
) -> bool:
    """Move a finished render on to its download; True if this signal moved it."""
    if not sig.output_url:
        error = JobError.of(ErrorCode.VERIFICATION_FAILED, "The provider reported success without an output.")
        await transition(conn, job.id, JobStatus.FAILED, reason=f"{source}: success without output",
                         expect=RENDERING, update=JobUpdate(error=error, progress=None), guard=_same_render(job))
        return False
    deadline = datetime.now(UTC) + timedelta(seconds=ctx.rt.settings.download_deadline_s)
    moved = await transition(
        conn, job.id, JobStatus.DOWNLOADING, reason=f"{source}: render finished", expect=RENDERING,
        update=JobUpdate(provider_output=sig.output_url, progress=None, deadline_at=deadline),
        emit=[DownloadRequested(job_id=job.id)], guard=_same_render(job),
    )
    return moved is not None
