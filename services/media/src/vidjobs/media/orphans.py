"""The orphan sweep: objects in storage that nothing in PostgreSQL accounts for are removed.

Orphans come from crashes between storing and recording (a copy uploaded, then its job failed or was deleted
before the delete request could run), from lost delete messages, from uploads whose row is gone, and from
the quarantined bytes of uploads no longer processing (decoded, rejected, deleted). An object
younger than `orphan_grace_s` is never touched: a copy may be storing it right now. A live (non-terminal) job's
objects are left alone for the same reason. One replica sweeps at a time (a PostgreSQL advisory lock).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from functools import partial
from typing import TypeAlias

import asyncpg
import msgspec
from asyncpg.pool import PoolConnectionProxy

from vidjobs.common.runtime import Runtime, every
from vidjobs.common.states import JobStatus
from vidjobs.common.uploads import UploadStatus
from vidjobs.storage.base import ObjectInfo, Storage, quarantine_key

log = logging.getLogger("vidjobs.media")

# The one pooled connection a sweep holds: its advisory lock is a session lock, so every step runs on it.
Session: TypeAlias = "asyncpg.Connection | PoolConnectionProxy[asyncpg.Record]"

ROOT = "accounts/"
BATCH = 500
LOCK = "SELECT pg_try_advisory_lock(hashtext('vidjobs.orphan_sweep'))"
UNLOCK = "SELECT pg_advisory_unlock(hashtext('vidjobs.orphan_sweep'))"
# Jobs whose objects must all be gone; completed and expired jobs keep the objects their asset rows name.
_KEEPS_NOTHING = frozenset({JobStatus.FAILED, JobStatus.CANCELED})
_KEEPS_ASSETS = frozenset({JobStatus.COMPLETED, JobStatus.EXPIRED})


class SweepReport(msgspec.Struct, kw_only=True):
    seen: int = 0
    removed: int = 0
    young: int = 0  # inside the grace period
    unrecognised: int = 0  # not a key layout we write; reported, never removed


class ObjectRef(msgspec.Struct, frozen=True):
    kind: str  # jobs | uploads
    owner: str  # the job or upload id
    info: ObjectInfo


def parse(info: ObjectInfo) -> ObjectRef | None:
    """`accounts/{account}/{jobs|uploads}/{id}/{name}` -> its owner; None for any other layout."""
    parts = info.key.split("/")
    if len(parts) < 5 or parts[0] != "accounts" or parts[2] not in ("jobs", "uploads") or not parts[3]:
        return None
    return ObjectRef(kind=parts[2], owner=parts[3], info=info)


async def _job_orphans(conn: Session, refs: list[ObjectRef]) -> list[str]:
    ids = list({r.owner for r in refs})
    rows = await conn.fetch("SELECT id, status, deleted_at FROM jobs WHERE id = ANY($1)", ids)
    jobs = {r["id"]: r for r in rows}
    kept = {r["key"] for r in await conn.fetch(
        "SELECT key FROM assets WHERE job_id = ANY($1) AND deleted_at IS NULL", ids)}
    orphans = []
    for ref in refs:
        job = jobs.get(ref.owner)
        if job is None or job["deleted_at"] is not None:
            orphans.append(ref.info.key)
            continue
        status = JobStatus(job["status"])
        if status in _KEEPS_NOTHING or (status in _KEEPS_ASSETS and ref.info.key not in kept):
            orphans.append(ref.info.key)
    return orphans


async def _upload_orphans(conn: Session, refs: list[ObjectRef]) -> list[str]:
    """A live upload keeps its image, and while it is processing its quarantined bytes (however old: they
    wait for a media worker that may be down); nothing else under its prefix."""
    rows = await conn.fetch("SELECT id, account_id, key, status FROM live_uploads WHERE id = ANY($1)",
                            list({r.owner for r in refs}))
    kept = {r["key"] for r in rows} | {quarantine_key(r["account_id"], r["id"]) for r in rows
                                       if r["status"] == UploadStatus.PROCESSING.value}
    return [r.info.key for r in refs if r.info.key not in kept]


async def _orphans_in(conn: Session, refs: Iterable[ObjectRef]) -> list[str]:
    refs = list(refs)
    jobs = [r for r in refs if r.kind == "jobs"]
    uploads = [r for r in refs if r.kind == "uploads"]
    orphans = await _job_orphans(conn, jobs) if jobs else []
    return orphans + (await _upload_orphans(conn, uploads) if uploads else [])


async def sweep(pool: asyncpg.Pool, storage: Storage, *, grace_s: float) -> SweepReport | None:
    """One pass over every object; None when another replica is sweeping."""
    async with pool.acquire() as conn:
        if not await conn.fetchval(LOCK):
            return None
        try:
            return await _sweep(conn, storage, grace_s)
        finally:
            try:
                await conn.fetchval(UNLOCK)
            except BaseException:
                # A pooled session is not reset on release (db._keep_session): a lock that could not be
                # released goes with its connection, or no replica would sweep again.
                conn.terminate()
                raise


async def _sweep(conn: Session, storage: Storage, grace_s: float) -> SweepReport:
    report, batch = SweepReport(), []
    cutoff = time.time() - grace_s
    async for info in storage.list_prefix(ROOT):
        report.seen += 1
        ref = parse(info)
        if ref is None:
            report.unrecognised += 1
        elif info.modified_at is None or info.modified_at > cutoff:
            report.young += 1
        else:
            batch.append(ref)
        if len(batch) >= BATCH:
            report.removed += await _remove(conn, storage, batch)
            batch = []
    if batch:
        report.removed += await _remove(conn, storage, batch)
    return report


async def _remove(conn: Session, storage: Storage, refs: list[ObjectRef]) -> int:
    orphans = await _orphans_in(conn, refs)
    for key in orphans:
        await storage.delete(key)
        log.info("orphan object removed", extra={"key": key})
    return len(orphans)


async def sweep_once(rt: Runtime, storage: Storage) -> None:
    report = await sweep(rt.pool, storage, grace_s=rt.settings.orphan_grace_s)
    if report is not None:
        log.info("orphan sweep done", extra=msgspec.structs.asdict(report))


async def run(rt: Runtime, storage: Storage) -> None:
    await every(rt, rt.settings.orphan_sweep_interval_s, partial(sweep_once, rt, storage), "orphan sweep")
