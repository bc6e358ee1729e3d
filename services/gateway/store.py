"""Reads of jobs on behalf of an account. Every one is scoped by account and hides deleted jobs, so another
account's job and a deleted one look exactly like a job that never existed."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from libs.common.jobs import JobRow, row_to_job
from libs.common.states import JobStatus


async def owned_job(conn: asyncpg.Connection | asyncpg.Pool, account_id: str, job_id: str) -> JobRow | None:
    row = await conn.fetchrow(
        "SELECT * FROM jobs WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL", job_id, account_id,
    )
    return None if row is None else row_to_job(row)


async def list_jobs(
    conn: asyncpg.Connection | asyncpg.Pool, account_id: str, *, status: JobStatus | None,
    after: tuple[datetime, str] | None, limit: int,
) -> list[JobRow]:
    """Newest first, strictly after the keyset position `after` (the last row of the previous page)."""
    before_at, before_id = after if after else (None, None)
    rows = await conn.fetch(
        """
        SELECT * FROM jobs
        WHERE account_id = $1 AND deleted_at IS NULL
          AND ($2::job_status IS NULL OR status = $2::job_status)
          AND ($3::timestamptz IS NULL OR (created_at, id) < ($3::timestamptz, $4::text))
        ORDER BY created_at DESC, id DESC
        LIMIT $5
        """,
        account_id, status.value if status else None, before_at, before_id, limit,
    )
    return [row_to_job(r) for r in rows]


async def trail(conn: asyncpg.Connection | asyncpg.Pool, job_id: str) -> list[asyncpg.Record]:
    return await conn.fetch(
        "SELECT from_status, to_status, at, reason FROM job_transitions WHERE job_id = $1 ORDER BY id", job_id,
    )
