"""A finished render's files as we store them, and the one place they are recorded.

The media service writes one `assets` row per file (its table; vidjobs.media.assets). Nothing else holds
them: a job's `outputs` are read from those rows, through the view `job_files` the media service keeps for
its readers (migration 0029), so a redone thumbnail or a retention pass is seen by the next read, and there is
no second copy to fall out of step."""

from __future__ import annotations

import asyncpg
import msgspec


class StoredFile(msgspec.Struct, frozen=True, kw_only=True):
    """One object in our bucket: its key, what it is and what we verified of it."""

    key: str
    content_type: str
    bytes: int
    sha256: str
    width: int | None = None
    height: int | None = None
    duration_s: float | None = None


class Outputs(msgspec.Struct, frozen=True, kw_only=True):
    """What the media service stored for a job; signed URLs are made from the keys at read time."""

    video: StoredFile
    thumbnail: StoredFile
    preview: StoredFile | None = None  # absent on jobs stored before previews existed

    def files(self) -> list[tuple[str, StoredFile]]:
        """(kind, file) for every file stored, as the asset rows name them."""
        found = [("video", self.video), ("thumbnail", self.thumbnail), ("preview", self.preview)]
        return [(kind, file) for kind, file in found if file is not None]


def outputs_sql(job_id: str) -> str:
    """A scalar subquery: the job's files as one jsonb object keyed by kind (decoded by `decode`), or NULL
    until it has both its video and its thumbnail. Served by the assets' unique (job_id, kind) index. Rows of removed
    files stay: an expired job still shows its facts and its thumbnail, and reads decide what to link by the
    job's status."""
    return f"""(SELECT jsonb_object_agg(a.kind, jsonb_build_object(
                    'key', a.key, 'content_type', a.content_type, 'bytes', a.bytes, 'sha256', a.sha256,
                    'width', a.width, 'height', a.height, 'duration_s', a.duration_s))
                FROM job_files a WHERE a.job_id = {job_id}
                HAVING bool_or(a.kind = 'video') AND bool_or(a.kind = 'thumbnail'))"""


def decode(value: dict[str, object] | None) -> Outputs | None:
    """The jsonb `outputs_sql` reads, as Outputs."""
    return None if value is None else msgspec.convert(value, Outputs)


async def read(conn: asyncpg.Connection | asyncpg.Pool, job_id: str) -> Outputs | None:
    """A job's stored files, deleted job or not; None until its render is recorded."""
    return decode(await conn.fetchval(f"SELECT {outputs_sql('$1')}", job_id))
