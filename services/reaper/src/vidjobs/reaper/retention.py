"""Retention: a completed job's original is kept `VIDJOBS_RETENTION_DAYS` from when it completed, then the job
becomes `expired`; a kept job (POST /v1/jobs/{id}/keep) is passed over until its owner releases it.

`VIDJOBS_EXPIRY_WARNING_DAYS` before that, its account's app hears `job.expiring`, once per window (the
moment is recorded on the job, with the event in the outbox, in one transaction). A clip is never removed
sooner than the warning's lead after its warning, so a job released from keeping long after its window ran
out is still told before it goes. The reaper owns the status change; the media service removes the objects
when the outbox's `AssetsDeleteRequested` reaches it (the video and its preview; the thumbnail stays while
the job exists). Uploads left processing past `upload_processing_deadline_s` are rejected. Uploads past
retention are marked deleted too, unless a live job still needs the image; the orphan sweep then removes
their objects. Rows are claimed with SKIP LOCKED, so several reapers can sweep at once without warning of or
expiring a job twice, and the guarded transition makes a second attempt a no-op anyway.
"""

from __future__ import annotations

import logging
from functools import partial

from vidjobs.common import outbox
from vidjobs.common.events import AppEventDue, AssetsDeleteRequested
from vidjobs.common.expiry import DAY_S, warning_lead_s
from vidjobs.common.runtime import Runtime, every
from vidjobs.common.states import EXPIRING_EVENT, JobStatus, sql
from vidjobs.common.transitions import APPS_LISTEN, transition

log = logging.getLogger("vidjobs.reaper")

BATCH = 200
UPLOADS_BATCH = 500  # uploads expired or rejected in one statement

# Served by jobs_retention_from_completed (completed, not deleted, not kept; by completed_at).
_LIVE = f"status = {sql(JobStatus.COMPLETED)} AND deleted_at IS NULL AND kept_at IS NULL"

_WARN = f"""
    WITH due AS (
        SELECT id FROM jobs
        WHERE {_LIVE} AND expiry_warned_at IS NULL
          AND completed_at < clock_timestamp() - make_interval(secs => $1)
        ORDER BY completed_at LIMIT $2
        FOR UPDATE SKIP LOCKED
    )
    UPDATE jobs AS j SET expiry_warned_at = clock_timestamp() FROM due WHERE j.id = due.id
    RETURNING j.id, j.expiry_warned_at, {APPS_LISTEN} AS apps_listen
"""

# $3: warnings are off. Otherwise a job is removed only once its warning has had its lead.
_DUE = f"""
    SELECT id FROM jobs
    WHERE {_LIVE} AND completed_at < clock_timestamp() - make_interval(secs => $1)
      AND ($3 OR expiry_warned_at < clock_timestamp() - make_interval(secs => $4))
    ORDER BY completed_at LIMIT $2
    FOR UPDATE SKIP LOCKED
"""


async def warn_due(rt: Runtime, *, limit: int = BATCH) -> int:
    """Tell the apps of one batch of jobs whose removal is now within the warning's lead; returns how many."""
    lead_s = warning_lead_s(rt.settings)
    if lead_s <= 0:
        return 0
    async with rt.tx() as conn:
        rows = await conn.fetch(_WARN, rt.settings.retention_days * DAY_S - lead_s, limit)
        # The key names this window: a job released from keeping and warned again is told again.
        await outbox.add(conn, [
            AppEventDue(job_id=r["id"], types=[EXPIRING_EVENT], key=f"{r['id']}:expiring:"
                                                                   f"{r['expiry_warned_at'].timestamp():.6f}")
            for r in rows if r["apps_listen"]])
    for r in rows:
        log.info("job's clip is expiring; its app is told", extra={"job_id": r["id"], "told": r["apps_listen"]})
    return len(rows)


async def expire_due(rt: Runtime, *, limit: int = BATCH) -> int:
    """Expire one batch of jobs past retention; returns how many moved."""
    days = rt.settings.retention_days
    lead_s = warning_lead_s(rt.settings)
    reason = f"retention: the original was kept {days:g} days"
    expired = 0
    async with rt.tx() as conn:
        for row in await conn.fetch(_DUE, days * DAY_S, limit, lead_s <= 0, lead_s):
            done = await transition(conn, row["id"], JobStatus.EXPIRED, reason=reason, expect=[JobStatus.COMPLETED],
                                    emit=[AssetsDeleteRequested(job_id=row["id"])])
            expired += done is not None
    if expired:
        log.info("jobs expired past retention", extra={"count": expired, "retention_days": days})
    return expired


async def expire_uploads(rt: Runtime) -> int:
    """Uploads are kept as long as originals, and longer while a live job still needs the image."""
    # Through the gateway's function (the table is its own); their objects become orphans, which the media
    # service's sweep removes.
    count: int = await rt.pool.fetchval("SELECT expire_unused_uploads($1, $2)", rt.settings.retention_days * DAY_S,
                                        UPLOADS_BATCH)
    if count:
        log.info("uploads expired past retention", extra={"count": count})
    return count


async def reject_unprocessed_uploads(rt: Runtime) -> int:
    """Uploads still processing past their deadline are rejected rather than left waiting for ever; the
    orphan sweep then removes their quarantined bytes."""
    count: int = await rt.pool.fetchval("SELECT reject_unprocessed_uploads($1, $2)",
                                        rt.settings.upload_processing_deadline_s, UPLOADS_BATCH)
    if count:
        log.warning("uploads rejected: not processed in time", extra={
            "count": count, "deadline_s": rt.settings.upload_processing_deadline_s})
    return count


async def sweep_once(rt: Runtime) -> None:
    # A backlog (say, after downtime) is worked off batch by batch; warnings first, so a job due for both
    # is told before it goes (it then waits out the warning's lead).
    while await warn_due(rt) == BATCH:
        pass
    while await expire_due(rt) == BATCH:
        pass
    await expire_uploads(rt)
    await reject_unprocessed_uploads(rt)


async def run(rt: Runtime) -> None:
    await every(rt, rt.settings.retention_sweep_interval_s, partial(sweep_once, rt), "retention sweep")
