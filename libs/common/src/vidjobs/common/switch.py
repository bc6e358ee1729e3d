"""The platform-wide submission switch: while it is off, no submitter sends anything new to any provider.

Jobs already at a provider keep rendering, downloading and completing; new jobs are still accepted and
wait in their queue with the reason shown. Every submitter reads the switch in the transaction that would
claim a submission, so turning it off takes effect at once across replicas.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common import db, outbox, waiting
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


async def set_submissions(conn: asyncpg.Connection | asyncpg.Pool, *, paused: bool, reason: str = "") -> Switch:
    """Turn submissions off or on. Turned on, every provider with a job waiting is woken in the same
    transaction: parked jobs wait for exactly that."""
    if isinstance(conn, asyncpg.Pool):
        async with conn.acquire() as lent:
            return await set_submissions(db.lent(lent), paused=paused, reason=reason)
    async with conn.transaction():
        row = await conn.fetchrow(
            """
            UPDATE platform_controls SET paused = $2, reason = $3, changed_at = now() WHERE name = $1
            RETURNING paused, reason, changed_at
            """,
            SUBMISSIONS, paused, reason,
        )
        assert row is not None, "migration 0006 creates the submissions switch"
        if not paused:
            await outbox.add(conn, [SlotFreed(provider=p) for p in await waiting.waiting_providers(conn)])
    return Switch(**dict(row))
