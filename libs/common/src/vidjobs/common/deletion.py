"""A job's deletion. Deletion is not a status: the row keeps its status, `deleted_at` hides it from every
read, and every consumer treats it as terminal."""

from __future__ import annotations

import asyncpg

from vidjobs.common import changes, credits, outbox, waiting
from vidjobs.common.events import AssetsDeleteRequested
from vidjobs.common.jobs import row_to_job, stop_at_provider
from vidjobs.common.states import RENDERING, SQL_TERMINAL, TERMINAL, JobStatus, sql


async def soft_delete(conn: asyncpg.Connection, job_id: str, account_id: str) -> bool:
    """Set the job's `deleted_at`, which hides it from every read at once; settle its credit if it was live;
    stop its render at the provider and hand its slot on; and ask for its assets to be removed. False if the
    account has no such job (or deleted it already)."""
    # A deleted live job never reaches a terminal transition: it is settled here, like a cancel.
    row = await conn.fetchrow(
        f"""
        UPDATE jobs SET deleted_at = clock_timestamp(), updated_at = clock_timestamp(), recover_at = NULL,
            actual_credits = CASE WHEN status IN {SQL_TERMINAL} THEN actual_credits
                                  ELSE {credits.owed_sql("false", f"status = {sql(JobStatus.DOWNLOADING)}")} END
        WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL
        RETURNING *
        """,
        job_id, account_id,
    )
    if row is None:
        return False
    job = row_to_job(row)
    if job.status not in TERMINAL:
        await credits.settle_credit(conn, job, "deleted", rendered=job.status is JobStatus.DOWNLOADING)
    await outbox.add(conn, [
        *stop_at_provider(job),
        *(await waiting.slot_wakeup(conn, job.provider, job.account_id) if job.status in RENDERING else []),
        AssetsDeleteRequested(job_id=job_id),
    ])
    changes.note(job_id, "deleted", row["updated_at"])
    if job.status is JobStatus.PENDING:
        changes.note_queue(account_id)
    return True
