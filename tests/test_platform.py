"""A product plugs vidjobs in with a platform key (docs/INTEGRATING.md): its users become accounts, its
purchases credit, its plans limits; disabled and deleted accounts; keys it issues; and the audit trail of
everything it changed. Through a real gateway on PostgreSQL and NATS."""

from __future__ import annotations

import asyncio
import secrets
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from tests.gateway_harness import JOB_BODY, assert_error, auth, completed_job, drive, gateway_settings, running_gateway
from tests.support import wait_until
from vidjobs.cli import platforms
from vidjobs.common.states import JobStatus
from vidjobs.gateway.platformkeys import Scope

ALL_SCOPES = [s.value for s in Scope]


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def platform_key(h: Any, scopes: list[str] | None = None, platform: str | None = None) -> str:
    async with h.pool.acquire() as conn:
        return (await platforms.create(conn, platform or f"app-{secrets.token_hex(3)}", scopes or ALL_SCOPES))[1]


async def call(h: Any, key: str, method: str, path: str, body: Any = None,
               headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """One request, sent again after Retry-After when its key's rate refused it, as a product's backend would."""
    while True:
        resp = await h.client.request(method, path, json=body, headers={**auth(key), **(headers or {})})
        answer = await resp.json() if resp.content_type == "application/json" else None
        if resp.status != 429 or answer["error"]["code"] != "rate_limited":
            return resp.status, answer
        await asyncio.sleep(int(resp.headers["Retry-After"]))


async def signup(h: Any, key: str, external_id: str, **body: Any) -> dict:
    status, account = await call(h, key, "POST", "/v1/platform/accounts", {"external_id": external_id, **body})
    assert status in (200, 201), account
    return account


async def grant(h: Any, key: str, account_id: str, amount: int, event: str, action: str = "grant") -> tuple[int, Any]:
    return await call(h, key, "POST", f"/v1/platform/accounts/{account_id}/credits",
                      {"action": action, "amount": amount, "idempotency_key": event, "reason": f"purchase {event}"})


async def test_sign_ups_made_concurrently_and_repeated_make_one_account_per_user(h):
    key = await platform_key(h)
    users = [f"user_{n}" for n in range(200)]
    again = users[:50]

    answers = await asyncio.gather(*(call(h, key, "POST", "/v1/platform/accounts", {"external_id": u})
                                     for u in users + again))

    made = {body["external_id"]: body["id"] for status, body in answers if status == 201}
    found = [(body["external_id"], body["id"]) for status, body in answers if status == 200]
    assert len(made) == 200 and all(made[user] == account_id for user, account_id in found)
    assert len(found) == 50
    assert await h.count("SELECT count(*) FROM accounts WHERE external_id IS NOT NULL") == 200
    status, page = await call(h, key, "GET", "/v1/platform/accounts?external_id=user_7")
    assert status == 200 and [a["id"] for a in page["data"]] == [made["user_7"]]


async def test_the_listing_pages_through_every_account_once(h):
    key = await platform_key(h)
    for n in range(7):
        await signup(h, key, f"u{n}")
    seen, cursor = [], None
    while True:
        query = "?limit=3" + (f"&cursor={cursor}" if cursor else "")
        status, page = await call(h, key, "GET", f"/v1/platform/accounts{query}")
        assert status == 200, page
        seen += [a["external_id"] for a in page["data"]]
        if (cursor := page["next_cursor"]) is None:
            break
    assert seen == [f"u{n}" for n in range(7)]


async def test_a_purchase_webhook_delivered_three_times_grants_once(h):
    key = await platform_key(h)
    account = await signup(h, key, "buyer")

    answers = await asyncio.gather(*(grant(h, key, account["id"], 500, "evt_1") for _ in range(3)))

    statuses = sorted(status for status, _ in answers)
    assert statuses == [200, 200, 201]
    assert {body["entry"]["id"] for _, body in answers} == {answers[0][1]["entry"]["id"]}
    status, found = await call(h, key, "GET", f"/v1/platform/accounts/{account['id']}")
    assert found["credits"] == {"balance": 500, "reserved": 0, "available": 500}
    status, ledger = await call(h, key, "GET", f"/v1/platform/accounts/{account['id']}/ledger")
    assert [(e["kind"], e["balance_change"], e["note"]) for e in ledger["data"]] == [("grant", 500, "purchase evt_1")]
    # The same event id for another amount is a conflict, not a second grant.
    status, body = await grant(h, key, account["id"], 900, "evt_1")
    assert status == 409 and "idempotency_key" in body["error"]["message"]


async def test_taking_back_never_goes_below_what_is_reserved(h):
    key = await platform_key(h)
    account = await signup(h, key, "refunded")
    await grant(h, key, account["id"], 1000, "buy")
    await h.pool.execute("UPDATE accounts SET credits_reserved = 800 WHERE id = $1", account["id"])

    refused = await grant(h, key, account["id"], 300, "refund-1", action="take_back")
    taken = await grant(h, key, account["id"], 200, "refund-2", action="take_back")

    assert refused[0] == 409 and "reserved" in refused[1]["error"]["message"]
    assert taken[0] == 201 and taken[1]["credits"] == {"balance": 800, "reserved": 800, "available": 0}


@pytest.mark.parametrize(("body", "field"), [
    ({"action": "grant", "amount": 2**63, "idempotency_key": "k"}, "amount"),
    ({"action": "take_back", "amount": -5, "idempotency_key": "k"}, "amount"),
    ({"action": "grant", "amount": 0, "idempotency_key": "k"}, "amount"),
    ({"action": "grant", "amount": 1.5, "idempotency_key": "k"}, "amount"),
    ({"action": "grant", "amount": 5}, "idempotency_key"),
    ({"action": "mint", "amount": 5, "idempotency_key": "k"}, "action"),
])
async def test_a_bad_credit_change_is_a_4xx_naming_its_field(h, body, field):
    key = await platform_key(h)
    account = await signup(h, key, "careful")
    status, answer = await call(h, key, "POST", f"/v1/platform/accounts/{account['id']}/credits", body)
    assert status == 422 and field in answer["error"]["message"], answer
    assert await h.count("SELECT count(*) FROM credit_ledger WHERE account_id = $1", account["id"]) == 0
    assert await h.count("SELECT count(*) FROM jobs WHERE account_id = $1", account["id"]) == 0
    assert [o async for o in h.gw.storage.list_prefix(f"accounts/{account['id']}/")] == []


async def test_a_bad_external_id_is_a_422_naming_it(h):
    key = await platform_key(h)
    for bad in ("x" * 10_000, "", "has space", "nul\x00"):
        status, answer = await call(h, key, "POST", "/v1/platform/accounts", {"external_id": bad})
        assert status == 422 and "external_id" in answer["error"]["message"], (bad[:20], answer)
    assert await h.count("SELECT count(*) FROM accounts WHERE external_id IS NOT NULL") == 0


async def test_plans_carry_limits_and_a_changed_plan_reaches_its_accounts(h):
    key = await platform_key(h)
    status, plan = await call(h, key, "PUT", "/v1/platform/plans/pro",
                              {"concurrent_jobs": 4, "max_queued_jobs": 50, "daily_spend_cap": 10_000})
    assert status == 200 and plan["accounts"] == 0
    on_plan = await signup(h, key, "pro-user", plan="pro")
    own = await signup(h, key, "custom-user", plan="pro", concurrent_jobs=9)
    assert on_plan["limits"]["concurrent_jobs"] == 4 and on_plan["plan"] == "pro"

    await call(h, key, "PUT", "/v1/platform/plans/pro", {"concurrent_jobs": 6, "max_queued_jobs": 50})
    status, changed = await call(h, key, "PATCH", f"/v1/platform/accounts/{own['id']}", {"max_job_credits": 300})

    _, reread = await call(h, key, "GET", f"/v1/platform/accounts/{on_plan['id']}")
    assert reread["limits"]["concurrent_jobs"] == 6 and reread["limits"]["daily_spend_cap"] is None
    assert changed["plan"] is None and changed["limits"]["max_job_credits"] == 300
    status, body = await call(h, key, "POST", "/v1/platform/accounts", {"external_id": "x", "plan": "nope"})
    assert status == 422 and "plan" in body["error"]["message"]


async def test_a_per_account_queue_cap_refuses_the_next_waiting_job(h):
    key = await platform_key(h)
    account = await signup(h, key, "queued", max_queued_jobs=1, concurrent_jobs=1)
    await grant(h, key, account["id"], 100_000, "g")
    acting = {"Vidjobs-Account": account["id"]}
    # Nothing is submitted here (no submitter runs): every job waits.
    first = await call(h, key, "POST", "/v1/jobs", JOB_BODY, acting)
    second = await call(h, key, "POST", "/v1/jobs", JOB_BODY, acting)
    assert first[0] == 201 and second[0] == 429, second
    _, own = await call(h, key, "GET", "/v1/account", headers=acting)
    assert own["limits"]["max_queued_jobs"] == 1


async def test_a_disabled_account_reads_but_cannot_create_and_its_waiting_jobs_are_canceled(h):
    key = await platform_key(h)
    account = await signup(h, key, "paused")
    await grant(h, key, account["id"], 100_000, "g")
    acting = {"Vidjobs-Account": account["id"]}
    _, job = await call(h, key, "POST", "/v1/jobs", JOB_BODY, acting)

    status, done = await call(h, key, "POST", f"/v1/platform/accounts/{account['id']}/disable", {"running": "finish"})

    assert status == 200 and done["jobs_canceled"] == [job["id"]] and done["account"]["status"] == "disabled"
    assert done["account"]["credits"]["reserved"] == 0
    assert (await call(h, key, "GET", f"/v1/jobs/{job['id']}", headers=acting))[1]["status"] == "canceled"
    status, refused = await call(h, key, "POST", "/v1/jobs", JOB_BODY, acting)
    assert status == 403 and refused["error"]["code"] == "account_disabled"
    upload = await h.client.post("/v1/uploads", data=b"\x89PNG", headers={**auth(key), **acting,
                                                                           "Content-Type": "image/png"})
    assert upload.status == 403 and (await upload.json())["error"]["code"] == "account_disabled"
    await call(h, key, "POST", f"/v1/platform/accounts/{account['id']}/enable")
    assert (await call(h, key, "POST", "/v1/jobs", JOB_BODY, acting))[0] == 201


async def test_a_platform_reaches_only_its_own_accounts(h):
    mine, theirs = await platform_key(h), await platform_key(h)
    other = await signup(h, theirs, "not-yours")
    for method, path in (("GET", f"/v1/platform/accounts/{other['id']}"),
                         ("PATCH", f"/v1/platform/accounts/{other['id']}"),
                         ("POST", f"/v1/platform/accounts/{other['id']}/keys"),
                         ("POST", f"/v1/platform/accounts/{other['id']}/tokens")):
        status, body = await call(h, mine, method, path, {})
        assert status == 404, (method, path, body)
    assert (await grant(h, mine, other["id"], 5, "steal"))[0] == 404
    status, _ = await call(h, mine, "GET", "/v1/jobs", headers={"Vidjobs-Account": other["id"]})
    assert status == 404
    _, page = await call(h, mine, "GET", "/v1/platform/accounts")
    assert page["data"] == []


async def test_acting_for_reaches_only_the_named_account_and_is_audited(h):
    key = await platform_key(h)
    alice, bob = await signup(h, key, "alice"), await signup(h, key, "bob")
    for account in (alice, bob):
        await grant(h, key, account["id"], 100_000, f"g-{account['id']}")

    status, job = await call(h, key, "POST", "/v1/jobs", JOB_BODY, {"Vidjobs-Account": alice["id"]})
    assert status == 201
    _, alices = await call(h, key, "GET", "/v1/jobs", headers={"Vidjobs-Account": alice["id"]})
    _, bobs = await call(h, key, "GET", "/v1/jobs", headers={"Vidjobs-Account": bob["id"]})
    status, hidden = await call(h, key, "GET", f"/v1/jobs/{job['id']}", headers={"Vidjobs-Account": bob["id"]})

    assert [j["id"] for j in alices["data"]] == [job["id"]] and bobs["data"] == [] and status == 404
    _, trail = await call(h, key, "GET", f"/v1/platform/audit?account_id={alice['id']}")
    actions = [(line["action"], line["status"]) for line in trail["data"]]
    assert ("create_job", 201) in actions and ("change_platform_account_credit", 201) in actions
    assert ("create_platform_account", 201) in actions  # named by the account it made
    assert all(line["request_id"] and line["platform_key_id"].startswith("pk_") for line in trail["data"])


async def test_keys_issued_by_the_platform_work_and_are_revoked(h):
    key = await platform_key(h)
    account = await signup(h, key, "with-key")
    status, issued = await call(h, key, "POST", f"/v1/platform/accounts/{account['id']}/keys", {"name": "server"})
    assert status == 201 and issued["key"].startswith("vj_")
    assert (await h.get(issued["key"], "/v1/account"))[0] == 200
    _, listed = await call(h, key, "GET", f"/v1/platform/accounts/{account['id']}/keys")
    assert [k["id"] for k in listed["data"]] == [issued["id"]] and "key" not in listed["data"][0]

    status, _ = await call(h, key, "DELETE", f"/v1/platform/accounts/{account['id']}/keys/{issued['id']}")
    assert status == 204
    await wait_until(lambda: _refused(h, issued["key"]), within=10, what="the key refused")


async def _refused(h: Any, key: str) -> bool:
    return (await h.get(key, "/v1/account"))[0] == 401


async def test_a_scope_the_key_lacks_is_403_naming_it(h):
    key = await platform_key(h, ["accounts"])
    account = await signup(h, key, "scoped")
    status, body = await grant(h, key, account["id"], 5, "e")
    assert status == 403 and "credits" in body["error"]["message"]
    status, body = await call(h, key, "GET", "/v1/jobs", headers={"Vidjobs-Account": account["id"]})
    assert status == 403 and "act" in body["error"]["message"]


async def test_a_deleted_account_is_closed_then_purged(h):
    key = await platform_key(h)
    account = await signup(h, key, "leaving")
    await grant(h, key, account["id"], 1000, "g")
    _, issued = await call(h, key, "POST", f"/v1/platform/accounts/{account['id']}/keys")
    done = await completed_job(h, account["id"])
    expired = await drive(h.pool, (await completed_job(h, account["id"])).id, JobStatus.EXPIRED)
    _, waiting = await call(h, key, "POST", "/v1/jobs", JOB_BODY, {"Vidjobs-Account": account["id"]})
    stored = [o async for o in h.gw.storage.list_prefix(f"accounts/{account['id']}/")]

    status, deleted = await call(h, key, "DELETE", f"/v1/platform/accounts/{account['id']}")

    assert status == 202 and deleted["keys_revoked"] == 1 and deleted["jobs_canceled"] == [waiting["id"]]
    assert len(stored) == 4 and done.status == "completed" and expired.status == "expired"
    assert (await call(h, key, "GET", f"/v1/platform/accounts/{account['id']}"))[0] == 404
    assert (await call(h, key, "POST", "/v1/platform/accounts/" + account["id"] + "/tokens"))[0] == 404
    await wait_until(lambda: _gone(h, account["id"]), within=30, what="the account purged")
    assert await h.count("SELECT count(*) FROM credit_ledger WHERE account_id = $1", account["id"]) == 0
    assert await h.count("SELECT count(*) FROM jobs WHERE account_id = $1", account["id"]) == 0
    assert [o async for o in h.gw.storage.list_prefix(f"accounts/{account['id']}/")] == []
    # The platform's record of what it did stays.
    _, trail = await call(h, key, "GET", f"/v1/platform/audit?account_id={account['id']}")
    assert ("delete_platform_account", 202) in [(line["action"], line["status"]) for line in trail["data"]]
    # Made again, the user is a new account.
    again = await signup(h, key, "leaving")
    assert again["id"] != account["id"] and again["credits"]["balance"] == 0


async def _gone(h: Any, account_id: str) -> bool:
    return await h.count("SELECT count(*) FROM accounts WHERE id = $1", account_id) == 0


async def test_a_rotated_key_works_through_its_overlap_and_a_revoked_one_stops(h):
    async with h.pool.acquire() as conn:
        old_id, old = await platforms.create(conn, "rotating", ALL_SCOPES)
        new_id, new = await platforms.rotate(conn, old_id, timedelta(hours=1))
    assert (await call(h, old, "GET", "/v1/platform"))[0] == 200
    assert (await call(h, new, "GET", "/v1/platform"))[1]["platform"] == "rotating"
    async with h.pool.acquire() as conn:
        assert await platforms.revoke(conn, old_id) is True
    await wait_until(lambda: _platform_refused(h, old), within=10, what="the key refused")
    status, body = await call(h, old, "GET", "/v1/platform")
    assert status == 401
    assert_error(body, "unauthorized")
    assert (await call(h, new, "GET", "/v1/platform"))[0] == 200


async def _platform_refused(h: Any, key: str) -> bool:
    return (await call(h, key, "GET", "/v1/platform"))[0] == 401


async def test_credit_moves_only_with_a_live_platform_key_that_holds_the_credits_scope(h):
    """What keeps a misbehaving service from adding credit: platform_credit hashes the key it is given and
    checks it, so knowing an account id (or holding EXECUTE) is not enough."""
    key = await platform_key(h)
    without = await platform_key(h, ["accounts"])
    account = await signup(h, key, "guarded")
    refusals = []
    for given in ("vjp_forged", without, "", key + "x"):
        with pytest.raises(asyncpg.InsufficientPrivilegeError) as refused:
            await h.pool.fetchrow("SELECT * FROM platform_credit($1, $2, 1000, 'k', 'n', 'r')", given, account["id"])
        refusals.append(refused.value.message)
    assert all("not a live platform key" in message for message in refusals)
    assert await h.count("SELECT credits_balance FROM accounts WHERE id = $1", account["id"]) == 0


@pytest.mark.parametrize("running", ["finish", "stop"])
async def test_disabling_lets_running_jobs_finish_or_stops_them_as_asked(h, running):
    key = await platform_key(h)
    account = await signup(h, key, f"busy-{running}", concurrent_jobs=5)
    await grant(h, key, account["id"], 100_000, "g")
    acting = {"Vidjobs-Account": account["id"]}
    _, rendering = await call(h, key, "POST", "/v1/jobs", JOB_BODY, acting)
    _, waiting = await call(h, key, "POST", "/v1/jobs", JOB_BODY, acting)
    await drive(h.pool, rendering["id"], JobStatus.SUBMITTED)

    status, done = await call(h, key, "POST", f"/v1/platform/accounts/{account['id']}/disable", {"running": running})

    expected = [waiting["id"]] if running == "finish" else sorted([waiting["id"], rendering["id"]])
    assert status == 200 and sorted(done["jobs_canceled"]) == expected
    _, still = await call(h, key, "GET", f"/v1/jobs/{rendering['id']}", headers=acting)
    assert still["status"] == ("submitted" if running == "finish" else "canceled")


async def test_a_path_or_method_that_is_not_served_answers_alike_for_a_platform_key(h):
    key = await platform_key(h)
    assert (await call(h, key, "GET", "/v1/platform/nothing-here"))[0] == 404
    status, body = await call(h, key, "PUT", "/v1/platform/accounts")
    assert status == 405 and body["error"]["code"] == "method_not_allowed"
