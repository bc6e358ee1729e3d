"""The `assets` table (owned by media): one row per stored object of a job, unique per (job, kind)."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg
import msgspec


class StoredAsset(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # video | thumbnail | preview
    key: str
    content_type: str
    bytes: int
    sha256: str
    width: int | None = None
    height: int | None = None
    duration_s: float | None = None


# One statement for every row of a job, whatever their number.
_UPSERT = """
    INSERT INTO assets (job_id, account_id, kind, key, content_type, bytes, sha256, width, height, duration_s)
    SELECT $1, $2, * FROM unnest($3::text[], $4::text[], $5::text[], $6::bigint[], $7::text[], $8::integer[],
                                 $9::integer[], $10::float8[])
    ON CONFLICT ON CONSTRAINT assets_one_per_kind DO UPDATE SET
        key = EXCLUDED.key, content_type = EXCLUDED.content_type, bytes = EXCLUDED.bytes,
        sha256 = EXCLUDED.sha256, width = EXCLUDED.width, height = EXCLUDED.height,
        duration_s = EXCLUDED.duration_s, deleted_at = NULL
"""


async def upsert(conn: asyncpg.Connection, job_id: str, account_id: str, items: Sequence[StoredAsset]) -> None:
    """Record stored objects; storing the same kind again (a redone upload) replaces the row."""
    if not items:
        return
    await conn.execute(_UPSERT, job_id, account_id, *(list(column) for column in zip(*(
        (a.kind, a.key, a.content_type, a.bytes, a.sha256, a.width, a.height, a.duration_s) for a in items
    ), strict=True)))


async def mark_deleted(
    conn: asyncpg.Connection | asyncpg.Pool, job_id: str, kinds: Sequence[str] | None = None,
) -> int:
    """Mark a job's asset rows (all, or only `kinds`) deleted, once; returns how many were marked now."""
    status = await conn.execute(
        """
        UPDATE assets SET deleted_at = clock_timestamp()
        WHERE job_id = $1 AND deleted_at IS NULL AND ($2::text[] IS NULL OR kind = ANY($2))
        """,
        job_id, None if kinds is None else list(kinds),
    )
    return int(status.split()[-1])


async def live_keys(conn: asyncpg.Connection | asyncpg.Pool, job_id: str, kinds: Sequence[str]) -> list[str]:
    rows = await conn.fetch(
        "SELECT key FROM assets WHERE job_id = $1 AND deleted_at IS NULL AND kind = ANY($2)", job_id, list(kinds),
    )
    return [r["key"] for r in rows]
