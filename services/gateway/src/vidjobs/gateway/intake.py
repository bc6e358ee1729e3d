"""Taking an upload in: its row in `uploads` (the gateway's table), recorded under the account's daily cap,
with the message that has the media worker decode it. What other services read of uploads and change in
them goes through vidjobs.common.uploads."""

from __future__ import annotations

import asyncpg
import msgspec

from vidjobs.common import outbox
from vidjobs.common.events import UploadReceived
from vidjobs.common.uploads import COLUMNS, UploadRow, UploadStatus


async def insert(conn: asyncpg.Connection, upload: UploadRow) -> None:
    """Record a stored upload (the gateway calls this once its bytes are in storage); one still processing
    asks the media worker to decode it, in the same transaction."""
    await conn.execute(
        f"INSERT INTO uploads ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        *msgspec.structs.astuple(upload),
    )
    if upload.status is UploadStatus.PROCESSING:
        await outbox.add(conn, [UploadReceived(upload_id=upload.id)])


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
