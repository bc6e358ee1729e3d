"""Credits against a real gateway and database: racing creates never overspend, the guardrails refuse with
402, the rate card prices jobs by version, and the append-only ledger explains every balance."""

from __future__ import annotations

import asyncio
import secrets
from typing import Any

import asyncpg
import pytest

from tests.gateway_harness import assert_error, drive, gateway_settings, running_gateway
from tests.stack import running_stack, stack_settings
from vidjobs.common import attempt_costs, jobs, ratecard
from vidjobs.common.ratecard import Price, RateCardIn
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate
from vidjobs.gateway.accounts import create_account

ESTIMATE = 50  # the README's example job, 5 s at 720p, on the launch card: 10 credits a second


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def _account(h, **options: Any) -> tuple[str, str]:
    settings = {"credits": 100_000, "concurrency": 2, "requests_per_s": 10_000.0, "request_burst": 10_000, **options}
    async with h.pool.acquire() as conn:
        return await create_account(conn, f"money-{secrets.token_hex(3)}", **settings)


async def assert_ledger_explains(pool: asyncpg.Pool, account_id: str) -> list[asyncpg.Record]:
    """The ledger's changes sum to the account's balance and reservation, and each entry's `after` figures
    follow from the one before."""
    entries = await pool.fetch("SELECT * FROM credit_ledger WHERE account_id = $1 ORDER BY id", account_id)
    account = await pool.fetchrow("SELECT credits_balance, credits_reserved FROM accounts WHERE id = $1", account_id)
    balance = reserved = 0
    for entry in entries:
        balance += entry["balance_change"]
        reserved += entry["reserved_change"]
        assert (entry["balance_after"], entry["reserved_after"]) == (balance, reserved), dict(entry)
    assert (balance, reserved) == (account["credits_balance"], account["credits_reserved"])
    return entries


async def test_a_hundred_racing_creates_against_credit_for_three_accept_exactly_three(h):
    account_id, key = await _account(h, credits=3 * ESTIMATE)

    answers = await asyncio.gather(*(h.post_job(key, prompt=f"race {i}") for i in range(100)))

    statuses = sorted(status for status, _ in answers)
    assert statuses == [201] * 3 + [402] * 97, statuses
    for status, body in answers:
        if status == 402:
            assert_error(body, "quota_exhausted", "credits")
            assert body["error"]["retryable"] is False
    assert await h.count("SELECT count(*) FROM jobs WHERE account_id = $1", account_id) == 3
    entries = await assert_ledger_explains(h.pool, account_id)
    assert [e["kind"] for e in entries] == ["grant"] + ["reserve"] * 3
    status, account = await h.get(key, "/v1/account")
    assert status == 200
    assert (account["credits"]["balance"], account["credits"]["reserved"]) == (3 * ESTIMATE, 3 * ESTIMATE)


async def test_cancel_releases_and_completion_charges_with_a_ledger_entry_each(h):
    account_id, key = await _account(h, credits=1000)
    _, canceled = await h.post_job(key)
    _, finished = await h.post_job(key)

    resp = await h.client.post(f"/v1/jobs/{canceled['id']}/cancel", headers={"Authorization": f"Bearer {key}"})
    assert resp.status == 200
    await drive(h.pool, finished["id"], JobStatus.SUBMITTED, JobStatus.DOWNLOADING, JobStatus.COMPLETED)

    entries = await assert_ledger_explains(h.pool, account_id)
    kinds = [(e["kind"], e["job_id"], e["balance_change"], e["reserved_change"]) for e in entries[1:]]
    assert kinds == [
        ("reserve", canceled["id"], 0, ESTIMATE), ("reserve", finished["id"], 0, ESTIMATE),
        ("release", canceled["id"], 0, -ESTIMATE), ("charge", finished["id"], -ESTIMATE, -ESTIMATE),
    ]
    costs = {j: await h.pool.fetchrow("SELECT estimated_credits, actual_credits FROM jobs WHERE id = $1", j)
             for j in (canceled["id"], finished["id"])}
    assert dict(costs[canceled["id"]]) == {"estimated_credits": ESTIMATE, "actual_credits": 0}
    assert dict(costs[finished["id"]]) == {"estimated_credits": ESTIMATE, "actual_credits": ESTIMATE}


