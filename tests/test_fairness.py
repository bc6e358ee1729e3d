"""Sharing render slots through the whole stack: an account's own cap holds across two submitter replicas
while its queue positions move up, a busy account does not hold back another account's first job, and the
platform switch stops new submissions while running jobs finish."""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

import asyncpg
import pytest

from tests.stack import demo_key, running_stack, stack_settings
from tests.support import wait_until
from tests.test_polite import most_in_flight
from vidjobs.cli.supervisor import SERVICES
from vidjobs.common import switch
from vidjobs.common.settings import ProviderLimits

TWO_SUBMITTERS = {**SERVICES, "submitter-2": "vidjobs.submitter"}
UNLIMITED = ProviderLimits(concurrency=1000, rate_per_s=1000, burst=1000)


async def _query(database_url: str, how: str, sql: str, *args: Any) -> Any:
    """One statement on a connection of its own, read with `how` (fetch, fetchval)."""
    conn = await asyncpg.connect(database_url)
    try:
        return await getattr(conn, how)(sql, *args)
    finally:
        await conn.close()


async def _moves(database_url: str, job_ids: list[str]) -> list[asyncpg.Record]:
    return await _query(database_url, "fetch", "SELECT job_id, from_status, to_status, at FROM job_transitions "
                                               "WHERE job_id = ANY($1) ORDER BY at, id", job_ids)


async def _claims(database_url: str, job_ids: list[str]) -> dict[str, asyncpg.Record]:
    """Each job's first claim of a provider slot: its order (id) and when its transaction began."""
    rows = await _query(database_url, "fetch", "SELECT job_id, id, claimed_at FROM provider_submissions "
                                               "WHERE job_id = ANY($1) AND attempt = 1", job_ids)
    return {r["job_id"]: r for r in rows}


async def _database_now(database_url: str) -> datetime:
    return await _query(database_url, "fetchval", "SELECT clock_timestamp()")


async def _rendering(database_url: str, job_ids: list[str]) -> int:
    return await _query(database_url, "fetchval", "SELECT count(*) FROM jobs WHERE id = ANY($1) "
                                                  "AND status IN ('submitted', 'processing')", job_ids)


async def _watch_positions(stack, job_ids: list[str], seen: dict[str, list[int]], stop: asyncio.Event) -> None:
    """Every waiting job's queue_position, as the API shows it, a few times a second."""
    while not stop.is_set():
        for job in await asyncio.gather(*(stack.job(j) for j in job_ids)):
            if job["status"] == "pending" and job["queue_position"] is not None:
                seen.setdefault(job["id"], []).append(job["queue_position"])
        await asyncio.sleep(0.1)


@pytest.mark.slow
async def test_an_accounts_cap_holds_across_two_submitters_and_positions_move_up(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, provider_limits={"fake": UNLIMITED})
    key = await demo_key(database_url, concurrency=1)
    async with running_stack(settings, key=key, services=TWO_SUBMITTERS) as stack:
        made = [await stack.create_job(params={"render_s": 0.4}) for _ in range(6)]
        ids = [j["id"] for j in made]
        seen: dict[str, list[int]] = {}
        stop = asyncio.Event()
        watcher = asyncio.create_task(_watch_positions(stack, ids, seen, stop))
        finals = await asyncio.gather(*(stack.wait_terminal(j, within=120) for j in ids))
        stop.set()
        await watcher
        moves = await _moves(database_url, ids)

    assert [f["status"] for f in finals] == ["completed"] * 6
    observed = most_in_flight(moves)
    print(f"\n6 jobs of an account capped at 1, 2 submitters: at most {observed} rendering at once; "
          f"positions seen: {[sorted(set(p), reverse=True) for p in seen.values()]}")
    assert observed == 1
    # The last job started in place 5 or later (one job rendering, the rest queued in creation order) ...
    assert max(seen[ids[-1]]) >= 4, seen
    for job_id, places in seen.items():
        # ... and every waiting job's place only moved forward, down to 1 before it started.
        assert places == sorted(places, reverse=True), (job_id, places)
        assert places[-1] == 1, (job_id, places)


