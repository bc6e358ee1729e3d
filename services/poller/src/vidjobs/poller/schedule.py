"""The poll schedule for providers without callbacks: one row per rendering job, tapered, scanned by one
scheduler through a due-time index (no task per job)."""

from __future__ import annotations

import asyncpg

# Each call is one statement: a pool runs it on a connection of its own.
Conn = asyncpg.Connection | asyncpg.Pool

# Every 2 s for the first 30 s, every 10 s up to 2 min, then every 30 s (docs/ARCHITECTURE.md "Recovery").
_TAPER = """
    CASE WHEN now() - p.started_at < interval '30 seconds' THEN interval '2 seconds'
         WHEN now() - p.started_at < interval '2 minutes' THEN interval '10 seconds'
         ELSE interval '30 seconds' END
"""


async def add(conn: Conn, job_id: str) -> None:
    await conn.execute(
        """
        INSERT INTO poll_schedule (job_id, next_poll_at) VALUES ($1, now() + interval '2 seconds')
        ON CONFLICT (job_id) DO NOTHING
        """,
        job_id,
    )


async def take_due(conn: Conn, limit: int) -> list[str]:
    """Claim due polls and push each one's next time out along the taper, in one statement."""
    rows = await conn.fetch(
        f"""
        WITH due AS (
            SELECT job_id FROM poll_schedule WHERE next_poll_at <= now()
            ORDER BY next_poll_at LIMIT $1 FOR UPDATE SKIP LOCKED
        )
        UPDATE poll_schedule AS p SET next_poll_at = now() + {_TAPER}, polls = p.polls + 1
        FROM due WHERE p.job_id = due.job_id
        RETURNING p.job_id
        """,
        limit,
    )
    return [r["job_id"] for r in rows]


async def remove(conn: Conn, job_id: str) -> None:
    await conn.execute("DELETE FROM poll_schedule WHERE job_id = $1", job_id)
