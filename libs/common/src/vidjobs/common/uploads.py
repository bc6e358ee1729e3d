"""Uploaded images (image-to-video input) as every service reads them.

The gateway owns the `uploads` table and writes it; the submitter reads a job's upload to hand its provider a
signed URL. Every read is scoped by account and hides deleted uploads, so another account's upload and a
deleted one look exactly like an upload that never existed.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common.states import SQL_TERMINAL


class UploadRow(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    account_id: str
    key: str  # the stored object: `upload_prefix(account_id, id) + "image.<ext>"`
    content_type: str
    bytes: int
    sha256: str
    width: int
    height: int
    created_at: datetime


_COLUMNS = "id, account_id, key, content_type, bytes, sha256, width, height, created_at"


async def owned(conn: asyncpg.Connection | asyncpg.Pool, account_id: str, upload_id: str) -> UploadRow | None:
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM uploads WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL",
        upload_id, account_id,
    )
    return None if row is None else UploadRow(**dict(row))


async def insert(conn: asyncpg.Connection | asyncpg.Pool, upload: UploadRow) -> None:
    """Record a stored upload (the gateway calls this once its object is in storage)."""
    await conn.execute(
        f"INSERT INTO uploads ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        *msgspec.structs.astuple(upload),
    )


# Today's uploads of an account (UTC), deleted ones included: deleting an upload frees no place in the cap.
_TODAY = """
SELECT count(*) FROM uploads
WHERE account_id = $1 AND created_at >= date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC'
"""


async def count_today(conn: asyncpg.Connection | asyncpg.Pool, account_id: str) -> int:
    count: int = await conn.fetchval(_TODAY, account_id)
    return count


async def insert_capped(conn: asyncpg.Connection, upload: UploadRow, daily_cap: int) -> bool:
    """Record a stored upload unless the account already made `daily_cap` today; False then. Uploads of one
    account are decided one at a time (a transaction-scoped lock), so racing uploads never pass the cap."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(hashtext('uploads:' || $1))", upload.account_id)
        if await count_today(conn, upload.account_id) >= daily_cap:
            return False
        await insert(conn, upload)
        return True


async def expire_unused(conn: asyncpg.Connection | asyncpg.Pool, older_than_s: float, *, limit: int = 500) -> int:
    """Mark uploads older than `older_than_s` deleted, unless a live job still needs its image; returns how
    many. Their objects become orphans, which the media service's sweep removes."""
    status = await conn.execute(
        f"""
        UPDATE uploads SET deleted_at = clock_timestamp()
        WHERE id IN (
            SELECT u.id FROM uploads u
            WHERE u.deleted_at IS NULL AND u.created_at < clock_timestamp() - make_interval(secs => $1)
              AND NOT EXISTS (
                  SELECT 1 FROM jobs j
                  WHERE j.request->>'input_image' = u.id AND j.deleted_at IS NULL
                    AND j.status NOT IN {SQL_TERMINAL})
            ORDER BY u.created_at LIMIT $2
            FOR UPDATE SKIP LOCKED)
        """,
        older_than_s, limit,
    )
    return int(status.split()[-1])
