"""Job change hints through real PostgreSQL and NATS: a hint is a core NATS message sent once the change has
committed, never before and never for a change rolled back, and nothing of it is written to JetStream."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import StreamConfig

from tests.stack import stack_settings
from vidjobs.common import bus, creation, events
from vidjobs.common.jobs import JobRequest
from vidjobs.common.runtime import open_runtime
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import transition


async def _pending_job(rt) -> str:
    await rt.pool.execute("INSERT INTO accounts (id, name, credits_balance) VALUES ('acct_c', 'c', 1000) "
                          "ON CONFLICT DO NOTHING")
    async with rt.tx() as conn:
        job = await creation.create(conn, account_id="acct_c", request=JobRequest(model="fake/default", prompt="a fox"),
                                    estimated_credits=10, recovery_delay_s=60)
    return job.id


async def _listen(nats_url: str, job_id: str):
    nc = await nats.connect(nats_url)
    got: asyncio.Queue = asyncio.Queue()

    async def on(msg) -> None:
        await got.put((asyncio.get_running_loop().time(), events.decode_change(msg.data)))

    await nc.subscribe(f"{events.CHANGED_PREFIX}.{job_id}", cb=on)
    await nc.flush()
    return nc, got


async def test_a_hint_is_sent_after_commit_and_not_for_a_rollback(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url)
    async with open_runtime("test", settings) as rt:
        job_id = await _pending_job(rt)
        nc, got = await _listen(nats_url, job_id)
        try:
            with pytest.raises(RuntimeError):
                async with rt.tx() as conn:
                    await transition(conn, job_id, JobStatus.CANCELED, reason="rolled back")
                    raise RuntimeError("the transaction fails after the move")
            async with rt.tx() as conn:
                await transition(conn, job_id, JobStatus.CANCELED, reason="test")
                await asyncio.sleep(0.3)  # inside the transaction: nothing may have been sent yet
                early = got.qsize()
            committed_at = asyncio.get_running_loop().time()
            at, hint = await asyncio.wait_for(got.get(), 5)
        finally:
            await nc.close()

    assert early == 0
    assert at >= committed_at
    assert (hint.job_id, hint.status) == (job_id, "canceled")
    assert got.empty()  # the rolled-back move sent nothing


async def test_hints_are_not_stored_and_an_older_hint_stream_is_removed(tmp_path, database_url, nats_url):
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    # What an earlier version created: a stream capturing every hint, written to disk.
    await js.add_stream(StreamConfig(name="VIDJOBS_CHANGES", subjects=[f"{events.CHANGED_PREFIX}.>"]))
    try:
        settings = stack_settings(tmp_path, database_url, nats_url)
        async with open_runtime("test", settings) as rt:
            job_id = await _pending_job(rt)
            listener, got = await _listen(nats_url, job_id)
            async with rt.tx() as conn:
                await transition(conn, job_id, JobStatus.CANCELED, reason="test")
            await asyncio.wait_for(got.get(), 5)
            await listener.close()
            streams = [s.config.name for s in await js.streams_info()]
    finally:
        await nc.close()

    assert "VIDJOBS_CHANGES" not in streams and bus.WORK_STREAM in streams
