"""Failover through the whole stack: a waiting job that names fallback models moves to the first that can
take it when its provider's breaker is open, and is charged the fallback's price; a job without fallbacks
waits where it is; a fallback dearer than the job's quote is never used. `fake` and `fake-poll` are two
providers (two breakers) served by one fake provider, so one can be made to fail while the other renders."""

from __future__ import annotations

import asyncio
from unittest.mock import AsyncMock

import asyncpg
import msgspec
import pytest

from tests.gateway_harness import auth, gateway_settings, running_gateway
from tests.stack import Stack, running_stack, stack_settings
from tests.support import wait_until
from tests.test_app_webhooks import client_app
from tests.test_money import assert_ledger_explains
from vidjobs.common import jobs, ratecard
from vidjobs.common.ratecard import Price, RateCardIn
from vidjobs.common.settings import ProviderLimits
from vidjobs.submitter import failover

# The breaker opens at the first refused submit and stays open for the whole test.
BREAKER = {"breaker_threshold": 1, "breaker_cooldown_s": 300, "retry_base_s": 0.2, "retry_cap_s": 0.5,
           "max_attempts": 6, "recovery_delay_s": 5}
QUICK = {"render_s": 0.2}


async def _publish_card(database_url: str) -> None:
    """fake-poll is half fake's price at 720p and twice it at 1080p."""
    conn = await asyncpg.connect(database_url)
    try:
        await ratecard.publish(conn, RateCardIn(credits_per_usd=100, note="two providers", prices=[
            *(Price(model="*", resolution=r, credits_per_second=10) for r in ("480p", "720p", "1080p")),
            Price(model="fake-poll/*", resolution="720p", credits_per_second=5),
            Price(model="fake-poll/*", resolution="1080p", credits_per_second=20),
        ]))
    finally:
        await conn.close()


async def _send(stack: Stack, method: str, path: str, body: dict) -> tuple[int, dict]:
    async with stack.session.request(method, f"{stack.url}{path}", json=body, headers=stack.auth) as resp:
        return resp.status, await resp.json()


async def _breaker_open(database_url: str) -> bool:
    conn = await asyncpg.connect(database_url)
    try:
        return bool(await conn.fetchval("SELECT state = 'open' FROM provider_breakers WHERE provider = 'fake'"))
    finally:
        await conn.close()


async def test_a_job_moves_to_a_cheaper_fallback_when_its_provider_is_down(tmp_path, database_url, nats_url):
    await _publish_card(database_url)
    async with client_app() as (app, port):
        settings = stack_settings(tmp_path, database_url, nats_url, webhook_allow_hosts=f"127.0.0.1:{port}",
                                  **BREAKER)
        async with running_stack(settings) as stack:
            status, _ = await _send(stack, "POST", "/v1/webhook-endpoints",
                                    {"url": f"http://127.0.0.1:{port}/hooks/app", "events": ["job.moved"]})
            assert status == 201
            # A job without fallbacks meets the outage first: its refused submit opens fake's breaker.
            stuck = await stack.create_job(params={"scenario": "unavailable_then_succeed"})
            await wait_until(lambda: _breaker_open(database_url), within=30, what="fake's breaker to open")

            moving = await stack.create_job(duration_s=2, params=QUICK, fallback_models=["fake-poll/default"])
            waiting = await stack.create_job(duration_s=2, params=QUICK)
            done = await stack.wait_terminal(moving["id"], within=60)
            trail = await stack.trail(moving["id"])
            held = await stack.job(waiting["id"])
            first = await stack.job(stuck["id"])
            await wait_until(lambda: _heard(app, "app"), within=30, what="the app to hear of the move")
            pool = await asyncpg.create_pool(database_url, min_size=1, max_size=1)
            try:
                account_id = await pool.fetchval("SELECT account_id FROM jobs WHERE id = $1", moving["id"])
                entries = await assert_ledger_explains(pool, account_id)
            finally:
                await pool.close()

    assert moving["fallback_models"] == ["fake-poll/default"] and moving["cost"]["estimated_credits"] == 20
    assert (done["status"], done["model"], done["fallback_models"]) == ("completed", "fake-poll/default", [])
    # Charged the fallback's price (2 s at 5 credits), not the 20 first reserved. The provider billed its list
    # price ($0.10 a second: 20 credits at 100 a USD), above that quote: the platform absorbed the rest.
    assert done["cost"] == {"estimated_credits": 10, "actual_credits": 10, "provider_credits": 20,
                            "absorbed_credits": 10}
    moves = [m for m in trail if m["from"] == "pending" and m["to"] == "pending"]
    assert len(moves) == 1 and "moved from fake/default to fake-poll/default" in moves[0]["reason"], trail
    assert "unavailable" in moves[0]["reason"]
    reprices = [e for e in entries if e["job_id"] == moving["id"] and e["kind"] == "reprice"]
    assert [(e["balance_change"], e["reserved_change"]) for e in reprices] == [(0, -10)]
    # Without fallbacks, a job waits for its own provider.
    assert (held["status"], held["model"]) == ("pending", "fake/default")
    assert "unavailable" in (held["queue_reason"] or "")
    assert first["model"] == "fake/default"
    heard = app.events("app")
    assert [(e["type"], e["data"]["id"], e["data"]["model"]) for e in heard] == [
        ("job.moved", moving["id"], "fake-poll/default")]


async def _heard(app, name: str) -> bool:
    return bool(app.received.get(name))


@pytest.fixture
async def h(tmp_path, database_url, nats_url):
    await _publish_card(database_url)
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as harness:
        yield harness


async def _patch(h, key: str, body: dict) -> tuple[int, dict]:
    resp = await h.client.patch("/v1/account", json=body, headers=auth(key))
    return resp.status, await resp.json()


