"""`GET /v1/account` (credit, the limits in force, today's spend, jobs in flight) and `GET /v1/account/ledger`
(every change of the account's credit, newest first, keyset pagination)."""

from __future__ import annotations

import pytest

from tests.gateway_harness import assert_error, auth, drive, gateway_settings, running_gateway
from vidjobs.common.states import JobStatus
from vidjobs.gateway.accounts import create_account

ENTRY_KEYS = {"id", "kind", "job_id", "balance_change", "reserved_change", "balance_after", "reserved_after", "note",
              "at", "absorbed"}


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def test_the_account_shows_credit_limits_spend_and_jobs(h):
    async with h.pool.acquire() as conn:
        account_id, key = await create_account(conn, "acme", credits=1000, concurrency=3, daily_spend_cap=500,
                                               max_job_credits=200, requests_per_s=5.0, request_burst=10)
    ids = [(await h.post_job(key))[1]["id"] for _ in range(3)]  # 50 credits each
    await drive(h.pool, ids[0], JobStatus.SUBMITTED)
    await drive(h.pool, ids[1], JobStatus.FAILED)  # nothing billed: its 50 are released

    status, account = await h.get(key, "/v1/account")

    assert status == 200
    assert account == {
        "id": account_id, "name": "acme",
        "credits": {"balance": 1000, "reserved": 100, "available": 900},
        "limits": {"concurrent_jobs": 3, "daily_spend_cap": 500, "max_job_credits": 200, "requests_per_s": 5.0,
                   "request_burst": 10, "max_queued_jobs": 1000, "max_open_streams": 100,
                   "max_open_streams_per_key": 50, "max_uploads_per_day": 1000, "max_body_bytes": 65536,
                   "max_upload_bytes": 10 * 1024 * 1024, "max_webhook_endpoints": 20,
                   "webhook_deliveries_in_flight": 16, "webhook_deliveries_per_minute": 600,
                   "max_webhook_manual_retries": 5, "max_exports_in_flight": 10},
        "spent_today": 100, "active_jobs": 2, "queued_jobs": 1, "uploads_today": 0, "fallback_models": [],
        "storage": {"used_bytes": 0, "limit_bytes": 10 * 1024**3, "kept_jobs": 0},
    }


async def test_the_ledger_lists_every_change_newest_first(h):
    account_id, key = await h.account(credits=1000)
    _, job = await h.post_job(key)
    await h.client.post(f"/v1/jobs/{job['id']}/cancel", headers=auth(key))

    status, ledger = await h.get(key, "/v1/account/ledger")

    assert status == 200 and ledger["next_cursor"] is None
    entries = ledger["data"]
    assert all(set(e) == ENTRY_KEYS and e["at"].endswith("Z") for e in entries)
    assert [(e["kind"], e["job_id"], e["balance_change"], e["reserved_change"], e["balance_after"],
             e["reserved_after"]) for e in entries] == [
        ("release", job["id"], 0, -50, 1000, 0),
        ("reserve", job["id"], 0, 50, 1000, 50),
        ("grant", None, 1000, 0, 1000, 0),
    ]
    assert entries[0]["id"] > entries[1]["id"] > entries[2]["id"]


async def test_the_ledger_pages_without_gaps_or_repeats(h):
    _, key = await h.account(credits=10_000)
    for _ in range(4):
        await h.post_job(key)
    _, everything = await h.get(key, "/v1/account/ledger?limit=100")

    seen, cursor = [], None
    while True:
        status, page = await h.get(key, "/v1/account/ledger?limit=2" + (f"&cursor={cursor}" if cursor else ""))
        assert status == 200 and len(page["data"]) <= 2
        seen += [e["id"] for e in page["data"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break

    assert len(everything["data"]) == 5
    assert seen == [e["id"] for e in everything["data"]]


@pytest.mark.parametrize(("query", "status", "name"), [
    ("limit=0", 422, "limit"),
    ("limit=101", 422, "limit"),
    ("cursor=%%%", 400, "cursor"),
    ("cursor=bm90IGEgY3Vyc29y", 400, "cursor"),
    ("colour=red", 422, "colour"),
])
async def test_bad_ledger_parameters_are_named(h, query, status, name):
    code, body = await h.get(await h.key(), f"/v1/account/ledger?{query}")
    assert code == status, body
    assert_error(body, "invalid_input", name)


async def test_a_job_cursor_is_not_a_ledger_cursor(h):
    key = await h.key()
    for _ in range(2):
        await h.post_job(key)
    _, page = await h.get(key, "/v1/jobs?limit=1")
    code, body = await h.get(key, f"/v1/account/ledger?cursor={page['next_cursor']}")
    assert code == 400
    assert_error(body, "invalid_input", "cursor")
