"""`GET /v1/account/usage`: an account's jobs in a time range, grouped by model, UTC day or one of its own
metadata keys, with what an app needs to bill its own users: jobs by status, credits charged and still held,
and seconds of video delivered.

Jobs are counted by when they were created (as the daily spend cap counts them); deleted jobs are left out, as
from every read (their charges stay in the ledger). One statement, over the account's listing index
(jobs_account_listing) for the range: the range is bounded by the route (MAX_RANGE), the groups by MAX_GROUPS.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common.states import SQL_TERMINAL, JobStatus, sql

MAX_GROUPS = 1000  # a metadata key may hold many values; more groups than this are cut off, and said to be


class Grouping(msgspec.Struct, frozen=True):
    """What the groups are: `model`, `day`, or `metadata` with the key."""

    kind: str
    metadata_key: str | None = None

    @classmethod
    def parse(cls, text: str) -> Grouping:
        """`model`, `day` or `metadata.<key>`, the key already checked by the query's pattern."""
        kind, _, key = text.partition(".")
        return cls(kind, key or None)


class Group(msgspec.Struct, frozen=True, kw_only=True):
    key: str | None
    jobs: int
    by_status: dict[str, int]
    credits_charged: int
    credits_reserved: int
    seconds_delivered: float


def _key_sql(grouping: Grouping) -> str:
    if grouping.kind == "day":
        return "to_char(j.created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
    if grouping.kind == "metadata":
        return "j.metadata ->> $5::text"
    return "j.model"


_DELIVERED = f"j.status IN ({sql(JobStatus.COMPLETED)}, {sql(JobStatus.EXPIRED)})"


def usage_sql(grouping: Grouping) -> str:
    """$1 the account, $2-$3 the range, $4 the most groups to answer, $5 the metadata key (when grouped by one).
    A delivered job's seconds are its stored video's, as the media service measured it."""
    return f"""
WITH picked AS MATERIALIZED (
    SELECT {_key_sql(grouping)} AS grp, j.status, j.actual_credits,
           CASE WHEN j.status NOT IN {SQL_TERMINAL} THEN j.estimated_credits END AS held,
           CASE WHEN {_DELIVERED} THEN COALESCE(
               (SELECT a.duration_s FROM job_files a WHERE a.job_id = j.id AND a.kind = 'video'),
               (j.request ->> 'duration_s')::float8) END AS seconds
    FROM jobs j
    WHERE j.account_id = $1 AND j.deleted_at IS NULL AND j.created_at >= $2 AND j.created_at < $3
),
counted AS (SELECT grp, status, count(*) AS n FROM picked GROUP BY grp, status)
SELECT p.grp, count(*) AS jobs, COALESCE(sum(p.actual_credits), 0)::bigint AS charged,
       COALESCE(sum(p.held), 0)::bigint AS reserved, COALESCE(sum(p.seconds), 0)::float8 AS seconds,
       (SELECT jsonb_object_agg(c.status, c.n) FROM counted c WHERE c.grp IS NOT DISTINCT FROM p.grp) AS by_status
FROM picked p
GROUP BY p.grp
ORDER BY p.grp NULLS LAST
LIMIT $4
"""


async def report(pool: asyncpg.Pool | asyncpg.Connection, account_id: str, grouping: Grouping, start: datetime,
                 end: datetime) -> tuple[list[Group], bool]:
    """The account's groups in key order (jobs without the metadata key last), and whether more were cut off."""
    args: list[object] = [account_id, start, end, MAX_GROUPS + 1]
    if grouping.metadata_key is not None:
        args.append(grouping.metadata_key)
    rows = await pool.fetch(usage_sql(grouping), *args)
    groups = [Group(key=r["grp"], jobs=r["jobs"], by_status=msgspec.convert(r["by_status"], dict[str, int]),
                    credits_charged=r["charged"], credits_reserved=r["reserved"],
                    seconds_delivered=round(r["seconds"], 3)) for r in rows[:MAX_GROUPS]]
    return groups, len(rows) > MAX_GROUPS
