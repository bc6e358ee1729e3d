"""Counters count committed outcomes only: a move rolled back with its transaction, or skipped because a
redelivered handler finds it already made, adds nothing; a committed one adds exactly once. Through real
PostgreSQL and NATS, reading the process's own registry as /metrics would."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from datetime import datetime

import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from tests.stack import host_port, stack_settings
from tests.standins.server import serving
from vidjobs.common import creation, events
from vidjobs.common.bus import Delivery
from vidjobs.common.errors import ErrorCode, JobError, Redeliver
from vidjobs.common.jobs import JobRequest, JobRow
from vidjobs.common.outcomes import fail_or_retry
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import Runtime, open_runtime
from vidjobs.common.states import STAGE_OF, JobStatus, Stage
from vidjobs.common.transitions import JobUpdate, transition
from vidjobs.media.worker import Media, on_download, opened


def _sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def _pending_job(rt):
    await rt.pool.execute("INSERT INTO accounts (id, name, credits_balance) VALUES ('acct_m', 'm', 1000) "
                          "ON CONFLICT DO NOTHING")
    async with rt.tx() as conn:
        return await creation.create(conn, account_id="acct_m",
                                     request=JobRequest(model="fake/default", prompt="a fox"),
                                     estimated_credits=10, recovery_delay_s=60)


async def _refuse(rt, job) -> None:
    """What the submitter does with a refused submission, as a handler that JetStream may redeliver."""
    error = JobError.of(ErrorCode.CONTENT_REJECTED, "refused")
    async with rt.tx() as conn:
        await fail_or_retry(conn, job, error, policies=Policies(rt.settings), reason="submit refused",
                            expect=[JobStatus.PENDING])


async def test_job_errors_count_only_committed_moves(tmp_path, database_url, nats_url):
    labels = {"code": "content_rejected", "provider": "fake"}
    settings = stack_settings(tmp_path, database_url, nats_url)
    async with open_runtime("test", settings) as rt:
        job = await _pending_job(rt)
        before = _sample("vidjobs_job_errors_total", labels)
        failed_before = _sample("vidjobs_job_transitions_total", {"to_status": "failed"})

        # The handler's transaction fails after the move: the move never happened.
        with pytest.raises(RuntimeError):
            async with rt.tx() as conn:
                await fail_or_retry(conn, job, JobError.of(ErrorCode.CONTENT_REJECTED, "refused"),
                                    policies=Policies(rt.settings), reason="submit refused",
                                    expect=[JobStatus.PENDING])
                raise RuntimeError("the handler fails before its transaction commits")
        after_rollback = _sample("vidjobs_job_errors_total", labels)

        await _refuse(rt, job)
        await _refuse(rt, job)  # redelivered: the job has already failed, nothing moves
        status = await rt.pool.fetchval("SELECT status FROM jobs WHERE id = $1", job.id)

    assert after_rollback == before
    assert status == "failed"
    assert _sample("vidjobs_job_errors_total", labels) == before + 1
    assert _sample("vidjobs_job_transitions_total", {"to_status": "failed"}) == failed_before + 1


# Every move a job makes on its way to completed, and the stage each one leaves (None: it stays in its stage).
PATH = [JobStatus.RETRYING, JobStatus.PENDING, JobStatus.SUBMITTED, JobStatus.PROCESSING, JobStatus.DOWNLOADING,
        JobStatus.COMPLETED]
LEFT_STAGES = [Stage.QUEUED, Stage.SUBMITTED, Stage.RENDERING, Stage.DOWNLOADING]


def _stage_samples() -> dict[str, tuple[float, float]]:
    """(observations, seconds) of each stage a job leaves, for the model these tests create jobs of."""
    labels = {"provider": "fake", "model": "fake/default"}
    return {stage.value: (_sample("vidjobs_job_stage_seconds_count", {"stage": stage.value, **labels}),
                          _sample("vidjobs_job_stage_seconds_sum", {"stage": stage.value, **labels}))
            for stage in LEFT_STAGES}


async def _stage_at(rt: Runtime, job_id: str) -> datetime:
    return await rt.pool.fetchval("SELECT stage_at FROM jobs WHERE id = $1", job_id)


async def test_stage_durations_are_observed_once_per_committed_stage_change(tmp_path, database_url, nats_url):
    """Each move of a job's whole path is first tried and rolled back (nothing observed), then committed: a
    move that changes the stage people see observes the stage it left, once, for exactly the time the job spent
    in it; a move within a stage observes nothing and keeps the stage's clock running."""
    settings = stack_settings(tmp_path, database_url, nats_url)
    ready = {"provider": "fake", "model": "fake/default"}
    observed: list[str] = []
    async with open_runtime("test", settings) as rt:
        job = await _pending_job(rt)
        ready_before = (_sample("vidjobs_job_ready_seconds_count", ready),
                        _sample("vidjobs_job_ready_seconds_sum", ready))
        status = job.status
        for to in PATH:
            entered, before = await _stage_at(rt, job.id), _stage_samples()
            with pytest.raises(RuntimeError):
                async with rt.tx() as conn:
                    await transition(conn, job.id, to, reason="rolled back")
                    raise RuntimeError("the handler fails before its transaction commits")
            assert _stage_samples() == before, f"a rolled-back move to {to} was observed"

            async with rt.tx() as conn:
                moved = await transition(conn, job.id, to, reason="test")
            assert moved is not None
            after, left = _stage_samples(), STAGE_OF[status].value
            if STAGE_OF[status] is STAGE_OF[to]:
                assert after == before, f"{status} -> {to} stays {left}, yet it was observed"
                assert await _stage_at(rt, job.id) == entered  # the stage's clock keeps running
            else:
                spent = (moved.job.updated_at - entered).total_seconds()
                assert after[left][0] == before[left][0] + 1, f"{status} -> {to} left {left}"
                assert after[left][1] == pytest.approx(before[left][1] + spent, abs=1e-6)
                assert {stage: n for stage, n in after.items() if stage != left} == {
                    stage: n for stage, n in before.items() if stage != left}
                observed.append(left)
            status = to
        ready_s = (moved.job.updated_at - moved.job.created_at).total_seconds()

    assert observed == [stage.value for stage in LEFT_STAGES]
    # Completion also observes creation to completion, once.
    assert _sample("vidjobs_job_ready_seconds_count", ready) == ready_before[0] + 1
    assert _sample("vidjobs_job_ready_seconds_sum", ready) == pytest.approx(ready_before[1] + ready_s, abs=1e-6)


