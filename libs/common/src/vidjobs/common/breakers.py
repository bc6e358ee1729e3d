"""Provider circuit breakers as stored: the submitter opens and closes them (services/submitter/limits.py)
and every replica reads the same row, so an operator sees and resets the one state all of them obey."""

from __future__ import annotations

import enum
from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common import outbox, waiting


class BreakerState(enum.StrEnum):
    CLOSED = "closed"  # submissions flow
    OPEN = "open"  # paused after repeated provider_unavailable; one probe when reopen_at comes
    HALF_OPEN = "half_open"  # one probe job is testing the provider


class Breaker(msgspec.Struct, kw_only=True):
    provider: str
    state: BreakerState
    failures: int  # consecutive provider_unavailable or timeout answers
    opened_at: datetime | None
    reopen_at: datetime | None  # open: when one probe may go; half open: when a silent probe is replaced
    probe_job_id: str | None
    cooldown_s: float


async def list_all(conn: asyncpg.Connection) -> list[Breaker]:
    rows = await conn.fetch("SELECT * FROM provider_breakers ORDER BY provider")
    return [msgspec.convert(dict(r), Breaker) for r in rows]


async def reset(conn: asyncpg.Connection, provider: str) -> Breaker | None:
    """Close the provider's breaker as a successful answer would, and hand a render slot to the next job
    waiting for it now rather than when its deferred message comes back. None if it never had one."""
    row = await conn.fetchrow(
        """
        UPDATE provider_breakers SET state = 'closed', failures = 0, probe_job_id = NULL, cooldown_s = 0,
            reopen_at = NULL
        WHERE provider = $1
        RETURNING *
        """,
        provider,
    )
    if row is None:
        return None
    await outbox.add(conn, await waiting.slot_wakeup(conn, provider))
    return msgspec.convert(dict(row), Breaker)
