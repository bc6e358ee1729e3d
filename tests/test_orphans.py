"""The orphan sweep on both storage backends: objects nothing in PostgreSQL accounts for are removed;
objects of live jobs, recorded assets, young objects and unknown layouts are left alone."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
import msgspec
import pytest

from tests.s3server import TEST_BUCKET
from vidjobs.common import creation, deletion, ids
from vidjobs.common.jobs import JobRequest
from vidjobs.common.renders import Outputs, StoredFile
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate, transition
from vidjobs.common.uploads import UploadRow, UploadStatus
from vidjobs.gateway import intake
from vidjobs.media import assets, orphans
from vidjobs.storage.base import Storage, job_prefix, quarantine_key, upload_prefix
from vidjobs.storage.filesystem import FileStorage
from vidjobs.storage.s3 import S3Storage

BUCKET = TEST_BUCKET
ACCOUNT = "acct_orphans"


@pytest.fixture(params=["file", "s3"])
async def storage(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Storage]:
    if request.param == "file":
        yield FileStorage(tmp_path / "objects", base_url="http://127.0.0.1:9", secret="s")
        return
    request.getfixturevalue("s3_server")
    s3 = S3Storage(BUCKET, f"sweep-{secrets.token_hex(4)}")
    yield s3
    await s3.close()


async def new_job(conn: asyncpg.Connection) -> str:
    job = await creation.create(conn, account_id=ACCOUNT, estimated_credits=1, recovery_delay_s=600,
                                request=JobRequest(model="fake/default", prompt="a fox", duration_s=1))
    return job.id


async def completed_job(conn: asyncpg.Connection, storage: Storage) -> tuple[str, list[str]]:
    job_id = await new_job(conn)
    prefix = job_prefix(ACCOUNT, job_id)
    video, thumbnail = (StoredFile(key=prefix + name, content_type="application/octet-stream", bytes=1, sha256="x")
                        for name in ("video.mp4", "thumbnail.jpg"))
    await transition(conn, job_id, JobStatus.SUBMITTED, reason="test", update=JobUpdate(provider_job_id="p"))
    await transition(conn, job_id, JobStatus.DOWNLOADING, reason="test", update=JobUpdate(provider_output="http://x"))
    await transition(conn, job_id, JobStatus.COMPLETED, reason="test")
    await assets.upsert(conn, job_id, ACCOUNT, Outputs(video=video, thumbnail=thumbnail))
    return job_id, [video.key, thumbnail.key]


async def upload(conn: asyncpg.Connection, status: UploadStatus) -> str:
    row = UploadRow(id=ids.new("upl"), account_id=ACCOUNT, key="", content_type="image/png", bytes=1,
                    sha256="0" * 64, width=1, height=1, created_at=datetime.now(UTC), status=status)
    row = msgspec.structs.replace(row, key=upload_prefix(ACCOUNT, row.id) + "image.png")
    await intake.insert(conn, row)
    return row.id


async def keys(storage: Storage) -> set[str]:
    return {info.key async for info in storage.list_prefix("accounts/")}


async def test_the_sweep_removes_exactly_the_orphans(pool: asyncpg.Pool, storage: Storage):
    await pool.execute("INSERT INTO accounts (id, name, credits_balance) VALUES ($1, 'o', 100)", ACCOUNT)
    async with pool.acquire() as conn, conn.transaction():
        done, recorded = await completed_job(conn, storage)
        live, canceled, deleted = await new_job(conn), await new_job(conn), await new_job(conn)
        await transition(conn, canceled, JobStatus.CANCELED, reason="test")
        await deletion.soft_delete(conn, deleted, ACCOUNT)
        waiting, ready = await upload(conn, UploadStatus.PROCESSING), await upload(conn, UploadStatus.READY)
    keep = {*recorded, job_prefix(ACCOUNT, live) + "video.mp4", f"accounts/{ACCOUNT}/notes.txt",
            # Bytes waiting for a media worker are kept however old; a ready upload keeps its image.
            quarantine_key(ACCOUNT, waiting), upload_prefix(ACCOUNT, ready) + "image.png"}
    orphaned = {
        job_prefix(ACCOUNT, done) + "video.old.mp4",  # not among the completed job's assets
        job_prefix(ACCOUNT, canceled) + "video.mp4",
        job_prefix(ACCOUNT, deleted) + "thumbnail.jpg",
        job_prefix(ACCOUNT, "job_neverexisted") + "video.mp4",
        upload_prefix(ACCOUNT, "upl_norow") + "image.png",
        quarantine_key(ACCOUNT, ready),  # decoded: a crash kept its raw bytes past their use
    }
    for key in keep | orphaned:
        await storage.put_bytes(key, b"bytes", "application/octet-stream")
    await asyncio.sleep(2.5)  # older than the grace period below (S3 may keep whole seconds only)
    young = job_prefix(ACCOUNT, "job_stillcopying") + "video.mp4"
    await storage.put_bytes(young, b"bytes", "video/mp4")

    report = await orphans.sweep(pool, storage, grace_s=2.0)

    assert report is not None
    assert await keys(storage) == keep | {young}
    assert (report.seen, report.removed, report.young, report.unrecognised) == (
        len(keep | orphaned) + 1, len(orphaned), 1, 1)


async def test_only_one_replica_sweeps_at_a_time(pool: asyncpg.Pool, storage: Storage):
    async with pool.acquire() as other:
        assert await other.fetchval(orphans.LOCK)
        try:
            assert await orphans.sweep(pool, storage, grace_s=0) is None
        finally:
            await other.fetchval(orphans.UNLOCK)
    assert await orphans.sweep(pool, storage, grace_s=0) is not None


class _PausedListing(FileStorage):
    """A real file store whose listing stops until let go, so a sweep can be stopped halfway."""

    def __init__(self, root: Path):
        super().__init__(root, base_url="http://127.0.0.1:9", secret="s")
        self.listing = asyncio.Event()
        self.go_on = asyncio.Event()

    async def list_prefix(self, prefix: str):
        self.listing.set()
        await self.go_on.wait()
        async for info in super().list_prefix(prefix):
            yield info


async def test_a_sweep_stopped_halfway_leaves_the_lock_free(pool: asyncpg.Pool, tmp_path: Path):
    """Pooled sessions are not reset on release (db._keep_session), so the sweep's session lock must never
    go back to the pool held: the next sweep, on whatever connection, takes it."""
    paused = _PausedListing(tmp_path / "objects")
    sweeping = asyncio.create_task(orphans.sweep(pool, paused, grace_s=0))
    await asyncio.wait_for(paused.listing.wait(), 5)
    sweeping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sweeping
    conns = [await pool.acquire() for _ in range(pool.get_max_size())]  # every connection, the sweep's among them
    try:
        held = [await c.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
                for c in conns]
    finally:
        for c in conns:
            await pool.release(c)
    assert held == [0] * len(conns)
    assert await orphans.sweep(pool, FileStorage(tmp_path / "objects", base_url="http://x", secret="s"),
                               grace_s=0) is not None