# --- a copy that fails verification, through the media service's own handler -------------------------------

NOT_A_VIDEO = b"<html><body>502 Bad Gateway</body></html>\n"


class Origin:
    """Where the provider says the render is: it serves a page that is not a video. `hold` keeps each answer
    back until released, so a test can move the job while a copy is under way."""

    def __init__(self) -> None:
        self.requested = asyncio.Event()
        self.release = asyncio.Event()
        self.release.set()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/render.mp4", self._render)
        return app

    async def _render(self, _: web.Request) -> web.Response:
        self.requested.set()
        await self.release.wait()
        return web.Response(body=NOT_A_VIDEO, content_type="video/mp4")


@contextlib.asynccontextmanager
async def failing_copies(tmp_path, database_url, nats_url) -> AsyncIterator[tuple[Media, Origin, str]]:
    """The media service's parts as it runs them, and the URL of a render that fails verification."""
    origin = Origin()
    async with serving(origin.app()) as url:
        settings = stack_settings(tmp_path, database_url, nats_url, download_allow_hosts=host_port(url))
        async with open_runtime("media", settings) as rt, opened(rt) as media:
            yield media, origin, f"{url}/render.mp4"


async def _downloading_job(rt: Runtime, output_url: str) -> JobRow:
    job = await _pending_job(rt)
    async with rt.tx() as conn:
        await transition(conn, job.id, JobStatus.SUBMITTED, reason="test: accepted")
        moved = await transition(conn, job.id, JobStatus.DOWNLOADING, reason="test: render finished",
                                 update=JobUpdate(provider_output=output_url))
    assert moved is not None
    return moved.job


