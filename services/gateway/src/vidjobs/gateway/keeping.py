"""Keeping a ready job's clip past retention, and the account's storage quota that kept clips count against.

A kept job is passed over by the reaper's retention sweep (its `kept_at` is set) until its owner releases it;
released, its window counts from `completed_at` again and its app is warned anew before it goes. What kept
clips hold is the bytes of their stored videos, against the account's `storage_quota_bytes`, or the
platform's VIDJOBS_STORAGE_QUOTA_BYTES. Keeps of one account are decided one at a time (an advisory lock of
the account's), so two at once cannot both fit in the room left for one.
"""

from __future__ import annotations

import asyncpg
import msgspec

from vidjobs.common.states import JobStatus, sql

Conn = asyncpg.Connection | asyncpg.Pool


class StorageUse(msgspec.Struct, frozen=True, kw_only=True):
    used_bytes: int  # held by the account's kept clips
    limit_bytes: int  # the most they may hold
    kept_jobs: int


class NotKeepable(Exception):
    """Only a ready (completed) job's clip can be kept; `status` is the job's."""

    def __init__(self, status: JobStatus):
        super().__init__(status.value)
        self.status = status


class OverQuota(Exception):
    def __init__(self, use: StorageUse, adding: int):
        super().__init__(f"{use.used_bytes} + {adding} > {use.limit_bytes}")
        self.use = use
        self.adding = adding


_USE = """
SELECT COALESCE(sum(a.bytes), 0)::bigint AS used_bytes, count(*) AS kept_jobs,
       (SELECT COALESCE(storage_quota_bytes, $2) FROM accounts WHERE id = $1) AS limit_bytes
FROM jobs j JOIN job_files a ON a.job_id = j.id AND a.kind = 'video' AND a.deleted_at IS NULL
WHERE j.account_id = $1 AND j.kept_at IS NOT NULL AND j.deleted_at IS NULL
"""

_CANDIDATE = """
SELECT j.status, j.kept_at,
       (SELECT a.bytes FROM job_files a WHERE a.job_id = j.id AND a.kind = 'video' AND a.deleted_at IS NULL) AS bytes
FROM jobs j WHERE j.id = $1 AND j.account_id = $2 AND j.deleted_at IS NULL
"""

_KEEP = f"""
UPDATE jobs SET kept_at = clock_timestamp(), updated_at = clock_timestamp()
WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL AND status = {sql(JobStatus.COMPLETED)} AND kept_at IS NULL
"""

# Released: its window counts from completed_at again, and its app is told again before it goes.
_RELEASE = """
UPDATE jobs SET kept_at = NULL, expiry_warned_at = NULL, updated_at = clock_timestamp()
WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL AND kept_at IS NOT NULL
"""


async def storage_use(conn: Conn, account_id: str, default_limit: int) -> StorageUse:
    row = await conn.fetchrow(_USE, account_id, default_limit)
    assert row is not None, "an aggregate answers one row"
    return StorageUse(used_bytes=row["used_bytes"], limit_bytes=row["limit_bytes"] or 0, kept_jobs=row["kept_jobs"])


async def keep(conn: asyncpg.Connection, account_id: str, job_id: str, default_limit: int) -> bool:
    """Keep the job's clip; False if the account has no such job. Raises NotKeepable, OverQuota. Call in a
    transaction: the account's lock is held until it ends."""
    await conn.execute("SELECT pg_advisory_xact_lock(hashtext('keep:' || $1))", account_id)
    found = await conn.fetchrow(_CANDIDATE, job_id, account_id)
    if found is None:
        return False
    if found["kept_at"] is not None:
        return True  # kept already: keeping again changes nothing
    status = JobStatus(found["status"])
    if status is not JobStatus.COMPLETED or found["bytes"] is None:
        raise NotKeepable(status)
    use = await storage_use(conn, account_id, default_limit)
    if use.used_bytes + found["bytes"] > use.limit_bytes:
        raise OverQuota(use, found["bytes"])
    if await conn.execute(_KEEP, job_id, account_id) == "UPDATE 0":
        # It expired (the reaper holds the row until its move commits) between the read and the write.
        raise NotKeepable(JobStatus.EXPIRED)
    return True


async def release(conn: Conn, account_id: str, job_id: str) -> None:
    """Stop keeping the job's clip; a job not kept is left as it is."""
    await conn.execute(_RELEASE, job_id, account_id)
