"""What each attempt's render cost the platform: the provider's reported bill, one row per attempt.

A job may be rendered more than once (a transient failure is retried as a new attempt), and a provider may
bill a render that failed. Each attempt's bill is kept in `attempt_costs` (migration 0023), in USD as the
provider reported it and in credits at the rate card the job was priced with, either NULL where the provider
gave none. The poller writes a row with each report (`record`); the latest report of an attempt stands, so
a repeated callback does not count twice.

A job's provider cost is the sum over its attempts. What the account is charged is decided as before
(credits.owed_sql: for the attempt at hand, never above the estimate); the platform absorbs the rest: the bills
of the earlier attempts, and whatever the last one's exceeds the charge by. settle_job_credit writes that to
the ledger as an `absorb` entry, which moves no credit, and a job's view reads it from there.

Only bills reported while the job is on the attempt they are for are kept: a late report about an attempt
given up on, or about a render the job does not use (a stray), is not recorded, and a job that ended keeps
the figures it was settled with.
"""

from __future__ import annotations

from decimal import Decimal

import asyncpg

from vidjobs.common.jobs import JobRow
from vidjobs.common.states import SQL_TERMINAL


def billed_sql(job_id: str) -> str:
    """A scalar subquery: the credits the provider billed for all of the job's attempts, or NULL while no
    attempt's bill is known. Served by the table's primary key."""
    return f"(SELECT sum(c.cost_credits)::bigint FROM attempt_costs c WHERE c.job_id = {job_id})"


def usd_of(value: float | None) -> Decimal | None:
    """A provider's USD figure as stored: exact decimal digits of what it said, not a binary float's."""
    return None if value is None else Decimal(str(value))


def absorbed_sql(job_id: str) -> str:
    """A scalar subquery: what the ledger's `absorb` entry for the job says the platform paid beyond its charge;
    NULL without one (nothing absorbed, or the job has not ended). Served by the ledger's job index."""
    return f"(SELECT l.absorbed FROM credit_ledger l WHERE l.job_id = {job_id} AND l.kind = 'absorb')"


async def record(conn: asyncpg.Connection, job: JobRow, *, credits: int, usd: float | None) -> None:
    """Store what the provider reported billing for the job's current attempt (not a status change; the
    charge is settled when the job ends): on the job row, which the charge reads, and in the attempt's row of
    `attempt_costs`, which the job's provider cost sums. `usd` as the provider reported it (None where it
    gave its bill otherwise), `credits` at the job's rate card. A report about an earlier attempt's render,
    or one reaching a job that has ended, changes nothing."""
    await conn.execute(
        f"""
        WITH current AS (
            UPDATE jobs SET provider_cost_credits = $2
            WHERE id = $1 AND attempt = $3 AND provider_job_id IS NOT DISTINCT FROM $4::text
              AND deleted_at IS NULL AND status NOT IN {SQL_TERMINAL}
            RETURNING id, attempt, account_id, provider, model, provider_job_id, rate_card_version
        )
        INSERT INTO attempt_costs AS a (job_id, attempt, account_id, provider, model, provider_job_id, cost_usd,
                                        cost_credits, rate_card_version)
        SELECT id, attempt, account_id, provider, model, provider_job_id, $5, $2, rate_card_version FROM current
        ON CONFLICT (job_id, attempt) DO UPDATE
            SET cost_usd = EXCLUDED.cost_usd, cost_credits = EXCLUDED.cost_credits,
                provider_job_id = EXCLUDED.provider_job_id, reported_at = clock_timestamp()
        """,
        job.id, credits, job.attempt, job.provider_job_id, usd_of(usd),
    )
