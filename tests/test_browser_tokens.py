"""Browser tokens: what a person's browser holds to watch (and perhaps start) their own jobs, without the
account's key. Through a real gateway (PostgreSQL, NATS), and one job through the whole stack."""

from __future__ import annotations

import asyncio
import logging
import secrets
from datetime import UTC, datetime
from typing import Any

import aiohttp
import asyncpg
import pytest

from tests.gateway_harness import JOB_BODY, assert_error, auth, drive, gateway_settings, read_event, running_gateway
from tests.stack import running_stack, stack_settings
from tests.support import wait_until
from tests.test_platform import ALL_SCOPES, call, platform_key, signup
from vidjobs.cli import platforms
from vidjobs.common.states import JobStatus
from vidjobs.gateway import browsertokens


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def mint(h: Any, key: str, **body: Any) -> dict:
    status, token = await call(h, key, "POST", "/v1/account/tokens", body)
    assert status == 201, token
    return token


async def test_a_token_reads_and_streams_its_accounts_job_and_nothing_else(h, caplog):
    account_id, key = await h.account()
    _, other_key = await h.account()
    _, job = await h.post_job(key)
    _, theirs = await h.post_job(other_key)
    token = (await mint(h, key))["token"]
    caplog.set_level(logging.INFO)

    assert (await call(h, token, "GET", f"/v1/jobs/{job['id']}"))[1]["id"] == job["id"]
    assert (await call(h, token, "GET", f"/v1/jobs/{theirs['id']}"))[0] == 404
    async with h.client.get(f"/v1/jobs/{job['id']}/stream?access_token={token}") as stream:
        assert stream.status == 200
        first = await read_event(stream)
        await drive(h.pool, job["id"], JobStatus.SUBMITTED)
        second = await read_event(stream)
    assert first is not None and first[1]["status"] == "pending"
    assert second is not None and second[1]["status"] == "submitted"
    async with h.client.get(f"/v1/jobs/{theirs['id']}/stream?access_token={token}") as refused:
        assert refused.status == 404
    # Our access log holds the path, never the query. (aiohttp's own request-line log, which this test server
    # keeps, is off in the gateway's server: `python -m vidjobs.gateway` runs with access_log=None.)
    ours = [r.getMessage() + repr(r.__dict__) for r in caplog.records if r.name.startswith("vidjobs")]
    assert ours and not any(token in line for line in ours)


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/v1/account", None), ("POST", "/v1/account/tokens", {}), ("GET", "/v1/account/webhook-secret", None),
    ("POST", "/v1/webhook-endpoints", {"url": "https://93.184.215.14/x"}), ("GET", "/v1/account/ledger", None),
    ("POST", "/v1/jobs", JOB_BODY), ("POST", "/v1/platform/accounts", {"external_id": "x"}),
])
async def test_a_read_token_may_not_reach_keys_secrets_credit_or_creates(h, method, path, body):
    _, key = await h.account()
    token = (await mint(h, key, scopes=["read"]))["token"]
    status, answer = await call(h, token, method, path, body)
    assert status == 403, answer
    assert_error(answer, "forbidden")


async def test_an_expired_token_is_refused(h):
    account_id, key = await h.account()
    _, job = await h.post_job(key)
    minted = await mint(h, key)
    # The same grant, signed with an expiry that has passed; and the grant's own row expired.
    past = browsertokens.sign(h.settings, browsertokens.Claims(minted["id"], account_id, int(datetime.now(UTC)
                                                                                              .timestamp()) - 1))
    status, answer = await call(h, past, "GET", f"/v1/jobs/{job['id']}")
    assert status == 401 and "expired" in answer["error"]["message"]
    await h.pool.execute("UPDATE browser_tokens SET expires_at = now() - interval '1 second' WHERE id = $1",
                         minted["id"])
    h.gw.tokens.forget(minted["id"])
    assert (await call(h, minted["token"], "GET", f"/v1/jobs/{job['id']}"))[0] == 401


