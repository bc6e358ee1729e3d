"""How an alias's routes compare (`vidjobs routes compare ALIAS`): per real model, from the jobs created
through the alias since a moment.

- jobs: created through the alias (jobs.route) since then, whatever became of them; a job that moved to a
  fallback model while it waited counts under the model that rendered it (jobs.model).
- render p50/p90: seconds from submission to the render leaving the provider (submitted_at to rendered_at, or
  completed_at for a job without it), over its completed jobs: the hold the estimates measure
  (vidjobs.common.estimates). ready p50/p90: creation to completion (created_at to completed_at), the wait
  included, which is what the account saw.
- failure rate: failed jobs over ended ones (completed, expired or failed; canceled ones are left out), in
  all and by error code.
- regenerate rate: the fraction of its completed jobs rerun (POST /v1/jobs/{id}/rerun, at any time) or
  followed, within VIDJOBS_REGENERATION_WINDOW_S of the completion, by another job of the same account asking
  for the same model (the alias, or the model named when there was none) with the same normalised prompt
  (vidjobs.common.regenerations). A regeneration says the first render was not what was wanted.
- credits per job: the mean of what its ended jobs were charged (actual_credits); provider cost per job: the
  mean of what the provider reported billing for them, in credits (provider_cost_credits), where it did.
"""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import asyncpg
import msgspec

from vidjobs.common.regenerations import normalised_prompt_sql
from vidjobs.common.states import JobStatus, sql

_DONE = sql(frozenset({JobStatus.COMPLETED, JobStatus.EXPIRED}))  # rendered; expired jobs were completed first
_FAILED = sql(JobStatus.FAILED)
_ENDED = sql(frozenset({JobStatus.COMPLETED, JobStatus.EXPIRED, JobStatus.FAILED}))

_ROUTED = f"""
WITH routed AS (
    SELECT j.id, j.account_id, j.model, j.status, j.error ->> 'code' AS code, j.created_at, j.submitted_at,
           j.rendered_at, j.completed_at, j.actual_credits, j.provider_cost_credits, j.route,
           {normalised_prompt_sql("j.request ->> 'prompt'")} AS prompt
    FROM jobs j WHERE j.route = $1 AND j.created_at >= $2
)"""

_FIGURES = _ROUTED + f"""
SELECT r.model,
       count(*) AS jobs,
       count(*) FILTER (WHERE r.status IN {_DONE}) AS completed,
       count(*) FILTER (WHERE r.status IN {_ENDED}) AS ended,
       count(*) FILTER (WHERE r.status = {_FAILED}) AS failed,
       percentile_cont(ARRAY[0.5, 0.9]) WITHIN GROUP (
           ORDER BY extract(epoch FROM COALESCE(r.rendered_at, r.completed_at) - r.submitted_at))
           FILTER (WHERE r.status IN {_DONE} AND r.submitted_at IS NOT NULL AND r.completed_at IS NOT NULL)
           AS render_s,
       percentile_cont(ARRAY[0.5, 0.9]) WITHIN GROUP (ORDER BY extract(epoch FROM r.completed_at - r.created_at))
           FILTER (WHERE r.status IN {_DONE} AND r.completed_at IS NOT NULL) AS ready_s,
       count(*) FILTER (WHERE r.status IN {_DONE} AND r.completed_at IS NOT NULL AND EXISTS (
           SELECT 1 FROM jobs n
           WHERE n.account_id = r.account_id AND n.id <> r.id AND (n.rerun_of = r.id OR (
                 COALESCE(n.route, n.model) = r.route AND n.created_at > r.completed_at
                 AND n.created_at <= r.completed_at + make_interval(secs => $3)
                 AND {normalised_prompt_sql("n.request ->> 'prompt'")} = r.prompt)))) AS regenerated,
       avg(r.actual_credits) FILTER (WHERE r.status IN {_ENDED} AND r.actual_credits IS NOT NULL)
           AS credits_per_job,
       avg(r.provider_cost_credits) FILTER (WHERE r.provider_cost_credits IS NOT NULL) AS provider_cost_per_job
FROM routed r GROUP BY r.model ORDER BY r.model
"""

_FAILURES = _ROUTED + f"""
SELECT r.model, COALESCE(r.code, 'unknown') AS code, count(*) AS failed
FROM routed r WHERE r.status = {_FAILED} GROUP BY 1, 2 ORDER BY 1, 3 DESC, 2
"""


class RouteFigures(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    jobs: int
    completed: int
    failed: int
    render_p50_s: float | None
    render_p90_s: float | None
    ready_p50_s: float | None
    ready_p90_s: float | None
    failure_rate: float | None  # of ended jobs; None with none ended
    failures_by_code: dict[str, float]  # each error code's share of the ended jobs
    regenerate_rate: float | None  # of completed jobs; None with none completed
    credits_per_job: float | None
    provider_cost_per_job: float | None


def _pair(values: list[float] | None) -> tuple[float | None, float | None]:
    return (values[0], values[1]) if values else (None, None)


async def compare(conn: asyncpg.Connection, alias: str, *, since: datetime, window_s: float) -> list[RouteFigures]:
    async with conn.transaction(isolation="repeatable_read", readonly=True):  # both reads see one moment
        figures = await conn.fetch(_FIGURES, alias, since, window_s)
        failures = await conn.fetch(_FAILURES, alias, since)
    by_code: dict[str, dict[str, int]] = {}
    for row in failures:
        by_code.setdefault(row["model"], {})[row["code"]] = row["failed"]
    out = []
    for row in figures:
        ended, done = row["ended"], row["completed"]
        render, ready = _pair(row["render_s"]), _pair(row["ready_s"])
        out.append(RouteFigures(
            model=row["model"], jobs=row["jobs"], completed=done, failed=row["failed"],
            render_p50_s=render[0], render_p90_s=render[1], ready_p50_s=ready[0], ready_p90_s=ready[1],
            failure_rate=row["failed"] / ended if ended else None,
            failures_by_code={code: n / ended for code, n in by_code.get(row["model"], {}).items()} if ended else {},
            regenerate_rate=row["regenerated"] / done if done else None,
            credits_per_job=_number(row["credits_per_job"]),
            provider_cost_per_job=_number(row["provider_cost_per_job"])))
    return out


def _number(value: Decimal | None) -> float | None:
    return None if value is None else float(value)
