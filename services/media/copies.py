"""Copy leases (`media_copies`): at most one media process copies a job's render at a time, across every
replica. A lease ends by itself at `expires_at`, so a copier killed mid-copy delays the next one by one TTL,
never forever; a live copier renews it while it works."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
from collections.abc import AsyncIterator

import asyncpg

log = logging.getLogger("vidjobs.media")

LEASE_TTL_S = 60.0
OWNER = f"media-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"  # unique per process start


async def take(pool: asyncpg.Pool, job_id: str, owner: str = OWNER) -> float | None:
    """None when the lease is ours now; else the seconds until another copier's lease runs out."""
    async with pool.acquire() as conn:
        taken = await conn.fetchval(
            """
            INSERT INTO media_copies (job_id, owner, expires_at)
            VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3))
            ON CONFLICT (job_id) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at
                WHERE media_copies.expires_at < clock_timestamp()
            RETURNING 1
            """,
            job_id, owner, LEASE_TTL_S,
        )
        if taken:
            return None
        left = await conn.fetchval(
            "SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM media_copies WHERE job_id = $1", job_id)
        return max(float(left or 0.0), 0.5)


async def release(pool: asyncpg.Pool, job_id: str, owner: str = OWNER) -> None:
    await pool.execute("DELETE FROM media_copies WHERE job_id = $1 AND owner = $2", job_id, owner)


async def _renew(pool: asyncpg.Pool, job_id: str, owner: str) -> None:
    while True:
        await asyncio.sleep(LEASE_TTL_S / 3)
        try:
            await pool.execute(
                "UPDATE media_copies SET expires_at = clock_timestamp() + make_interval(secs => $3) "
                "WHERE job_id = $1 AND owner = $2", job_id, owner, LEASE_TTL_S)
        except Exception as exc:  # the copy goes on; at worst a second copier starts after the TTL
            log.warning("could not renew a copy lease", extra={"job_id": job_id, "error": repr(exc)})


@contextlib.asynccontextmanager
async def held(pool: asyncpg.Pool, job_id: str, owner: str = OWNER) -> AsyncIterator[None]:
    """Renew the lease while the body runs, and give it up after (also when the body fails)."""
    renewing = asyncio.create_task(_renew(pool, job_id, owner), name=f"copy-lease-{job_id}")
    try:
        yield
    finally:
        renewing.cancel()
        with contextlib.suppress(Exception):
            await release(pool, job_id, owner)
