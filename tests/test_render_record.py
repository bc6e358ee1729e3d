"""A finished render has one record: the media service's asset rows. Every read of a job builds its `outputs`
from them, and upgrading a database that kept a second copy on the job row loses no finished job's files."""

from __future__ import annotations

import secrets

import asyncpg
import pytest

from tests.gateway_harness import completed_job, drive, gateway_settings, running_gateway
from vidjobs.common import creation, db
from vidjobs.common.jobs import JobRequest
from vidjobs.common.states import JobStatus


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def _record(pool: asyncpg.Pool, job_id: str, account_id: str, kind: str, key: str, body: bytes,
                  content_type: str, width: int, height: int, duration_s: float | None = None) -> None:
    """An asset row written as the media service writes one: one per (job, kind), a redo replaces it."""
    await pool.execute(
        """
        INSERT INTO assets (job_id, account_id, kind, key, content_type, bytes, sha256, width, height, duration_s)
        VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
        ON CONFLICT ON CONSTRAINT assets_one_per_kind DO UPDATE SET key = EXCLUDED.key, bytes = EXCLUDED.bytes,
            sha256 = EXCLUDED.sha256, width = EXCLUDED.width, height = EXCLUDED.height
        """,
        job_id, account_id, kind, key, content_type, len(body), secrets.token_hex(32), width, height, duration_s,
    )


async def test_a_read_shows_the_files_media_recorded_and_follows_a_redone_thumbnail(h):
    account_id, key = await h.account()
    async with h.pool.acquire() as conn, conn.transaction():
        job = await creation.create(conn, account_id=account_id, estimated_credits=10, recovery_delay_s=3600,
                                    request=JobRequest(model="fake/default", prompt="one record"))
    prefix = f"accounts/{account_id}/jobs/{job.id}/"
    video, thumb, redone = b"\x00\x00\x00\x18ftypmp42" + bytes(2048), b"\xff\xd8first", b"\xff\xd8second!"
    await h.gw.storage.put_bytes(prefix + "video.mp4", video, "video/mp4")
    await h.gw.storage.put_bytes(prefix + "thumb.jpg", thumb, "image/jpeg")
    await drive(h.pool, job.id, JobStatus.SUBMITTED, JobStatus.DOWNLOADING, JobStatus.COMPLETED)
    await _record(h.pool, job.id, account_id, "video", prefix + "video.mp4", video, "video/mp4", 1280, 720, 2.5)
    await _record(h.pool, job.id, account_id, "thumbnail", prefix + "thumb.jpg", thumb, "image/jpeg", 320, 180)

    status, body = await h.get(key, f"/v1/jobs/{job.id}")
    assert status == 200, body
    out = body["outputs"]
    assert out is not None, "a completed job with its asset rows shows its outputs"
    assert (out["width"], out["height"], out["duration_s"], out["bytes"]) == (1280, 720, 2.5, len(video))
    assert (out["thumbnail_width"], out["thumbnail_height"], out["preview_url"]) == (320, 180, None)
    async with h.client.session.get(out["thumbnail_url"]) as resp:
        assert await resp.read() == thumb

    # The media service redoes the thumbnail under a new name: the very next read serves the new one.
    await h.gw.storage.put_bytes(prefix + "thumb2.jpg", redone, "image/jpeg")
    await _record(h.pool, job.id, account_id, "thumbnail", prefix + "thumb2.jpg", redone, "image/jpeg", 640, 360)
    _, listed = await h.get(key, "/v1/jobs")
    [shown] = [j for j in listed["data"] if j["id"] == job.id]
    assert (shown["outputs"]["thumbnail_width"], shown["outputs"]["thumbnail_height"]) == (640, 360)
    async with h.client.session.get(shown["outputs"]["thumbnail_url"]) as resp:
        assert await resp.read() == redone


async def test_the_job_row_keeps_no_second_copy(h):
    account_id, _ = await h.account()
    await completed_job(h, account_id)
    columns = {r["column_name"] for r in await h.pool.fetch(
        "SELECT column_name FROM information_schema.columns WHERE table_name = 'jobs'")}
    assert "outputs" not in columns


