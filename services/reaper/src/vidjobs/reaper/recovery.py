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

from vidjobs.common import events, jobs, logs, outbox, recovery_checks, render_timeouts, requestids, waiting
from vidjobs.common.bus import Delivery
from vidjobs.common.errors import ErrorCode, JobError, Redeliver
from vidjobs.common.events import DownloadRequested, JobQueued, PollRequested, RecoveryDue
from vidjobs.common.jobs import JobRow
from vidjobs.common.outcomes import next_attempt
from vidjobs.common.render_deadlines import RenderDeadlines, render_deadline
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import Runtime
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate, transition
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
    # What a model's renders take here, for when a render should be done; None: unmeasured (the fixed figures).
    deadlines: RenderDeadlines | None = None


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
        # Locked: a change committed while this check decides (the submitter parking the job, a callback
        # moving it) would otherwise be undone by the next check scheduled here from the row as it was. The
        # row before the lease: the lease refers to the job, and holding that reference while waiting for the
        # row would deadlock with a callback that updated the row and then asks for it again.
        current = await jobs.fetch_locked(conn, job.id)
        if current is None or current.finished or current.recover_at != job.recover_at:
            return  # it moved while we looked
        if await leases.take(conn, job.id, ctx.owner, LEASE_TTL_S) is None:
            raise Redeliver("job is leased by another reaper", delay=await leases.seconds_left(conn, job.id))
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
            await _check_render(ctx, conn, job, now)
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


async def _hand_off(ctx: Context, conn: asyncpg.Connection, job: JobRow, event: events.Event, now: datetime,
                    next_in: float | None = None) -> None:
    await outbox.add(conn, [event])
    await recovery_checks.reschedule_recovery(conn, job.id, _next_check_in(ctx, job, now) if next_in is None
                                              else next_in)


def _next_check_in(ctx: Context, job: JobRow, now: datetime) -> float:
    return recovery_checks.by_deadline(job, now, ctx.rt.settings.recovery_interval_s)


async def _check_render(ctx: Context, conn: asyncpg.Connection, job: JobRow, now: datetime) -> None:
    """Nobody has heard of this render for a while. Before its deadline: ask its provider, and look again along
    the taper (vidjobs.common.recovery_checks). At its deadline: ask once more, and let the answer decide (the
    poller downloads a finished render, fails a failed one and times out one still going). Once the provider
    has had `deadline_question_s` to answer that and has not: timed out without its answer."""
    settings = ctx.rt.settings
    if job.deadline_at is None or not _past(job.deadline_at, now):
        expected = await render_deadline(ctx.deadlines, conn, settings, job.model)
        next_in = recovery_checks.render_check_in(job, now, expected.expected_s, settings)
        await _hand_off(ctx, conn, job, PollRequested(job_id=job.id, reason="recovery"), now, next_in)
        return
    answer_by = job.deadline_at + timedelta(seconds=settings.deadline_question_s)
    if now < answer_by:
        log.info("render at its deadline; asking its provider once more", extra={"job_id": job.id})
        await _hand_off(ctx, conn, job, PollRequested(job_id=job.id, reason=render_timeouts.DEADLINE_POLL), now,
                        (answer_by - now).total_seconds())
        return
    await render_timeouts.time_out(conn, job, ctx.policies, why="the provider did not answer at the deadline")


async def _end_backoff(ctx: Context, conn: asyncpg.Connection, job: JobRow, now: datetime) -> None:
    if job.retry_at is not None and job.retry_at > now:
        await recovery_checks.reschedule_recovery(conn, job.id, (job.retry_at - now).total_seconds())
        return
    await next_attempt(conn, job, reason="backoff over", now=now, recovery_delay_s=ctx.rt.settings.recovery_delay_s)