@pytest.mark.slow
async def test_a_busy_account_does_not_hold_back_another_accounts_first_job(tmp_path, database_url, nats_url):
    cap, render_s, queued = 2, 0.5, 50
    limits = {"fake": ProviderLimits(concurrency=cap, rate_per_s=1000, burst=1000)}
    settings = stack_settings(tmp_path, database_url, nats_url, provider_limits=limits)
    key_a = await demo_key(database_url, concurrency=queued)
    key_b = await demo_key(database_url)
    async with running_stack(settings, key=key_a) as stack:
        a_jobs = await asyncio.gather(*(stack.create_job(params={"render_s": render_s}) for _ in range(queued)))
        a_ids = [j["id"] for j in a_jobs]
        await wait_until(lambda: _rendering(database_url, a_ids), within=30, what="account A to fill the slots")
        await asyncio.sleep(1.5)  # a few slot turns, so B arrives while slots are being handed out
        b_job = await stack.as_key(key_b).create_job(params={"render_s": render_s})
        b_visible = await _database_now(database_url)  # B's row has committed: every later hand-out sees it
        await stack.as_key(key_b).wait_terminal(b_job["id"], within=60)
        await asyncio.gather(*(stack.wait_terminal(j, within=180) for j in a_ids))
        moves = await _moves(database_url, [*a_ids, b_job["id"]])
        claims = await _claims(database_url, [*a_ids, b_job["id"]])

    b_claim = claims[b_job["id"]]
    # A slot is handed out when its claim is written, in a transaction begun at claimed_at; one begun after B
    # was visible reads B in the queue. The job's "submitted" move comes later, after the provider answered,
    # so counting those moves would also count slots handed out before B existed.
    a_after_b = sum(1 for j in a_ids if b_visible <= claims[j]["claimed_at"] and claims[j]["id"] < b_claim["id"])
    a_waiting = sum(1 for j in a_ids if claims[j]["id"] > b_claim["id"])
    b_wait = (b_claim["claimed_at"] - datetime.fromisoformat(b_job["created_at"])).total_seconds()
    print(f"\nA queued {queued} on a provider capped at {cap}; B's first job was handed a slot {b_wait:.2f} s after "
          f"it was created, ahead of {a_waiting} of A's queued jobs; A jobs handed a slot after B was visible "
          f"and before it: {a_after_b}")
    assert a_waiting >= cap * 4  # B really arrived behind a long queue
    assert a_after_b == 0  # the first slot handed out once B could be seen went to B
    assert most_in_flight(moves) <= cap


async def test_the_platform_switch_stops_new_submissions_and_lets_running_jobs_finish(
    tmp_path, database_url, nats_url,
):
    settings = stack_settings(tmp_path, database_url, nats_url, provider_limits={"fake": UNLIMITED})
    async with running_stack(settings) as stack:
        running = await stack.create_job(params={"render_s": 2.0})
        await stack.wait_for_status(running["id"], "submitted", "processing", within=30)
        pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
        try:
            await switch.set_submissions(pool, paused=True, reason="provider invoice review")
            held = await stack.create_job(params={"render_s": 0.1})
            assert (await stack.wait_terminal(running["id"], within=60))["status"] == "completed"

            async def says_why():
                job = await stack.job(held["id"])
                return job if job["queue_reason"] and "paused" in job["queue_reason"] else None

            waiting = await wait_until(says_why, within=30, what="the held job to say why it waits")
            assert waiting["status"] == "pending" and "provider invoice review" in waiting["queue_reason"]
            assert held["id"] not in (await stack.counters())["submissions_by_job"]  # it never reached the provider
            await switch.set_submissions(pool, paused=False)
            done = await stack.wait_terminal(held["id"], within=60)
        finally:
            await pool.close()
    assert done["status"] == "completed"
