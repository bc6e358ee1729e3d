"""An operator's two ways to end a stuck job's wait: another attempt, or an honest failure.

Both go through the transition function and the queues the services use, so the job's audit trail, its
credit and its app's webhooks come out as for any other move, and a service that races the operator finds
the move already made (the transition's guard) rather than a job changed under it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import asyncpg

from vidjobs.common import jobs, outbox, recovery_checks, waiting
from vidjobs.common.errors import ErrorCode, JobError, VidjobsError
from vidjobs.common.events import DownloadRequested, JobQueued
from vidjobs.common.jobs import JobRow
from vidjobs.common.outcomes import next_attempt
from vidjobs.common.states import RENDERING, JobStatus
from vidjobs.common.transitions import Guard, JobUpdate, transition

STUCK = JobError.of(ErrorCode.TIMEOUT, "The render stopped making progress; an operator started it again.")


class CannotRescue(VidjobsError):
    """The job is in a state the rescue does not apply to (ended, deleted, or moved meanwhile)."""


def _same_render(job: JobRow) -> Guard:
    return Guard(attempt=job.attempt, provider_job_id=job.provider_job_id)


def _live(job: JobRow) -> None:
    if job.deleted_at is not None:
        raise CannotRescue(f"{job.id} was deleted; nothing to do")
    if job.finished:
        # An ending was settled and reported to the owner; a new render is a new job, with a new quote.
        raise CannotRescue(f"{job.id} already ended ({job.status.value}); a finished job is never reopened, "
                           "its owner can submit it again")


async def retry(conn: asyncpg.Connection, job: JobRow, *, recovery_delay_s: float) -> str:
    """Give a stuck job another go at the stage it is stuck in; says what was done. A render the provider
    sits on is abandoned (and stopped there) for a new attempt; a download is asked for again, never
    re-rendered; a queued job whose message was lost is queued again."""
    _live(job)
    now = datetime.now(UTC)
    match job.status:
        case JobStatus.SUBMITTED | JobStatus.PROCESSING:
            moved = await transition(conn, job.id, JobStatus.RETRYING, reason="operator: retry a stuck render",
                                     expect=RENDERING, guard=_same_render(job),
                                     update=JobUpdate(error=STUCK, retry_at=now, recover_at=now, progress=None))
            if moved is None:
                raise CannotRescue(f"{job.id} moved on while this ran; look at it again")
            await outbox.add(conn, jobs.stop_at_provider(job))
            await next_attempt(conn, moved.job, reason="operator: retry", now=now, recovery_delay_s=recovery_delay_s)
            return f"abandoned attempt {job.attempt} and queued the next one"
        case JobStatus.RETRYING:
            if await next_attempt(conn, job, reason="operator: retry now", now=now,
                                  recovery_delay_s=recovery_delay_s) is None:
                raise CannotRescue(f"{job.id} moved on while this ran; look at it again")
            return "cut its backoff short and queued its next attempt"
        case JobStatus.PENDING:
            if waiting.message_alive(job, now):
                why = job.wait_reason or "no reason given"
                raise CannotRescue(f"{job.id} is not stuck: it waits for a slot ({why}) and its message looked "
                                   f"at it at {job.waited_at:%H:%M:%S} UTC")
            await outbox.add(conn, [JobQueued(job_id=job.id)])
            await recovery_checks.reschedule_recovery(conn, job.id, recovery_delay_s)
            return "queued it for a submission slot again"
        case JobStatus.DOWNLOADING:
            await outbox.add(conn, [DownloadRequested(job_id=job.id)])
            return "asked for its download again"
    raise CannotRescue(f"{job.id} is {job.status.value}; nothing to retry")


async def fail(conn: asyncpg.Connection, job: JobRow, *, reason: str) -> JobRow:
    """End a stuck job as failed, as a failure in its own stage would: its reservation is released and what
    it owes charged, its render stopped at the provider, its app told."""
    _live(job)
    error = JobError.of(ErrorCode.INTERNAL, reason or "This job was stuck, so an operator stopped it.")
    if job.status is JobStatus.RETRYING:
        # The table lets a job waiting out its backoff leave only for the queue (or a cancel): it goes
        # there and fails from there, in this one transaction, so nobody sees it queued.
        back = await transition(conn, job.id, JobStatus.PENDING, reason="operator: fail (leaves its backoff)",
                                expect=[JobStatus.RETRYING], guard=_same_render(job))
        job = back.job if back is not None else job
    moved = await transition(conn, job.id, JobStatus.FAILED, reason=f"operator: {reason or 'failed a stuck job'}",
                             expect=[job.status], guard=_same_render(job),
                             update=JobUpdate(error=error, progress=None), emit=jobs.stop_at_provider(job))
    if moved is None:
        raise CannotRescue(f"{job.id} moved on while this ran; look at it again")
    return moved.job
