"""Waiting is free: a job waiting for a slot is parked, with no message going round, no recovery check coming
back and no lock taken for it, however long it waits. The event that frees a slot hands it out at once (a
render ending, at its own provider or, for a job its account's cap held back, at another), and one sweep per
provider catches a wake-up that was lost."""

from __future__ import annotations

import asyncio
from datetime import datetime

import asyncpg
import nats

from tests.stack import demo_key, running_stack, stack_settings
from tests.support import wait_until
from vidjobs.common import creation, events, jobs, waiting
from vidjobs.common.bus import WORK_STREAM
from vidjobs.common.events import SlotFreed
from vidjobs.common.jobs import JobRequest
from vidjobs.common.settings import ProviderLimits
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import transition
from vidjobs.gateway.accounts import create_account

WAITING = 12
ONE_SLOT = {"fake": ProviderLimits(concurrency=1, rate_per_s=1000, burst=1000)}


async def _deliveries(nats_url: str, consumer: str) -> tuple[int, int]:
    """(messages the consumer holds: pending + unacknowledged, deliveries so far)."""
    nc = await nats.connect(nats_url)
    try:
        info = await nc.jetstream().consumer_info(WORK_STREAM, consumer)
        return info.num_pending + info.num_ack_pending, info.delivered.consumer_seq
    finally:
        await nc.close()


async def _fetch(database_url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


async def test_waiting_jobs_hold_no_message_and_cost_no_deliveries(tmp_path, database_url, nats_url):
    # Recovery checks every 2 s: a waiting job whose check came round would show in the reaper's deliveries.
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=1, recovery_interval_s=2)
    key = await demo_key(database_url, concurrency=1)
    async with running_stack(settings, key=key) as stack:
        made = [await stack.create_job(params={"render_s": 60}) for _ in range(WAITING + 1)]
        await asyncio.sleep(4)  # every job handled once, every first recovery check come and gone
        first = {c: await _deliveries(nats_url, c) for c in ("submitter", "reaper-recovery")}
        await asyncio.sleep(8)
        then = {c: await _deliveries(nats_url, c) for c in ("submitter", "reaper-recovery")}
        parked = await _fetch(database_url, "SELECT id FROM jobs WHERE id = ANY($1) AND status = 'pending' "
                                            "AND recover_at IS NULL", [j["id"] for j in made])

    assert len(parked) == WAITING
    assert then["submitter"] == (0, first["submitter"][1]), (first, then)  # none held, none delivered
    # The one rendering job's checks go on (one every 2 s, each delivered up to about three times as it waits
    # out its due time); the twelve parked ones have none, which would add at least 48.
    assert then["reaper-recovery"][1] - first["reaper-recovery"][1] <= 2 * WAITING, (first, then)


async def test_a_job_behind_a_full_quota_starts_when_the_slot_frees(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, provider_limits=ONE_SLOT, queue_sweep_interval_s=3600)
    async with running_stack(settings) as stack:
        ahead = await stack.create_job(params={"render_s": 3})
        behind = await stack.create_job(params={"render_s": 0.1})
        await stack.wait_for_status(ahead["id"], "processing")
        # Parked, and its message acknowledged: waited for, as on a loaded machine either can take longer than
        # any fixed sleep. It then waits holding no message of its own (checked again below).
        await wait_until(lambda: _parked(database_url, behind["id"]), within=10, what="the job behind to park")
        await wait_until(lambda: _holds_nothing(nats_url, "submitter"), within=5, what="its message acknowledged")
        before = await _deliveries(nats_url, "submitter")
        done = await stack.wait_terminal(behind["id"], within=30)
        moves = await _fetch(database_url, "SELECT job_id, to_status, at FROM job_transitions "
                                           "WHERE job_id = ANY($1) ORDER BY at", [ahead["id"], behind["id"]])

    assert done["status"] == "completed"
    freed = next(m["at"] for m in moves if m["job_id"] == ahead["id"] and m["to_status"] == "downloading")
    started = next(m["at"] for m in moves if m["job_id"] == behind["id"] and m["to_status"] == "submitted")
    assert 0 <= (started - freed).total_seconds() < 2, (freed, started)  # the freed slot, not a timer
    assert before[0] == 0, before  # while it waited, no message of its own


