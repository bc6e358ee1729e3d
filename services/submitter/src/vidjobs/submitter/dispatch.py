"""Whose job goes next: the platform switch, per-account concurrency caps, and fairness across accounts.

A free provider slot is not given to whichever message happens to arrive; it goes to the fair head of that
provider's queue: among accounts with a waiting job and room under their own cap, the one with the fewest
renders in flight (on this provider, then overall), then the one whose last turn is longest ago (round
robin), and its head: its oldest waiting interactive job, else its oldest waiting batch job (lanes,
jobs.Lane). So an account with a thousand queued jobs holds back another account's first job by at most the
one slot being handed out. Lanes order an account's own jobs only: which account goes next never looks at
them, so an account's batch job takes its turn in the round robin however many interactive jobs others have.

A job's own message (its create, its retry) and every event that frees a slot (a render ending, a breaker
closing, the switch resumed, the queue sweep) are the occasions to hand out the provider's free slots: the
handler submits the fair head, which may be another account's job. A job that must wait is parked, and
costs nothing until one of those events reaches it through the fair head.

Every decision runs under the provider's advisory lock (see `limits`), and the chosen account's lock, so
replicas serving different providers still never exceed one account's cap. Lock order: provider, account,
job rows, submission row.
"""

from __future__ import annotations

import asyncpg
import msgspec

from vidjobs.common import switch
from vidjobs.common.jobs import JobRow
from vidjobs.common.states import SQL_PENDING, SQL_RENDERING
from vidjobs.submitter import limits


class Wait(msgspec.Struct, frozen=True):
    """The handled job stays queued, for this reason. A pacing wait is over in about `delay_s` (a rate token,
    a race just lost), so the message looks again then; any other lasts until an event frees a slot (a render
    ends, a breaker closes, the switch resumes) and the job is parked meanwhile."""

    delay_s: float
    reason: str
    kind: str  # paused | breaker | concurrency | account | rate: a bounded metric label
    pacing: bool = False


class Pick(msgspec.Struct, frozen=True):
    """Submit this job now (the handled one, or the fair head of its provider's queue)."""

    job_id: str
    account_id: str


async def lock_account(conn: asyncpg.Connection, account_id: str) -> None:
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('vidjobs.account'), hashtext($1))", account_id)


async def paused(conn: asyncpg.Connection) -> Wait | None:
    state = await switch.submissions(conn)
    if not state.paused:
        return None
    why = f": {state.reason}" if state.reason else ""
    return Wait(5.0, f"new submissions are paused for the whole platform{why}", "paused")


async def account_load(conn: asyncpg.Connection, account_id: str, claim_ttl_s: float) -> tuple[int, int]:
    """(renders in flight for the account, its cap). In flight: submitted or rendering at any provider, or
    a call to a provider that has not answered yet."""
    row = await conn.fetchrow(
        f"""
        SELECT a.concurrent_jobs AS cap,
               (SELECT count(*) FROM jobs j
                WHERE j.account_id = $1 AND j.status IN {SQL_RENDERING} AND j.deleted_at IS NULL)
             + (SELECT count(*) FROM provider_submissions s JOIN jobs j ON j.id = s.job_id
                WHERE j.account_id = $1 AND s.answered_at IS NULL
                  AND s.claimed_at > clock_timestamp() - make_interval(secs => $2)) AS busy
        FROM accounts a WHERE a.id = $1
        """,
        account_id, claim_ttl_s,
    )
    return row["busy"], row["cap"]


_FAIR_HEAD = f"""
WITH RECURSIVE calling AS (   -- calls to a provider still waiting for an answer
    SELECT s.job_id, s.attempt FROM provider_submissions s
    WHERE s.answered_at IS NULL AND s.claimed_at > clock_timestamp() - make_interval(secs => $2)
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


async def account_wait(conn: asyncpg.Connection, job: JobRow, claim_ttl_s: float) -> Wait:
    """Why `job` waits when no waiting job may go: its account is using all its slots."""
    busy, cap = await account_load(conn, job.account_id, claim_ttl_s)
    if busy >= cap:
        return Wait(0.0, f"your account has {busy} job{'s' if busy != 1 else ''} rendering, its limit of {cap}; "
                           "this one starts when one of them finishes", "account")
    return Wait(0.0, "waiting for a free slot", "account")


async def has_room(conn: asyncpg.Connection | asyncpg.Pool, provider: str, provider_limits: limits.ProviderLimits,
                   claim_ttl_s: float) -> bool:
    """Whether a slot of the provider could be handed out now, judged without its lock (the sweep's cheap
    look; `choose` decides under the lock): submissions not paused, the breaker not pausing it, and fewer
    renders in flight than its cap."""
    if (await switch.submissions(conn)).paused or await limits.breaker_pausing(conn, provider):
        return False
    return await limits.in_flight(conn, provider, claim_ttl_s) < provider_limits.concurrency


async def choose(
    conn: asyncpg.Connection, job: JobRow, provider_limits: limits.ProviderLimits, claim_ttl_s: float,
    *, fair: bool = True,
) -> Pick | Wait:
    """Who takes `job`'s provider's next slot now, or why `job` waits. Call inside a transaction, after
    `limits.lock_provider`. Spends a rate token only when it picks. `fair=False` offers the slot to `job`
    itself, not the queue's head (for a turn after the head could not be claimed)."""
    if (stop := await paused(conn)) is not None:
        return stop
    breaker = await limits.breaker_gate(conn, job.provider, job.id)
    if breaker.wait_s is not None:
        return Wait(breaker.wait_s, breaker.reason or "provider paused", breaker.kind)
    busy = await limits.in_flight(conn, job.provider, claim_ttl_s)
    if busy >= provider_limits.concurrency:
        return Wait(0.0, f"{job.provider} already has {busy} renders in flight, its limit", "concurrency")
    if breaker.probe or not fair:
        # One job tests a provider that was down: the one the breaker chose, not the queue's head.
        pick: Pick | None = Pick(job_id=job.id, account_id=job.account_id)
    else:
        pick = await fair_head(conn, job.provider, claim_ttl_s)
    if pick is None:
        return await account_wait(conn, job, claim_ttl_s)
    await lock_account(conn, pick.account_id)
    taken, cap = await account_load(conn, pick.account_id, claim_ttl_s)
    if taken >= cap:
        # Another provider's replica gave this account its last slot a moment ago.
        if pick.job_id == job.id:
            return await account_wait(conn, job, claim_ttl_s)
        return Wait(0.2, "waiting for a free slot", "account", pacing=True)
    wait = await limits.take_token(conn, job.provider, provider_limits)
    if wait is not None:
        return Wait(wait, f"pacing submissions to {job.provider} at {provider_limits.rate_per_s:g} per second",
                    "rate", pacing=True)
    await conn.execute(
        """
        INSERT INTO account_turns (account_id, last_turn_at) VALUES ($1, clock_timestamp())
        ON CONFLICT (account_id) DO UPDATE SET last_turn_at = EXCLUDED.last_turn_at
        """,
        pick.account_id,
    )
    return pick
