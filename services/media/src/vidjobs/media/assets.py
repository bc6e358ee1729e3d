"""The `assets` table (owned by media): one row per stored object of a job, unique per (job, kind). It is the
one record of a render's files (vidjobs.common.renders); reads build a job's outputs from it."""

from __future__ import annotations

from collections.abc import Sequence

import asyncpg

from vidjobs.common.renders import Outputs

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


async def upsert(conn: asyncpg.Connection, job_id: str, account_id: str, outputs: Outputs) -> None:
    """Record a render's stored files; storing the same kind again (a redone upload) replaces the row."""
    await conn.execute(_UPSERT, job_id, account_id, *(list(column) for column in zip(*(
        (kind, f.key, f.content_type, f.bytes, f.sha256, f.width, f.height, f.duration_s)
        for kind, f in outputs.files()
    ), strict=True)))


async def set_deleted_at(
    conn: asyncpg.Connection | asyncpg.Pool, job_id: str, kinds: Sequence[str] | None = None,
) -> int:
    """Set `deleted_at` on a job's asset rows (all, or only `kinds`) that have none yet; returns how many it set."""
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