async def test_a_dearer_fallback_is_refused_when_named_and_left_out_of_the_default(h):
    _, key = await h.account(credits=10_000)
    # Named by the job: refused at once, with the price that rules it out.
    status, named = await h.post_job(key, resolution="1080p", duration_s=2, fallback_models=["fake-poll/default"])
    # The account's default: kept for a job it can take within its quote, left out of one it cannot.
    patched, account = await _patch(h, key, {"fallback_models": ["fake-poll/default", "fake-poll/default"]})
    _, cheap = await h.post_job(key, duration_s=2)
    _, dear = await h.post_job(key, duration_s=2, resolution="1080p")
    _, opt_out = await h.post_job(key, duration_s=2, fallback_models=[])
    _, alias_of_itself = await h.post_job(key, duration_s=2, fallback_models=["fake/default"])

    assert status == 422 and "more than its quote of 20" in named["error"]["message"], named
    assert patched == 200 and account["fallback_models"] == ["fake-poll/default"]
    assert (cheap["fallback_models"], cheap["cost"]["estimated_credits"]) == (["fake-poll/default"], 20)
    assert dear["fallback_models"] == [] and opt_out["fallback_models"] == []
    assert alias_of_itself["fallback_models"] == []  # moving to the model it has would change nothing


async def test_a_move_never_raises_the_reservation(h):
    """The submitter's own check, beside the gateway's: a fallback priced above what the job holds is passed
    over even if one slipped through."""
    _, key = await h.account(credits=10_000)
    _, made = await h.post_job(key, duration_s=2, fallback_models=["fake-poll/default"])
    job = await jobs.fetch(h.pool, made["id"])
    never_sooner = AsyncMock(return_value=False)
    async with h.pool.acquire() as conn:
        fits = await failover.target(conn, job, frozenset({"fake", "fake-poll"}), failover.Why.BREAKER,
                                     never_sooner, None)
        held_less = msgspec.structs.replace(job, estimated_credits=9)
        too_dear = await failover.target(conn, held_less, frozenset({"fake", "fake-poll"}), failover.Why.BREAKER,
                                         never_sooner, None)
        not_sooner = await failover.target(conn, job, frozenset({"fake", "fake-poll"}), failover.Why.MAX_WAIT,
                                           never_sooner, None)
        not_offered = await failover.target(conn, job, frozenset({"fake"}), failover.Why.BREAKER, never_sooner, None)
    assert fits == failover.Target(model="fake-poll/default", quote=10, rest=[])
    assert too_dear is None and not_sooner is None and not_offered is None


async def test_bad_fallbacks_are_refused_with_422(h):
    _, key = await h.account(credits=10_000)
    bodies = [
        {"fallback_models": ["fake-poll/default", "fake-poll/a", "fake-poll/b", "fake-poll/c"]},
        {"fallback_models": "fake-poll/default"},
        {"fallback_models": ["not a model"]},
        {"fallback_models": ["nowhere/model"]},
        {"max_wait_s": 0},
        {"max_wait_s": 10**9},
        {"fallback_models": ["fake-poll/default"], "params": {"render_s": -1}},
    ]
    for body in bodies:
        status, answer = await h.post_job(key, **body)
        assert status == 422, (body, answer)
        assert answer["error"]["code"] == "invalid_input", answer
    for body in ({"fallback_models": ["nowhere/model"]}, {"fallback_models": ["fake/other-model"]},
                 {"fallback_models": None, "x": 1}):
        status, answer = await _patch(h, key, body)
        assert status == 422, (body, answer)


async def test_a_job_whose_estimated_start_passes_its_max_wait_moves_to_a_sooner_fallback(tmp_path, database_url,
                                                                                          nats_url):
    """fake renders one job at a time; once two of its renders are measured, a job queued behind four more
    is estimated to start well after 3 s: with max_wait_s 3 it moves to fake-poll, which has a slot free.
    A job with a limit its estimate keeps, or without fallbacks, stays."""
    await _publish_card(database_url)
    settings = stack_settings(tmp_path, database_url, nats_url, estimate_min_samples=2, estimate_refresh_s=0.5,
                              provider_limits={"fake": ProviderLimits(concurrency=1, rate_per_s=10, burst=10)})
    two_s = {"render_s": 2}
    async with running_stack(settings) as stack:
        for measured in [await stack.create_job(params=two_s) for _ in range(2)]:
            await stack.wait_terminal(measured["id"], within=60)
        # A model's measurements are read at most once per estimate_refresh_s, and reads of the renders under
        # way read them too: the read after that interval counts both renders.
        await asyncio.sleep(settings.estimate_refresh_s)
        ahead = [await stack.create_job(params=two_s) for _ in range(4)]
        hurried = await stack.create_job(params=two_s, fallback_models=["fake-poll/default"], max_wait_s=3)
        patient = await stack.create_job(params=two_s, fallback_models=["fake-poll/default"], max_wait_s=3600)
        unmovable = await stack.create_job(params=two_s, max_wait_s=3)
        moved = await stack.wait_terminal(hurried["id"], within=60)
        stayed = [await stack.wait_terminal(j["id"], within=90) for j in (*ahead, patient, unmovable)]
        trail = await stack.trail(hurried["id"])

    assert hurried["estimate"]["start_p50"] is not None
    assert (moved["status"], moved["model"]) == ("completed", "fake-poll/default")
    [move] = [m for m in trail if m["from"] == "pending" and m["to"] == "pending"]
    assert "max_wait_s of 3 s" in move["reason"], move
    assert [(j["status"], j["model"]) for j in stayed] == [("completed", "fake/default")] * 6
