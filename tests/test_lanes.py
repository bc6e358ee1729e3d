"""Lanes (`priority`): within one account, its waiting interactive jobs are numbered and submitted ahead of its
waiting batch jobs, each lane oldest first; across accounts the fair order is unchanged, so a batch job keeps
its account's turn. Shown through the gateway alone (places, streams, refusals, idempotency: no submitter
runs, so jobs stay waiting), through the whole stack (the order of submission), and through the planner (the
queue's reads stay index probes with the lane in the indexes)."""

from __future__ import annotations

import asyncio
import json

import asyncpg
import pytest

from tests.gateway_harness import assert_error, auth, gateway_settings, read_event, running_gateway
from tests.stack import demo_key, running_stack, stack_settings
from vidjobs.common import waiting
from vidjobs.common.jobs import Lane
from vidjobs.common.settings import ProviderLimits
from vidjobs.gateway import tenant
from vidjobs.submitter import dispatch

UNLIMITED = {"fake": ProviderLimits(concurrency=1000, rate_per_s=1000, burst=1000)}
ONE_SLOT = {"fake": ProviderLimits(concurrency=1, rate_per_s=1000, burst=1000)}
QUICK = {"render_s": 0.1}


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def _places(h, key: str, ids: list[str]) -> list[int | None]:
    return [(await h.get(key, f"/v1/jobs/{job_id}"))[1]["queue_position"] for job_id in ids]


async def test_interactive_jobs_are_numbered_ahead_of_the_accounts_batch_jobs(h):
    key = await h.key()
    batch = [(await h.post_job(key, priority="batch"))[1] for _ in range(2)]
    interactive = [(await h.post_job(key))[1] for _ in range(2)]
    ids = [job["id"] for job in interactive + batch]

    # Each create answers the place it took: behind its own lane and the lanes before it.
    assert [job["queue_position"] for job in batch + interactive] == [1, 2, 1, 2]
    assert [job["priority"] for job in batch + interactive] == ["batch", "batch", "interactive", "interactive"]
    assert await _places(h, key, ids) == [1, 2, 3, 4]
    _, listed = await h.get(key, "/v1/jobs")
    assert {job["id"]: job["queue_position"] for job in listed["data"]} == dict(zip(ids, [1, 2, 3, 4], strict=True))

    await h.client.post(f"/v1/jobs/{ids[0]}/cancel", headers=auth(key))
    assert await _places(h, key, ids) == [None, 1, 2, 3]
    # A later interactive job still goes ahead of the batch jobs that were there first.
    _, later = await h.post_job(key)
    assert later["queue_position"] == 2
    assert await _places(h, key, ids[1:]) == [1, 3, 4]


async def test_a_batch_jobs_stream_hears_an_interactive_job_go_ahead_of_it(h):
    key = await h.key()
    _, waiting = await h.post_job(key, priority="batch")
    resp = await h.client.get(f"/v1/jobs/{waiting['id']}/stream", headers=auth(key))
    _, first = await read_event(resp)

    await h.post_job(key)  # interactive: it takes the place ahead, and the batch job's stream rereads it
    _, moved = await asyncio.wait_for(read_event(resp), 10)

    assert (first["queue_position"], moved["queue_position"]) == (1, 2)
    assert moved["priority"] == "batch" and moved["status"] == "pending"
    resp.close()


@pytest.mark.parametrize("priority", ["urgent", "BATCH", None, 1])
async def test_a_priority_that_is_not_a_lane_is_refused_naming_the_lanes(h, priority):
    code, body = await h.post_job(await h.key(), priority=priority)

    assert code == 422, body
    assert_error(body, "invalid_input", "priority", "use one of batch, interactive")
    assert await h.count("SELECT count(*) FROM jobs") == 0


async def test_a_replay_with_another_priority_is_another_request(h):
    key = await h.key()
    once = {"Idempotency-Key": "lane-1"}
    _, job = await h.post_job(key, headers=once)
    spelled_out, same = await h.post_job(key, headers=once, priority="interactive")  # the default, written out
    changed, conflict = await h.post_job(key, headers=once, priority="batch")

    assert (spelled_out, same["id"]) == (200, job["id"])
    assert changed == 409
    assert_error(conflict, "conflict", "Idempotency-Key")
    assert await h.count("SELECT count(*) FROM jobs") == 1


async def _submitted_in_order(database_url: str, job_ids: list[str]) -> list[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT job_id FROM job_transitions WHERE job_id = ANY($1) AND to_status = "
                                "'submitted' ORDER BY id", job_ids)
    finally:
        await conn.close()
    return [r["job_id"] for r in rows]


async def _holding_the_slot(stack) -> dict:
    """A render that never ends on its own, at the provider: whatever is created next waits for it."""
    holder = await stack.create_job(params={"scenario": "hang"})
    await stack.wait_for_status(holder["id"], "submitted", "processing", within=30)
    return holder


async def _cancel(stack, job_id: str) -> None:
    async with stack.session.post(f"{stack.url}/v1/jobs/{job_id}/cancel", headers=stack.auth) as resp:
        assert resp.status == 200, await resp.text()


