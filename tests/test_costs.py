"""Honest costs through the whole stack: every attempt's bill is kept, a job's provider cost is their sum, the
charge stays within the estimate, and what the platform paid beyond it is in the ledger and in `vidjobs usage`."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal

import asyncpg

from tests.stack import running_stack, stack_settings
from tests.support import operator_command

ESTIMATE = 50  # 5 s at 720p on the launch card: 10 credits a second; 100 credits a USD


async def test_a_job_retried_twice_costs_its_three_attempts_and_the_platform_absorbs_the_retries(
        tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=1, recovery_interval_s=1,
                              retry_base_s=0.2, retry_cap_s=1, max_attempts=3)
    async with running_stack(settings) as stack:
        made = await asyncio.gather(
            # Two renders fail after starting, each billed $0.10; the third succeeds, billed $0.30.
            stack.create_job(duration_s=5, params={"scenario": "fail_then_succeed", "render_s": 0.2,
                                                   "failed_cost_usd": 0.1, "cost_usd": 0.3}),
            # One render, billed $0.80: above the 50-credit estimate.
            stack.create_job(duration_s=5, params={"render_s": 0.2, "cost_usd": 0.8}),
        )
        retried, dear = await asyncio.gather(*(stack.wait_terminal(j["id"], within=90) for j in made))
        async with stack.session.get(f"{stack.url}/v1/account/ledger?limit=100", headers=stack.auth) as resp:
            ledger = (await resp.json())["data"]

    assert (retried["status"], retried["attempt"]) == ("completed", 3), retried
    assert retried["cost"] == {"estimated_credits": ESTIMATE, "actual_credits": 30, "provider_credits": 50,
                               "absorbed_credits": 20}
    assert dear["status"] == "completed"
    assert dear["cost"] == {"estimated_credits": ESTIMATE, "actual_credits": ESTIMATE, "provider_credits": 80,
                            "absorbed_credits": 30}

    absorbed = {e["job_id"]: e for e in ledger if e["kind"] == "absorb"}
    assert {j: e["absorbed"] for j, e in absorbed.items()} == {retried["id"]: 20, dear["id"]: 30}
    assert all(e["balance_change"] == 0 and e["reserved_change"] == 0 for e in absorbed.values())
    assert "3 attempt(s)" in absorbed[retried["id"]]["note"]
    charged = {e["job_id"]: -e["balance_change"] for e in ledger if e["kind"] == "charge"}
    assert charged == {retried["id"]: 30, dear["id"]: ESTIMATE}

    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT attempt, cost_usd, cost_credits FROM attempt_costs WHERE job_id = $1 "
                                "ORDER BY attempt", retried["id"])
    finally:
        await conn.close()
    assert [tuple(r) for r in rows] == [(1, Decimal("0.1"), 10), (2, Decimal("0.1"), 10), (3, Decimal("0.3"), 30)]

    vidjobs = operator_command(database_url)
    table, as_json = await asyncio.gather(vidjobs("usage", "--group-by", "model"),
                                          vidjobs("usage", "--group-by", "provider", "--json"))
    assert (table.code, as_json.code) == (0, 0), table.err + as_json.err
    assert [json.loads(line) for line in as_json.out.splitlines()] == [{
        "group": "fake", "jobs": 2, "attempts_billed": 4, "provider_cost_usd": 1.3, "provider_cost_credits": 130,
        "credits_charged": 80, "credits_absorbed": 50,
    }]
    assert "fake/default" in table.out and "1.30" in table.out and "absorbed" in table.out
