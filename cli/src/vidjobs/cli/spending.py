"""What the platform spent and took in, for `vidjobs usage`: per provider, model or UTC day, what providers
billed for every attempt's render (in USD as they reported it, and in credits at each job's rate card), what
accounts were charged, and what the platform absorbed (the ledger's `absorb` entries: retried attempts and
bills above the estimate).

Jobs are counted by when they were created, as the daily spend cap counts them; deleted jobs count, since
their renders were billed. A job's attempts are grouped by the provider and model each rendered with (a job may
move to a fallback model between attempts); its charge and what was absorbed by the model it ended with."""

from __future__ import annotations

import enum
from datetime import datetime
from decimal import Decimal

import asyncpg
import msgspec


class GroupBy(enum.StrEnum):
    PROVIDER = "provider"
    MODEL = "model"
    DAY = "day"


class UsageRow(msgspec.Struct, kw_only=True):
    group: str  # the provider, the model, or the UTC day (YYYY-MM-DD) of the jobs' creation
    jobs: int  # jobs created in the range
    attempts_billed: int  # attempts whose provider reported what it billed
    provider_cost_usd: float  # what providers reported billing, in USD
    provider_cost_credits: int  # the same, in credits at each job's rate card
    credits_charged: int  # what accounts were charged for the jobs that ended
    credits_absorbed: int  # what the platform paid beyond the charge


def _key(alias: str, group_by: GroupBy) -> str:
    if group_by is GroupBy.DAY:
        return "to_char(p.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
    return f"{alias}.{group_by.value}"


def report_sql(group_by: GroupBy) -> str:
    return f"""
WITH picked AS MATERIALIZED (
    SELECT id, provider, model, created_at, actual_credits FROM jobs WHERE created_at >= $1 AND created_at < $2
),
billed AS (
    SELECT {_key("a", group_by)} AS grp, count(*) AS attempts, COALESCE(sum(a.cost_usd), 0) AS usd,
           COALESCE(sum(a.cost_credits), 0) AS credits
    FROM attempt_costs a JOIN picked p ON p.id = a.job_id GROUP BY 1
),
settled AS (
    SELECT {_key("p", group_by)} AS grp, count(*) AS jobs, COALESCE(sum(p.actual_credits), 0) AS charged,
           COALESCE(sum(l.absorbed), 0) AS absorbed
    FROM picked p LEFT JOIN credit_ledger l ON l.job_id = p.id AND l.kind = 'absorb' GROUP BY 1
)
SELECT COALESCE(s.grp, b.grp) AS grp, COALESCE(s.jobs, 0) AS jobs, COALESCE(b.attempts, 0) AS attempts,
       COALESCE(b.usd, 0) AS usd, COALESCE(b.credits, 0)::bigint AS credits,
       COALESCE(s.charged, 0)::bigint AS charged, COALESCE(s.absorbed, 0)::bigint AS absorbed
FROM settled s FULL JOIN billed b ON b.grp = s.grp
ORDER BY 1
"""


async def report(conn: asyncpg.Connection, group_by: GroupBy, start: datetime, end: datetime) -> list[UsageRow]:
    """The platform's figures for jobs created from `start` up to (not including) `end`."""
    rows = await conn.fetch(report_sql(group_by), start, end)
    return [UsageRow(group=r["grp"], jobs=r["jobs"], attempts_billed=r["attempts"],
                     provider_cost_usd=float(Decimal(r["usd"])), provider_cost_credits=r["credits"],
                     credits_charged=r["charged"], credits_absorbed=r["absorbed"]) for r in rows]
