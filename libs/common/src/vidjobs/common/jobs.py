"""The job row as every service reads it, and the creation of a job (its first audit row)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, NamedTuple

import asyncpg
import msgspec

from vidjobs.common import changes, credits, ids, outbox, requestids
from vidjobs.common.errors import JobError, QueueFull
from vidjobs.common.events import (
    AssetsDeleteRequested,
    CancelRequested,
    JobQueued,
    RecoveryDue,
    SlotFreed,
)
from vidjobs.common.states import RENDERING, SQL_PENDING, SQL_TERMINAL, TERMINAL, JobStatus, sql

# A job waiting on a provider's pacing (a wait of a second or so) keeps its message, which looks again within
# this long; any other wait parks the job (`park`) until an event hands it a slot.
WAIT_LOOK_S = 30.0


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
    stage_at: datetime | None = None  # when it entered its current stage (NULL on jobs finished before it existed)
    fallback_models: list[str] = []  # where it may move while it waits, in order (services/submitter/failover.py)
    max_wait_s: int | None = None  # the owner's limit on waiting for a slot
    max_wait_until: datetime | None = None  # created_at + max_wait_s
    lane: Lane = Lane.INTERACTIVE  # its lane in its account's queue

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
    lane: Lane = Lane.INTERACTIVE,
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
    queue = await queue_count(conn, account_id, lane)
    if max_waiting is not None and queue.waiting >= max_waiting:
        raise QueueFull(max_waiting)
    row = await conn.fetchrow(
        """
        INSERT INTO jobs (id, account_id, model, provider, request, estimated_credits, recover_at, route,
                          rate_card_version, request_id, metadata, webhook_url, webhook_events, fallback_models,
                          max_wait_s, max_wait_until, lane)
        VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7), $8, $9, $10, $11, $12, $13, $14,
                $15::integer, now() + make_interval(secs => $15::integer), $16)
        RETURNING *
        """,
        job_id, account_id, request.model, request.provider, msgspec.to_builtins(request),
        estimated_credits, recovery_delay_s, route, rate_card_version, requestids.current(), metadata or {},
        webhook_url, webhook_events, fallback_models or [], max_wait_s, lane,
    )
    job = row_to_job(row)
    await conn.execute(
        "INSERT INTO job_transitions (job_id, from_status, to_status, reason) VALUES ($1, NULL, $2, $3)",
        job_id, JobStatus.PENDING.value, "created",
    )
    # No change hint for the job: nothing can be listening for a job whose id has not been answered yet. The
    # jobs of later lanes it went ahead of moved back a place: their streams hear it as a queue move.
    if queue.waiting > queue.ahead:
        changes.note_queue(account_id)
    await outbox.add(conn, [JobQueued(job_id=job_id), RecoveryDue(job_id=job_id, due_at=job.recover_at)])
    return Created(job, queue.ahead)


# Providers with a waiting job: a skip scan of jobs_provider_waiting, one index probe per provider however
# long its queue.
_WAITING_PROVIDERS = f"""
WITH RECURSIVE providers AS (
    (SELECT provider FROM jobs WHERE status = {SQL_PENDING} AND deleted_at IS NULL ORDER BY provider LIMIT 1)
    UNION ALL
    SELECT (SELECT j.provider FROM jobs j
            WHERE j.status = {SQL_PENDING} AND j.deleted_at IS NULL AND j.provider > p.provider
            ORDER BY j.provider LIMIT 1)
    FROM providers p WHERE p.provider IS NOT NULL
)
SELECT provider FROM providers WHERE provider IS NOT NULL
"""


async def waiting_providers(conn: asyncpg.Connection | asyncpg.Pool) -> list[str]:
    return [r["provider"] for r in await conn.fetch(_WAITING_PROVIDERS)]


async def slot_wakeup(conn: asyncpg.Connection, provider: str, account_id: str | None = None) -> list[SlotFreed]:
    """The messages that hand a render slot just freed at `provider` to the next waiting job: one for
    `provider` if a job waits for it, and, when the slot was `account_id`'s, one for each other provider where
    that account has a job waiting (its cap may have held it back there). Parked jobs wait for exactly these;
    the submitter's queue sweep catches one that was lost."""
    found = await conn.fetch(
        f"""
        SELECT w.provider FROM ({_WAITING_PROVIDERS}) w
        WHERE w.provider = $1 OR EXISTS (
            SELECT 1 FROM jobs j WHERE j.provider = w.provider AND j.account_id = $2 AND j.status = {SQL_PENDING}
                                   AND j.deleted_at IS NULL)
        """, provider, account_id)
    return [SlotFreed(provider=r["provider"]) for r in found]


class QueueCount(NamedTuple):
    waiting: int  # all the account's jobs waiting for a slot
    ahead: int  # of those, the ones in `lane` or a lane before it: a job queued now in `lane` comes after them


