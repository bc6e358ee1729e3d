"""Requests per API key: past the bucket, 429 with `Retry-After`; each key has its own bucket; a refused
request spends nothing; the bucket is shared by every gateway that reads the same database."""

from __future__ import annotations

import asyncio

import pytest

from tests.gateway_harness import assert_error, gateway_settings, running_gateway
from tests.support import wait_until
from vidjobs.cli.embedded import free_port
from vidjobs.gateway import ratelimit
from vidjobs.gateway.accounts import add_api_key, hash_key


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def tokens(h, key: str) -> float:
    return await h.pool.fetchval("SELECT rate_tokens FROM api_keys WHERE key_hash = $1", hash_key(key))


async def test_the_request_past_the_burst_is_429_until_a_token_is_back(h):
    _, key = await h.account(requests_per_s=2.0, request_burst=3)

    first_three = [(await h.get(key, "/v1/account"))[0] for _ in range(3)]
    resp = await h.client.get("/v1/account", headers={"Authorization": f"Bearer {key}"})

    assert first_three == [200, 200, 200]
    assert resp.status == 429
    body = await resp.json()
    assert_error(body, "rate_limited", "2 requests per second", "3")
    assert body["error"]["retryable"] is True
    retry_after = int(resp.headers["Retry-After"])
    assert retry_after >= 1

    await asyncio.sleep(retry_after)
    assert (await h.get(key, "/v1/account"))[0] == 200


async def test_a_refused_request_spends_no_token(h):
    _, key = await h.account(requests_per_s=2.0, request_burst=3)
    for _ in range(3):
        await h.get(key, "/v1/account")
    assert (await h.get(key, "/v1/account"))[0] == 429

    refused = [(await h.get(key, "/v1/jobs"))[0] for _ in range(5)]

    assert refused == [429] * 5
    await asyncio.sleep(0.5 + 0.1)  # one token at 2/s, whatever the refused requests did
    assert (await h.get(key, "/v1/jobs"))[0] == 200
    # The row, once synced, holds what was spent: the refused requests took it no lower than empty.
    await asyncio.sleep(ratelimit.SYNC_S * 2)
    assert await tokens(h, key) >= 0


async def test_requests_write_nothing_but_their_keys_spending_once_a_sync(h):
    _, key = await h.account(requests_per_s=0.5, request_burst=1)
    assert (await h.get(key, "/v1/account"))[0] == 200
    await asyncio.sleep(ratelimit.SYNC_S * 2)  # the one admitted request's spending reaches the row
    touched = await h.pool.fetchval("SELECT rate_updated_at FROM api_keys WHERE key_hash = $1", hash_key(key))
    assert touched is not None

    hammered = [(await h.get(key, "/v1/jobs"))[0] for _ in range(50)]
    await asyncio.sleep(ratelimit.SYNC_S * 2)

    assert hammered == [429] * 50
    # Refused from memory, and nothing spent: the key's row was not written again.
    assert await h.pool.fetchval("SELECT rate_updated_at FROM api_keys WHERE key_hash = $1", hash_key(key)) == touched
    # Another key of no account is still looked up, and refused as unknown, not as rate limited.
    assert (await h.get("vj_unknown", "/v1/jobs"))[0] == 401
    await asyncio.sleep(2.1)  # a token at 0.5/s
    assert (await h.get(key, "/v1/jobs"))[0] == 200


async def test_each_key_of_an_account_has_its_own_bucket(h):
    account_id, key = await h.account(requests_per_s=2.0, request_burst=3)
    async with h.pool.acquire() as conn:
        await add_api_key(conn, account_id, "vj_second-key-of-the-same-account")
    for _ in range(3):
        await h.get(key, "/v1/account")
    assert (await h.get(key, "/v1/account"))[0] == 429

    second = [(await h.get("vj_second-key-of-the-same-account", "/v1/account"))[0] for _ in range(3)]

    assert second == [200, 200, 200]


async def test_the_platform_default_applies_to_accounts_without_their_own(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url, api_rate_per_s=0.5, api_rate_burst=2)
    async with running_gateway(settings) as h:
        _, key = await h.account()
        statuses = [(await h.get(key, "/v1/jobs"))[0] for _ in range(3)]
        resp = await h.client.get("/v1/jobs", headers={"Authorization": f"Bearer {key}"})

    assert statuses == [200, 200, 429]
    assert int(resp.headers["Retry-After"]) == 2  # a whole token at 0.5/s, rounded up


