"""Regenerations: a created job that renders again what its account already had ready.

A job is one when it is a rerun (`rerun_of` set: POST /v1/jobs/{id}/rerun), or when its account had a job of
the same model and the same prompt, normalised, completed (ready) within VIDJOBS_REGENERATION_WINDOW_S before
it. Each created job is counted once, in vidjobs_regenerations_total{model}, when its create commits (an
idempotent replay made nothing and counts nothing). Many regenerations of a model say its renders miss what
people ask for.

The normalised prompt is the prompt lower-cased, trimmed of spaces, with every run of whitespace made one
space. In SQL it is exactly `lower(regexp_replace(btrim(prompt), '\\s+', ' ', 'g'))`: the same expression
reads the regenerate rates elsewhere, so the two agree on what "the same prompt" means.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import asyncpg

from vidjobs.common import metrics
from vidjobs.common.jobs import JobRow
from vidjobs.common.states import JobStatus, sql

_WHITESPACE = re.compile(r"\s+")


def normalise_prompt(prompt: str) -> str:
    """What `normalised_prompt_sql` makes of `prompt`, step for step: btrim (spaces only), then runs of
    whitespace to one space, then lower case."""
    return _WHITESPACE.sub(" ", prompt.strip(" ")).lower()


def normalised_prompt_sql(prompt: str) -> str:
    """The SQL expression of the normalised prompt of `prompt` (an SQL text expression)."""
    return rf"lower(regexp_replace(btrim({prompt}), '\s+', ' ', 'g'))"


# A job of the account, of the model and with the same normalised prompt, that became ready within the window
# before now (the new job's creation; it is not among them, being just inserted and not completed). An expired
# job was ready once, and its completed_at still says when. Read through jobs_account_model_ready.
_READY_BEFORE = f"""
SELECT EXISTS (
    SELECT 1 FROM jobs p
    WHERE p.model = $2 AND p.account_id = $1 AND p.id <> $4
      AND p.status IN ({sql(JobStatus.COMPLETED)}, {sql(JobStatus.EXPIRED)})
      AND p.completed_at > clock_timestamp() - make_interval(secs => $5)
      AND {normalised_prompt_sql("p.request->>'prompt'")} = {normalised_prompt_sql("$3::text")}
)
"""


async def is_regeneration(conn: asyncpg.Connection, job: JobRow, window_s: float) -> bool:
    """Whether the just-created `job` renders again what its account already had: a rerun, or the same model
    and prompt as one of its jobs ready within `window_s` before it."""
    if job.rerun_of is not None:
        return True
    found = await conn.fetchval(_READY_BEFORE, job.account_id, job.model, job.request.prompt, job.id, window_s)
    return bool(found)


def count(model: str) -> None:
    """One created job that is a regeneration (call once its create has committed)."""
    metrics.REGENERATIONS.labels(model).inc()


def offer(models: Iterable[str]) -> None:
    """Export the count of each model a process offers from its start, at zero until the first: a rate over
    it is then right from the first regeneration rather than from the second."""
    for model in models:
        metrics.REGENERATIONS.labels(model)