async def test_the_provider_reported_cost_is_charged_never_above_the_estimate(h):
    account_id, key = await _account(h, credits=1000)
    _, cheap = await h.post_job(key)
    _, dear = await h.post_job(key)
    _, billed_then_failed = await h.post_job(key)
    for job_id, reported in ((cheap["id"], 30), (dear["id"], 80), (billed_then_failed["id"], 20)):
        await drive(h.pool, job_id, JobStatus.SUBMITTED)
        await h.pool.execute("UPDATE jobs SET provider_cost_credits = $2 WHERE id = $1", job_id, reported)
    await drive(h.pool, cheap["id"], JobStatus.DOWNLOADING, JobStatus.COMPLETED)
    await drive(h.pool, dear["id"], JobStatus.DOWNLOADING, JobStatus.COMPLETED)
    await drive(h.pool, billed_then_failed["id"], JobStatus.DOWNLOADING, JobStatus.FAILED)

    actual = {r["id"]: r["actual_credits"] for r in await h.pool.fetch(
        "SELECT id, actual_credits FROM jobs WHERE account_id = $1", account_id)}
    assert actual == {cheap["id"]: 30, dear["id"]: ESTIMATE, billed_then_failed["id"]: 20}
    entries = await assert_ledger_explains(h.pool, account_id)
    assert entries[-1]["balance_after"] == 1000 - 30 - ESTIMATE - 20
    assert "capped at the estimate" in next(e["note"] for e in entries if e["job_id"] == dear["id"]
                                            and e["kind"] == "charge")
    status, job = await h.get(key, f"/v1/jobs/{cheap['id']}")
    # Written straight onto the row: no attempt's bill was recorded, so nothing is known to be absorbed.
    assert status == 200 and job["cost"] == {"estimated_credits": ESTIMATE, "actual_credits": 30,
                                             "provider_credits": None, "absorbed_credits": 0}


async def test_the_per_job_maximum_and_the_daily_cap_refuse_with_402(h):
    account_id, key = await _account(h, credits=10_000, max_job_credits=60, daily_spend_cap=120)

    status, body = await h.post_job(key, resolution="1080p")  # 75 credits
    assert status == 402
    assert_error(body, "quota_exhausted", "per-job maximum", "60")
    assert (await h.post_job(key))[0] == 201
    assert (await h.post_job(key))[0] == 201
    status, body = await h.post_job(key)  # 100 committed today, 50 more would pass 120
    assert status == 402
    assert_error(body, "quota_exhausted", "cap", "120")

    first = await h.pool.fetchval("SELECT id FROM jobs WHERE account_id = $1 ORDER BY created_at LIMIT 1", account_id)
    resp = await h.client.post(f"/v1/jobs/{first}/cancel", headers={"Authorization": f"Bearer {key}"})
    assert resp.status == 200  # released: it no longer counts against today's cap
    assert (await h.post_job(key))[0] == 201
    assert await h.count("SELECT count(*) FROM jobs WHERE account_id = $1", account_id) == 3
    await assert_ledger_explains(h.pool, account_id)


async def test_a_new_rate_card_prices_new_jobs_and_leaves_quoted_ones_alone(h):
    account_id, key = await _account(h, credits=10_000)
    _, before = await h.post_job(key)
    async with h.pool.acquire() as conn:
        version = await ratecard.publish(conn, RateCardIn(credits_per_usd=100, note="fake is dearer", prices=[
            Price(model="*", resolution=r, credits_per_second=10) for r in ("480p", "720p", "1080p")
        ] + [Price(model="fake/*", resolution="720p", credits_per_second=20),
             Price(model="fake/special", resolution="720p", credits_per_second=2.5)]))
    _, after = await h.post_job(key)
    _, special = await h.post_job(key, model="fake/special", duration_s=3)

    rows = {r["id"]: (r["estimated_credits"], r["rate_card_version"]) for r in await h.pool.fetch(
        "SELECT id, estimated_credits, rate_card_version FROM jobs WHERE account_id = $1", account_id)}
    assert rows == {before["id"]: (ESTIMATE, 1), after["id"]: (100, version), special["id"]: (8, version)}
    assert after["cost"]["estimated_credits"] == 100


