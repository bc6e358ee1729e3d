"""Credits: a job's estimate is reserved when it is created; when it ends the reservation is released and a
completed job is charged."""

from __future__ import annotations

import asyncpg

from libs.common.errors import QuotaExhausted
from libs.common.states import JobStatus


async def reserve(conn: asyncpg.Connection, *, account_id: str, amount: int) -> None:
    """Hold `amount` credits for a new job, only if that much is free. One guarded statement, so requests
    racing for the last credits cannot both win. Raises QuotaExhausted."""
    held = await conn.fetchval(
        """
        UPDATE accounts SET credits_reserved = credits_reserved + $2
        WHERE id = $1 AND credits_balance - credits_reserved >= $2
        RETURNING id
        """,
        account_id, amount,
    )
    if held is None:
        raise QuotaExhausted(f"this job needs {amount} credits and the account has fewer free; add credit")


async def settle(conn: asyncpg.Connection, *, account_id: str, estimated: int, charged: int) -> None:
    await conn.execute(
        """
        UPDATE accounts SET credits_reserved = credits_reserved - $2, credits_balance = credits_balance - $3
        WHERE id = $1
        """,
        account_id, estimated, charged,
    )


def charge_for(to: JobStatus, estimated: int, actual: int | None) -> int:
    """Only a delivered render costs the customer; anything else gives the reservation back."""
    if to is JobStatus.COMPLETED:
        return estimated if actual is None else actual
    return 0
