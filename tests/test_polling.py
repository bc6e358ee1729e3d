"""Tapered polling for providers without callbacks: one scheduler over a due-time index, every 2 s for the
first 30 s, every 10 s up to 2 min, then every 30 s; and how many of each kind of message a poller handles at
once, as set."""

from __future__ import annotations

import asyncpg

from tests.stack import running_stack, stack_settings
from vidjobs.common import creation
from vidjobs.common.jobs import JobRequest
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import Runtime
from vidjobs.common.settings import load
from vidjobs.poller import schedule
from vidjobs.poller import worker as poller
from vidjobs.poller.signals import SignalContext


async def _job(pool: asyncpg.Pool) -> str:
    await pool.execute("INSERT INTO accounts (id, name, credits_balance) VALUES ('acct_p', 'p', 1000) "
                       "ON CONFLICT DO NOTHING")
    async with pool.acquire() as conn, conn.transaction():
        job = await creation.create(conn, account_id="acct_p", request=JobRequest(model="fake-poll/x", prompt="p"),
                                    estimated_credits=1, recovery_delay_s=60)
    return job.id


async def test_polls_taper_as_a_render_ages(pool):
    ages = {"young": 10, "middle": 60, "old": 300}
    ids = {}
    for name, age in ages.items():
        ids[name] = await _job(pool)
        await pool.execute(
            "INSERT INTO poll_schedule (job_id, next_poll_at, started_at) "
            "VALUES ($1, now() - interval '1 second', now() - make_interval(secs => $2))", ids[name], age)
    not_due = await _job(pool)
    async with pool.acquire() as conn:
        await schedule.add(conn, not_due)

    async with pool.acquire() as conn:
        taken = await schedule.take_due(conn, limit=10)

    assert sorted(taken) == sorted(ids.values())  # the new one is not due for 2 s
    gaps = {name: await pool.fetchval(
        "SELECT extract(epoch FROM next_poll_at - now()) FROM poll_schedule WHERE job_id = $1", job_id)
        for name, job_id in ids.items()}
    assert {name: round(float(gap)) for name, gap in gaps.items()} == {"young": 2, "middle": 10, "old": 30}


async def test_a_provider_without_callbacks_is_polled_to_completion(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=600)  # only polls can find it
    async with running_stack(settings) as stack:
        job = await stack.create_job(model="fake-poll/default", params={"render_s": 6})
        done = await stack.wait_terminal(job["id"], within=60)
        trail = await stack.trail(job["id"])
        conn = await asyncpg.connect(database_url)
        try:
            left = await conn.fetchval("SELECT count(*) FROM poll_schedule")
        finally:
            await conn.close()

    assert done["status"] == "completed"
    assert [m["to"] for m in trail] == ["pending", "submitted", "processing", "downloading", "completed"]
    assert all("scheduled poll" in m["reason"] for m in trail[2:4])
    assert left == 0  # a finished job leaves the schedule


def test_the_poller_s_consumers_take_their_concurrency_from_the_settings():
    settings = load({"VIDJOBS_INBOX_CONCURRENCY": "3", "VIDJOBS_POLL_CONCURRENCY": "5",
                     "VIDJOBS_CANCEL_CONCURRENCY": "2"})
    rt = Runtime(name="poller", settings=settings, pool=None, nc=None, js=None, relay=None)  # type: ignore[arg-type]
    ctx = poller.Context(rt=rt, adapters={}, signals=SignalContext(rt=rt, policies=Policies(settings)))
    assert {spec.durable: spec.concurrency for spec in poller.consumers(ctx)} == \
        {"poller-inbox": 3, "poller-poll": 5, "poller-cancel": 2}
