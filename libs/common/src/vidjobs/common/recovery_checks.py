"""A live job's next recovery check (`recover_at`, and its RecoveryDue message): the reaper's look at a job
whose own messages may have been lost."""

from __future__ import annotations

from datetime import datetime

import asyncpg

from vidjobs.common import outbox
from vidjobs.common.events import RecoveryDue
from vidjobs.common.jobs import JobRow
from vidjobs.common.states import SQL_TERMINAL, TERMINAL


async def reschedule_recovery(conn: asyncpg.Connection, job_id: str, delay_s: float) -> datetime | None:
    """Push a live job's next recovery check out by `delay_s` and stage its message."""
    due: datetime | None = await conn.fetchval(
        f"""
        UPDATE jobs SET recover_at = clock_timestamp() + make_interval(secs => $2)
        WHERE id = $1 AND deleted_at IS NULL
          AND status NOT IN {SQL_TERMINAL}
        RETURNING recover_at
        """,
        job_id, delay_s,
    )
    if due is not None:
        await outbox.add(conn, [RecoveryDue(job_id=job_id, due_at=due)])
    return due


async def watch_again(conn: asyncpg.Connection, job: JobRow, interval_s: float) -> None:
    """A job just moved out of the queue: if it was parked, with no recovery check scheduled, its checks begin
    again now that something of its own can go wrong (whoever moved it: the submitter, or a callback that
    arrived before the submitter's answer)."""
    if job.recover_at is None and job.status not in TERMINAL:
        await reschedule_recovery(conn, job.id, interval_s)
