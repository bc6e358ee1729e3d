"""The shared ending of every failed step: retry when the policy allows, fail honestly otherwise."""

from __future__ import annotations

from collections.abc import Collection
from datetime import UTC, datetime

import asyncpg

from libs.common.errors import JobError
from libs.common.events import RecoveryDue
from libs.common.jobs import JobRow
from libs.common.retry import Policies, next_retry
from libs.common.states import JobStatus
from libs.common.transitions import Guard, JobUpdate, Transitioned, transition


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
