"""The operator commands as an operator runs them: `vidjobs accounts|keys|credits|submissions|rates ...` in a
subprocess, against a fresh migrated database named by VIDJOBS_DATABASE_URL."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.support import operator_command
from vidjobs.cli.exitcodes import Exit
from vidjobs.common import credits, ratecard, switch
from vidjobs.gateway import accounts
from vidjobs.gateway.accounts import Account, hash_key


@pytest.fixture
def vidjobs(database_url: str):
    return operator_command(database_url)


def _json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines()]


async def _add_jobs(pool, account_id: str) -> None:
    """One job rendering, one completed, one waiting but deleted: one active job."""
    await pool.executemany(
        """
        INSERT INTO jobs (id, account_id, status, model, provider, request, deleted_at)
        VALUES ($1, $2, $3, 'fake/default', 'fake', '{}', CASE WHEN $4 THEN now() END)
        """,
        [(f"job_{account_id}_{n}", account_id, status, deleted)
         for n, (status, deleted) in enumerate([("processing", False), ("completed", False), ("pending", True)])],
    )


# An account the operator made: no platform, no plan, its own limits, never disabled by a platform.
OPERATORS = {"platform_id": None, "external_id": None, "plan": None, "max_queued_jobs": None, "disabled_at": None}


async def test_accounts_create_list_and_set(vidjobs, pool):
    made, plain = await asyncio.gather(
        vidjobs("accounts", "create", "acme", "--credits", "500", "--concurrency", "3", "--daily-cap", "2000",
                "--max-job", "300", "--rate", "2.5", "--burst", "5"),
        vidjobs("accounts", "create", "plain"),
    )
    assert (made.code, plain.code) == (0, 0), made.err + plain.err
    # Only the key, on one line: `KEY=$(vidjobs accounts create ...)` works.
    key = made.out.strip()
    assert made.out == f"{key}\n" and key.startswith("vj_")
    acme = await accounts.by_key(pool, key)
    assert acme == Account(id=acme.id, name="acme", concurrent_jobs=3, credits_balance=500, credits_reserved=0,
                           daily_spend_cap=2000, max_job_credits=300, requests_per_s=2.5, request_burst=5)
    await _add_jobs(pool, acme.id)

    listed, table = await asyncio.gather(vidjobs("accounts", "list", "--json"), vidjobs("accounts", "list"))
    rows = {row["name"]: row for row in _json_lines(listed.out)}
    assert rows["acme"] == {
        "id": acme.id, "name": "acme", "concurrent_jobs": 3, "credits_balance": 500, "credits_reserved": 0,
        "daily_spend_cap": 2000, "max_job_credits": 300, "requests_per_s": 2.5, "request_burst": 5,
        "fallback_models": [], "storage_quota_bytes": None, "live_keys": 1, "active_jobs": 1, **OPERATORS,
    }
    assert rows["plain"] | {"id": None} == {
        "id": None, "name": "plain", "concurrent_jobs": 2, "credits_balance": 10_000, "credits_reserved": 0,
        "daily_spend_cap": None, "max_job_credits": None, "requests_per_s": None, "request_burst": None,
        "fallback_models": [], "storage_quota_bytes": None, "live_keys": 1, "active_jobs": 0, **OPERATORS,
    }
    header, *lines = table.out.splitlines()
    assert header.split()[:4] == ["id", "name", "balance", "reserved"] and "active jobs" in header
    assert [acme.id, "acme", "500", "0", "3", "2000", "300", "2.5", "5", "1", "1"] in [ln.split() for ln in lines]
    assert len(lines) == 2

    changed, unknown = await asyncio.gather(
        vidjobs("accounts", "set", acme.id, "--concurrency", "1", "--daily-cap", "none", "--rate", "10",
                "--storage-quota", "1000000"),
        vidjobs("accounts", "set", "acct_nope", "--burst", "2"),
    )
    assert changed.code == 0 and changed.out == "", changed.err
    after = await accounts.fetch(pool, acme.id)
    # What was named changed (a cap cleared with `none`); the rest stayed.
    assert (after.concurrent_jobs, after.daily_spend_cap, after.requests_per_s) == (1, None, 10.0)
    assert after.storage_quota_bytes == 1_000_000
    assert (after.max_job_credits, after.request_burst, after.credits_balance) == (300, 5, 500)
    assert unknown.code == Exit.NOT_FOUND and unknown.out == ""
    assert unknown.err.startswith("vidjobs: no account 'acct_nope'") and "vidjobs accounts list" in unknown.err


async def test_keys_several_per_account_stored_hashed_and_revocable(vidjobs, pool):
    async with pool.acquire() as conn:
        account_id, first = await accounts.create_account(conn, "keyed", credits=0, concurrency=1)
    ci, deploy = await asyncio.gather(vidjobs("keys", "create", account_id, "--name", "ci"),
                                      vidjobs("keys", "create", account_id, "--name", "deploy"))
    ci_key, deploy_key = ci.out.strip(), deploy.out.strip()
    assert ci.out == f"{ci_key}\n" and deploy.out == f"{deploy_key}\n"
    keys = [first, ci_key, deploy_key]
    for key in keys:
        assert (await accounts.by_key(pool, key)).id == account_id

    # Stored hashed: no plaintext key anywhere in the table, one hash per key.
    stored = await pool.fetch("SELECT k::text AS row, key_hash FROM api_keys k")
    assert not [key for key in keys for row in stored if key in row["row"]]
    assert {row["key_hash"] for row in stored} == {hash_key(key) for key in keys}

    listed = await vidjobs("keys", "list", account_id, "--json")
    by_name = {row["name"]: row for row in _json_lines(listed.out)}
    assert set(by_name) == {"", "ci", "deploy"}
    assert by_name["ci"]["prefix"] == ci_key[:8] and by_name["ci"]["revoked_at"] is None
    assert set(by_name["ci"]) == {"id", "account_id", "name", "prefix", "created_at", "last_used_at", "revoked_at"}
    assert not [key for key in keys if key in listed.out]

    ci_id = by_name["ci"]["id"]
    revoked = await vidjobs("keys", "revoke", ci_id)
    assert revoked.code == 0 and revoked.out == "", revoked.err
    # Refused at once; the account's other keys go on working.
    assert await accounts.by_key(pool, ci_key) is None
    assert (await accounts.by_key(pool, deploy_key)).id == account_id

    again, unknown, orphan, table = await asyncio.gather(
        vidjobs("keys", "revoke", ci_id), vidjobs("keys", "revoke", "key_nope"),
        vidjobs("keys", "create", "acct_nope"), vidjobs("keys", "list", account_id),
    )
    assert again.code == 0 and "already revoked" in again.err
    assert unknown.code == Exit.NOT_FOUND and unknown.err.startswith("vidjobs: no API key 'key_nope'")
    assert orphan.code == Exit.NOT_FOUND and orphan.out == ""
    assert orphan.err.startswith("vidjobs: no account 'acct_nope'")
    rows = {line.split()[0]: line for line in table.out.splitlines()[1:]}
    assert len(rows) == 3 and rows[ci_id].endswith("Z") and rows[by_name["deploy"]["id"]].endswith("-")
    assert await pool.fetchval("SELECT count(*) FROM api_keys WHERE account_id = $1", account_id) == 3


async def test_credits_grant_ledger_and_refused_withdrawal(vidjobs, pool):
    async with pool.acquire() as conn:
        account_id, _ = await accounts.create_account(conn, "payer", credits=1000, concurrency=1)
    granted = await vidjobs("credits", "grant", account_id, "500", "--note", "welcome bonus")
    assert granted.code == 0 and granted.out == "1500\n", granted.err

    # A running job holds 1200, so 300 is free.
    async with pool.acquire() as conn, conn.transaction():
        await credits.reserve(conn, account_id=account_id, job_id="job_held", amount=1200)
    refused = await vidjobs("credits", "grant", account_id, "-400")
    assert refused.code == Exit.REFUSED and refused.out == ""
    assert refused.err.startswith("vidjobs: cannot take back 400 credits")
    after = await accounts.fetch(pool, account_id)
    assert (after.credits_balance, after.credits_reserved) == (1500, 1200)

    ledger, newest = await asyncio.gather(vidjobs("credits", "ledger", account_id, "--json"),
                                          vidjobs("credits", "ledger", account_id, "--limit", "1"))
    entries = _json_lines(ledger.out)
    # Newest first; the refused withdrawal wrote nothing.
    assert [(e["kind"], e["balance_change"], e["reserved_change"]) for e in entries] == [
        ("reserve", 0, 1200), ("grant", 500, 0), ("grant", 1000, 0)]
    assert entries[1]["note"] == "welcome bonus" and entries[1]["balance_after"] == 1500
    total = await pool.fetchval("SELECT sum(balance_change) FROM credit_ledger WHERE account_id = $1", account_id)
    assert total == after.credits_balance
    header, *lines = newest.out.splitlines()
    assert "balance" in header and len(lines) == 1 and "reserve" in lines[0] and "job_held" in lines[0]


async def test_submissions_pause_status_and_resume(vidjobs, pool):
    paused = await vidjobs("submissions", "pause", "--reason", "provider incident")
    assert paused.code == 0 and paused.out == "", paused.err
    state = await switch.submissions(pool)
    assert (state.paused, state.reason) == (True, "provider incident")

    status = await vidjobs("submissions", "status")
    assert status.out.startswith("submissions: paused") and "provider incident" in status.out

    resumed = await vidjobs("submissions", "resume")
    assert resumed.code == 0
    status = await vidjobs("submissions", "status", "--json")
    assert json.loads(status.out) | {"changed_at": None} == {"paused": False, "reason": "", "changed_at": None}
    assert (await switch.submissions(pool)).paused is False


async def test_rates_set_show_and_a_bad_card(vidjobs, pool, tmp_path):
    good = tmp_path / "card.json"
    good.write_text(json.dumps({"credits_per_usd": 120, "note": "summer prices", "prices": [
        {"model": "*", "resolution": "720p", "credits_per_second": 12},
        {"model": "fake/*", "resolution": "1080p", "credits_per_second": 7.5},
    ]}))
    bad_value = tmp_path / "free.json"
    bad_value.write_text(json.dumps({"credits_per_usd": 100, "prices": [
        {"model": "*", "resolution": "720p", "credits_per_second": 0}]}))
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"credit_per_usd": 100, "prices": []}))
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps({"credits_per_usd": 100, "prices": [
        {"model": "*", "resolution": "720p", "credits_per_second": 1},
        {"model": "*", "resolution": "720p", "credits_per_second": 2}]}))

    published, zero, misspelt, doubled = await asyncio.gather(*(
        vidjobs("rates", "set", str(path)) for path in (good, bad_value, typo, twice)))
    assert published.code == 0 and published.out == "2\n", published.err
    assert zero.code == 2 and zero.err.startswith("vidjobs: ") and "$.prices[0].credits_per_second" in zero.err
    assert misspelt.code == 2 and "credit_per_usd" in misspelt.err
    assert doubled.code == 2 and "$.prices[1]" in doubled.err and "priced twice" in doubled.err
    assert await pool.fetchval("SELECT max(version) FROM rate_cards") == 2  # the bad cards made nothing

    shown, shown_json = await asyncio.gather(vidjobs("rates", "show"), vidjobs("rates", "show", "--json"))
    title, header, *lines = shown.out.splitlines()
    assert title.startswith("rate card v2") and "120 credits per USD" in title and "summer prices" in title
    assert sorted(line.split() for line in lines) == [["*", "720p", "12"], ["fake/*", "1080p", "7.5"]]
    card = json.loads(shown_json.out)
    assert (card["version"], card["credits_per_usd"]) == (2, 120)
    assert card["prices"] == [{"model": "*", "resolution": "720p", "credits_per_second": 12.0},
                              {"model": "fake/*", "resolution": "1080p", "credits_per_second": 7.5}]
    assert (await ratecard.current(pool)).note == "summer prices"
