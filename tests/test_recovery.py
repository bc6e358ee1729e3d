"""The delayed recovery check (docs/ARCHITECTURE.md "Recovery") against a real PostgreSQL: the five cases it must hold
in, and the lease that keeps two reapers from recovering one job."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import asyncpg
import nats
import pytest

from vidjobs.common import bus, creation, deletion, events, jobs, recovery_checks, waiting
from vidjobs.common.bus import Delivery
from vidjobs.common.errors import Redeliver
from vidjobs.common.events import RECOVERY, JobQueued, RecoveryDue
from vidjobs.common.jobs import JobRequest
from vidjobs.common.outbox import Relay
from vidjobs.common.retry import Policies
from vidjobs.common.runtime import Runtime
from vidjobs.common.settings import Settings
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate, transition
from vidjobs.reaper.backlog import SubmitQueue
from vidjobs.reaper.recovery import Context, on_recovery_due

DELIVERY = Delivery(attempt=1, subject=RECOVERY)


@pytest.fixture
async def ctx(pool: asyncpg.Pool) -> AsyncIterator[Context]:
    """A reaper context over the real database. Its relay never runs, so every event the check hands off
    stays in the outbox where the test can count it."""
    settings = Settings(recovery_interval_s=60)
    rt = Runtime(name="reaper", settings=settings, pool=pool, nc=None, js=None, relay=Relay(pool, None))  # type: ignore[arg-type]
    await pool.execute("INSERT INTO accounts (id, name, credits_balance) VALUES ('acct_r', 'r', 10000)")
    yield Context(rt=rt, policies=Policies(settings), owner="reaper-a")


async def _rendering_job(pool: asyncpg.Pool, *, due_in_s: float = -1) -> jobs.JobRow:
    """A submitted job whose recovery check is due (or not yet), as a provider that went quiet leaves it."""
    async with pool.acquire() as conn, conn.transaction():
        job = await creation.create(conn, account_id="acct_r", request=JobRequest(model="fake/default", prompt="p"),
                                    estimated_credits=10, recovery_delay_s=60)
        await transition(conn, job.id, JobStatus.SUBMITTED, reason="accepted",
                         update=JobUpdate(provider_job_id=f"rnd_{job.id}"))
        await conn.execute("UPDATE jobs SET recover_at = now() + make_interval(secs => $2) WHERE id = $1",
                           job.id, due_in_s)
        await conn.execute("DELETE FROM outbox")
        return await jobs.fetch(conn, job.id)


def _check(job: jobs.JobRow) -> RecoveryDue:
    assert job.recover_at is not None
    return RecoveryDue(job_id=job.id, due_at=job.recover_at)


async def _handed_off(pool: asyncpg.Pool) -> list[str]:
    return [bytes(r["payload"]).decode() for r in await pool.fetch(
        "SELECT payload FROM outbox WHERE subject = 'vidjobs.work.poll' ORDER BY id")]


async def test_a_quiet_job_is_handed_to_the_poller_and_checked_again_later(ctx, pool):
    job = await _rendering_job(pool)

    await on_recovery_due(ctx, _check(job), DELIVERY)

    assert len(await _handed_off(pool)) == 1
    after = await jobs.fetch(pool, job.id)
    assert after.recover_at > datetime.now(UTC) + timedelta(seconds=50)
    assert await pool.fetchval("SELECT owner FROM recovery_leases WHERE job_id = $1", job.id) == "reaper-a"


async def test_callback_won_the_race_so_the_check_does_nothing(ctx, pool):
    job = await _rendering_job(pool)
    check = _check(job)
    async with pool.acquire() as conn:  # the callback path finishes the job first
        await transition(conn, job.id, JobStatus.DOWNLOADING, reason="callback")
        await transition(conn, job.id, JobStatus.COMPLETED, reason="stored")
    await pool.execute("DELETE FROM outbox")

    await on_recovery_due(ctx, check, DELIVERY)

    assert await _handed_off(pool) == []
    assert await pool.fetchval("SELECT count(*) FROM recovery_leases") == 0


async def test_a_check_not_yet_due_is_deferred_until_it_is(ctx, pool):
    job = await _rendering_job(pool, due_in_s=30)

    with pytest.raises(Redeliver) as deferred:
        await on_recovery_due(ctx, _check(job), DELIVERY)

    assert 25 < deferred.value.delay <= 30
    assert await _handed_off(pool) == []


async def test_a_check_delivered_twice_hands_off_once(ctx, pool):
    job = await _rendering_job(pool)
    check = _check(job)

    results = await asyncio.gather(*(on_recovery_due(ctx, check, DELIVERY) for _ in range(2)),
                                   return_exceptions=True)
    later = await on_recovery_due(ctx, check, Delivery(attempt=2, subject=RECOVERY))  # and once more, late

    assert len(await _handed_off(pool)) == 1
    assert all(r is None or isinstance(r, Redeliver) for r in results), results
    assert later is None


async def test_two_reapers_never_recover_one_job_at_once(ctx, pool):
    job = await _rendering_job(pool)
    other = Context(rt=ctx.rt, policies=ctx.policies, owner="reaper-b")
    # Hold the row so both reapers are inside their checks together.
    async with pool.acquire() as blocker:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("SELECT 1 FROM jobs WHERE id = $1 FOR UPDATE", job.id)
        racing = [asyncio.create_task(on_recovery_due(c, _check(job), DELIVERY)) for c in (ctx, other)]
        await asyncio.sleep(0.3)
        await tx.rollback()
        results = await asyncio.gather(*racing, return_exceptions=True)

    assert len(await _handed_off(pool)) == 1, results
    assert sum(isinstance(r, Redeliver) for r in results) <= 1


async def test_a_job_deleted_meanwhile_is_left_alone(ctx, pool):
    job = await _rendering_job(pool)
    check = _check(job)
    async with pool.acquire() as conn, conn.transaction():
        assert await deletion.soft_delete(conn, job.id, job.account_id)

    await on_recovery_due(ctx, check, DELIVERY)

    assert await _handed_off(pool) == []
    assert (await jobs.fetch(pool, job.id)).recover_at is None


async def test_a_hand_off_that_fails_once_leaves_nothing_and_succeeds_when_redelivered(ctx, pool):
    job = await _rendering_job(pool)
    check = _check(job)
    # The database refuses the first hand-off, as a failover or a full disk would. (A sequence, because it is
    # the one thing the refused transaction's rollback does not undo.)
    await pool.execute("""
        CREATE SEQUENCE refusals;
        CREATE FUNCTION refuse_once() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF nextval('refusals') = 1 THEN
                RAISE EXCEPTION 'hand-off refused once';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER refuse_once BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION refuse_once();
    """)

    with pytest.raises(asyncpg.RaiseError):
        await on_recovery_due(ctx, check, DELIVERY)
    # The failed attempt rolled back whole: no lease held, no hand-off, the job still due.
    assert await pool.fetchval("SELECT count(*) FROM recovery_leases") == 0
    assert await _handed_off(pool) == []
    assert (await jobs.fetch(pool, job.id)).recover_at == job.recover_at

    await on_recovery_due(ctx, check, Delivery(attempt=2, subject=RECOVERY))

    assert len(await _handed_off(pool)) == 1


async def test_a_retrying_job_goes_back_to_the_queue_when_its_backoff_ends(ctx, pool):
    job = await _rendering_job(pool)
    async with pool.acquire() as conn:
        past = datetime.now(UTC) - timedelta(seconds=1)
        await transition(conn, job.id, JobStatus.RETRYING, reason="provider down",
                         update=JobUpdate(retry_at=past, recover_at=past))
    job = await jobs.fetch(pool, job.id)

    await on_recovery_due(ctx, _check(job), DELIVERY)

    after = await jobs.fetch(pool, job.id)
    assert after.status is JobStatus.PENDING and after.attempt == 2
    # On the submit subject: the job wants a slot again. Nothing waited when its render's slot came free,
    # so that sent no wake-up.
    sent = [events.decode(events.SUBMIT, bytes(r["payload"])) for r in await pool.fetch(
        "SELECT payload FROM outbox WHERE subject = 'vidjobs.work.submit' ORDER BY id")]
    assert sent == [JobQueued(job_id=job.id)]


async def test_the_next_check_is_not_held_up_by_the_previous_lease(ctx, pool):
    job = await _rendering_job(pool)
    await on_recovery_due(ctx, _check(job), DELIVERY)
    # Time passes: the job's next check comes due, and another reaper picks it up.
    await pool.execute("UPDATE jobs SET recover_at = now() - interval '1 second' WHERE id = $1", job.id)
    await pool.execute("UPDATE recovery_leases SET expires_at = (SELECT recover_at FROM jobs WHERE id = $1)", job.id)
    other = Context(rt=ctx.rt, policies=ctx.policies, owner="reaper-b")

    await on_recovery_due(other, _check(await jobs.fetch(pool, job.id)), DELIVERY)

    assert len(await _handed_off(pool)) == 2


async def _never_looked_at(pool: asyncpg.Pool) -> jobs.JobRow:
    """A job queued a while ago whose first message the submitter has not reached: its check is due."""
    async with pool.acquire() as conn, conn.transaction():
        job = await creation.create(conn, account_id="acct_r", request=JobRequest(model="fake/default", prompt="p"),
                                    estimated_credits=10, recovery_delay_s=-1)
        await conn.execute("DELETE FROM outbox")
        return await jobs.fetch(conn, job.id)


async def _submits(pool: asyncpg.Pool) -> int:
    return await pool.fetchval("SELECT count(*) FROM outbox WHERE subject = 'vidjobs.work.submit'")


async def test_a_waiting_jobs_check_sends_no_second_message_while_the_submitter_is_behind(ctx, pool, nats_url):
    """A burst of creates queues more messages than the submitter handles before their first recovery checks
    come due. A check that finds its job not yet looked at while the submitter still has messages it has not
    been handed defers: the job's own message is in that queue. Sending another would only double the queue
    (a backlog of 100,000 jobs then never settles). With nothing queued, the message was lost: hand it off."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    try:
        await bus.ensure_streams(js)
        spec = bus.ConsumerSpec(durable=events.SUBMIT_DURABLE, subject=events.SUBMIT, handler=None,  # type: ignore[arg-type]
                                ack_wait_s=30, max_deliver=5)
        await js.add_consumer(bus.WORK_STREAM, config=bus.consumer_config(spec))
        queue = SubmitQueue(js, ttl_s=0)
        behind = Context(rt=ctx.rt, policies=ctx.policies, owner="reaper-a", submit_queue=queue)
        queued = await js.publish(events.SUBMIT, events.encode(JobQueued(job_id="job_ahead")))

        job = await _never_looked_at(pool)
        await on_recovery_due(behind, _check(job), DELIVERY)
        deferred = await jobs.fetch(pool, job.id)
        sent_while_behind = await _submits(pool)

        await js.delete_msg(bus.WORK_STREAM, queued.seq)  # the submitter caught up
        await pool.execute("UPDATE jobs SET recover_at = now() - interval '1 second' WHERE id = $1", job.id)
        await pool.execute("DELETE FROM recovery_leases")
        await on_recovery_due(behind, _check(await jobs.fetch(pool, job.id)), DELIVERY)
        sent_after = await _submits(pool)
    finally:
        await nc.close()

    assert sent_while_behind == 0
    assert deferred.recover_at > datetime.now(UTC) + timedelta(seconds=50)
    assert sent_after == 1


