"""Counters count committed outcomes only: a move rolled back with its transaction, or skipped because a
redelivered handler finds it already made, adds nothing; a committed one adds exactly once. Through real
PostgreSQL and NATS, reading the process's own registry as /metrics would."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from prometheus_client import REGISTRY

from tests.stack import stack_settings
from vidjobs.common import creation
from vidjobs.common.errors import ErrorCode, JobError, MediaError
from vidjobs.common.jobs import JobRequest
from vidjobs.common.outcomes import fail_or_retry
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import open_runtime
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import transition
from vidjobs.media import worker as media_worker
from vidjobs.media.worker import Media
from vidjobs.storage.factory import open_storage


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
    labels = {"code": "content_rejected"}
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


async def test_stage_durations_are_observed_once_per_committed_stage_change(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url)
    queued = {"stage": "queued", "provider": "fake", "model": "fake/default"}
    ready = {"provider": "fake", "model": "fake/default"}
    async with open_runtime("test", settings) as rt:
        job = await _pending_job(rt)
        queued_before = _sample("vidjobs_job_stage_seconds_count", queued)
        ready_before = _sample("vidjobs_job_ready_seconds_count", ready)
        created_stage_at = await rt.pool.fetchval("SELECT stage_at FROM jobs WHERE id = $1", job.id)

        # pending -> retrying -> pending stays in the stage people see as queued: its clock keeps running.
        for to in (JobStatus.RETRYING, JobStatus.PENDING):
            async with rt.tx() as conn:
                await transition(conn, job.id, to, reason="test")
        still_queued_at = await rt.pool.fetchval("SELECT stage_at FROM jobs WHERE id = $1", job.id)
        with pytest.raises(RuntimeError):
            async with rt.tx() as conn:
                await transition(conn, job.id, JobStatus.SUBMITTED, reason="rolled back")
                raise RuntimeError("the handler fails before its transaction commits")
        after_rollback = _sample("vidjobs_job_stage_seconds_count", queued)
        for to in (JobStatus.SUBMITTED, JobStatus.DOWNLOADING, JobStatus.COMPLETED):
            async with rt.tx() as conn:
                await transition(conn, job.id, to, reason="test")

    assert still_queued_at == created_stage_at
    assert after_rollback == queued_before
    assert _sample("vidjobs_job_stage_seconds_count", queued) == queued_before + 1
    assert _sample("vidjobs_job_ready_seconds_count", ready) == ready_before + 1


async def test_failed_copies_count_only_the_fail_that_commits(tmp_path, database_url, nats_url):
    """Two deliveries of one download both fail to verify the render (a redelivery racing the first): one of
    them fails the job, and only that one is counted."""
    settings = stack_settings(tmp_path, database_url, nats_url)
    labels = {"outcome": "failed", "code": "verification_failed"}
    async with open_runtime("media", settings) as rt:
        job = await _pending_job(rt)
        for to in (JobStatus.SUBMITTED, JobStatus.DOWNLOADING):
            async with rt.tx() as conn:
                await transition(conn, job.id, to, reason="test")
        media = Media(rt=rt, storage=open_storage(settings), copier=None, adapters={})  # type: ignore[arg-type]
        before = _sample("vidjobs_media_copies_total", labels)
        deadline = datetime.now(UTC) + timedelta(minutes=5)
        for _ in range(2):
            err = MediaError(ErrorCode.VERIFICATION_FAILED, "not a playable video")
            await media_worker._copy_failed(media, job, err, SimpleNamespace(attempt=1), deadline)
        status = await rt.pool.fetchval("SELECT status FROM jobs WHERE id = $1", job.id)

    assert status == "failed"
    assert _sample("vidjobs_media_copies_total", labels) == before + 1
