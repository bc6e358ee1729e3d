"""What a provider reports of a job's render, stored beside its status (none of it is a status change): its
place in the provider's queue and its progress. What the provider billed for it is kept by attempt_costs."""

from __future__ import annotations

import asyncpg

from vidjobs.common import changes
from vidjobs.common.states import JobStatus, sql


async def record_queue_position(conn: asyncpg.Connection, job_id: str, position: int) -> None:
    """Store a submitted job's place in its provider's queue, as the provider reported it."""
    at = await conn.fetchval(
        f"""
        UPDATE jobs SET provider_queue_position = $2, updated_at = clock_timestamp()
        WHERE id = $1 AND status = {sql(JobStatus.SUBMITTED)} AND deleted_at IS NULL
          AND provider_queue_position IS DISTINCT FROM $2
        RETURNING updated_at
        """,
        job_id, position,
    )
    if at is not None:
        changes.note(job_id, JobStatus.SUBMITTED.value, at)


async def record_progress(conn: asyncpg.Connection, job_id: str, progress: float) -> bool:
    """Store a provider's own progress figure for a rendering job (not a status change)."""
    row = await conn.fetchrow(
        f"""
        UPDATE jobs SET progress = $2, updated_at = clock_timestamp()
        WHERE id = $1 AND status = {sql(JobStatus.PROCESSING)} AND deleted_at IS NULL
          AND (progress IS NULL OR progress < $2)
        RETURNING updated_at
        """,
        job_id, progress,
    )
    if row is None:
        return False
    changes.note(job_id, JobStatus.PROCESSING.value, row["updated_at"])
    return True
