"""What a provider reports of a job's render, stored beside its status (none of it is a status change): its
place in the provider's queue, its progress, and what the provider billed for it (attempt_costs)."""

from __future__ import annotations

import asyncpg

from vidjobs.common import attempt_costs, changes
from vidjobs.common.jobs import JobRow
from vidjobs.common.states import SQL_TERMINAL, JobStatus, sql


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


async def record_provider_cost(conn: asyncpg.Connection, job: JobRow, *, credits: int, usd: float | None) -> None:
    """Store what the provider reported billing for the job's current attempt (not a status change; the
    charge is settled when the job ends): on the job row, which the charge reads, and in the attempt's row of
    `attempt_costs`, which the job's provider cost sums. `usd` as the provider reported it (None where it
    gave its bill otherwise), `credits` at the job's rate card. A report about an earlier attempt's render,
    or one reaching a job that has ended, changes nothing."""
    await conn.execute(
        f"""
        WITH current AS (
            UPDATE jobs SET provider_cost_credits = $2
            WHERE id = $1 AND attempt = $3 AND provider_job_id IS NOT DISTINCT FROM $4::text
              AND deleted_at IS NULL AND status NOT IN {SQL_TERMINAL}
            RETURNING id, attempt, account_id, provider, model, provider_job_id, rate_card_version
        )
        INSERT INTO attempt_costs AS a (job_id, attempt, account_id, provider, model, provider_job_id, cost_usd,
                                        cost_credits, rate_card_version)
        SELECT id, attempt, account_id, provider, model, provider_job_id, $5, $2, rate_card_version FROM current
        ON CONFLICT (job_id, attempt) DO UPDATE
            SET cost_usd = EXCLUDED.cost_usd, cost_credits = EXCLUDED.cost_credits,
                provider_job_id = EXCLUDED.provider_job_id, reported_at = clock_timestamp()
        """,
        job.id, credits, job.attempt, job.provider_job_id, attempt_costs.usd(usd),
    )
