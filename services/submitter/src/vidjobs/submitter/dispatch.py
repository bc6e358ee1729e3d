"""Whose job goes next: per-account concurrency caps, and fairness across accounts.

A free provider slot is not given to whichever message happens to arrive; it goes to the fair head of that
provider's queue: among accounts with a waiting job and room under their own cap, the one with the fewest
renders in flight (on this provider, then overall), then the one whose last turn is longest ago (round
robin), and its head: its oldest waiting interactive job, else its oldest waiting batch job (lanes,
jobs.Lane). So an account with a thousand queued jobs holds back another account's first job by at most the
one slot being handed out. Lanes order an account's own jobs only: which account goes next never looks at
them, so an account's batch job takes its turn in the round robin however many interactive jobs others have.

Every decision runs under the provider's advisory lock and the chosen account's lock (`slots`, which makes
the decision and calls down into this module), so replicas serving different providers still never exceed
one account's cap.
"""

from __future__ import annotations

import asyncpg
import msgspec

from vidjobs.common import inflight
from vidjobs.common.states import SQL_PENDING, SQL_RENDERING


class Pick(msgspec.Struct, frozen=True):
    """Submit this job now (the handled one, or the fair head of its provider's queue)."""

    job_id: str
    account_id: str


async def lock_account(conn: asyncpg.Connection, account_id: str) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('vidjobs.account'), hashtext($1))", account_id)


async def account_load(conn: asyncpg.Connection, account_id: str, claim_ttl_s: float) -> tuple[int, int]:
    """(renders in flight for the account, its cap). In flight: submitted or rendering at any provider, or
    a call to a provider that has not answered yet."""
    row = await conn.fetchrow(
        f"""
        SELECT a.concurrent_jobs AS cap,
               (SELECT count(*) FROM jobs j
                WHERE j.account_id = $1 AND j.status IN {SQL_RENDERING} AND j.deleted_at IS NULL)
             + (SELECT count(*) FROM provider_submissions s JOIN jobs j ON j.id = s.job_id
                WHERE j.account_id = $1 AND {inflight.unanswered_call("$2", "s")}) AS busy
        FROM accounts a WHERE a.id = $1
        """,
        account_id, claim_ttl_s,
    )
    assert row is not None, f"no account {account_id!r}"  # a job's account outlives the job
    return row["busy"], row["cap"]


_FAIR_HEAD = f"""
WITH RECURSIVE calling AS (   -- calls to a provider still waiting for an answer
    SELECT s.job_id, s.attempt FROM provider_submissions s WHERE {inflight.unanswered_call("$2", "s")}
),
busy AS (
    SELECT account_id, count(*) FILTER (WHERE provider = $1) AS here, count(*) AS total
    FROM (SELECT account_id, provider FROM jobs
          WHERE status IN {SQL_RENDERING} AND deleted_at IS NULL
          UNION ALL
          SELECT j.account_id, j.provider FROM calling c JOIN jobs j ON j.id = c.job_id) AS b
    GROUP BY account_id
),
waiting AS (        -- accounts with a job waiting for this provider: a skip scan of jobs_provider_waiting,
                    -- one index probe per account however deep its queue
    SELECT account_id FROM (
        SELECT account_id FROM jobs WHERE provider = $1 AND status = {SQL_PENDING} AND deleted_at IS NULL
        ORDER BY account_id LIMIT 1) AS first
    UNION ALL
    SELECT (SELECT j.account_id FROM jobs j
            WHERE j.provider = $1 AND j.status = {SQL_PENDING} AND j.deleted_at IS NULL AND j.account_id > w.account_id
            ORDER BY j.account_id LIMIT 1)
    FROM waiting w WHERE w.account_id IS NOT NULL
),
heads AS (          -- each account's first job waiting for this provider that nobody is submitting: its
                    -- queue's order (waiting.queue_place_sql), interactive lane first, read from the index's front
    SELECT h.id, w.account_id, h.created_at
    FROM waiting w CROSS JOIN LATERAL (
        SELECT j.id, j.created_at FROM jobs j
        WHERE j.provider = $1 AND j.account_id = w.account_id AND j.status = {SQL_PENDING} AND j.deleted_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM calling c WHERE c.job_id = j.id AND c.attempt = j.attempt)
        ORDER BY j.lane, j.created_at, j.id LIMIT 1) AS h
    WHERE w.account_id IS NOT NULL
)
SELECT h.id AS job_id, h.account_id
FROM heads h JOIN accounts a ON a.id = h.account_id LEFT JOIN busy b ON b.account_id = h.account_id
    LEFT JOIN account_turns t ON t.account_id = h.account_id
WHERE COALESCE(b.total, 0) < a.concurrent_jobs
-- Which account: by what it has in flight and its last turn, never by the lane of its head.
ORDER BY COALESCE(b.here, 0), COALESCE(b.total, 0), t.last_turn_at NULLS FIRST, h.created_at, h.id
LIMIT 1
"""


async def fair_head(conn: asyncpg.Connection | asyncpg.Pool, provider: str, claim_ttl_s: float) -> Pick | None:
    row = await conn.fetchrow(_FAIR_HEAD, provider, claim_ttl_s)
    return None if row is None else Pick(job_id=row["job_id"], account_id=row["account_id"])


async def take_turn(conn: asyncpg.Connection, account_id: str) -> None:
    """Record that the account was handed a slot now: the round robin puts it behind every account whose last
    turn is older."""
    await conn.execute(
        """
        INSERT INTO account_turns (account_id, last_turn_at) VALUES ($1, clock_timestamp())
        ON CONFLICT (account_id) DO UPDATE SET last_turn_at = EXCLUDED.last_turn_at
        """,
        account_id,
    )


async def account_wait(conn: asyncpg.Connection, account_id: str, claim_ttl_s: float) -> str:
    """Why a job of the account waits when no waiting job may go: its account using all its slots, if so."""
    busy, cap = await account_load(conn, account_id, claim_ttl_s)
    if busy >= cap:
        return (f"your account has {busy} job{'s' if busy != 1 else ''} rendering, its limit of {cap}; "
                "this one starts when one of them finishes")
    return "waiting for a free slot"
