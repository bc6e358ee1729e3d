"""Canceling a job: the one way an owner's cancel and an operator's (closing an account) end a live job."""

from __future__ import annotations

import asyncpg

from vidjobs.common import jobs, outbox
from vidjobs.common.errors import ErrorCode, JobError
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate, Transitioned, transition


async def cancel(conn: asyncpg.Connection, job_id: str, *, reason: str) -> Transitioned | None:
    """Move a live job to canceled through the transition function (which settles its credit and hands its
    slot on) and ask its provider to stop rendering it. None when it had already ended."""
    moved = await transition(conn, job_id, JobStatus.CANCELED, reason=reason,
                             update=JobUpdate(error=JobError.of(ErrorCode.CANCELED)))
    if moved is not None:
        await outbox.add(conn, jobs.stop_at_provider(moved.job, was=moved.from_status))
    return moved
