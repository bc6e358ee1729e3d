"""A job's creation: its credit reserved, its row and first audit row, its submit message and its first
recovery check, in the caller's transaction. The one status write outside `transitions`: a new job has no
previous status to guard."""

from __future__ import annotations

from typing import Any, NamedTuple

import asyncpg
import msgspec

from vidjobs.common import changes, credits, ids, outbox, requestids, waiting
from vidjobs.common.errors import QueueFull
from vidjobs.common.events import JobQueued, RecoveryDue
from vidjobs.common.jobs import JobRequest, JobRow, Lane, row_to_job
from vidjobs.common.states import JobStatus


class Created(NamedTuple):
    job: JobRow
    waiting_ahead: int  # the account's jobs it was queued behind (its lane and those before): its place is this + 1


async def create(conn: asyncpg.Connection, **options: Any) -> JobRow:
    """`enqueue`, for callers that need only the job."""
    return (await enqueue(conn, **options)).job


async def enqueue(
    conn: asyncpg.Connection, *, account_id: str, request: JobRequest, estimated_credits: int,
    recovery_delay_s: float, route: str | None = None, rate_card_version: int | None = None,
    max_waiting: int | None = None, metadata: dict[str, str] | None = None, webhook_url: str | None = None,
    webhook_events: list[str] | None = None, fallback_models: list[str] | None = None, max_wait_s: int | None = None,
    lane: Lane = Lane.INTERACTIVE, rerun_of: str | None = None,
) -> Created:
    """Reserve the estimate, then insert a pending job with its creation audit row, its submit event and its
    first recovery check. Raises QuotaExhausted (and creates nothing) when the account's credit or
    guardrails do not allow it, and QueueFull when `max_waiting` of its jobs already wait for a slot.

    Creation is the one status write outside `transitions.transition`: it has no previous status to guard.
    Must run inside the caller's transaction.
    """
    job_id = ids.new("job")
    await credits.reserve(conn, account_id=account_id, job_id=job_id, amount=estimated_credits)
    # Counted under the account row's lock, which `reserve` took: racing creates are decided one at a time,
    # and the jobs counted ahead of the new one give its place in the queue.
    queue = await waiting.queue_count(conn, account_id, lane)
    if max_waiting is not None and queue.waiting >= max_waiting:
        raise QueueFull(max_waiting)
    row = await conn.fetchrow(
        """
        INSERT INTO jobs (id, account_id, model, provider, request, estimated_credits, recover_at, route,
                          rate_card_version, request_id, metadata, webhook_url, webhook_events, fallback_models,
                          max_wait_s, max_wait_until, lane, rerun_of)
        VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7), $8, $9, $10, $11, $12, $13, $14,
                $15::integer, now() + make_interval(secs => $15::integer), $16, $17)
        RETURNING *
        """,
        job_id, account_id, request.model, request.provider, msgspec.to_builtins(request),
        estimated_credits, recovery_delay_s, route, rate_card_version, requestids.current(), metadata or {},
        webhook_url, webhook_events, fallback_models or [], max_wait_s, lane, rerun_of,
    )
    assert row is not None, "INSERT ... RETURNING answers the row it inserted"
    job = row_to_job(row)
    assert job.recover_at is not None, "a new job's first recovery check is set by the insert"
    await conn.execute(
        "INSERT INTO job_transitions (job_id, from_status, to_status, reason, stage) VALUES ($1, NULL, $2, $3, $4)",
        job_id, JobStatus.PENDING.value, "created", job.stage,
    )
    # No change hint for the job: nothing can be listening for a job whose id has not been answered yet. The
    # jobs of later lanes it went ahead of moved back a place: their streams hear it as a queue move.
    if queue.waiting > queue.ahead:
        changes.note_queue(account_id)
    await outbox.add(conn, [JobQueued(job_id=job_id), RecoveryDue(job_id=job_id, due_at=job.recover_at)])
    return Created(job, queue.ahead)
