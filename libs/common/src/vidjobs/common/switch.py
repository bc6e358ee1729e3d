"""The platform-wide submission switch: while it is off, no submitter sends anything new to any provider.

Jobs already at a provider keep rendering, downloading and completing; new jobs are still accepted and
wait in their queue with the reason shown. Every submitter reads the switch in the transaction that would
claim a submission, so turning it off takes effect at once across replicas.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common import outbox, waiting
from vidjobs.common.events import SlotFreed

SUBMISSIONS = "submissions"


class Switch(msgspec.Struct, frozen=True, kw_only=True):
    paused: bool
    reason: str
    changed_at: datetime


async def submissions(conn: asyncpg.Connection | asyncpg.Pool) -> Switch:
    row = await conn.fetchrow(
        "SELECT paused, reason, changed_at FROM platform_controls WHERE name = $1", SUBMISSIONS)
    assert row is not None, "migration 0006 creates the submissions switch"
    return Switch(**dict(row))


async def set_submissions(pool: asyncpg.Connection | asyncpg.Pool, *, paused: bool, reason: str = "") -> Switch:
    """Turn submissions off or on. Turned on, every provider with a job waiting is woken in the same
    transaction: parked jobs wait for exactly that."""
    async with pool.acquire() if isinstance(pool, asyncpg.Pool) else _as_is(pool) as conn, conn.transaction():
        row = await conn.fetchrow(
            """
            UPDATE platform_controls SET paused = $2, reason = $3, changed_at = now() WHERE name = $1
            RETURNING paused, reason, changed_at
            """,
            SUBMISSIONS, paused, reason,
        )
        if not paused:
            await outbox.add(conn, [SlotFreed(provider=p) for p in await waiting.waiting_providers(conn)])
    return Switch(**dict(row))


@contextlib.asynccontextmanager
async def _as_is(conn: asyncpg.Connection) -> AsyncIterator[asyncpg.Connection]:
    yield conn
