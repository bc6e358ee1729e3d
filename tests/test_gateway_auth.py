"""API keys and tenancy: 401 without a good key, and another account's job answers exactly like a missing one."""

from __future__ import annotations

import hashlib

import pytest

from tests.gateway_harness import (
    JOB_BODY,
    assert_error,
    assert_no_traceback,
    auth,
    gateway_settings,
    raw_request,
    running_gateway,
)
from tests.support import wait_until
from vidjobs.common.errors import StoreError
from vidjobs.gateway import ratelimit
from vidjobs.gateway.accounts import add_api_key, create_account

PROTECTED = [
    ("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/v1/jobs/job_x"), ("POST", "/v1/jobs/job_x/cancel"),
    ("DELETE", "/v1/jobs/job_x"), ("GET", "/v1/jobs/job_x/events"), ("GET", "/v1/jobs/job_x/stream"),
    ("GET", "/v1/account"), ("GET", "/v1/account/ledger"), ("GET", "/v1/no-such-route"),
]


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer vj_unknown"}, {"Authorization": "Basic abc"},
                                     {"Authorization": "Bearer "}])
async def test_every_v1_route_needs_a_known_key(h, headers):
    for method, path in PROTECTED:
        resp = await h.client.request(method, path, json=JOB_BODY, headers=headers)
        assert resp.status == 401, (method, path)
        assert resp.headers["WWW-Authenticate"].startswith("Bearer")
        assert_error(await resp.json(), "unauthorized")
    assert await h.count("SELECT count(*) FROM jobs") == 0


@pytest.mark.parametrize("token", [b"\xff\xfe", b"vj_\xc3\xa9", b"vj_\x80abc"])
async def test_a_key_that_is_not_ascii_is_401_not_a_fault(h, caplog, token):
    answer = await raw_request(h, "GET", b"/v1/account", [(b"Authorization", b"Bearer " + token)])

    assert answer.status == 401, answer.body
    assert_error(answer.json(), "unauthorized")
    assert_no_traceback(caplog)


async def test_a_revoked_key_is_refused(h):
    account_id, key = await h.account()
    assert (await h.get(key, "/v1/account"))[0] == 200
    await h.pool.execute("UPDATE api_keys SET revoked_at = now() WHERE account_id = $1", account_id)

    # A key in use is dropped from every gateway's memory at its next sync of the key's spending.
    async def refused() -> bool:
        return (await h.get(key, "/v1/account"))[0] == 401

    await wait_until(refused, within=ratelimit.SYNC_S * 4, interval=0.05, what="the revoked key to be refused")
    status, body = await h.get(key, "/v1/account")
    assert status == 401
    assert_error(body, "unauthorized", "revoked")


def _same_but_the_request(body: dict) -> dict:
    """An error body without its request id, which is every request's own."""
    return {"error": {k: v for k, v in body["error"].items() if k != "request_id"}}


async def test_another_accounts_job_is_404_everywhere(h):
    owner, stranger = await h.key(), await h.key()
    _, job = await h.post_job(owner)
    path = f"/v1/jobs/{job['id']}"
    missing = await h.client.get("/v1/jobs/job_00000000000000000000000000", headers=auth(stranger))

    for method, url in [("GET", path), ("POST", f"{path}/cancel"), ("GET", f"{path}/events"),
                        ("GET", f"{path}/stream"), ("DELETE", path)]:
        resp = await h.client.request(method, url, headers=auth(stranger))
        assert resp.status == 404, (method, url)
        assert _same_but_the_request(await resp.json()) == _same_but_the_request(await missing.json())

    _, listed = await h.get(stranger, "/v1/jobs")
    assert listed["data"] == []
    status, still = await h.get(owner, path)
    assert status == 200 and still["status"] == "pending"


async def test_keys_are_stored_only_as_their_hash(pool):
    async with pool.acquire() as conn:
        account_id, key = await create_account(conn, "acme", credits=5, concurrency=3)

    assert key.startswith("vj_") and len(key) > 30
    row = await pool.fetchrow("SELECT * FROM api_keys WHERE account_id = $1", account_id)
    assert bytes(row["key_hash"]) == hashlib.sha256(key.encode()).digest()
    assert key not in str(dict(row))
    account = await pool.fetchrow("SELECT * FROM accounts WHERE id = $1", account_id)
    assert (account["name"], account["credits_balance"], account["concurrent_jobs"]) == ("acme", 5, 3)


async def test_add_api_key_is_idempotent_and_refuses_another_accounts_key(pool):
    async with pool.acquire() as conn:
        first, _ = await create_account(conn, "one", credits=0, concurrency=1)
        second, _ = await create_account(conn, "two", credits=0, concurrency=1)
        await add_api_key(conn, first, "vj_demo-key")
        await add_api_key(conn, first, "vj_demo-key")
        with pytest.raises(StoreError):
            await add_api_key(conn, second, "vj_demo-key")
    assert await pool.fetchval("SELECT count(*) FROM api_keys WHERE account_id = $1", first) == 2


async def test_a_registered_known_key_authenticates(h):
    account_id, _ = await h.account()
    async with h.pool.acquire() as conn:
        await add_api_key(conn, account_id, "vj_known-demo-key")
    status, body = await h.get("vj_known-demo-key", "/v1/account")
    assert status == 200 and body["id"] == account_id
