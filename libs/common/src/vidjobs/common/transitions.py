"""The one function that changes a job's status.

It checks the move against the table in `states`, updates the row only if it still has an expected status
(`WHERE id = $1 AND status = ANY($2)`), with the stage people see after it (`states.stage_after`, which never
goes back), appends the audit row and writes the outgoing events to the outbox, all in one transaction. No
row back means another worker already made this move (or a later one): that is logged and answered with
`None`, never raised, so redelivered messages are harmless.

It reads the row through `jobs` and carries out a move's follow-ups through `credits` (the settlement) and
`waiting` (the freed slot); none of those calls back into it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from datetime import datetime
from functools import partial
from typing import Any

import asyncpg
import msgspec

from vidjobs.common import changes, metrics, outbox
from vidjobs.common.credits import owed_sql, settle_credit
from vidjobs.common.errors import JobError
from vidjobs.common.events import AppEventDue, Event
from vidjobs.common.jobs import JobRequest, JobRow, row_to_job
from vidjobs.common.states import (
    BILLED_ENDINGS,
    FOLLOW_UPS,
    NON_TERMINAL,
    RENDERING,
    SQL_RENDERING,
    STAGE_OF,
    STAGE_ORDER,
    TERMINAL,
    FollowUp,
    JobStatus,
    Stage,
    app_events,
    sources_of,
    sql,
    stage_after,
)
from vidjobs.common.waiting import slot_wakeup

log = logging.getLogger("vidjobs.transitions")

UNSET: Any = msgspec.UNSET


class JobUpdate(msgspec.Struct, kw_only=True):
    """Columns a transition may set beside the status. UNSET leaves a column alone; None clears it."""

    attempt: int = UNSET
    provider_job_id: str | None = UNSET
    provider_output: str | None = UNSET
    progress: float | None = UNSET
    error: JobError | None = UNSET
    actual_credits: int | None = UNSET
    submitted_at: datetime | None = UNSET
    retry_at: datetime | None = UNSET
    deadline_at: datetime | None = UNSET
    recover_at: datetime | None = UNSET
    # A waiting job moving to a fallback model (pending -> pending): what it renders with, and its new quote.
    model: str = UNSET
    provider: str = UNSET
    request: JobRequest = UNSET
    estimated_credits: int = UNSET
    fallback_models: list[str] = UNSET

    def columns(self) -> dict[str, Any]:
        out = {}
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if value is not UNSET:
                out[name] = msgspec.to_builtins(value) if isinstance(value, msgspec.Struct) else value
        return out


class Guard(msgspec.Struct, kw_only=True, frozen=True):
    """What else must still hold of the row for the move to apply: a signal about one attempt's render must
    not move the job once it has gone on to another attempt. UNSET checks nothing."""

    attempt: int = UNSET
    provider_job_id: str | None = UNSET


class Transitioned(msgspec.Struct):
    from_status: JobStatus
    job: JobRow


class IllegalTransition(ValueError):
    """A caller asked for a move the table does not allow: a programming error, not a race."""


def allowed_sources(to: JobStatus, expect: Collection[JobStatus] | None) -> list[str]:
    legal = sources_of(to)
    chosen = legal if expect is None else legal & frozenset(expect)
    if not chosen:
        raise IllegalTransition(f"no legal move to {to} from {sorted(expect or ())}")
    return sorted(s.value for s in chosen)


def _guard_sql(guard: Guard | None, first: int) -> tuple[str, list[int | str | None]]:
    if guard is None:
        return "", []
    clauses: list[str] = []
    values: list[int | str | None] = []
    if guard.attempt is not UNSET:
        values.append(guard.attempt)
        clauses.append(f"AND attempt = ${first + len(values) - 1}")
    if guard.provider_job_id is not UNSET:
        values.append(guard.provider_job_id)
        clauses.append(f"AND provider_job_id IS NOT DISTINCT FROM ${first + len(values) - 1}::text")
    return " ".join(clauses), values


# `status` is the row's status before this move: a render the provider finished is owed when the owner cancels.
_ACTUAL_SQL = "actual_credits = " + owed_sql(
    f"$3::job_status = {sql(JobStatus.COMPLETED)}",
    f"prev.status = {sql(JobStatus.DOWNLOADING)} AND $3::job_status = {sql(JobStatus.CANCELED)}")


# Whether any webhook of the job's app would hear of a move: its own URL, or one of its account's endpoints.
APPS_LISTEN = """(j.webhook_url IS NOT NULL OR EXISTS (
    SELECT 1 FROM webhook_endpoints e
    WHERE e.account_id = j.account_id AND e.deleted_at IS NULL AND e.disabled_at IS NULL))"""


def same_stage(to: JobStatus) -> list[str]:
    """The statuses a move to `to` may come from without the stage people see changing."""
    return sorted(s.value for s in sources_of(to) if STAGE_OF[s] is STAGE_OF[to])


# The stages a job passes through before its ending, in order, and the one each status before an ending has of
# its own: spelled from the enums, as `states.sql` spells statuses.
_ON_THE_WAY = sorted({STAGE_OF[s] for s in NON_TERMINAL}, key=STAGE_ORDER.__getitem__)
_ON_THE_WAY_SQL = "ARRAY[" + ", ".join(f"'{stage.value}'" for stage in _ON_THE_WAY) + "]::text[]"
_OWN_STAGE_SQL = ("CASE prev.status::text " + " ".join(
    f"WHEN '{s.value}' THEN '{STAGE_OF[s].value}'" for s in JobStatus if s in NON_TERMINAL) + " END")


def stage_sql(to: JobStatus) -> str:
    """The stage after a move to `to`, in SQL, as `states.stage_after` makes it: an ending's own; otherwise the
    latest of the stage the job had reached (`prev.stage`, which the release before this one did not keep up
    to date, so also its status's own) and `to`'s own."""
    if to in TERMINAL:
        return f"'{STAGE_OF[to].value}'::job_stage"
    return (f"({_ON_THE_WAY_SQL})[GREATEST(array_position({_ON_THE_WAY_SQL}, prev.stage::text), "
            f"array_position({_ON_THE_WAY_SQL}, {_OWN_STAGE_SQL}), {_ON_THE_WAY.index(STAGE_OF[to]) + 1})]::job_stage")


def _update_sql(columns: dict[str, Any], to: JobStatus, guard: Guard | None) -> tuple[str, list[Any]]:
    # A job that moves is no longer waiting for whatever held it.
    sets = ["status = $3", "updated_at = clock_timestamp()", "wait_reason = NULL", "provider_queue_position = NULL"]
    values: list[Any] = []
    if to in TERMINAL:
        # A finished job needs no more watching (and the schema's CHECK insists on it). Its first ending is
        # when it completed; expiry after completion does not move that.
        columns = {**columns, "recover_at": None, "retry_at": None, "deadline_at": None}
        sets.append("completed_at = COALESCE(j.completed_at, clock_timestamp())")
    if to in BILLED_ENDINGS and "actual_credits" not in columns:
        sets.append(_ACTUAL_SQL)
    if to not in RENDERING:
        # A render leaving its slot: how long renders hold one is what the estimates of waiting jobs measure.
        sets.append(f"rendered_at = CASE WHEN prev.status IN {SQL_RENDERING} THEN clock_timestamp() "
                    "ELSE j.rendered_at END")
    if "attempt" in columns:
        # What the provider billed belongs to one attempt's render; a new attempt starts with no bill.
        sets.append("provider_cost_credits = NULL")
    if to is JobStatus.RETRYING and "error" in columns:
        # The next attempt clears the error; what sent the job round again stays, for its `retry`.
        columns = {**columns, "retry_error": columns["error"]}
    sets.append(f"stage = {stage_sql(to)}")
    for i, (name, value) in enumerate(columns.items(), start=4):
        sets.append(f"{name} = ${i}")
        values.append(value)
    guard_clause, guard_values = _guard_sql(guard, 4 + len(values))
    values.extend(guard_values)
    # The operators' stage clock (by each status's own stage, states.STAGE_OF) restarts only when that stage
    # changes (retrying -> pending stays queued); the stage people see is `stage`, above.
    values.append(same_stage(to))
    sets.append(f"stage_at = CASE WHEN prev.status = ANY(${3 + len(values)}::job_status[]) THEN j.stage_at "
                "ELSE clock_timestamp() END")
    sql = f"""
        WITH prev AS (
            SELECT id, status, stage, stage_at FROM jobs
            WHERE id = $1 AND status = ANY($2::job_status[]) AND deleted_at IS NULL {guard_clause}
            FOR UPDATE
        )
        UPDATE jobs AS j SET {", ".join(sets)}
        FROM prev WHERE j.id = prev.id
        RETURNING prev.status AS from_status, prev.stage AS reached_stage, prev.stage_at AS left_stage_at, j.*,
                  {APPS_LISTEN} AS apps_listen
    """
    return sql, values


async def _in_transaction(conn: asyncpg.Connection, job: JobRow, from_status: JobStatus, to: JobStatus,
                          follow_ups: frozenset[FollowUp], apps_listen: bool, stage_moved: bool) -> list[Event]:
    """The move's follow-ups that write or send (states.FOLLOW_UPS); returns the events they send."""
    sent: list[Event] = []
    if FollowUp.SETTLE_CREDIT in follow_ups:
        await settle_credit(conn, job, to.value,
                            rendered=from_status is JobStatus.DOWNLOADING and to is JobStatus.CANCELED)
    if FollowUp.FREE_SLOT in follow_ups:
        sent += await slot_wakeup(conn, job.provider, job.account_id)
    told = app_events(from_status, to, stage_moved=stage_moved) if FollowUp.TELL_APPS in follow_ups else []
    if told and apps_listen:
        sent.append(AppEventDue(job_id=job.id, types=told, key=f"{job.id}:{to.value}:{job.updated_at.timestamp():.6f}"))
    return sent


async def transition(
    conn: asyncpg.Connection,
    job_id: str,
    to: JobStatus,
    *,
    reason: str,
    expect: Collection[JobStatus] | None = None,
    update: JobUpdate | None = None,
    emit: Sequence[Event] = (),
    guard: Guard | None = None,
) -> Transitioned | None:
    """Move `job_id` to `to` if its status is still one of `expect` (default: every legal source) and the
    `guard` still holds."""
    sources = allowed_sources(to, expect)
    sql, values = _update_sql(update.columns() if update else {}, to, guard)
    async with changes.after_commit(), conn.transaction():
        row = await conn.fetchrow(sql, job_id, sources, to.value, *values)
        if row is None:
            log.info("transition skipped: job not in an expected status",
                     extra={"job_id": job_id, "to": to.value, "expected": sources, "reason": reason})
            return None
        from_status = JobStatus(row["from_status"])
        job = row_to_job(row)
        await conn.execute(
            "INSERT INTO job_transitions (job_id, from_status, to_status, reason, stage) VALUES ($1, $2, $3, $4, $5)",
            job_id, from_status.value, to.value, reason, job.stage,
        )
        follow_ups = FOLLOW_UPS[from_status, to]
        shown_before = stage_after(_stage(row["reached_stage"]), from_status)
        sent = await _in_transaction(conn, job, from_status, to, follow_ups, row["apps_listen"],
                                     stage_moved=job.stage is not shown_before)
        await outbox.add(conn, [*sent, *emit])
        changes.note(job_id, to.value, job.updated_at)
        if from_status is JobStatus.PENDING:
            changes.note_queue(job.account_id)  # the places behind it moved up
        # Counted once the move commits, and only then: see metrics.
        changes.on_commit(partial(_count_move, job, from_status, row["left_stage_at"], follow_ups))
    log.info("job transitioned", extra={"job_id": job_id, "account_id": job.account_id, "from": from_status.value,
                                        "to": to.value, "reason": reason})
    return Transitioned(from_status=from_status, job=job)


def _stage(value: str | None) -> Stage | None:
    return None if value is None else Stage(value)


def _count_move(job: JobRow, from_status: JobStatus, left_stage_at: datetime | None,
                follow_ups: frozenset[FollowUp]) -> None:
    to = job.status
    metrics.TRANSITIONS.labels(to.value).inc()
    if to in (JobStatus.RETRYING, JobStatus.FAILED) and job.error is not None:
        metrics.JOB_ERRORS.labels(job.error.code.value, job.provider).inc()
    if STAGE_OF[from_status] is not STAGE_OF[to] and from_status not in TERMINAL and left_stage_at is not None:
        metrics.STAGE_SECONDS.labels(STAGE_OF[from_status].value, job.provider, job.model).observe(
            (job.updated_at - left_stage_at).total_seconds())
    if to is JobStatus.COMPLETED:
        metrics.JOB_READY_SECONDS.labels(job.provider, job.model).observe(
            (job.updated_at - job.created_at).total_seconds())
    if FollowUp.ROUTE_OUTCOME in follow_ups:
        metrics.JOBS_FINISHED.labels(job.provider, job.model, to.value).inc()
        if job.route is not None:
            metrics.ROUTE_JOBS.labels(job.route, job.model, to.value).inc()
            metrics.ROUTE_SECONDS.labels(job.route, job.model).observe(
                (job.updated_at - job.created_at).total_seconds())

