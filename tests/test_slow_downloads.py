"""Large renders from slow providers: a download that keeps coming is allowed its size at the minimum rate
(past the stage deadline, which moves with it), and one that stops coming is given up after the stall time,
freeing its copy slot for the next render.

The provider here is the fake provider's own output serving (paced with `serve_kb_per_s`, stalled with
`serve_stall_after_mb`) in front of its tiny clip, on loopback; the media worker runs against PostgreSQL and
a nats-server as in test_media.py. Small sizes at slow rates stand in for 500 MB at 1 MB/s: the rule is the
same (bench/slow_download.py runs the large one and reports memory).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from aiohttp import web

from tests.standins.server import serving
from tests.support import wait_until
from tests.test_media import running_media, wait_status
from vidjobs.common import creation, jobs
from vidjobs.common.errors import ErrorCode
from vidjobs.common.events import DownloadRequested
from vidjobs.common.jobs import JobRequest
from vidjobs.common.runtime import Runtime
from vidjobs.common.settings import Settings
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate, transition
from vidjobs.fakeprovider import outputs
from vidjobs.fakeprovider.clips import ClipSpec, clip_size, render_mp4
from vidjobs.fakeprovider.wire import RenderParams

STEADY_MB, STEADY_KB_PER_S = 5, 1000  # 5 s at 1 MB/s: well past the 2 s stage deadline below
STAGE_S = 2.0


@pytest.fixture
def settings(database_url: str, nats_url: str, tmp_path: Path) -> Settings:
    return Settings().with_(
        data_dir=str(tmp_path), database_url=database_url, nats_url=nats_url,
        storage_url=f"file://{tmp_path / 'objects'}", signing_secret="x", retry_base_s=0.1, retry_cap_s=0.2,
        download_allow_hosts="127.0.0.1", fake_provider="on", download_deadline_s=STAGE_S,
        download_min_kb_per_s=400.0, download_stall_s=1.0, download_attempts=2, download_concurrency=1,
    )


@contextlib.asynccontextmanager
async def provider_outputs() -> AsyncIterator[str]:
    """Serves /{name}.mp4 as the fake provider would under the params each name stands for."""
    clip = await render_mp4(ClipSpec(*clip_size("16:9"), duration_s=1, seed=5))
    served = {
        "steady": RenderParams(output_mb=STEADY_MB, serve_kb_per_s=STEADY_KB_PER_S),
        "stalled": RenderParams(output_mb=STEADY_MB, serve_stall_after_mb=1),
        "plain": RenderParams(),
    }

    async def handle(request: web.Request) -> web.StreamResponse:
        return await outputs.serve(request, clip, served[request.match_info["name"]])

    app = web.Application()
    app.router.add_get("/{name}.mp4", handle)
    async with serving(app) as base:
        yield base


async def downloading_job(rt: Runtime, output_url: str) -> str:
    """A finished render with the stage deadline the poller gives it, and its DownloadRequested."""
    await rt.pool.execute(
        "INSERT INTO accounts (id, name, credits_balance) VALUES ('acct_slow', 'slow', 1000) ON CONFLICT DO NOTHING")
    async with rt.tx() as conn:
        job = await creation.create(conn, account_id="acct_slow", estimated_credits=10, recovery_delay_s=600,
                                    request=JobRequest(model="fake/default", prompt="a fox in snow", duration_s=1))
        await transition(conn, job.id, JobStatus.SUBMITTED, reason="test: accepted",
                         update=JobUpdate(provider_job_id=f"p-{job.id}"))
        await transition(conn, job.id, JobStatus.DOWNLOADING, reason="test: render finished",
                         update=JobUpdate(provider_output=output_url,
                                          deadline_at=datetime.now(UTC) + timedelta(seconds=STAGE_S)),
                         emit=[DownloadRequested(job_id=job.id)])
    return job.id


async def test_a_slow_but_steady_download_completes_past_the_stage_deadline(settings: Settings):
    async with provider_outputs() as base, running_media(settings) as rt:
        job_id = await downloading_job(rt, f"{base}/steady.mp4")
        given = (await jobs.fetch(rt.pool, job_id)).deadline_at

        async def moved() -> datetime | None:
            job = await jobs.fetch(rt.pool, job_id)
            return job.deadline_at if job and job.deadline_at and job.deadline_at > given else None

        # While it runs, the job's deadline is past the stage's, so the reaper leaves it be.
        later = await wait_until(moved, within=10, what="the download deadline to move")
        job = await wait_status(rt, job_id, JobStatus.COMPLETED, within=30)
        trail = await rt.pool.fetch("SELECT to_status FROM job_transitions WHERE job_id = $1 ORDER BY id", job_id)

    assert job.attempt == 1 and job.error is None
    assert [r["to_status"] for r in trail][-2:] == ["downloading", "completed"]  # one try, never retried
    # At least the size at the minimum rate (5 MB at 400 kB/s, 12.5 s) from when the download began.
    assert later - given >= timedelta(seconds=STEADY_MB * 1_000_000 / 400_000 - STAGE_S)


async def test_a_stalled_download_is_given_up_and_frees_its_copy_slot(settings: Settings):
    async with provider_outputs() as base, running_media(settings) as rt:
        stalled = await downloading_job(rt, f"{base}/stalled.mp4")
        after = await downloading_job(rt, f"{base}/plain.mp4")  # waits for the one copy slot
        failed = await wait_status(rt, stalled, JobStatus.FAILED, within=30)
        done = await wait_status(rt, after, JobStatus.COMPLETED, within=30)
        leases = await rt.pool.fetchval("SELECT count(*) FROM media_copies WHERE job_id = $1", stalled)

    assert failed.error is not None and failed.error.code is ErrorCode.DOWNLOAD_FAILED
    assert "sent nothing for 1 s" in failed.error.message, failed.error.message
    assert done.error is None
    assert leases == 0  # the copy lease went with the slot
