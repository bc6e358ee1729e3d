"""Retention through the real stack: a completed job's original is removed after `VIDJOBS_RETENTION_DAYS`
(here a few seconds), the job moves to `expired` and keeps its thumbnail; deleting it removes the rest."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import pytest

from tests import imagefiles
from tests.stack import assert_legal_trail, running_stack, stack_settings
from tests.support import wait_until

RETENTION_S = 4.0


@pytest.fixture
def settings(tmp_path, database_url, nats_url):
    # No warning before removal here (tests/test_keep.py has it): the window is exactly the retention.
    return stack_settings(tmp_path, database_url, nats_url, retention_days=RETENTION_S / 86400,
                          retention_sweep_interval_s=0.5, expiry_warning_days=0)


async def test_a_completed_job_expires_keeping_its_thumbnail_until_deleted(settings):
    async with running_stack(settings) as stack:
        created = await stack.create_job(params={"render_s": 0.2})
        done = await stack.wait_for_status(created["id"], "completed", within=60)
        out = done["outputs"]
        retained_until = datetime.fromisoformat(out["retained_until"])
        assert retained_until - datetime.fromisoformat(done["completed_at"]) == timedelta(seconds=RETENTION_S)
        for url in (out["video_url"], out["preview_url"], out["thumbnail_url"]):
            assert (await stack.download(url))[0] == 200

        expired = await stack.wait_for_status(created["id"], "expired", within=30)

        assert expired["stage"] == "expired" and expired["error"] is None
        assert expired["cost"] == done["cost"]  # expiry is not a second settlement
        kept = expired["outputs"]
        assert kept["video_url"] is None and kept["preview_url"] is None
        assert (kept["sha256"], kept["bytes"]) == (out["sha256"], out["bytes"])  # the facts stay on record
        assert (await stack.download(kept["thumbnail_url"]))[0] == 200
        # The links handed out while it was completed are still signed, but the objects are gone.
        await wait_until(lambda: _gone(stack, out["video_url"]), within=15, what="the original to be removed")
        assert (await stack.download(out["preview_url"]))[0] == 404
        trail = await stack.trail(created["id"])
        assert_legal_trail(trail)
        assert trail[-1]["from"] == "completed" and trail[-1]["to"] == "expired"
        assert trail[-1]["reason"].startswith("retention")

        async with stack.session.delete(f"{stack.url}/v1/jobs/{created['id']}", headers=stack.auth) as resp:
            assert resp.status == 204
        await wait_until(lambda: _gone(stack, kept["thumbnail_url"]), within=15, what="the thumbnail to be removed")
        objects = Path(urlsplit(settings.storage_url).path)
        assert objects.is_dir()
        assert not [p for p in objects.rglob("*") if created["id"] in str(p) and p.is_file()]


async def _gone(stack, url: str) -> bool:
    return (await stack.download(url))[0] == 404


@pytest.fixture
def sweeping(tmp_path, database_url, nats_url):
    # The orphan sweep runs every second here; its grace still covers an upload between store and record.
    return stack_settings(tmp_path, database_url, nats_url, retention_days=RETENTION_S / 86400,
                          retention_sweep_interval_s=0.5, orphan_sweep_interval_s=1.0, orphan_grace_s=2.0)


async def test_an_upload_expires_once_no_live_job_needs_it_and_its_object_is_swept(sweeping):
    async with running_stack(sweeping) as stack:
        upload_id = (await stack.ready_upload(imagefiles.png_with_text()))["id"]
        # A job that needs the image keeps it alive past retention until the job is over.
        held = await stack.create_job(input_image=upload_id, params={"scenario": "hang"})
        await asyncio.sleep(RETENTION_S + 1.5)
        assert await _upload_state(sweeping, upload_id) == (False, True)
        async with stack.session.post(f"{stack.url}/v1/jobs/{held['id']}/cancel", headers=stack.auth) as resp:
            assert resp.status == 200

        await wait_until(lambda: _swept(sweeping, upload_id), within=30, what="the upload to expire and be swept")

        async with stack.session.post(f"{stack.url}/v1/jobs", headers=stack.auth, json={
            "model": "fake/default", "prompt": "again", "duration_s": 1, "input_image": upload_id,
        }) as resp:
            body = await resp.json()
            assert resp.status == 422 and body["error"]["code"] == "invalid_input", body


async def _upload_state(settings, upload_id: str) -> tuple[bool, bool]:
    """(deleted in the database, object still in storage)."""
    conn = await asyncpg.connect(settings.database_url)
    try:
        row = await conn.fetchrow("SELECT key, deleted_at FROM uploads WHERE id = $1", upload_id)
    finally:
        await conn.close()
    root = Path(urlsplit(settings.storage_url).path)
    return row["deleted_at"] is not None, (root / row["key"]).exists()


async def _swept(settings, upload_id: str) -> bool:
    return await _upload_state(settings, upload_id) == (True, False)