async def test_the_ledger_refuses_changes(h):
    account_id, _ = await _account(h)
    for sql in ("UPDATE credit_ledger SET balance_change = 0", "DELETE FROM credit_ledger", "TRUNCATE credit_ledger"):
        with pytest.raises(asyncpg.RaiseError, match="append-only"):
            await h.pool.execute(sql)
    await assert_ledger_explains(h.pool, account_id)



async def test_through_the_stack_the_providers_reported_cost_is_what_is_charged(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url)
    async with running_stack(settings) as stack:
        made = await asyncio.gather(
            stack.create_job(duration_s=5, params={"render_s": 0.2, "cost_usd": 0.3}),
            stack.create_job(duration_s=5, params={"render_s": 0.2}),
            stack.create_job(duration_s=5, params={"render_s": 0.2, "scenario": "content_rejected"}),
        )
        finals = await asyncio.gather(*(stack.wait_terminal(j["id"], within=60) for j in made))
        async with stack.session.get(f"{stack.url}/v1/account", headers=stack.auth) as resp:
            account = await resp.json()

    assert [(f["status"], f["cost"]) for f in finals] == [
        # $0.30 at 100 credits per USD
        ("completed", {"estimated_credits": ESTIMATE, "actual_credits": 30, "provider_credits": 30,
                       "absorbed_credits": 0}),
        # the fake's list price
        ("completed", {"estimated_credits": ESTIMATE, "actual_credits": ESTIMATE, "provider_credits": ESTIMATE,
                       "absorbed_credits": 0}),
        # never billed: released
        ("failed", {"estimated_credits": ESTIMATE, "actual_credits": 0, "provider_credits": None,
                    "absorbed_credits": 0}),
    ]
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
    try:
        account_id = await pool.fetchval("SELECT account_id FROM jobs WHERE id = $1", made[0]["id"])
        entries = await assert_ledger_explains(pool, account_id)
    finally:
        await pool.close()
    assert account["credits"]["reserved"] == 0
    assert account["credits"]["balance"] == entries[0]["balance_change"] - 30 - ESTIMATE


async def test_creates_racing_settlements_on_one_account_neither_deadlock_nor_drift(h):
    account_id, key = await _account(h, credits=100_000, daily_spend_cap=90_000)
    earlier = [(await h.post_job(key))[1]["id"] for _ in range(40)]
    headers = {"Authorization": f"Bearer {key}"}

    async def cancel(job_id: str) -> int:
        resp = await h.client.post(f"/v1/jobs/{job_id}/cancel", headers=headers)
        return resp.status

    # Each create locks the account and then its day's spend; each cancel settles, touching both as well.
    answers = await asyncio.gather(*(h.post_job(key) for _ in range(40)), *(cancel(j) for j in earlier))

    assert [a[0] if isinstance(a, tuple) else a for a in answers] == [201] * 40 + [200] * 40
    await assert_ledger_explains(h.pool, account_id)
    committed = await h.pool.fetchval("SELECT sum(committed) FROM account_daily_spend WHERE account_id = $1",
                                      account_id)
    assert committed == 40 * ESTIMATE  # the live jobs' estimates; the canceled ones gave theirs back


# --- what the provider billed, per attempt, and what an ending after a finished render owes ---------------

async def _report_cost(h, job_id: str, credits_owed: int) -> None:
    """What the poller stores when a signal carries the provider's bill for the job's current render."""
    job = await jobs.fetch(h.pool, job_id)
    assert job is not None
    async with h.pool.acquire() as conn:
        await attempt_costs.record(conn, job, credits=credits_owed, usd=None)


async def _charge_entry(h, account_id: str, job_id: str) -> asyncpg.Record:
    entries = await assert_ledger_explains(h.pool, account_id)
    return next(e for e in entries if e["job_id"] == job_id and e["kind"] in ("charge", "release"))


