"""Retention: a completed job's original is kept `VIDJOBS_RETENTION_DAYS`, then the job becomes `expired`.

The reaper owns the status change; the media service removes the objects when the outbox's
`AssetsDeleteRequested` reaches it (the video and its preview; the thumbnail stays while the job exists).
Uploads left processing past `upload_processing_deadline_s` are rejected. Uploads past retention are marked
deleted too, unless a live job still needs the image; the orphan sweep then removes their objects. Rows are
claimed with SKIP LOCKED, so several reapers can sweep at once without expiring a job twice, and the guarded
transition makes a second attempt a no-op anyway.
"""

from __future__ import annotations

import logging
from functools import partial

from vidjobs.common import uploads
from vidjobs.common.events import AssetsDeleteRequested
from vidjobs.common.runtime import Runtime, every
from vidjobs.common.states import JobStatus, sql
from vidjobs.common.transitions import transition

log = logging.getLogger("vidjobs.reaper")

BATCH = 200

_DUE = f"""
    SELECT id FROM jobs
    WHERE status = {sql(JobStatus.COMPLETED)} AND deleted_at IS NULL
      AND updated_at < clock_timestamp() - make_interval(secs => $1)
    ORDER BY updated_at LIMIT $2
    FOR UPDATE SKIP LOCKED
"""


async def expire_due(rt: Runtime, *, limit: int = BATCH) -> int:
    """Expire one batch of jobs past retention; returns how many moved."""
    days = rt.settings.retention_days
    reason = f"retention: the original was kept {days:g} days"
    expired = 0
    async with rt.tx() as conn:
        for row in await conn.fetch(_DUE, days * 86400.0, limit):
            done = await transition(conn, row["id"], JobStatus.EXPIRED, reason=reason, expect=[JobStatus.COMPLETED],
                                    emit=[AssetsDeleteRequested(job_id=row["id"])])
            expired += done is not None
    if expired:
        log.info("jobs expired past retention", extra={"count": expired, "retention_days": days})
    return expired


async def expire_uploads(rt: Runtime) -> int:
    """Uploads are kept as long as originals, and longer while a live job still needs the image."""
    count = await uploads.expire_unused(rt.pool, rt.settings.retention_days * 86400.0)
    if count:
        log.info("uploads expired past retention", extra={"count": count})
    return count


async def reject_unprocessed_uploads(rt: Runtime) -> int:
    """Uploads still processing past their deadline are rejected rather than left waiting for ever; the
    orphan sweep then removes their quarantined bytes."""
    count = await uploads.reject_unprocessed(rt.pool, rt.settings.upload_processing_deadline_s)
    if count:
        log.warning("uploads rejected: not processed in time", extra={
            "count": count, "deadline_s": rt.settings.upload_processing_deadline_s})
    return count


async def sweep_once(rt: Runtime) -> None:
    while await expire_due(rt) == BATCH:
        pass  # a backlog (say, after downtime): keep going until it is worked off
    await expire_uploads(rt)
    await reject_unprocessed_uploads(rt)


async def run(rt: Runtime) -> None:
    await every(rt, rt.settings.retention_sweep_interval_s, partial(sweep_once, rt), "retention sweep")
