"""What each attempt's render cost the platform: the provider's reported bill, one row per attempt.

A job may be rendered more than once (a transient failure is retried as a new attempt), and a provider may
bill a render that failed. Each attempt's bill is kept in `attempt_costs` (migration 0023), in USD as the
provider reported it and in credits at the rate card the job was priced with, either NULL where the provider
gave none. The poller writes a row with each report (provider_reports.record_provider_cost); the latest
report of an attempt stands, so a repeated callback does not count twice.

A job's provider cost is the sum over its attempts. What the account is charged is decided as before
(credits.owed_sql: for the attempt at hand, never above the estimate); the platform absorbs the rest: the bills
of the earlier attempts, and whatever the last one's exceeds the charge by. settle_job_credit writes that to
the ledger as an `absorb` entry, which moves no credit, and a job's view reads it from there.
"""

from __future__ import annotations

from decimal import Decimal


def billed_sql(job_id: str) -> str:
    """A scalar subquery: the credits the provider billed for all of the job's attempts, or NULL while no
    attempt's bill is known. Served by the table's primary key."""
    return f"(SELECT sum(c.cost_credits)::bigint FROM attempt_costs c WHERE c.job_id = {job_id})"


def usd(value: float | None) -> Decimal | None:
    """A provider's USD figure as stored: exact decimal digits of what it said, not a binary float's."""
    return None if value is None else Decimal(str(value))


def absorbed_sql(job_id: str) -> str:
    """A scalar subquery: what the ledger's `absorb` entry for the job says the platform paid beyond its charge;
    NULL without one (nothing absorbed, or the job has not ended). Served by the ledger's job index."""
    return f"(SELECT l.absorbed FROM credit_ledger l WHERE l.job_id = {job_id} AND l.kind = 'absorb')"
