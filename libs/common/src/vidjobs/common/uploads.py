"""Uploaded images (image-to-video input) as every service reads them.

The gateway owns the `uploads` table and records each upload as `processing`, with an UploadReceived event in
the same transaction; the media worker decodes the image and marks it `ready` or `rejected`; the submitter
reads a job's upload to hand its provider a signed URL. Every read for a tenant is scoped by account and
hides deleted uploads, so another account's upload and a deleted one look exactly like an upload that never
existed.
"""

from __future__ import annotations

import enum
from datetime import datetime

import asyncpg
import msgspec

from vidjobs.common import outbox
from vidjobs.common.events import UploadReceived
from vidjobs.common.states import SQL_TERMINAL


class UploadStatus(enum.StrEnum):
    PROCESSING = "processing"  # stored in quarantine; the media worker has not decoded it yet
    READY = "ready"  # decoded, cleaned and stored under its key: a job may name it
    REJECTED = "rejected"  # the media worker refused it; `reason` and `message` say why


class UploadRow(msgspec.Struct, kw_only=True, frozen=True):
    id: str
    account_id: str
    # The cleaned image: `upload_prefix(account_id, id) + "image.<ext>"`. Named from the start; the object
    # exists once the upload is ready (the raw bytes wait under `quarantine_key` until then).
    key: str
    content_type: str
    # While processing: what was received and what its header declares. Once ready: the cleaned image's.
    bytes: int
    sha256: str
    width: int
    height: int
    created_at: datetime
    status: UploadStatus = UploadStatus.READY
    reason: str | None = None  # why it was rejected: an imageheaders.Refusal value, or REASON_UNPROCESSED
    message: str | None = None  # the same, in words

    @property
    def ready(self) -> bool:
        return self.status is UploadStatus.READY


# A rejection of an upload that could not be processed at all (its message kept failing).
REASON_UNPROCESSED = "image_unprocessed"

_COLUMNS = "id, account_id, key, content_type, bytes, sha256, width, height, created_at, status, reason, message"


def _row(record: asyncpg.Record) -> UploadRow:
    return UploadRow(**{**dict(record), "status": UploadStatus(record["status"])})


async def owned(conn: asyncpg.Connection | asyncpg.Pool, account_id: str, upload_id: str) -> UploadRow | None:
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM uploads WHERE id = $1 AND account_id = $2 AND deleted_at IS NULL",
        upload_id, account_id,
    )
    return None if row is None else _row(row)


async def fetch(conn: asyncpg.Connection | asyncpg.Pool, upload_id: str) -> UploadRow | None:
    """Any account's live upload, for the media worker, which acts on the id an event names."""
    row = await conn.fetchrow(f"SELECT {_COLUMNS} FROM uploads WHERE id = $1 AND deleted_at IS NULL", upload_id)
    return None if row is None else _row(row)


async def insert(conn: asyncpg.Connection, upload: UploadRow) -> None:
    """Record a stored upload (the gateway calls this once its bytes are in storage); one still processing
    asks the media worker to decode it, in the same transaction."""
    await conn.execute(
        f"INSERT INTO uploads ({_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        *msgspec.structs.astuple(upload),
    )
    if upload.status is UploadStatus.PROCESSING:
        await outbox.add(conn, [UploadReceived(upload_id=upload.id)])


class Cleaned(msgspec.Struct, kw_only=True, frozen=True):
    """What the media worker stored under an upload's key."""

    bytes: int
    sha256: str
    width: int
    height: int


async def mark_ready(conn: asyncpg.Connection | asyncpg.Pool, upload_id: str, cleaned: Cleaned) -> bool:
    """The processing upload is ready, described by its cleaned image; False when it was not processing (a
    duplicate delivery finished it already, or it was deleted)."""
    status = await conn.execute(
        "UPDATE uploads SET status = $2, bytes = $3, sha256 = $4, width = $5, height = $6 "
        "WHERE id = $1 AND status = $7 AND deleted_at IS NULL",
        upload_id, UploadStatus.READY.value, cleaned.bytes, cleaned.sha256, cleaned.width, cleaned.height,
        UploadStatus.PROCESSING.value,
    )
    return status.split()[-1] == "1"


async def mark_rejected(conn: asyncpg.Connection | asyncpg.Pool, upload_id: str, reason: str, message: str) -> bool:
    """The processing upload is rejected; False when it was not processing."""
    status = await conn.execute(
        "UPDATE uploads SET status = $2, reason = $3, message = $4 WHERE id = $1 AND status = $5",
        upload_id, UploadStatus.REJECTED.value, reason, message[:500], UploadStatus.PROCESSING.value,
    )
    return status.split()[-1] == "1"


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


async def reject_unprocessed(conn: asyncpg.Connection | asyncpg.Pool, older_than_s: float, *,
                             limit: int = 500) -> int:
    """Reject uploads still processing `older_than_s` after they were made (their message was lost, or the
    media worker has been down that long); returns how many. Their quarantined bytes become orphans, which
    the media service's sweep removes."""
    status = await conn.execute(
        """
        UPDATE uploads SET status = $2, reason = $3, message = $4
        WHERE id IN (
            SELECT id FROM uploads
            WHERE status = $1 AND deleted_at IS NULL
              AND created_at < clock_timestamp() - make_interval(secs => $5)
            ORDER BY created_at LIMIT $6
            FOR UPDATE SKIP LOCKED)
          AND status = $1
        """,
        UploadStatus.PROCESSING.value, UploadStatus.REJECTED.value, REASON_UNPROCESSED,
        "the image was not processed in time; upload it again", older_than_s, limit,
    )
    return int(status.split()[-1])


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
