"""A job waiting for a slot holds at most one message however long it waits: the recovery check, which comes
round for every live job, adds no second one while the job's own message is still going round."""

from __future__ import annotations

import asyncio

import nats

from tests.stack import demo_key, running_stack, stack_settings
from vidjobs.common import events, jobs
from vidjobs.common.bus import WORK_STREAM
from vidjobs.common.events import SlotFreed
from vidjobs.common.jobs import JobRequest
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import transition
from vidjobs.gateway.accounts import create_account

WAITING = 12


async def _submitter_messages(nats_url: str) -> tuple[int, int]:
    """(messages the submitter holds: pending + unacknowledged, deliveries so far)."""
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().consumer_info(WORK_STREAM, "submitter")
        return info.num_pending + info.num_ack_pending, info.delivered.consumer_seq
    finally:
        await nc.close()


async def test_waiting_jobs_hold_one_message_each(tmp_path, database_url, nats_url):
    # Recovery checks every 2 s: a check that re-queued a waiting job would multiply its messages fast.
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=1, recovery_interval_s=2)
    key = await demo_key(database_url, concurrency=1)
    async with running_stack(settings, key=key) as stack:
        jobs = [await stack.create_job(params={"render_s": 60}) for _ in range(WAITING + 1)]
        samples = []
        for _ in range(5):
            await asyncio.sleep(4)
            samples.append(await _submitter_messages(nats_url))
        waiting = [j for j in [await stack.job(j["id"]) for j in jobs] if j["status"] == "pending"]

    assert len(waiting) == WAITING
    held = [messages for messages, _ in samples]
    assert max(held) <= WAITING + 1, samples  # one each (a freed-slot wake-up may be in flight)
    # Deliveries per waiting job stay flat in time: no more in the last 8 s than in the first.
    deliveries = [d for _, d in samples]
    assert deliveries[-1] - deliveries[-3] <= deliveries[1] + WAITING, samples


async def _slot_wakeups(pool) -> int:
    rows = await pool.fetch("SELECT payload FROM outbox WHERE subject = $1", events.SUBMIT)
    return sum(isinstance(events.decode(events.SUBMIT, bytes(r["payload"])), SlotFreed) for r in rows)


async def test_a_freed_slot_wakes_the_queue_only_when_a_job_waits_for_it(pool):
    async with pool.acquire() as conn:
        account_id, _ = await create_account(conn, "slots", credits=10_000, concurrency=8)
        made = []
        for prompt in ("alone", "waits"):
            async with conn.transaction():
                made.append(await jobs.create(conn, account_id=account_id, estimated_credits=10,
                                              request=JobRequest(model="fake/default", prompt=prompt),
                                              recovery_delay_s=3600))
        rendering, waiting = made
        await transition(conn, rendering.id, JobStatus.SUBMITTED, reason="test")
        await conn.execute("DELETE FROM outbox")

        # Nobody waits for a fake slot but `waiting` itself: its render finishing wakes the queue.
        await transition(conn, rendering.id, JobStatus.DOWNLOADING, reason="test")
        assert await _slot_wakeups(pool) == 1
        await conn.execute("DELETE FROM outbox")

        # Once nothing waits, a slot that frees sends nothing.
        await transition(conn, waiting.id, JobStatus.SUBMITTED, reason="test")
        await transition(conn, waiting.id, JobStatus.DOWNLOADING, reason="test")
        assert await _slot_wakeups(pool) == 0


async def test_a_waiting_jobs_patience_grows_with_its_place_and_is_counted_only_that_far(pool):
    from vidjobs.submitter import dispatch

    async with pool.acquire() as conn:
        account_id, _ = await create_account(conn, "patience", credits=100_000, concurrency=1)
        queued = []
        for i in range(80):
            async with conn.transaction():
                queued.append(await jobs.create(conn, account_id=account_id, estimated_credits=10,
                                                request=JobRequest(model="fake/default", prompt=f"q{i}"),
                                                recovery_delay_s=3600))
        waits = [await dispatch.patience(conn, queued[i]) for i in (0, 2, 58, 79)]
        places = [await dispatch.queue_place(conn, queued[79], up_to=n) for n in (10, 100)]

    assert waits == [1.0, 2.0, 30.0, 30.0]
    assert places == [10, 80]
