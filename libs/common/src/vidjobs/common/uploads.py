"""Uploaded images (image-to-video input) as every service reads them.

The gateway owns the `uploads` table and records each upload as `processing`, with an UploadReceived event in
the same transaction (vidjobs.gateway.intake); the media worker decodes the image and marks it `ready` or
`rejected` (vidjobs.media.quarantine); the submitter reads a job's upload to hand its provider a signed URL;
the reaper rejects uploads left processing and expires unused ones (vidjobs.reaper.retention). The other
services reach the table only through what the gateway keeps for them (migration 0029): the view
`live_uploads`, read here, and one function for each change they make. Every read for a tenant is scoped by
account and hides deleted uploads, so another account's upload and a deleted one look exactly like an upload
that never existed.
"""

from __future__ import annotations

import enum
from datetime import datetime

import asyncpg
import msgspec


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

# An upload row's columns, in UploadRow's order.
COLUMNS = "id, account_id, key, content_type, bytes, sha256, width, height, created_at, status, reason, message"


def _row(record: asyncpg.Record) -> UploadRow:
    return UploadRow(**{**dict(record), "status": UploadStatus(record["status"])})


async def owned(conn: asyncpg.Connection | asyncpg.Pool, account_id: str, upload_id: str) -> UploadRow | None:
    row = await conn.fetchrow(f"SELECT {COLUMNS} FROM live_uploads WHERE id = $1 AND account_id = $2",
                              upload_id, account_id)
    return None if row is None else _row(row)


async def fetch(conn: asyncpg.Connection | asyncpg.Pool, upload_id: str) -> UploadRow | None:
    """Any account's live upload, for the media worker, which acts on the id an event names."""
    row = await conn.fetchrow(f"SELECT {COLUMNS} FROM live_uploads WHERE id = $1", upload_id)
    return None if row is None else _row(row)
