"""`Idempotency-Key` is remembered for exactly `VIDJOBS_IDEMPOTENCY_TTL_S` (24 hours): within it the same body
replays and another body is 409; past it the key is forgotten, and the gateway's sweep deletes its row."""

from __future__ import annotations

import pytest

from tests.gateway_harness import JOB_BODY, assert_error, gateway_settings, running_gateway
from tests.support import wait_until
from vidjobs.gateway import idempotency

DAY_S = 86400


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def age(h, key: str, seconds: float) -> None:
    """Make the stored key `seconds` old."""
    await h.pool.execute(
        "UPDATE idempotency_keys SET created_at = now() - make_interval(secs => $2) WHERE key = $1", key, seconds)


async def test_the_ttl_is_24_hours_by_default(h):
    assert h.settings.idempotency_ttl_s == DAY_S


async def test_replay_within_the_ttl_answers_the_same_job_and_another_body_is_409(h):
    key = await h.key()
    _, job = await h.post_job(key, headers={"Idempotency-Key": "k"})
    await age(h, "k", DAY_S - 60)

    again, same = await h.post_job(key, headers={"Idempotency-Key": "k"})
    other, conflict = await h.post_job(key, headers={"Idempotency-Key": "k"}, prompt="another clip")

    assert (again, same["id"]) == (200, job["id"])
    assert other == 409
    replay = await h.client.post("/v1/jobs", json=JOB_BODY, headers={"Authorization": f"Bearer {key}",
                                                                     "Idempotency-Key": "k"})
    fresh = await h.client.post("/v1/jobs", json=JOB_BODY, headers={"Authorization": f"Bearer {key}",
                                                                    "Idempotency-Key": "k2"})
    assert (replay.status, replay.headers.get("Idempotent-Replayed")) == (200, "true")
    assert (fresh.status, fresh.headers.get("Idempotent-Replayed")) == (201, None)
    assert_error(conflict, "conflict", "Idempotency-Key")
    assert await h.count("SELECT count(*) FROM jobs") == 2


async def test_a_key_past_the_ttl_is_forgotten_and_makes_a_new_job(h):
    key = await h.key()
    _, old = await h.post_job(key, headers={"Idempotency-Key": "k"})
    await age(h, "k", DAY_S + 1)

    status, new = await h.post_job(key, headers={"Idempotency-Key": "k"})
    replay, same = await h.post_job(key, headers={"Idempotency-Key": "k"})

    assert status == 201 and new["id"] != old["id"]
    assert (replay, same["id"]) == (200, new["id"])  # the key now names the new job, for another 24 hours
    row = await h.pool.fetchrow("SELECT job_id, now() - created_at < interval '1 minute' AS fresh "
                                "FROM idempotency_keys WHERE key = 'k'")
    assert (row["job_id"], row["fresh"]) == (new["id"], True)
    assert await h.count("SELECT count(*) FROM jobs") == 2


async def test_an_expired_key_with_another_body_is_not_a_conflict(h):
    key = await h.key()
    await h.post_job(key, headers={"Idempotency-Key": "k"})
    await age(h, "k", DAY_S + 1)
    status, _ = await h.post_job(key, headers={"Idempotency-Key": "k"}, prompt="another clip")
    assert status == 201


async def test_the_sweep_deletes_expired_keys_only(h):
    key = await h.key()
    for name in ["old-1", "old-2", "live"]:
        await h.post_job(key, headers={"Idempotency-Key": name})
    await age(h, "old-1", DAY_S + 1)
    await age(h, "old-2", DAY_S * 3)

    deleted = await idempotency.sweep(h.pool, h.settings.idempotency_ttl_s, batch=1)

    assert deleted == 2
    assert [r["key"] for r in await h.pool.fetch("SELECT key FROM idempotency_keys")] == ["live"]
    assert await h.count("SELECT count(*) FROM jobs") == 3  # the jobs stay; only the keys are forgotten


async def test_the_gateway_sweeps_on_its_own(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url, idempotency_sweep_interval_s=0.2)
    async with running_gateway(settings) as h:
        key = await h.key()
        await h.post_job(key, headers={"Idempotency-Key": "old"})
        await h.post_job(key, headers={"Idempotency-Key": "live"})
        await age(h, "old", DAY_S + 1)

        async def swept() -> bool:
            return await h.count("SELECT count(*) FROM idempotency_keys WHERE key = 'old'") == 0

        await wait_until(swept, within=10, what="the gateway's sweep to delete the expired key")
        assert await h.count("SELECT count(*) FROM idempotency_keys WHERE key = 'live'") == 1