_QUEUE_COUNT = f"""
SELECT count(*) AS waiting, count(*) FILTER (WHERE lane <= $2) AS ahead FROM jobs
WHERE account_id = $1 AND status = {SQL_PENDING} AND deleted_at IS NULL
"""


async def queue_count(conn: asyncpg.Connection | asyncpg.Pool, account_id: str, lane: Lane) -> QueueCount:
    """How many of the account's jobs wait for a slot, and how many a new job in `lane` would queue behind
    (the partial index jobs_account_waiting alone)."""
    row = await conn.fetchrow(_QUEUE_COUNT, account_id, lane)
    return QueueCount(row["waiting"], row["ahead"])


def queue_place_sql(account: str, lane: str, created_at: str, job_id: str, up_to: str = "ALL") -> str:
    """SQL for a waiting job's place in its account's queue (1 is next): the account's waiting jobs before it
    or it, in (lane, created_at, id) order (interactive ahead of batch, then oldest first), counted no further
    than `up_to`. The one definition the gateway shows and the submitter acts on (dispatch's choice of an
    account's head follows the same order); the index jobs_account_waiting is read from the front, so the
    cost is the smaller of the place and `up_to`."""
    return f"""(SELECT count(*) FROM (
        SELECT 1 FROM jobs w
        WHERE w.account_id = {account} AND w.status = {SQL_PENDING} AND w.deleted_at IS NULL
          AND (w.lane, w.created_at, w.id) <= ({lane}, {created_at}, {job_id})
        ORDER BY w.lane, w.created_at, w.id LIMIT {up_to}) AS ahead)"""


def owed_sql(delivered: str, rendered: str = "false") -> str:
    """SQL for what a job ending now owes, kept as its `actual_credits` beside its estimate. `delivered` and
    `rendered` are SQL conditions. A delivered render, or one the provider finished before the owner ended
    the job (`rendered`), costs the provider's reported cost where it gave one, else the estimate: a cost of
    0 is no report, since nothing renders for free. Any other ending costs what the provider billed for the
    attempt at hand, if anything. Never more than the estimate: the estimate is the quote the credit was
    reserved for."""
    return f"""GREATEST(0, LEAST(estimated_credits, CASE WHEN ({delivered}) OR ({rendered})
        THEN COALESCE(NULLIF(provider_cost_credits, 0), estimated_credits)
        ELSE COALESCE(provider_cost_credits, 0) END))"""


async def settle_credit(conn: asyncpg.Connection, job: JobRow, ending: str, *, rendered: bool = False) -> None:
    """A job just ended (`ending`: its terminal status, or "deleted"): release its reservation and charge its
    `actual_credits`, with a ledger entry saying why. `rendered`: the provider had finished the render.
    `job` is the row as this transaction just wrote it: the settlement reads the same figures."""
    charged = max(0, min(job.actual_credits or 0, job.estimated_credits))
    await credits.settle(conn, job_id=job.id, note=credits.settle_note(
        ending, job.id, job.estimated_credits, charged, job.provider_cost_credits, rendered=rendered))


def stop_at_provider(job: JobRow, was: JobStatus | None = None) -> list[CancelRequested]:
    """The message that asks the provider to stop rendering this job, if it may still be rendering (judged
    by `was`, its status before the change at hand, when given)."""
    if job.provider_job_id is None or (was or job.status) not in RENDERING:
        return []
    return [CancelRequested(job_id=job.id, provider=job.provider, provider_job_id=job.provider_job_id)]


async def mark_deleted(conn: asyncpg.Connection, job_id: str, account_id: str) -> bool:
    """Hide a job from every read at once and ask for its assets to be removed. Deletion is not a status:
    the row keeps its status, and every consumer treats `deleted_at` as terminal. False if no such job."""
    # A deleted live job never reaches a terminal transition: it is settled here, like a cancel.
    row = await conn.fetchrow(
        f"""
        UPDATE jobs SET deleted_at = clock_timestamp(), updated_at = clock_timestamp(), recover_at = NULL,
            actual_credits = CASE WHEN status IN {SQL_TERMINAL} THEN actual_credits
                                  ELSE {owed_sql("false", f"status = {sql(JobStatus.DOWNLOADING)}")} END
        WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL
        RETURNING *
        """,
        job_id, account_id,
    )
    if row is None:
        return False
    job = row_to_job(row)
    if job.status not in TERMINAL:
        await settle_credit(conn, job, "deleted", rendered=job.status is JobStatus.DOWNLOADING)
    await outbox.add(conn, [
        *stop_at_provider(job),
        *(await slot_wakeup(conn, job.provider, job.account_id) if job.status in RENDERING else []),
        AssetsDeleteRequested(job_id=job_id),
    ])
    changes.note(job_id, "deleted", row["updated_at"])
    if job.status is JobStatus.PENDING:
        changes.note_queue(account_id)
    return True


