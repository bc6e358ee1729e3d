"""The shared ending of every failed step: retry when the policy allows, fail honestly otherwise."""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime, timedelta

import asyncpg

from vidjobs.common.errors import JobError
from vidjobs.common.events import JobQueued, RecoveryDue
from vidjobs.common.jobs import JobRow
from vidjobs.common.retry import Policies, next_retry, spends_attempt
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import Guard, JobUpdate, Transitioned, transition


async def fail_or_retry(
    conn: asyncpg.Connection, job: JobRow, error: JobError, *, policies: Policies, reason: str,
    expect: Collection[JobStatus], retry_after: float | None = None, guard: Guard | None = None,
) -> Transitioned | None:
    now = datetime.now(UTC)
    policy = policies.for_provider(job.provider)
    when = next_retry(policy, error, attempt=job.attempt, created_at=job.created_at, now=now, retry_after=retry_after)
    if when is not None:
        return await transition(
            conn, job.id, JobStatus.RETRYING, reason=f"{reason}; retry at {when.isoformat()}", expect=expect,
            update=JobUpdate(error=error, retry_at=when, recover_at=when, progress=None),
            emit=[RecoveryDue(job_id=job.id, due_at=when)], guard=guard,
        )
    return await transition(
        conn, job.id, JobStatus.FAILED, reason=reason, expect=expect,
        update=JobUpdate(error=error, progress=None), guard=guard,
    )


async def next_attempt(
    conn: asyncpg.Connection, job: JobRow, *, reason: str, now: datetime, recovery_delay_s: float,
) -> Transitioned | None:
    """A retrying job goes back to the queue for its next attempt (the end of a backoff, or an operator's
    retry), with its first recovery check of that attempt."""
    attempt = job.attempt + (1 if job.error is None or spends_attempt(job.error) else 0)
    due = now + timedelta(seconds=recovery_delay_s)
    return await transition(
        conn, job.id, JobStatus.PENDING, reason=f"{reason}; attempt {attempt}", expect=[JobStatus.RETRYING],
        # The next attempt has no render yet: a late signal about the last one must not find it here.
        update=JobUpdate(attempt=attempt, retry_at=None, error=None, deadline_at=None, recover_at=due,
                         provider_job_id=None, provider_output=None),
        emit=[JobQueued(job_id=job.id), RecoveryDue(job_id=job.id, due_at=due)],
    )