async def test_a_later_attempt_is_not_charged_an_earlier_attempts_bill(h):
    account_id, key = await _account(h, credits=1000)
    _, job = await h.post_job(key)
    await drive(h.pool, job["id"], JobStatus.SUBMITTED, update=JobUpdate(provider_job_id="render-1"))
    await _report_cost(h, job["id"], 20)  # attempt 1 billed 20, then failed
    await drive(h.pool, job["id"], JobStatus.RETRYING)
    await drive(h.pool, job["id"], JobStatus.PENDING, update=JobUpdate(attempt=2))
    await drive(h.pool, job["id"], JobStatus.SUBMITTED, update=JobUpdate(provider_job_id="render-2"))
    await drive(h.pool, job["id"], JobStatus.DOWNLOADING, JobStatus.COMPLETED)  # attempt 2 reported nothing

    entry = await _charge_entry(h, account_id, job["id"])
    assert (entry["kind"], entry["balance_change"]) == ("charge", -ESTIMATE), dict(entry)
    assert "the estimate" in entry["note"]
    # The platform paid attempt 1's bill: an entry of its own, which moves no credit.
    absorbed = await h.pool.fetch("SELECT * FROM credit_ledger WHERE job_id = $1 AND kind = 'absorb'", job["id"])
    assert [(e["absorbed"], e["balance_change"], e["reserved_change"]) for e in absorbed] == [(20, 0, 0)]
    status, seen = await h.get(key, f"/v1/jobs/{job['id']}")
    assert status == 200 and seen["cost"] == {"estimated_credits": ESTIMATE, "actual_credits": ESTIMATE,
                                              "provider_credits": 20, "absorbed_credits": 20}


async def test_a_reported_cost_of_zero_falls_back_to_the_rate_card(h):
    account_id, key = await _account(h, credits=1000)
    _, job = await h.post_job(key)
    await drive(h.pool, job["id"], JobStatus.SUBMITTED)
    await _report_cost(h, job["id"], 0)
    await drive(h.pool, job["id"], JobStatus.DOWNLOADING, JobStatus.COMPLETED)

    entry = await _charge_entry(h, account_id, job["id"])
    assert entry["balance_change"] == -ESTIMATE, dict(entry)
    assert "the estimate" in entry["note"]


@pytest.mark.parametrize("end", ["cancel", "delete"])
@pytest.mark.parametrize("reported", [None, 30])
async def test_ending_a_job_whose_render_finished_charges_the_rendered_cost(h, end, reported):
    account_id, key = await _account(h, credits=1000)
    _, job = await h.post_job(key)
    await drive(h.pool, job["id"], JobStatus.SUBMITTED)
    if reported is not None:
        await _report_cost(h, job["id"], reported)
    await drive(h.pool, job["id"], JobStatus.DOWNLOADING)  # the provider finished: it billed us

    path = f"/v1/jobs/{job['id']}" + ("/cancel" if end == "cancel" else "")
    resp = await (h.client.post if end == "cancel" else h.client.delete)(
        path, headers={"Authorization": f"Bearer {key}"})
    assert resp.status in (200, 204)

    owed = ESTIMATE if reported is None else reported
    entry = await _charge_entry(h, account_id, job["id"])
    assert (entry["kind"], entry["balance_change"], entry["reserved_change"]) == ("charge", -owed, -ESTIMATE)
    assert "rendered" in entry["note"], entry["note"]
    assert await h.count("SELECT actual_credits FROM jobs WHERE id = $1", job["id"]) == owed


async def test_ending_a_job_before_its_render_finished_owes_only_what_the_provider_billed(h):
    account_id, key = await _account(h, credits=1000)
    _, job = await h.post_job(key)
    await drive(h.pool, job["id"], JobStatus.SUBMITTED, JobStatus.PROCESSING)
    resp = await h.client.post(f"/v1/jobs/{job['id']}/cancel", headers={"Authorization": f"Bearer {key}"})
    assert resp.status == 200

    entry = await _charge_entry(h, account_id, job["id"])
    assert (entry["kind"], entry["balance_change"]) == ("release", 0), dict(entry)
