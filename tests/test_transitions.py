"""The transition function against a real PostgreSQL: guarded moves, audit rows, outbox rows."""

from __future__ import annotations

import asyncio

import pytest

from vidjobs.common import creation, deletion, jobs, transitions
from vidjobs.common.jobs import JobRequest
from vidjobs.common.states import LEGAL, JobStatus


async def _account(pool, account_id: str = "acct_t") -> str:
    await pool.execute("INSERT INTO accounts (id, name, credits_balance) VALUES ($1, $1, 1000) ON CONFLICT DO NOTHING",
                       account_id)
    return account_id


async def _job(pool) -> jobs.JobRow:
    account = await _account(pool)
    async with pool.acquire() as conn, conn.transaction():
        return await creation.create(
                conn, account_id=account, request=JobRequest(model="fake/default", prompt="a fox"),
                estimated_credits=10, recovery_delay_s=60,
            )


async def test_create_writes_audit_and_outbox(pool):
    job = await _job(pool)
    assert job.status is JobStatus.PENDING
    audit = await pool.fetch("SELECT from_status, to_status FROM job_transitions WHERE job_id = $1", job.id)
    assert [(r["from_status"], r["to_status"]) for r in audit] == [(None, "pending")]
    subjects = sorted(r["subject"] for r in await pool.fetch("SELECT subject FROM outbox"))
    # No change hint: nothing can listen for a job whose id has not been answered yet (and hints are core NATS
    # messages sent after commit, never outbox rows).
    assert subjects == sorted(["vidjobs.work.submit", "vidjobs.work.recovery"])


async def test_legal_move_is_applied_once(pool):
    job = await _job(pool)
    async with pool.acquire() as conn:
        first = await transitions.transition(conn, job.id, JobStatus.SUBMITTED, reason="accepted",
                                             update=transitions.JobUpdate(provider_job_id="p1"))
        again = await transitions.transition(conn, job.id, JobStatus.SUBMITTED, reason="accepted")
    assert first is not None and first.from_status is JobStatus.PENDING
    assert first.job.provider_job_id == "p1"
    assert again is None
    audit = await pool.fetch("SELECT to_status FROM job_transitions WHERE job_id = $1 ORDER BY id", job.id)
    assert [r["to_status"] for r in audit] == ["pending", "submitted"]


async def test_illegal_move_is_refused_before_touching_the_row(pool):
    job = await _job(pool)
    async with pool.acquire() as conn:
        with pytest.raises(transitions.IllegalTransition):
            await transitions.transition(conn, job.id, JobStatus.COMPLETED, reason="x",
                                         expect=[JobStatus.PENDING])
        # completed is legal only from downloading: a pending job is left alone.
        assert await transitions.transition(conn, job.id, JobStatus.COMPLETED, reason="x") is None
    assert (await jobs.fetch(pool, job.id)).status is JobStatus.PENDING


async def test_terminal_states_clear_the_recovery_schedule(pool):
    job = await _job(pool)
    assert job.recover_at is not None
    async with pool.acquire() as conn:
        done = await transitions.transition(conn, job.id, JobStatus.CANCELED, reason="owner")
    assert done.job.recover_at is None
    for to in JobStatus:
        async with pool.acquire() as conn:
            if JobStatus.CANCELED in {s for s, t in LEGAL.items() if to in t}:
                assert await transitions.transition(conn, job.id, to, reason="late") is None


async def test_racing_workers_make_one_move(pool):
    job = await _job(pool)

    async def attempt(reason: str):
        async with pool.acquire() as conn:
            return await transitions.transition(conn, job.id, JobStatus.SUBMITTED, reason=reason)

    results = await asyncio.gather(*(attempt(f"worker-{i}") for i in range(5)))
    assert sum(r is not None for r in results) == 1
    count = await pool.fetchval(
        "SELECT count(*) FROM job_transitions WHERE job_id = $1 AND to_status = 'submitted'", job.id)
    assert count == 1


async def _credits(pool, account_id: str = "acct_t") -> tuple[int, int]:
    row = await pool.fetchrow("SELECT credits_balance, credits_reserved FROM accounts WHERE id = $1", account_id)
    return row["credits_balance"], row["credits_reserved"]


async def _reserved_job(pool) -> jobs.JobRow:
    job = await _job(pool)
    await pool.execute("UPDATE accounts SET credits_balance = 100")
    return job


async def test_completion_charges_the_estimate_once(pool):
    job = await _reserved_job(pool)
    async with pool.acquire() as conn:
        for to in (JobStatus.SUBMITTED, JobStatus.DOWNLOADING, JobStatus.COMPLETED, JobStatus.EXPIRED):
            assert await transitions.transition(conn, job.id, to, reason="test") is not None
    assert await _credits(pool) == (90, 0)  # expiry after completion charges nothing more
    assert (await jobs.fetch(pool, job.id)).actual_credits == 10