# A job finished before the asset rows were the one record: its outputs on the row, as the media service wrote
# them (the preview's sizes absent, as on jobs stored before previews existed).
_OLD_OUTPUTS = {"video_key": "accounts/a_old/jobs/{job}/video.mp4", "thumbnail_key": "accounts/a_old/jobs/{job}/t.jpg",
                "preview_key": None, "duration_s": 4.0, "width": 640, "height": 360, "bytes": 9999,
                "sha256": "ab" * 32, "thumbnail_width": 160, "thumbnail_height": 90}


async def _old_job(conn: asyncpg.Connection, job_id: str, status: str, outputs: dict | None) -> None:
    await conn.execute(
        """
        INSERT INTO jobs (id, account_id, status, model, provider, request, estimated_credits, outputs)
        VALUES ($1, 'a_old', $2, 'fake/default', 'fake', '{"model": "fake/default", "prompt": "old"}', 5, $3)
        """,
        job_id, status, None if outputs is None else {k: (v.format(job=job_id) if isinstance(v, str) else v)
                                                      for k, v in outputs.items()},
    )


async def test_upgrading_moves_outputs_kept_only_on_the_job_row_into_asset_rows(empty_database_url):
    conn = await asyncpg.connect(empty_database_url)
    await db.init_connection(conn)
    try:
        # The schema as it stood before the change, holding one job of each kind an upgrade meets.
        await db._apply_pending(conn, [m for m in db._migration_files() if m[0] <= 12])
        await conn.execute("INSERT INTO accounts (id, name, credits_balance) VALUES ('a_old', 'old', 100)")
        await _old_job(conn, "job_rowonly", "completed", _OLD_OUTPUTS)  # outputs on the row alone
        await _old_job(conn, "job_expired", "expired", _OLD_OUTPUTS)
        await _old_job(conn, "job_both", "completed", _OLD_OUTPUTS)  # also has its rows, as media wrote them
        await conn.execute(
            """INSERT INTO assets (job_id, account_id, kind, key, content_type, bytes, sha256, width, height,
                                   duration_s)
               VALUES ('job_both', 'a_old', 'video', 'accounts/a_old/jobs/job_both/video.mp4', 'video/mp4', 9999,
                       $1, 640, 360, 4.0),
                      ('job_both', 'a_old', 'thumbnail', 'accounts/a_old/jobs/job_both/t.jpg', 'image/jpeg', 77,
                       'cd', 160, 90, NULL)""", "ab" * 32)
        await _old_job(conn, "job_pending", "pending", None)

        applied = await db.migrate(empty_database_url)
        assert applied and all(int(name[:4]) > 12 for name in applied)

        rows = await conn.fetch("SELECT job_id, kind, key, bytes, sha256, width, height, duration_s, content_type "
                                "FROM assets ORDER BY job_id, kind")
        got = {(r["job_id"], r["kind"]): r for r in rows}
        assert set(got) == {(j, k) for j in ("job_rowonly", "job_expired", "job_both") for k in ("thumbnail", "video")}
        for job_id in ("job_rowonly", "job_expired"):
            video, thumb = got[(job_id, "video")], got[(job_id, "thumbnail")]
            assert (video["key"], video["bytes"], video["sha256"], video["width"], video["height"],
                    video["duration_s"], video["content_type"]) == (
                f"accounts/a_old/jobs/{job_id}/video.mp4", 9999, "ab" * 32, 640, 360, 4.0, "video/mp4")
            assert (thumb["key"], thumb["width"], thumb["height"], thumb["content_type"]) == (
                f"accounts/a_old/jobs/{job_id}/t.jpg", 160, 90, "image/jpeg")
        assert got[("job_both", "thumbnail")]["bytes"] == 77, "rows media wrote are kept as they are"
        assert await conn.fetchval("SELECT count(*) FROM information_schema.columns "
                                   "WHERE table_name = 'jobs' AND column_name = 'outputs'") == 0
    finally:
        await conn.close()