async def set_wait_reason(conn: asyncpg.Connection, job_id: str, reason: str, *, park: bool = False) -> None:
    """Say why a queued job is not submitted yet (not a status change; the next transition clears it).
    Parked (`park`), it waits for a slot to be handed to it and nothing of its own is scheduled: no message,
    no recovery check (its next one is scheduled when it is submitted). Otherwise its message is alive:
    `waited_at` tells the recovery check not to publish another."""
    row = await conn.fetchrow(
        f"""
        UPDATE jobs j SET wait_reason = $2, waited_at = clock_timestamp(),
                          recover_at = CASE WHEN $3 THEN NULL ELSE j.recover_at END,
                          updated_at = CASE WHEN o.reason IS DISTINCT FROM $2 THEN clock_timestamp()
                                            ELSE j.updated_at END
        FROM (SELECT id, wait_reason AS reason FROM jobs WHERE id = $1) AS o
        WHERE j.id = o.id AND j.status = {SQL_PENDING} AND j.deleted_at IS NULL
        RETURNING j.updated_at, o.reason IS DISTINCT FROM $2 AS changed
        """,
        job_id, reason, park,
    )
    if row is not None and row["changed"]:
        changes.note(job_id, JobStatus.PENDING.value, row["updated_at"])


def message_alive(job: JobRow, now: datetime) -> bool:
    """Whether a waiting job's own message looked at it recently enough to be still going round."""
    return job.waited_at is not None and (now - job.waited_at).total_seconds() < 3 * WAIT_LOOK_S


async def record_queue_position(conn: asyncpg.Connection, job_id: str, position: int) -> None:
    """Store a submitted job's place in its provider's queue, as the provider reported it."""
    at = await conn.fetchval(
        f"""
        UPDATE jobs SET provider_queue_position = $2, updated_at = clock_timestamp()
        WHERE id = $1 AND status = {sql(JobStatus.SUBMITTED)} AND deleted_at IS NULL
          AND provider_queue_position IS DISTINCT FROM $2
        RETURNING updated_at
        """,
        job_id, position,
    )
    if at is not None:
        changes.note(job_id, JobStatus.SUBMITTED.value, at)


async def record_progress(conn: asyncpg.Connection, job_id: str, progress: float) -> bool:
    """Store a provider's own progress figure for a rendering job (not a status change)."""
    row = await conn.fetchrow(
        f"""
        UPDATE jobs SET progress = $2, updated_at = clock_timestamp()
        WHERE id = $1 AND status = {sql(JobStatus.PROCESSING)} AND deleted_at IS NULL
          AND (progress IS NULL OR progress < $2)
        RETURNING updated_at
        """,
        job_id, progress,
    )
    if row is None:
        return False
    changes.note(job_id, JobStatus.PROCESSING.value, row["updated_at"])
    return True


async def reschedule_recovery(conn: asyncpg.Connection, job_id: str, delay_s: float) -> datetime | None:
    """Push a live job's next recovery check out by `delay_s` and stage its message."""
    due = await conn.fetchval(
        f"""
        UPDATE jobs SET recover_at = clock_timestamp() + make_interval(secs => $2)
        WHERE id = $1 AND deleted_at IS NULL
          AND status NOT IN {SQL_TERMINAL}
        RETURNING recover_at
        """,
        job_id, delay_s,
    )
    if due is not None:
        await outbox.add(conn, [RecoveryDue(job_id=job_id, due_at=due)])
    return due


async def watch_again(conn: asyncpg.Connection, job: JobRow, interval_s: float) -> None:
    """A job just moved out of the queue: if it was parked, with no recovery check scheduled, its checks begin
    again now that something of its own can go wrong (whoever moved it: the submitter, or a callback that
    arrived before the submitter's answer)."""
    if job.recover_at is None and job.status not in TERMINAL:
        await reschedule_recovery(conn, job.id, interval_s)


async def record_provider_cost(
    conn: asyncpg.Connection, job_id: str, credits_owed: int, *, attempt: int, provider_job_id: str | None,
) -> None:
    """Store what the provider reported billing for the job's current render (not a status change; the
    charge is settled when the job ends). A report about an earlier attempt's render changes nothing."""
    await conn.execute(
        f"""
        UPDATE jobs SET provider_cost_credits = $2
        WHERE id = $1 AND attempt = $3 AND provider_job_id IS NOT DISTINCT FROM $4::text AND deleted_at IS NULL
          AND status NOT IN {SQL_TERMINAL}
        """,
        job_id, credits_owed, attempt, provider_job_id,
    )