async def _moves_to(rt: Runtime, job_id: str, status: JobStatus) -> list[str]:
    return [r["reason"] for r in await rt.pool.fetch(
        "SELECT reason FROM job_transitions WHERE job_id = $1 AND to_status = $2 ORDER BY id", job_id, status.value)]


async def test_racing_deliveries_of_a_failing_copy_fail_the_job_once_and_count_it_once(tmp_path, database_url,
                                                                                         nats_url):
    """Two deliveries of one download handled at once (a redelivery racing the first), each handed back while
    it is deferred, as JetStream would: the one that comes second finds the render being copied and waits, the
    copy fails verification, one delivery fails the job, and only that fail is counted."""
    labels = {"outcome": "failed", "code": "verification_failed"}
    async with failing_copies(tmp_path, database_url, nats_url) as (media, origin, render_url):
        job = await _downloading_job(media.rt, render_url)
        before = _sample("vidjobs_media_copies_total", labels)
        origin.release.clear()  # the first copy waits for its render until the other delivery has come and waited
        event = events.DownloadRequested(job_id=job.id)
        deferred_while_copying = 0

        async def delivered(attempt: int) -> None:
            nonlocal deferred_while_copying
            delivery = Delivery(attempt=attempt, subject=events.DOWNLOAD)
            for _ in range(50):
                try:
                    return await on_download(media, event, delivery)
                except Redeliver as deferred:
                    assert not deferred.counts, deferred  # waiting for the other copy spends no try
                    deferred_while_copying += 1
                    origin.release.set()
                    await asyncio.sleep(min(deferred.delay, 0.1))
            raise AssertionError("the delivery was deferred for ever")

        await asyncio.wait_for(asyncio.gather(delivered(1), delivered(2)), 30)
        status = await media.rt.pool.fetchval("SELECT status FROM jobs WHERE id = $1", job.id)
        failed_by = await _moves_to(media.rt, job.id, JobStatus.FAILED)

    assert deferred_while_copying >= 1  # the two did overlap: one waited for the other's copy
    assert status == "failed"
    assert failed_by == ["media: verification_failed"]
    assert _sample("vidjobs_media_copies_total", labels) == before + 1


async def test_a_failing_copy_of_a_job_that_moved_on_meanwhile_counts_nothing(tmp_path, database_url, nats_url):
    """The job is canceled while its render is being fetched; the copy then fails verification, but its fail
    does not commit (the job is no longer downloading), so nothing is counted."""
    labels = {"outcome": "failed", "code": "verification_failed"}
    async with failing_copies(tmp_path, database_url, nats_url) as (media, origin, render_url):
        job = await _downloading_job(media.rt, render_url)
        before = _sample("vidjobs_media_copies_total", labels)
        verified_before = _sample("vidjobs_media_verifications_total", {"outcome": "verification_failed"})
        origin.release.clear()
        copying = asyncio.create_task(on_download(media, events.DownloadRequested(job_id=job.id),
                                                  Delivery(attempt=1, subject=events.DOWNLOAD)))
        await asyncio.wait_for(origin.requested.wait(), 10)
        async with media.rt.tx() as conn:
            assert await transition(conn, job.id, JobStatus.CANCELED, reason="test: the owner canceled")
        origin.release.set()
        await asyncio.wait_for(copying, 20)
        status = await media.rt.pool.fetchval("SELECT status FROM jobs WHERE id = $1", job.id)
        failed_by = await _moves_to(media.rt, job.id, JobStatus.FAILED)
        verified = _sample("vidjobs_media_verifications_total", {"outcome": "verification_failed"})

    assert status == "canceled" and failed_by == []
    assert verified == verified_before + 1  # the copy did reach verification, and failed it
    assert _sample("vidjobs_media_copies_total", labels) == before
