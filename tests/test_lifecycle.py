"""A render job's whole path through the real stack: every service its own process, real NATS JetStream,
real PostgreSQL, the filesystem backend and the fake provider over HTTP."""

from __future__ import annotations

import asyncio
import hashlib
import io

import pytest
from PIL import Image

from tests.stack import assert_legal_trail, running_stack, stack_settings
from tests.support import wait_until
from vidjobs.common import events
from vidjobs.common.events import DownloadRequested, JobQueued, PollRequested, RecoveryDue
from vidjobs.common.states import JobStatus


@pytest.fixture
def settings(tmp_path, database_url, nats_url):
    return stack_settings(tmp_path, database_url, nats_url)


async def test_job_completes_and_its_video_downloads_intact(settings):
    async with running_stack(settings) as stack:
        created = await stack.create_job(params={"render_s": 0.5}, aspect_ratio="16:9")
        assert created["status"] == "pending" and created["stage"] == "queued"

        job = await stack.wait_terminal(created["id"])

        assert job["status"] == "completed" and job["stage"] == "ready", job
        out = job["outputs"]
        status, body, headers = await stack.download(out["video_url"])
        assert status == 200
        assert len(body) == out["bytes"] and hashlib.sha256(body).hexdigest() == out["sha256"]
        assert body[4:8] == b"ftyp"  # an MP4 container
        status, thumb, _ = await stack.download(out["thumbnail_url"])
        assert status == 200
        image = Image.open(io.BytesIO(thumb))
        assert image.format == "JPEG" and image.size[0] > 0
        assert out["width"] > out["height"]  # 16:9 as asked
        trail = await stack.trail(job["id"])
        assert_legal_trail(trail)
        assert [m["to"] for m in trail][-2:] == ["downloading", "completed"]
        assert (await stack.counters())["renders_by_job"].get(job["id"]) == 1


async def test_duplicate_callbacks_move_the_job_once(settings):
    async with running_stack(settings) as stack:
        created = await stack.create_job(params={"scenario": "duplicate_callbacks", "render_s": 0.2})
        job = await stack.wait_terminal(created["id"])
        assert job["status"] == "completed", job
        trail = await stack.trail(job["id"])
        assert_legal_trail(trail)
        targets = [m["to"] for m in trail]
        assert len(targets) == len(set(targets)), f"a status was entered twice: {targets}"
        assert targets.count("downloading") == 1


async def test_no_callback_job_is_completed_by_the_recovery_check(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=2, recovery_interval_s=2)
    async with running_stack(settings) as stack:
        created = await stack.create_job(params={"scenario": "no_callback", "render_s": 0.5})
        job = await stack.wait_terminal(created["id"], within=60)
        assert job["status"] == "completed", job
        reasons = [m["reason"] for m in await stack.trail(job["id"])]
        assert any("recovery" in r for r in reasons), reasons


async def test_redelivered_messages_change_nothing_twice(settings):
    async with running_stack(settings) as stack:
        job = await stack.wait_terminal((await stack.create_job(params={"render_s": 0.2}))["id"])
        assert job["status"] == "completed"
        before = await stack.trail(job["id"])
        counters_before = await stack.counters()

        # Every consumer is handed its message for this job again, as JetStream would after a lost ack.
        import nats

        nc = await nats.connect(settings.nats_url)
        js = nc.jetstream()
        inbox_ids = await _inbox_ids(settings.database_url)
        from datetime import UTC, datetime

        replays = [JobQueued(job_id=job["id"]), PollRequested(job_id=job["id"], reason="recovery"),
                   DownloadRequested(job_id=job["id"]), RecoveryDue(job_id=job["id"], due_at=datetime.now(UTC))]
        replays += [events.InboxReceived(inbox_id=i, provider="fake") for i in inbox_ids]
        for event in replays:
            await js.publish(events.subject_for(event), events.encode(event))
        await nc.close()

        async def drained():
            return await _work_outstanding(settings.nats_url) == 0

        await wait_until(drained, within=30, what="the replayed messages to be consumed")
        await asyncio.sleep(0.5)
        assert await stack.trail(job["id"]) == before
        assert await stack.counters() == counters_before
        assert (await stack.job(job["id"]))["outputs"]["sha256"] == job["outputs"]["sha256"]


async def test_stopped_and_restarted_stack_still_serves_a_completed_job(settings):
    async with running_stack(settings) as stack:
        job = await stack.wait_terminal((await stack.create_job(params={"render_s": 0.2}))["id"])
        key = stack.key
    assert job["status"] == "completed"
    async with running_stack(settings, key=key) as stack:
        again = await stack.job(job["id"])
        assert again["status"] == "completed"
        status, body, _ = await stack.download(again["outputs"]["video_url"])
        assert status == 200 and hashlib.sha256(body).hexdigest() == job["outputs"]["sha256"]


async def _inbox_ids(database_url: str) -> list[int]:
    import asyncpg

    conn = await asyncpg.connect(database_url)
    try:
        return [r["id"] for r in await conn.fetch("SELECT id FROM webhook_inbox")]
    finally:
        await conn.close()


async def _work_outstanding(nats_url: str) -> int:
    """Messages not yet handed to, or still held by, a work consumer. The reaper may legitimately hold the
    job's original recovery check in its delayed redelivery, so only its undelivered messages count."""
    import nats

    from vidjobs.common.bus import WORK_STREAM

    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        total = 0
        for name in ("submitter", "poller-inbox", "poller-poll", "media-download", "reaper-recovery"):
            info = await js.consumer_info(WORK_STREAM, name)
            total += info.num_pending + (0 if name == "reaper-recovery" else info.num_ack_pending)
        return total
    finally:
        await nc.close()


def test_statuses_named_in_the_contract():
    assert {s.value for s in JobStatus} == {
        "pending", "submitted", "processing", "retrying", "downloading", "completed", "failed", "canceled", "expired"}