async def _waiting_on_a_lock(pool: asyncpg.Pool) -> bool:
    return await pool.fetchval("SELECT count(*) > 0 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                               "AND datname = current_database()")


async def test_a_check_racing_the_submitters_park_leaves_the_job_parked(ctx, pool):
    """The submitter parks a job (no message, no check: it waits for a slot to be handed to it) while that
    job's first check is being judged from the row as it was before. The check must not schedule a look at a
    job that is now parked, nor send it another message: the park wins, as it would had it come first. (A
    fault run's backlog once found one of 200 parked jobs still holding a check the race had put back.)"""
    job = await _never_looked_at(pool)
    async with pool.acquire() as submitter, submitter.transaction():
        await waiting.set_wait_reason(submitter, job.id, "the provider has no render slot free", park=True)
        check = asyncio.create_task(on_recovery_due(ctx, _check(job), DELIVERY))
        for _ in range(200):  # until the check waits for the submitter's row lock (or has finished)
            if check.done() or await _waiting_on_a_lock(pool):
                break
            await asyncio.sleep(0.02)
    await check

    after = await jobs.fetch(pool, job.id)
    assert after.waited_at is not None
    assert after.recover_at is None, "the parked job holds a check the race put back"
    assert await _submits(pool) == 0


async def test_a_check_and_a_callback_on_one_job_wait_for_each_other_and_never_deadlock(ctx, pool):
    """A provider callback's transaction updates the job (its progress), then moves its next check
    (`heard_from`, holding the row), while the job's check comes due in the reaper. The reaper holds nothing of
    the job while it waits for the row (its lease, whose key refers to the job, comes after), and neither asks
    for more of the row than an update does: the callback finishes, then the check runs on what it left."""
    job = await _rendering_job(pool)
    async with pool.acquire() as poller:
        async with poller.transaction():
            await poller.execute("UPDATE jobs SET updated_at = clock_timestamp() WHERE id = $1", job.id)
            check = asyncio.create_task(on_recovery_due(ctx, _check(job), DELIVERY))
            for _ in range(200):  # until the check waits for the callback's row lock (or has finished)
                if check.done() or await _waiting_on_a_lock(pool):
                    break
                await asyncio.sleep(0.02)
            await recovery_checks.heard_from(poller, job, None, ctx.rt.settings)
        await check