async def test_a_lost_wake_up_is_caught_by_the_queue_sweep(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, provider_limits=ONE_SLOT, queue_sweep_interval_s=1)
    async with running_stack(settings) as stack:
        ahead = await stack.create_job(params={"render_s": 600})
        behind = await stack.create_job(params={"render_s": 0.1})
        await stack.wait_for_status(ahead["id"], "processing")
        await wait_until(lambda: _parked(database_url, behind["id"]), within=10, what="the job behind to park")
        # The slot comes free with no event at all: as if the wake-up had been lost with its message.
        await _fetch(database_url, "UPDATE jobs SET status = 'failed', recover_at = NULL, deadline_at = NULL "
                                   "WHERE id = $1", ahead["id"])
        done = await stack.wait_terminal(behind["id"], within=30)

    assert done["status"] == "completed"


async def _holds_nothing(nats_url: str, consumer: str) -> bool:
    return (await _deliveries(nats_url, consumer))[0] == 0


async def _parked(database_url: str, job_id: str) -> bool:
    rows = await _fetch(database_url, "SELECT 1 FROM jobs WHERE id = $1 AND status = 'pending' AND recover_at IS NULL",
                        job_id)
    return bool(rows)


async def _slot_wakeups(pool: asyncpg.Pool) -> list[str]:
    rows = await pool.fetch("SELECT payload FROM outbox WHERE subject = $1 ORDER BY id", events.SUBMIT)
    decoded = [events.decode(events.SUBMIT, bytes(r["payload"])) for r in rows]
    return sorted(e.provider for e in decoded if isinstance(e, SlotFreed))


async def _create(conn: asyncpg.Connection, account_id: str, model: str, prompt: str) -> jobs.JobRow:
    async with conn.transaction():
        return await creation.create(conn, account_id=account_id, estimated_credits=10,
                                     request=JobRequest(model=model, prompt=prompt), recovery_delay_s=3600)


async def test_a_freed_slot_wakes_the_queues_where_a_job_waits_for_it(pool):
    async with pool.acquire() as conn:
        account_id, _ = await create_account(conn, "slots", credits=10_000, concurrency=8)
        rendering = await _create(conn, account_id, "fake/default", "alone")
        waiting = await _create(conn, account_id, "fake/default", "waits")
        await transition(conn, rendering.id, JobStatus.SUBMITTED, reason="test")
        await conn.execute("DELETE FROM outbox")

        # Nobody waits for a fake slot but `waiting` itself: its render finishing wakes the queue.
        await transition(conn, rendering.id, JobStatus.DOWNLOADING, reason="test")
        assert await _slot_wakeups(pool) == ["fake"]
        await conn.execute("DELETE FROM outbox")

        # The account also waits at another provider, where its cap may have held it back: that one too.
        elsewhere = await _create(conn, account_id, "fake-poll/default", "elsewhere")
        await transition(conn, waiting.id, JobStatus.SUBMITTED, reason="test")
        await conn.execute("DELETE FROM outbox")
        await transition(conn, waiting.id, JobStatus.DOWNLOADING, reason="test")
        assert await _slot_wakeups(pool) == ["fake-poll"]
        await conn.execute("DELETE FROM outbox")

        # Once nothing waits, a slot that frees sends nothing.
        await transition(conn, elsewhere.id, JobStatus.CANCELED, reason="test")
        finished = await _create(conn, account_id, "fake/default", "last")
        await transition(conn, finished.id, JobStatus.SUBMITTED, reason="test")
        await transition(conn, finished.id, JobStatus.DOWNLOADING, reason="test")
        assert await _slot_wakeups(pool) == []


async def test_parking_stops_the_recovery_checks_until_the_job_is_submitted(pool):
    async with pool.acquire() as conn:
        account_id, _ = await create_account(conn, "parking", credits=10_000, concurrency=1)
        job = await _create(conn, account_id, "fake/default", "parks")
        async with conn.transaction():
            await waiting.set_wait_reason(conn, job.id, "fake already has 1 renders in flight, its limit", park=True)
        parked = await jobs.fetch(conn, job.id)
        async with conn.transaction():
            await waiting.set_wait_reason(conn, job.id, "pacing submissions", park=False)
        paced = await jobs.fetch(conn, job.id)

    assert parked is not None and parked.recover_at is None and parked.wait_reason.startswith("fake already")
    assert isinstance(parked.waited_at, datetime)
    assert paced is not None and paced.recover_at is None  # pacing keeps what it found, and sets nothing
