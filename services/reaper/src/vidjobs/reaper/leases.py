"""Recovery leases: at most one reaper recovers a job at a time. A lease ends by itself at `expires_at`,
so a reaper that dies holding one delays recovery by one TTL, never forever; a hand-off that succeeds holds
its lease until the job's next check is due."""

from __future__ import annotations

import uuid

import asyncpg


async def take(conn: asyncpg.Connection, job_id: str, owner: str, ttl_s: float) -> uuid.UUID | None:
    """The new lease's token, or None while another worker's lease is live."""
    token: uuid.UUID | None = await conn.fetchval(
        """
        INSERT INTO recovery_leases (job_id, token, owner, expires_at)
        VALUES ($1, $2, $3, clock_timestamp() + make_interval(secs => $4))
        ON CONFLICT (job_id) DO UPDATE
            SET token = EXCLUDED.token, owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
            WHERE recovery_leases.expires_at < clock_timestamp()
        RETURNING token
        """,
        job_id, uuid.uuid4(), owner, ttl_s,
    )
    return token


async def hold_until_next_check(conn: asyncpg.Connection, job_id: str) -> None:
    """Keep the lease while the handed-off work runs, and end it when the job's next check comes due, so that
    check (on any reaper) is never deferred by the lease of the one before."""
    await conn.execute(
        """
        UPDATE recovery_leases
        SET expires_at = COALESCE((SELECT recover_at FROM jobs WHERE id = $1), clock_timestamp())
        WHERE job_id = $1
        """,
        job_id,
    )


async def seconds_left(conn: asyncpg.Connection, job_id: str) -> float:
    left = await conn.fetchval(
        "SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM recovery_leases WHERE job_id = $1", job_id,
    )
    return max(float(left or 0.0), 0.1)


async def purge_expired(conn: asyncpg.Connection | asyncpg.Pool) -> int:
    result = await conn.execute("DELETE FROM recovery_leases WHERE expires_at < clock_timestamp()")
    return int(result.split()[-1])
