"""Copy leases (`media_copies`): at most one media process copies a job's render at a time, across every
replica. A lease ends by itself at `expires_at`, so a copier killed mid-copy delays the next one by one TTL,
never forever; a live copier renews it while it works. A lease of this process's own that it is not copying
under (one whose release failed, the database away as the copy ended) is taken back at once."""

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
_COPYING: set[str] = set()  # the jobs this process copies now, under held()


class Busy(Exception):
    """Another copier holds the lease; `seconds` until it runs out."""

    def __init__(self, seconds: float):
        super().__init__(f"another copier holds this render for {seconds:.1f} s more")
        self.seconds = seconds


async def take(pool: asyncpg.Pool, job_id: str, ttl_s: float = LEASE_TTL_S, owner: str = OWNER) -> int:
    """Take the lease; returns how many copiers before us died while decoding this render. Raises Busy."""
    async with pool.acquire() as conn:
        crashes: int | None = await conn.fetchval(
            """
            INSERT INTO media_copies (job_id, owner, expires_at)
            VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3))
            ON CONFLICT (job_id) DO UPDATE SET owner = EXCLUDED.owner, expires_at = EXCLUDED.expires_at,
                decoding = false,
                crashes = media_copies.crashes + (media_copies.decoding AND media_copies.owner <> $2)::int
                WHERE media_copies.expires_at < clock_timestamp() OR (media_copies.owner = $2 AND $4)
            RETURNING crashes
            """,
            job_id, owner, ttl_s, job_id not in _COPYING,
        )
        if crashes is not None:
            return crashes
        left = await conn.fetchval(
            "SELECT extract(epoch FROM expires_at - clock_timestamp()) FROM media_copies WHERE job_id = $1", job_id)
        raise Busy(max(float(left or 0.0), 0.5))


@contextlib.asynccontextmanager
async def decoding(pool: asyncpg.Pool, job_id: str, owner: str = OWNER) -> AsyncIterator[None]:
    """While the body runs, our copy of this render is being decoded: if we die now, the render is suspect."""
    mark = "UPDATE media_copies SET decoding = $3 WHERE job_id = $1 AND owner = $2"
    await pool.execute(mark, job_id, owner, True)
    yield
    await pool.execute(mark, job_id, owner, False)


async def release(pool: asyncpg.Pool, job_id: str, owner: str = OWNER) -> None:
    await pool.execute("DELETE FROM media_copies WHERE job_id = $1 AND owner = $2", job_id, owner)


async def _renew(pool: asyncpg.Pool, job_id: str, ttl_s: float, owner: str) -> None:
    while True:
        await asyncio.sleep(ttl_s / 3)
        try:
            await pool.execute(
                "UPDATE media_copies SET expires_at = clock_timestamp() + make_interval(secs => $3) "
                "WHERE job_id = $1 AND owner = $2", job_id, owner, ttl_s)
        except Exception as exc:  # the copy goes on; at worst a second copier starts after the TTL
            log.warning("could not renew a copy lease", extra={"job_id": job_id, "error": repr(exc)})


@contextlib.asynccontextmanager
async def held(pool: asyncpg.Pool, job_id: str, ttl_s: float = LEASE_TTL_S, owner: str = OWNER) -> AsyncIterator[None]:
    """Renew the lease while the body runs, and give it up after (also when the body fails)."""
    renewing = asyncio.create_task(_renew(pool, job_id, ttl_s, owner), name=f"copy-lease-{job_id}")
    _COPYING.add(job_id)
    try:
        yield
    finally:
        _COPYING.discard(job_id)
        renewing.cancel()
        with contextlib.suppress(Exception):  # if this fails, take() gives our lease back to us at once
            await release(pool, job_id, owner)
