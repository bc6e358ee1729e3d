"""The delayed recovery check (docs/ARCHITECTURE.md "Recovery").

When a check comes due the job is reread: deleted or terminal → done; superseded by a newer schedule → done;
not yet due or leased by another worker → deferred; otherwise a lease is taken and the job is handed to the
stage that should move it next. Lease, hand-off and the next check are one transaction, so a hand-off that
fails leaves nothing behind and the redelivered check starts over.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import asyncpg

from vidjobs.common import events, jobs, logs, outbox, recovery_checks, requestids, waiting
from vidjobs.common.bus import Delivery
from vidjobs.common.errors import ErrorCode, JobError, Redeliver
from vidjobs.common.events import DownloadRequested, JobQueued, PollRequested, RecoveryDue
from vidjobs.common.jobs import JobRow
from vidjobs.common.outcomes import fail_or_retry, next_attempt
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import Runtime
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import Guard, JobUpdate, transition
from vidjobs.reaper import leases
from vidjobs.reaper.backlog import SubmitQueue

log = logging.getLogger("vidjobs.reaper")

LEASE_TTL_S = 30.0
OWNER = f"reaper-{socket.gethostname()}-{os.getpid()}"


@dataclass(frozen=True)
class Context:
    rt: Runtime
    policies: Policies
    owner: str = OWNER  # who holds the leases this reaper takes
    # How far behind the submitter is; None: not asked (a waiting job never looked at is handed off again).
    submit_queue: SubmitQueue | None = None


async def on_recovery_due(ctx: Context, event: RecoveryDue, delivery: Delivery) -> None:
    job = await jobs.fetch(ctx.rt.pool, event.job_id)
    if job is None or job.finished or job.recover_at is None:
        return
    logs.about_job(job.id, job.account_id)
    if requestids.current() is None:  # a check the sweep re-sent: no request of its own
        requestids.continue_job(job.request_id)
    if event.due_at < job.recover_at - timedelta(milliseconds=1):
        return  # superseded: a newer check for this job is scheduled
    now = datetime.now(UTC)
    if job.recover_at > now:
        raise Redeliver("recovery check not yet due", delay=(job.recover_at - now).total_seconds())
    async with ctx.rt.tx() as conn:
        if await leases.take(conn, job.id, ctx.owner, LEASE_TTL_S) is None:
            raise Redeliver("job is leased by another reaper", delay=await leases.seconds_left(conn, job.id))
        current = await jobs.fetch(conn, job.id)
        if current is None or current.finished or current.recover_at != job.recover_at:
            return  # it moved while we looked
        await recover(ctx, conn, current, now)
        await leases.hold_until_next_check(conn, job.id)


async def recover(ctx: Context, conn: asyncpg.Connection, job: JobRow, now: datetime) -> None:
    """Hand the job to whatever should move it next, and schedule the following check."""
    log.info("recovering job", extra={"job_id": job.id, "status": job.status.value})
    match job.status:
        case JobStatus.PENDING:
            if waiting.message_alive(job, now) or await _queued_behind_others(ctx, job):
                # It waits for a slot and its own message is going round, or is still queued: one is enough.
                await recovery_checks.reschedule_recovery(conn, job.id, _next_check_in(ctx, job, now))
            else:
                await _hand_off(ctx, conn, job, JobQueued(job_id=job.id), now)
        case JobStatus.RETRYING:
            await _end_backoff(ctx, conn, job, now)
        case JobStatus.SUBMITTED | JobStatus.PROCESSING:
            if _past(job.deadline_at, now):
                await _render_timed_out(ctx, conn, job)
            else:
                await _hand_off(ctx, conn, job, PollRequested(job_id=job.id, reason="recovery"), now)
        case JobStatus.DOWNLOADING:
            if _past(job.deadline_at, now):
                error = JobError.of(ErrorCode.DOWNLOAD_FAILED, "The render could not be copied before its deadline.")
                await transition(conn, job.id, JobStatus.FAILED, reason="download deadline passed",
                                 expect=[JobStatus.DOWNLOADING], update=JobUpdate(error=error))
            else:
                await _hand_off(ctx, conn, job, DownloadRequested(job_id=job.id), now)


async def _queued_behind_others(ctx: Context, job: JobRow) -> bool:
    """A waiting job the submitter never looked at, while the submitter still has messages it has not been
    handed: its own message is among them (a burst of creates outruns the first recovery checks). Another
    would only lengthen that queue; with nothing queued, its message was lost and is sent again."""
    return job.waited_at is None and ctx.submit_queue is not None and await ctx.submit_queue.waiting() > 0


def _past(moment: datetime | None, now: datetime) -> bool:
    return moment is not None and moment <= now


async def _hand_off(ctx: Context, conn: asyncpg.Connection, job: JobRow, event: events.Event, now: datetime) -> None:
    await outbox.add(conn, [event])
    await recovery_checks.reschedule_recovery(conn, job.id, _next_check_in(ctx, job, now))


def _next_check_in(ctx: Context, job: JobRow, now: datetime) -> float:
    interval = ctx.rt.settings.recovery_interval_s
    if job.deadline_at is not None:
        # Look again right at the deadline, so a stuck stage fails on time rather than an interval late.
        interval = min(interval, max((job.deadline_at - now).total_seconds(), 0.0) + 0.1)
    return interval


async def _end_backoff(ctx: Context, conn: asyncpg.Connection, job: JobRow, now: datetime) -> None:
    if job.retry_at is not None and job.retry_at > now:
        await recovery_checks.reschedule_recovery(conn, job.id, (job.retry_at - now).total_seconds())
        return
    await next_attempt(conn, job, reason="backoff over", now=now, recovery_delay_s=ctx.rt.settings.recovery_delay_s)


async def _render_timed_out(ctx: Context, conn: asyncpg.Connection, job: JobRow) -> None:
    """The render passed its deadline: it fails with `render_timeout` (tried again only where the provider's
    retry policy says `retry_on_timeout`), its credit reservation is released as every failure's is, and the
    provider is asked to stop it, whatever happens next."""
    retried = ctx.policies.for_provider(job.provider).retry_on_timeout
    error = JobError.of(ErrorCode.RENDER_TIMEOUT, _timeout_message(job, retried=retried))
    moved = await fail_or_retry(conn, job, error, policies=ctx.policies, reason="render deadline passed",
                                expect=[JobStatus.SUBMITTED, JobStatus.PROCESSING], guard=_same_render(job))
    if moved is not None:
        log.info("render timed out", extra={"job_id": job.id, "to": moved.job.status.value,
                                            "provider_job_id": job.provider_job_id})
        # Whatever happens next, this render is abandoned: stop paying for it.
        await outbox.add(conn, jobs.stop_at_provider(job))


def _same_render(job: JobRow) -> Guard:
    return Guard(attempt=job.attempt, provider_job_id=job.provider_job_id)


def _timeout_message(job: JobRow, *, retried: bool) -> str:
    allowed = ""
    if job.deadline_at is not None and job.submitted_at is not None:
        allowed = f" within {(job.deadline_at - job.submitted_at).total_seconds():.0f} s"
    then = ("it was stopped and is tried again while attempts remain" if retried
            else "it was stopped and its credit released. Render it again to try once more")
    return f"The provider did not finish the render{allowed}, its deadline; {then}."