async def test_cancel_and_delete_give_the_reservation_back(pool):
    canceled, deleted = await _reserved_job(pool), await _reserved_job(pool)
    assert await _credits(pool) == (100, 20)
    async with pool.acquire() as conn, conn.transaction():
        await transitions.transition(conn, canceled.id, JobStatus.CANCELED, reason="owner")
        assert await deletion.soft_delete(conn, deleted.id, deleted.account_id)
        assert not await deletion.soft_delete(conn, deleted.id, deleted.account_id)
    assert await _credits(pool) == (100, 0)


def test_every_legal_move_declares_its_follow_ups():
    from vidjobs.common.states import FOLLOW_UPS, LEGAL, FollowUp, app_events

    F = FollowUp
    assert set(FOLLOW_UPS) == {(src, to) for src, targets in LEGAL.items() for to in targets}
    # A render slot comes free when the job leaves the provider, however it leaves.
    assert FOLLOW_UPS[JobStatus.PROCESSING, JobStatus.DOWNLOADING] == {F.FREE_SLOT, F.TELL_APPS}
    assert FOLLOW_UPS[JobStatus.SUBMITTED, JobStatus.CANCELED] == {F.FREE_SLOT, F.SETTLE_CREDIT, F.ROUTE_OUTCOME,
                                                                  F.TELL_APPS}
    assert FOLLOW_UPS[JobStatus.SUBMITTED, JobStatus.PROCESSING] == {F.TELL_APPS}
    # Ending settles the bill once; expiry comes after completion, which already did.
    assert FOLLOW_UPS[JobStatus.DOWNLOADING, JobStatus.COMPLETED] == {F.SETTLE_CREDIT, F.ROUTE_OUTCOME, F.TELL_APPS}
    assert FOLLOW_UPS[JobStatus.COMPLETED, JobStatus.EXPIRED] == {F.TELL_APPS}
    # A retry keeps the stage people see; its app hears of it as a retry, and its return to the queue is no news.
    assert FOLLOW_UPS[JobStatus.PENDING, JobStatus.RETRYING] == {F.TELL_APPS}
    assert app_events(JobStatus.PROCESSING, JobStatus.RETRYING) == ["job.retrying"]
    assert FOLLOW_UPS[JobStatus.RETRYING, JobStatus.PENDING] == frozenset()
    assert app_events(JobStatus.DOWNLOADING, JobStatus.COMPLETED) == ["job.stage", "job.completed"]
    assert app_events(JobStatus.COMPLETED, JobStatus.EXPIRED) == ["job.stage"]


async def _trail(pool, job_id: str) -> list[tuple[str | None, str, str]]:
    rows = await pool.fetch("SELECT from_status, to_status, reason FROM job_transitions WHERE job_id = $1 ORDER BY id",
                            job_id)
    return [(r["from_status"], r["to_status"], r["reason"]) for r in rows]


async def test_deleting_a_live_job_cancels_it_through_the_transition_and_the_trail_says_so(pool):
    """Deletion ends a live job as a cancel does, by the one function that moves a status: the trail answers
    where the render went, the credit is settled once by the move's follow-up, and the provider is asked to
    stop."""
    job = await _reserved_job(pool)
    async with pool.acquire() as conn:
        await transitions.transition(conn, job.id, JobStatus.SUBMITTED, reason="accepted",
                                     update=transitions.JobUpdate(provider_job_id="r1"))
        async with conn.transaction():
            assert await deletion.soft_delete(conn, job.id, job.account_id)
    row = await jobs.fetch(pool, job.id)
    subjects = [r["subject"] for r in await pool.fetch("SELECT subject FROM outbox ORDER BY id")]
    ledger = await pool.fetch("SELECT kind FROM credit_ledger WHERE job_id = $1 AND kind <> 'reserve'", job.id)

    assert (row.status, row.error.code.value, row.deleted_at is not None) == (JobStatus.CANCELED, "canceled", True)
    assert (await _trail(pool, job.id))[-1] == ("submitted", "canceled", "deleted")
    assert "vidjobs.work.cancel" in subjects and "vidjobs.work.assets_delete" in subjects
    assert [r["kind"] for r in ledger] == ["release"] and await _credits(pool) == (100, 0)


async def test_deleting_a_finished_job_moves_nothing(pool):
    job = await _reserved_job(pool)
    async with pool.acquire() as conn:
        for to in (JobStatus.SUBMITTED, JobStatus.DOWNLOADING, JobStatus.COMPLETED):
            await transitions.transition(conn, job.id, to, reason="test")
        before = await _trail(pool, job.id)
        async with conn.transaction():
            assert await deletion.soft_delete(conn, job.id, job.account_id)
            assert not await deletion.soft_delete(conn, job.id, job.account_id)
    row = await jobs.fetch(pool, job.id)

    assert row.status is JobStatus.COMPLETED and row.deleted_at is not None
    assert await _trail(pool, job.id) == before
    assert await _credits(pool) == (90, 0)


async def test_another_accounts_job_is_not_deleted_nor_moved(pool):
    job = await _job(pool)
    other = await _account(pool, "acct_other")
    async with pool.acquire() as conn, conn.transaction():
        assert not await deletion.soft_delete(conn, job.id, other)
    row = await jobs.fetch(pool, job.id)
    assert row.status is JobStatus.PENDING and row.deleted_at is None
