"""Media under faults: a render whose copy kills the media process every time is dead-lettered after a
bounded number of tries while healthy copies complete, and leaves no scratch files behind; an object store
that is down while renders are copied delays them but fails none."""

from __future__ import annotations

import asyncio
import shutil
from types import SimpleNamespace

import pytest

from tests.faults.scenarios.media_faults import kill_whenever_it_decodes, scratch_of
from tests.stack import Stack, running_stack, stack_settings
from tests.support import wait_until
from tests.test_poison import _dead_letters
from vidjobs.common import creation, events
from vidjobs.common.bus import Delivery
from vidjobs.common.errors import GiveUp
from vidjobs.common.events import DownloadRequested
from vidjobs.common.jobs import JobRequest
from vidjobs.common.settings import Settings
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import transition
from vidjobs.gateway.accounts import create_account
from vidjobs.media import copies
from vidjobs.media.worker import DECODER_CRASHES, on_download


async def test_a_process_killing_download_is_dead_lettered(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, ack_wait_s=2, media_copy_lease_s=3)
    async with running_stack(settings) as stack:
        poison = await stack.create_job(duration_s=5, params={"render_s": 0.2})  # a decode long enough to catch
        kills: list[int] = []
        landed: list[int] = []
        killer = asyncio.create_task(kill_whenever_it_decodes(stack, poison["id"], kills, landed))
        try:
            healthy = [await stack.create_job(params={"render_s": 0.2}) for _ in range(3)]
            failed = await stack.wait_terminal(poison["id"], within=120)
        finally:
            killer.cancel()
        fine = await asyncio.gather(*(stack.wait_terminal(j["id"], within=60) for j in healthy))
        dead = await wait_until(lambda: _dead_letters(nats_url), within=10, what="a dead letter")
        # The media process that runs now cleaned up after the ones that were killed.
        await wait_until(lambda: _none_left(kills), within=30, what="scratch space of killed copies removed")

    assert failed["status"] == "failed" and failed["error"]["code"] == "internal"
    assert len(landed) == DECODER_CRASHES, (kills, landed)  # bounded, however often it kills
    assert len(kills) <= 2 * DECODER_CRASHES, kills
    assert [j["status"] for j in fine] == ["completed"] * 3
    assert [subject for subject, _ in dead] == ["vidjobs.dead.media-download"]


async def _none_left(pids: list[int]) -> bool:
    return not scratch_of(pids)


async def test_an_object_store_outage_fails_no_download(tmp_path, database_url, nats_url):
    # A small delivery budget: on a failure path that counted outages, jobs would fail within seconds.
    settings = stack_settings(tmp_path, database_url, nats_url, max_deliveries=2, download_attempts=2)
    root = tmp_path / "objects"
    async with running_stack(settings) as stack:
        await stack.wait_terminal((await stack.create_job(params={"render_s": 0.1}))["id"])  # the store works
        hidden = tmp_path / "objects-away"
        root.rename(hidden)
        root.write_text("the object store is down")  # every write under it now fails (NotADirectoryError)
        try:
            jobs = [await stack.create_job(params={"render_s": 0.1}) for _ in range(4)]
            await wait_until(lambda: _all_downloading(stack, jobs), within=30, what="jobs waiting to be stored")
            await asyncio.sleep(8)
            during = [(await stack.job(j["id"]))["status"] for j in jobs]
        finally:
            root.unlink()
            hidden.rename(root)
        done = await asyncio.gather(*(stack.wait_terminal(j["id"], within=90) for j in jobs))

    assert during == ["downloading"] * 4
    assert [j["status"] for j in done] == ["completed"] * 4
    shutil.rmtree(root, ignore_errors=True)


async def _all_downloading(stack: Stack, jobs: list[dict]) -> bool:
    statuses = [(await stack.job(j["id"]))["status"] for j in jobs]
    return statuses == ["downloading"] * len(jobs)


async def test_giving_up_on_a_poison_keeps_its_lease_so_no_copy_starts_before_its_job_fails(pool):
    """The copy that gives up on a render (its decoder died DECODER_CRASHES times) must not free the render for
    another copy before the job is failed: a duplicate delivery taking it then would see no crashes at all and
    decode it again, killing one more process."""
    job = await _job(pool, "poison")
    async with pool.acquire() as conn:
        for to in (JobStatus.SUBMITTED, JobStatus.DOWNLOADING):
            assert await transition(conn, job.id, to, reason="test") is not None
        # A copier died mid-decode once more than the limit allows, and its lease has run out.
        await conn.execute(
            "INSERT INTO media_copies (job_id, owner, expires_at, decoding, crashes) "
            "VALUES ($1, 'media-host-1-dead', clock_timestamp() - interval '1 second', true, $2)",
            job.id, DECODER_CRASHES - 1)
    media = SimpleNamespace(rt=SimpleNamespace(pool=pool, settings=Settings(media_copy_lease_s=30)))

    with pytest.raises(GiveUp):
        await on_download(media, DownloadRequested(job_id=job.id), Delivery(attempt=1, subject=events.DOWNLOAD))

    with pytest.raises(copies.Busy):  # a duplicate delivery defers until the dead letter has failed the job
        await copies.take(pool, job.id, 30, owner="media-host-2-other")


async def test_a_lease_this_process_could_not_give_up_is_taken_back_by_it_at_once(pool):
    """A copy that ended while the database was away could not delete its lease (held() gives it up in a
    `finally` that the outage made fail): the lease outlives the copy by a whole TTL, and every redelivery of
    the job meanwhile is deferred as if another copier were at work. This process knows it is copying nothing
    of that job, so it takes its own lease back at once; a lease it does hold, or another process's, still
    defers a duplicate."""
    job_id = (await _job(pool, "lease")).id
    await copies.take(pool, job_id, 60)  # ours, as a failed release leaves it, with a minute to run
    await pool.execute("UPDATE media_copies SET decoding = true WHERE job_id = $1", job_id)  # ended mid-decode

    crashes = await copies.take(pool, job_id, 60)  # the redelivery: no wait for our own stale lease

    async with copies.held(pool, job_id, 60):
        with pytest.raises(copies.Busy):  # a duplicate delivery while this process copies it
            await copies.take(pool, job_id, 60)
        with pytest.raises(copies.Busy):  # another media process
            await copies.take(pool, job_id, 60, owner="media-host-2-other")
    assert crashes == 0  # an error this process lived through is not a copier dying mid-decode


async def _job(pool, account: str):
    """A pending job of a new account's."""
    async with pool.acquire() as conn:
        account_id, _ = await create_account(conn, account, credits=1000, concurrency=2)
        async with conn.transaction():
            return await creation.create(conn, account_id=account_id,
                                         request=JobRequest(model="fake/default", prompt="p"),
                                         estimated_credits=10, recovery_delay_s=3600)