async def test_a_forged_or_altered_token_is_refused_without_a_read(h):
    account_id, key = await h.account()
    minted = (await mint(h, key))["token"]
    head, claims, signature = minted.split(".")
    forged = browsertokens.sign(h.settings.with_(secrets_key=browsertokens.sealing.new_key()),
                                browsertokens.Claims("tok_x", account_id, 2**40))
    for bad in (forged, f"{head}.{claims}.{signature[:-2]}AA", f"{head}.{claims}x.{signature}", "vjt_" + "a" * 600):
        status, answer = await call(h, bad, "GET", "/v1/jobs")
        assert status == 401, (bad[:30], answer)


async def test_a_token_dies_when_its_issuers_key_is_revoked(h):
    account_id, key = await h.account()
    token = (await mint(h, key))["token"]
    assert (await call(h, token, "GET", "/v1/jobs"))[0] == 200
    await h.pool.execute("UPDATE api_keys SET revoked_at = now() WHERE account_id = $1", account_id)

    async def refused() -> bool:
        return (await call(h, token, "GET", "/v1/jobs"))[0] == 401
    await wait_until(refused, within=10, what="the token refused")


async def test_a_platform_minted_token_dies_with_the_platform_key(h):
    async with h.pool.acquire() as conn:
        key_id, key = await platforms.create(conn, "dying", ALL_SCOPES)
    account = await signup(h, key, "viewer")
    status, minted = await call(h, key, "POST", f"/v1/platform/accounts/{account['id']}/tokens", {"ttl_s": 600})
    assert status == 201 and (await call(h, minted["token"], "GET", "/v1/jobs"))[0] == 200
    async with h.pool.acquire() as conn:
        await platforms.revoke(conn, key_id)

    async def refused() -> bool:
        return (await call(h, minted["token"], "GET", "/v1/jobs"))[0] == 401
    await wait_until(refused, within=10, what="the token refused")


async def test_a_token_for_some_jobs_sees_only_those_and_the_ones_it_creates(h):
    _, key = await h.account()
    _, shown = await h.post_job(key)
    _, hidden = await h.post_job(key)
    token = (await mint(h, key, scopes=["read", "create"], jobs=[shown["id"]]))["token"]

    assert (await call(h, token, "GET", f"/v1/jobs/{shown['id']}"))[0] == 200
    assert (await call(h, token, "GET", f"/v1/jobs/{hidden['id']}"))[0] == 404
    assert (await call(h, token, "GET", "/v1/jobs"))[0] == 403
    status, made = await call(h, token, "POST", "/v1/jobs", JOB_BODY)
    assert status == 201 and (await call(h, token, "GET", f"/v1/jobs/{made['id']}"))[0] == 200


async def test_creates_through_a_token_stop_at_its_credit_ceiling(h):
    _, key = await h.account(concurrency=10)
    estimate = (await h.post_job(key))[1]["cost"]["estimated_credits"]
    token = (await mint(h, key, scopes=["read", "create"], credit_ceiling=estimate * 2))["token"]

    answers = await asyncio.gather(*(call(h, token, "POST", "/v1/jobs", JOB_BODY) for _ in range(4)))

    assert sorted(status for status, _ in answers) == [201, 201, 402, 402]
    refused = next(body for status, body in answers if status == 402)
    assert_error(refused, "quota_exhausted", "browser token may reserve")


@pytest.mark.parametrize(("body", "field"), [
    ({"ttl_s": 10 * 365 * 86400}, "ttl_s"), ({"ttl_s": 5}, "ttl_s"), ({"scopes": ["admin"]}, "scopes"),
    ({"scopes": []}, "scopes"), ({"credit_ceiling": 10}, "credit_ceiling"), ({"jobs": ["job_nope"]}, "jobs"),
    ({"jobs": [f"job_{n}" for n in range(101)]}, "jobs"), ({"credit_ceiling": 2**63, "scopes": ["create"]},
                                                           "credit_ceiling"),
])
async def test_a_bad_token_request_is_a_422_naming_its_field(h, body, field):
    _, key = await h.account()
    status, answer = await call(h, key, "POST", "/v1/account/tokens", body)
    assert status == 422 and field in answer["error"]["message"], answer
    assert await h.count("SELECT count(*) FROM browser_tokens") == 0


