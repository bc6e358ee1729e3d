"""The platform-wide submission switch: while it is off, no submitter sends anything new to any provider.

Jobs already at a provider keep rendering, downloading and completing; new jobs are still accepted and
wait in their queue with the reason shown. Every submitter reads the switch in the transaction that would
claim a submission, so turning it off takes effect at once across replicas.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg
import msgspec

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
    row = await conn.fetchrow(
        """
        UPDATE platform_controls SET paused = $2, reason = $3, changed_at = now() WHERE name = $1
        RETURNING paused, reason, changed_at
        """,
        SUBMISSIONS, paused, reason,
    )
    return Switch(**dict(row))