async def test_an_accounts_interactive_jobs_are_submitted_before_its_batch_jobs(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, provider_limits=UNLIMITED)
    key = await demo_key(database_url, concurrency=1)
    async with running_stack(settings, key=key) as stack:
        holder = await _holding_the_slot(stack)
        b1, b2 = [(await stack.create_job(params=QUICK, priority="batch"))["id"] for _ in range(2)]
        i1, i2 = [(await stack.create_job(params=QUICK))["id"] for _ in range(2)]
        waiting = [await stack.job(job_id) for job_id in (i1, i2, b1, b2)]
        await _cancel(stack, holder["id"])  # the account's one slot comes free
        finals = await asyncio.gather(*(stack.wait_terminal(job_id, within=60) for job_id in (i1, i2, b1, b2)))
        order = await _submitted_in_order(database_url, [i1, i2, b1, b2])

    assert [(job["status"], job["queue_position"]) for job in waiting] == [("pending", n) for n in (1, 2, 3, 4)]
    assert [job["status"] for job in finals] == ["completed"] * 4
    assert order == [i1, i2, b1, b2]


async def test_a_batch_job_keeps_its_accounts_turn_against_anothers_interactive_jobs(tmp_path, database_url,
                                                                                     nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, provider_limits=ONE_SLOT)
    key_x = await demo_key(database_url)
    async with running_stack(settings) as stack:
        x = stack.as_key(key_x)
        holder = await _holding_the_slot(stack)  # account Y's, so Y's last turn is the newer one
        y1, y2, y3 = [(await stack.create_job(params=QUICK))["id"] for _ in range(3)]
        xb1, xb2 = [(await x.create_job(params=QUICK, priority="batch"))["id"] for _ in range(2)]
        await _cancel(stack, holder["id"])  # the provider's one slot comes free
        await asyncio.gather(*(stack.wait_terminal(job_id, within=60) for job_id in (y1, y2, y3)),
                             *(x.wait_terminal(job_id, within=60) for job_id in (xb1, xb2)))
        order = await _submitted_in_order(database_url, [y1, y2, y3, xb1, xb2])

    # Turn by turn, as if every job were interactive: X's batch jobs alternate with Y's interactive ones.
    assert order == [xb1, y1, xb2, y2, y3]


async def _plan(pool: asyncpg.Pool, sql: str, *args: object) -> list[dict]:
    """Every node of the statement's plan."""
    raw = await pool.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
    nodes, stack = [], [json.loads(raw)[0]["Plan"]]
    while stack:
        nodes.append(node := stack.pop())
        stack += node.get("Plans", [])
    return nodes


def _reads(nodes: list[dict], index: str) -> list[str]:
    """The index conditions of the plan's scans of `index`."""
    return [n.get("Index Cond", "") for n in nodes if n.get("Index Name") == index]


async def test_the_queues_reads_stay_index_probes_with_the_lane_in_the_indexes(pool):
    """With many finished jobs and deep queues of both lanes, every read of the waiting jobs is served by
    jobs_account_waiting or jobs_provider_waiting in their order (no sort by lane), and none reads the table
    whole."""
    await pool.execute("INSERT INTO accounts (id, name) SELECT 'acct_' || a, 'a' || a FROM generate_series(0, 49) a")
    await pool.execute(
        """
        INSERT INTO jobs (id, account_id, model, provider, request, status, estimated_credits, lane, created_at)
        SELECT 'job_p' || i, 'acct_' || (i % 50), 'fake/default', CASE WHEN i % 7 = 0 THEN 'fake-poll' ELSE 'fake' END,
               '{"model": "fake/default", "prompt": "p"}', (CASE WHEN i % 5 = 0 THEN 'pending' ELSE 'completed'
               END)::job_status, 10, i % 2, now() - make_interval(secs => i)
        FROM generate_series(1, 30000) i
        """)
    await pool.execute("VACUUM ANALYZE jobs")  # as autovacuum leaves a table: statistics and visibility
    job = await pool.fetchrow("SELECT id, account_id FROM jobs WHERE status = 'pending' AND lane = 1 "
                              "ORDER BY created_at LIMIT 1")

    place = await _plan(pool, tenant._ONE_JOB, job["id"], job["account_id"])
    page = await _plan(pool, tenant.page_sql(tenant.JobFilter(), None)[0], job["account_id"], 21)
    count = await _plan(pool, waiting._QUEUE_COUNT, job["account_id"], Lane.BATCH)
    head = await _plan(pool, dispatch._FAIR_HEAD, "fake", 45.0)
    providers = await _plan(pool, waiting._WAITING_PROVIDERS)

    # A job's place: one range of the account's index, up to the job's own (lane, created_at, id).
    assert any("ROW(lane, created_at, id) <=" in cond for cond in _reads(place, "jobs_account_waiting")), place
    # The page's numbering reads the account's index in its order, with no sort in between. (Its places at each
    # provider, for the estimates, sort the account's waiting jobs by provider: at most max_queued_jobs rows.)
    windows = [n for n in page if n["Node Type"] == "WindowAgg"]
    assert any([c.get("Index Name") for c in w["Plans"]] == ["jobs_account_waiting"] for w in windows), page
    assert _reads(count, "jobs_account_waiting"), count
    # Each account's head: one probe of the provider's index per account; the accounts found by a skip scan.
    assert any("account_id = w.account_id" in cond for cond in _reads(head, "jobs_provider_waiting")), head
    assert any("provider = 'fake'" in cond for cond in _reads(head, "jobs_provider_waiting")), head
    assert _reads(providers, "jobs_provider_waiting"), providers
    for nodes in (place, page, count, head, providers):
        assert not [n for n in nodes if n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"], nodes
    for nodes in (place, count, head, providers):
        assert not [n for n in nodes if n["Node Type"] == "Sort" and any("lane" in k for k in n["Sort Key"])], nodes