async def test_a_token_for_a_deleted_account_is_refused(h):
    key = await platform_key(h)
    account = await signup(h, key, "gone")
    await call(h, key, "DELETE", f"/v1/platform/accounts/{account['id']}")
    status, answer = await call(h, key, "POST", f"/v1/platform/accounts/{account['id']}/tokens", {})
    assert status == 404 and "account" in answer["error"]["message"]


async def test_access_token_is_for_a_browser_token_on_a_get_only(h):
    _, key = await h.account()
    token = (await mint(h, key))["token"]
    assert (await h.client.get(f"/v1/jobs?access_token={key}")).status == 401
    assert (await h.client.post(f"/v1/jobs?access_token={token}", json=JOB_BODY)).status == 401
    both = await h.client.get(f"/v1/jobs?access_token={token}", headers=auth(token))
    assert both.status == 400
    listed = await h.client.get(f"/v1/jobs?access_token={token}&limit=5")
    assert listed.status == 200  # the parameter is taken out before the query is read


async def test_a_product_signs_up_a_user_credits_a_purchase_and_the_browser_follows_its_job_to_ready(
        tmp_path, database_url, nats_url):
    """The whole flow of docs/INTEGRATING.md, through the real stack: sign-up → account, purchase webhook →
    credit, page → browser token → a job created and followed to its final state over EventSource's query
    parameter."""
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=2, recovery_interval_s=2)
    async with running_stack(settings) as stack:
        async with stack.session.get(stack.url) as resp:
            assert resp.status == 200
        conn_key = await _platform_key(settings.database_url)
        http = stack.session
        base = stack.url
        platform = {"Authorization": f"Bearer {conn_key}"}
        async with http.post(f"{base}/v1/platform/accounts", json={"external_id": "u-1"}, headers=platform) as r:
            account = await r.json()
        body = {"action": "grant", "amount": 10_000, "idempotency_key": "evt_1", "reason": "purchase"}
        async with http.post(f"{base}/v1/platform/accounts/{account['id']}/credits", json=body, headers=platform) as r:
            assert r.status == 201
        async with http.post(f"{base}/v1/platform/accounts/{account['id']}/tokens",
                             json={"scopes": ["read", "create"], "credit_ceiling": 1000}, headers=platform) as r:
            token = (await r.json())["token"]
        browser = {"Authorization": f"Bearer {token}"}
        payload = {"model": "fake/default", "prompt": "a red fox in snow", "duration_s": 1}
        async with http.post(f"{base}/v1/jobs", json=payload, headers=browser) as r:
            job = await r.json()
            assert r.status == 201, job
        seen = await _follow(http, f"{base}/v1/jobs/{job['id']}/stream?access_token={token}")
    assert seen[-1] == "completed" and seen[0] in ("pending", "submitted")


async def _platform_key(database_url: str) -> str:
    conn = await asyncpg.connect(database_url)
    try:
        return (await platforms.create(conn, f"app-{secrets.token_hex(3)}", ALL_SCOPES))[1]
    finally:
        await conn.close()


async def _follow(http: aiohttp.ClientSession, url: str) -> list[str]:
    seen: list[str] = []
    async with http.get(url, timeout=aiohttp.ClientTimeout(total=120)) as stream:
        assert stream.status == 200
        while (event := await read_event(stream)) is not None:
            if event[0] == "job" and (not seen or seen[-1] != event[1]["status"]):
                seen.append(event[1]["status"])
    return seen



async def test_a_token_reads_its_own_grant_and_nothing_else_may(h):
    account_id, key = await h.account()
    minted = await mint(h, key, scopes=["create", "read"], credit_ceiling=500, ttl_s=120)
    await call(h, minted["token"], "POST", "/v1/jobs", JOB_BODY)

    status, grant = await call(h, minted["token"], "GET", "/v1/token")

    assert status == 200 and grant["id"] == minted["id"] and grant["account_id"] == account_id
    assert grant["scopes"] == ["create", "read"] and grant["credit_ceiling"] == 500 and grant["credits_used"] == 50
    assert grant["expires_at"] == minted["expires_at"] and "token" not in grant
    assert (await call(h, key, "GET", "/v1/token"))[0] == 403
