"""Moving a downloading job's deadline when its render's size gives the download longer than the stage had:
the reaper fails a downloading job at its deadline, and must not fail one whose copy is still within pace."""

from __future__ import annotations

import asyncpg

from vidjobs.common.states import JobStatus

# What the copy still does once the download is in: verify, thumbnail, preview and store (seconds, not more).
AFTER_DOWNLOAD_S = 120.0


async def extend(pool: asyncpg.Pool, job_id: str, seconds: float) -> None:
    """The job's deadline is at least `seconds` (plus AFTER_DOWNLOAD_S) from now; never brought forward, and
    only while the job is still downloading."""
    await pool.execute(
        """
        UPDATE jobs SET deadline_at = greatest(deadline_at, clock_timestamp() + make_interval(secs => $2))
        WHERE id = $1 AND status = $3 AND deadline_at IS NOT NULL
        """,
        job_id, seconds + AFTER_DOWNLOAD_S, JobStatus.DOWNLOADING.value)