async def test_concurrent_requests_get_exactly_the_burst(h):
    # Two gateways in production share one bucket through the row lock; concurrent requests are the same race.
    _, key = await h.account(requests_per_s=0.01, request_burst=5)

    statuses = await asyncio.gather(*(h.get(key, "/v1/jobs") for _ in range(12)))

    assert sorted(s for s, _ in statuses) == [200] * 5 + [429] * 7


async def test_unknown_and_revoked_keys_stay_401(h):
    account_id, key = await h.account(requests_per_s=1.0, request_burst=1)
    assert (await h.get("vj_nobody", "/v1/jobs"))[0] == 401
    await h.pool.execute("UPDATE api_keys SET revoked_at = now() WHERE account_id = $1", account_id)
    status, body = await h.get(key, "/v1/jobs")
    assert status == 401
    assert_error(body, "unauthorized", "revoked")


async def test_a_request_records_when_the_key_was_last_used(h):
    _, key = await h.account()
    assert await h.pool.fetchval("SELECT last_used_at FROM api_keys WHERE key_hash = $1", hash_key(key)) is None
    await h.get(key, "/v1/jobs")

    async def recorded() -> bool:  # at the next sync of the key's spending
        return await h.pool.fetchval("SELECT last_used_at FROM api_keys WHERE key_hash = $1",
                                     hash_key(key)) is not None

    await wait_until(recorded, within=ratelimit.SYNC_S * 4, interval=0.05, what="last_used_at")


async def test_the_account_shows_the_limits_in_force(h):
    _, own = await h.account(requests_per_s=2.5, request_burst=7)
    _, default = await h.account()
    _, a = await h.get(own, "/v1/account")
    _, b = await h.get(default, "/v1/account")
    assert (a["limits"]["requests_per_s"], a["limits"]["request_burst"]) == (2.5, 7)
    assert (b["limits"]["requests_per_s"], b["limits"]["request_burst"]) == (
        h.settings.api_rate_per_s, h.settings.api_rate_burst)


async def test_two_gateways_share_a_keys_rate_within_one_sync(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url)
    async with running_gateway(settings) as a, running_gateway(settings.with_(http_port=free_port())) as b:
        _, key = await a.account(requests_per_s=0.01, request_burst=10)

        on_a = [(await a.get(key, "/v1/jobs"))[0] for _ in range(10)]
        await asyncio.sleep(ratelimit.SYNC_S * 2)  # a's spending reaches the row
        on_b = [(await b.get(key, "/v1/jobs"))[0] for _ in range(5)]

        assert on_a == [200] * 10
        assert on_b == [429] * 5  # b read the row a had written: nothing left

        # Between two syncs, each gateway spends from the level it last saw: at most the burst each. The debt
        # then shows on both, which refuse the key until it has refilled.
        _, other = await a.account(requests_per_s=0.01, request_burst=10)
        together = await asyncio.gather(*(gw.get(other, "/v1/jobs") for gw in (a, b) for _ in range(10)))
        admitted = sum(status == 200 for status, _ in together)
        await asyncio.sleep(ratelimit.SYNC_S * 2)
        after = [(await gw.get(other, "/v1/jobs"))[0] for gw in (a, b)]

        assert 10 <= admitted <= 20
        assert after == [429, 429]


async def test_every_answer_to_a_key_carries_the_ratelimit_headers(h):
    """The IETF draft's structured fields: the policy is the key's bucket (3 at once, full again in 2 s at
    2/s), and each answer says how many are left and when the bucket is full again."""
    _, key = await h.account(requests_per_s=2.0, request_burst=3)
    answers = []
    for _ in range(4):
        resp = await h.client.get("/v1/account", headers={"Authorization": f"Bearer {key}"})
        answers.append((resp.status, resp.headers.get("RateLimit-Policy"), resp.headers.get("RateLimit")))
    unauthenticated = await h.client.get("/v1/account")

    assert [a[0] for a in answers] == [200, 200, 200, 429]
    assert {a[1] for a in answers} == {'"per-key";q=3;w=2'}
    assert [a[2].split(";")[1] for a in answers] == ["r=2", "r=1", "r=0", "r=0"]
    assert all(1 <= int(a[2].rsplit("t=", 1)[1]) <= 2 for a in answers)
    assert "RateLimit" not in unauthenticated.headers
