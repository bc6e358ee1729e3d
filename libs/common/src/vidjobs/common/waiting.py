"""Jobs waiting for a render slot: the queue's order and counts, the wake-up a freed slot sends, and why a
waiting job is not submitted yet. None of it changes a job's status (`transitions` does that)."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

import asyncpg

from vidjobs.common import changes
from vidjobs.common.events import SlotFreed
from vidjobs.common.jobs import JobRow, Lane
from vidjobs.common.states import SQL_PENDING, JobStatus

# A job waiting on a provider's pacing (a wait of a second or so) keeps its message, which looks again within
# this long; any other wait parks the job (`park`) until an event hands it a slot.
WAIT_LOOK_S = 30.0


# Providers with a waiting job: a skip scan of jobs_provider_waiting, one index probe per provider however
# long its queue.
_WAITING_PROVIDERS = f"""
WITH RECURSIVE providers AS (
    (SELECT provider FROM jobs WHERE status = {SQL_PENDING} AND deleted_at IS NULL ORDER BY provider LIMIT 1)
    UNION ALL
    SELECT (SELECT j.provider FROM jobs j
            WHERE j.status = {SQL_PENDING} AND j.deleted_at IS NULL AND j.provider > p.provider
            ORDER BY j.provider LIMIT 1)
    FROM providers p WHERE p.provider IS NOT NULL
)
SELECT provider FROM providers WHERE provider IS NOT NULL
"""


async def waiting_providers(conn: asyncpg.Connection | asyncpg.Pool) -> list[str]:
    return [r["provider"] for r in await conn.fetch(_WAITING_PROVIDERS)]


async def slot_wakeup(conn: asyncpg.Connection, provider: str, account_id: str | None = None) -> list[SlotFreed]:
    """The messages that hand a render slot just freed at `provider` to the next waiting job: one for
    `provider` if a job waits for it, and, when the slot was `account_id`'s, one for each other provider where
    that account has a job waiting (its cap may have held it back there). Parked jobs wait for exactly these;
    the submitter's queue sweep catches one that was lost."""
    found = await conn.fetch(
        f"""
        SELECT w.provider FROM ({_WAITING_PROVIDERS}) w
        WHERE w.provider = $1 OR EXISTS (
            SELECT 1 FROM jobs j WHERE j.provider = w.provider AND j.account_id = $2 AND j.status = {SQL_PENDING}
                                   AND j.deleted_at IS NULL)
        """, provider, account_id)
    return [SlotFreed(provider=r["provider"]) for r in found]


class QueueCount(NamedTuple):
    waiting: int  # all the account's jobs waiting for a slot
    ahead: int  # of those, the ones in `lane` or a lane before it: a job queued now in `lane` comes after them


_QUEUE_COUNT = f"""
SELECT count(*) AS waiting, count(*) FILTER (WHERE lane <= $2) AS ahead FROM jobs
WHERE account_id = $1 AND status = {SQL_PENDING} AND deleted_at IS NULL
"""


async def queue_count(conn: asyncpg.Connection | asyncpg.Pool, account_id: str, lane: Lane) -> QueueCount:
    """How many of the account's jobs wait for a slot, and how many a new job in `lane` would queue behind
    (the partial index jobs_account_waiting alone)."""
    row = await conn.fetchrow(_QUEUE_COUNT, account_id, lane)
    assert row is not None, "an aggregate without GROUP BY answers one row"
    return QueueCount(row["waiting"], row["ahead"])


def queue_place_sql(account: str, lane: str, created_at: str, job_id: str, up_to: str = "ALL") -> str:
    """SQL for a waiting job's place in its account's queue (1 is next): the account's waiting jobs before it
    or it, in (lane, created_at, id) order (interactive ahead of batch, then oldest first), counted no further
    than `up_to`. The one definition the gateway shows and the submitter acts on (dispatch's choice of an
    account's head follows the same order); the index jobs_account_waiting is read from the front, so the
    cost is the smaller of the place and `up_to`."""
    return f"""(SELECT count(*) FROM (
        SELECT 1 FROM jobs w
        WHERE w.account_id = {account} AND w.status = {SQL_PENDING} AND w.deleted_at IS NULL
          AND (w.lane, w.created_at, w.id) <= ({lane}, {created_at}, {job_id})
        ORDER BY w.lane, w.created_at, w.id LIMIT {up_to}) AS ahead)"""


async def set_wait_reason(conn: asyncpg.Connection, job_id: str, reason: str, *, park: bool = False) -> None:
    """Say why a queued job is not submitted yet (not a status change; the next transition clears it).
    Parked (`park`), it waits for a slot to be handed to it and nothing of its own is scheduled: no message,
    no recovery check (its next one is scheduled when it is submitted). Otherwise its message is alive:
    `waited_at` tells the recovery check not to publish another."""
    row = await conn.fetchrow(
        f"""
        UPDATE jobs j SET wait_reason = $2, waited_at = clock_timestamp(),
                          recover_at = CASE WHEN $3 THEN NULL ELSE j.recover_at END,
                          updated_at = CASE WHEN o.reason IS DISTINCT FROM $2 THEN clock_timestamp()
                                            ELSE j.updated_at END
        FROM (SELECT id, wait_reason AS reason FROM jobs WHERE id = $1) AS o
        WHERE j.id = o.id AND j.status = {SQL_PENDING} AND j.deleted_at IS NULL
        RETURNING j.updated_at, o.reason IS DISTINCT FROM $2 AS changed
        """,
        job_id, reason, park,
    )
    if row is not None and row["changed"]:
        changes.note(job_id, JobStatus.PENDING.value, row["updated_at"])


def message_alive(job: JobRow, now: datetime) -> bool:
    """Whether a waiting job's own message looked at it recently enough to be still going round."""
    return job.waited_at is not None and (now - job.waited_at).total_seconds() < 3 * WAIT_LOOK_S
