"""`queue_position`: a waiting job's place among its account's waiting jobs, made at read time, moving up as
jobs ahead leave the queue; the provider's own position once submitted; null otherwise. No submitter runs
here, so jobs stay waiting until a test moves them."""

from __future__ import annotations

import asyncio

import pytest

from tests.gateway_harness import auth, drive, gateway_settings, read_event, running_gateway
from vidjobs.common import provider_reports
from vidjobs.common.states import JobStatus


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url)
    async with running_gateway(settings) as harness:
        yield harness


async def positions(h, key: str, ids: list[str]) -> list[int | None]:
    return [(await h.get(key, f"/v1/jobs/{job_id}"))[1]["queue_position"] for job_id in ids]


async def test_waiting_jobs_are_numbered_in_order_and_move_up_when_one_leaves(h):
    key = await h.key()
    created = [(await h.post_job(key))[1] for _ in range(3)]
    ids = [job["id"] for job in created]

    assert [job["queue_position"] for job in created] == [1, 2, 3]
    assert await positions(h, key, ids) == [1, 2, 3]

    await h.client.post(f"/v1/jobs/{ids[0]}/cancel", headers=auth(key))

    assert await positions(h, key, ids) == [None, 1, 2]


async def test_the_list_shows_the_same_positions_on_every_page(h):
    key = await h.key()
    ids = [(await h.post_job(key))[1]["id"] for _ in range(4)]
    await h.client.delete(f"/v1/jobs/{ids[1]}", headers=auth(key))

    _, first = await h.get(key, "/v1/jobs?limit=2")
    _, second = await h.get(key, f"/v1/jobs?limit=2&cursor={first['next_cursor']}")

    shown = {job["id"]: job["queue_position"] for job in first["data"] + second["data"]}
    assert shown == {ids[3]: 3, ids[2]: 2, ids[0]: 1}


async def test_another_accounts_jobs_do_not_count(h):
    mine, theirs = await h.key(), await h.key()
    await h.post_job(theirs)
    first = (await h.post_job(mine))[1]
    await h.post_job(theirs)
    second = (await h.post_job(mine))[1]

    assert (first["queue_position"], second["queue_position"]) == (1, 2)
    _, listed = await h.get(mine, "/v1/jobs")
    assert [job["queue_position"] for job in listed["data"]] == [2, 1]


async def test_only_waiting_jobs_have_a_place_and_a_submitted_one_shows_the_providers(h):
    key = await h.key()
    ids = [(await h.post_job(key))[1]["id"] for _ in range(3)]

    await drive(h.pool, ids[0], JobStatus.SUBMITTED)
    async with h.pool.acquire() as conn, conn.transaction():
        await provider_reports.record_queue_position(conn, ids[0], 7)  # as fal reports its own queue
    await drive(h.pool, ids[1], JobStatus.SUBMITTED, JobStatus.PROCESSING)

    assert await positions(h, key, ids) == [7, None, 1]


async def test_a_stream_sends_the_new_position_when_a_job_ahead_leaves(h):
    key = await h.key()
    ids = [(await h.post_job(key))[1]["id"] for _ in range(3)]
    resp = await h.client.get(f"/v1/jobs/{ids[2]}/stream", headers=auth(key))
    _, first = await read_event(resp)
    assert first["queue_position"] == 3

    # Job 1 leaving sends a hint about its account's queue, on which the stream of job 3 rereads it.
    await h.client.post(f"/v1/jobs/{ids[0]}/cancel", headers=auth(key))
    _, moved = await asyncio.wait_for(read_event(resp), 10)
    await h.client.delete(f"/v1/jobs/{ids[1]}", headers=auth(key))
    _, next_up = await asyncio.wait_for(read_event(resp), 10)

    assert (moved["queue_position"], next_up["queue_position"]) == (2, 1)
    assert moved["status"] == next_up["status"] == "pending"
    resp.close()


async def test_a_stream_of_a_waiting_job_sends_nothing_while_nothing_changes(h):
    key = await h.key()
    _, job = await h.post_job(key)
    resp = await h.client.get(f"/v1/jobs/{job['id']}/stream", headers=auth(key))
    await read_event(resp)

    # No hint comes and no timer of its own fires: no event, since the job's JSON is unchanged.
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(read_event(resp), 1.0)
    resp.close()
