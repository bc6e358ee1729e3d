"""The job row as every service reads it: the request it renders, its lane, the stored row, and the message
that asks its provider to stop.

What writes a job lives beside it, each in a module of its own: `creation` (a new job), `transitions` (every
status change), `deletion` (a live job canceled through `transitions`, then hidden), `waiting` (the queue and
why a job waits), `recovery_checks`, `provider_reports` (progress, place in the provider's queue),
`attempt_costs` (what each attempt was billed) and `credits` (what a job ending owes). This module imports
none of them: they all read the row through it.
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any

import asyncpg
import msgspec

from vidjobs.common.errors import JobError
from vidjobs.common.events import CancelRequested
from vidjobs.common.states import RENDERING, TERMINAL, JobStatus, Stage


class JobRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The normalised render request, as accepted by the API and handed to an adapter."""

    model: str
    prompt: str
    duration_s: int = 5
    aspect_ratio: str = "16:9"
    resolution: str = "720p"
    seed: int | None = None
    negative_prompt: str | None = None
    input_image: str | None = None
    params: dict[str, Any] = {}

    @property
    def provider(self) -> str:
        return self.model.split("/", 1)[0]

    @property
    def model_name(self) -> str:
        return self.model.split("/", 1)[1]


class Lane(enum.IntEnum):
    """A job's lane in its account's queue (`priority` in the API): the account's waiting interactive jobs go
    ahead of its waiting batch ones. Stored as this number, so that index order is lane order; the order
    across accounts (the submitter's fair pick) never looks at it."""

    INTERACTIVE = 0
    BATCH = 1

    @property
    def priority(self) -> str:
        """The lane's name in the API."""
        return self.name.lower()

    @classmethod
    def of(cls, priority: str) -> Lane:
        return cls[priority.upper()]


class JobRow(msgspec.Struct, kw_only=True):
    id: str
    account_id: str
    status: JobStatus
    model: str
    provider: str
    request: JobRequest
    attempt: int
    provider_job_id: str | None
    provider_output: str | None
    progress: float | None
    error: JobError | None
    estimated_credits: int
    actual_credits: int | None
    created_at: datetime
    updated_at: datetime
    submitted_at: datetime | None
    retry_at: datetime | None
    deadline_at: datetime | None
    recover_at: datetime | None
    deleted_at: datetime | None
    route: str | None = None
    wait_reason: str | None = None
    provider_queue_position: int | None = None
    rate_card_version: int | None = None
    provider_cost_credits: int | None = None  # what the provider reported billing, in credits
    waited_at: datetime | None = None  # when a submitter last deferred this waiting job's message
    request_id: str | None = None  # the request that created it (requestids)
    metadata: dict[str, str] = {}  # the owner's own labels
    completed_at: datetime | None = None  # when it reached its ending (completed, failed, canceled)
    webhook_url: str | None = None  # where its app hears of it, beside the account's endpoints
    webhook_events: list[str] | None = None  # which events go to webhook_url
    # When it entered its status's own stage (states.STAGE_OF; NULL on jobs finished before it existed).
    stage_at: datetime | None = None
    # The stage people see as its last move left it; a release before it did not keep it (states.stage_after).
    stage: Stage = Stage.QUEUED
    retry_error: JobError | None = None  # what ended the try before this one; None on its first try
    fallback_models: list[str] = []  # where it may move while it waits, in order (vidjobs.submitter.failover)
    max_wait_s: int | None = None  # the owner's limit on waiting for a slot
    max_wait_until: datetime | None = None  # created_at + max_wait_s
    lane: Lane = Lane.INTERACTIVE  # its lane in its account's queue
    rerun_of: str | None = None  # the job it renders again (POST /v1/jobs/{id}/rerun)
    kept_at: datetime | None = None  # kept past retention by its owner since then (vidjobs.common.retention)
    expiry_warned_at: datetime | None = None  # when its app was told `job.expiring` for its current window

    @property
    def finished(self) -> bool:
        """Terminal or deleted: every consumer stops here."""
        return self.deleted_at is not None or self.status in TERMINAL


def row_to_job(row: asyncpg.Record) -> JobRow:
    data = {k: row[k] for k in JobRow.__struct_fields__}
    return msgspec.convert(data, JobRow, from_attributes=False, strict=False)


async def fetch(conn: asyncpg.Connection | asyncpg.Pool, job_id: str) -> JobRow | None:
    """The job as stored, deleted or not (workers decide what deletion means for them)."""
    row = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1", job_id)
    return None if row is None else row_to_job(row)


async def fetch_locked(conn: asyncpg.Connection, job_id: str) -> JobRow | None:
    """`fetch`, holding the row until the transaction ends: a decision taken on it cannot be overtaken by a
    concurrent change (which waits, then applies to what this transaction left). Held as an update holds it
    (NO KEY UPDATE), not more: rows that refer to the job (its audit trail, its lease) are still written
    beside it, and a transaction that wrote one first is not left waiting on us while we wait on it."""
    row = await conn.fetchrow("SELECT * FROM jobs WHERE id = $1 FOR NO KEY UPDATE", job_id)
    return None if row is None else row_to_job(row)


def stop_at_provider(job: JobRow, was: JobStatus | None = None) -> list[CancelRequested]:
    """The message that asks the provider to stop rendering this job, if it may still be rendering (judged
    by `was`, its status before the change at hand, when given)."""
    if job.provider_job_id is None or (was or job.status) not in RENDERING:
        return []
    return [CancelRequested(job_id=job.id, provider=job.provider, provider_job_id=job.provider_job_id,
                            model_name=job.request.model_name)]
