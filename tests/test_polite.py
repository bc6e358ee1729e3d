"""Submitting politely through the whole stack: a provider's concurrency cap and request rate hold across
two submitter replicas, and its circuit breaker opens on repeated outages and closes after one probe."""

from __future__ import annotations

import asyncio
from datetime import datetime

import asyncpg
import msgspec
import pytest

from tests.stack import running_stack, stack_settings
from tests.support import wait_until
from vidjobs.cli.supervisor import SERVICES
from vidjobs.common.settings import ProviderLimits

TWO_SUBMITTERS = {**SERVICES, "submitter-2": "vidjobs.submitter"}
RENDERING = {"submitted", "processing"}


async def _moves(database_url: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(database_url)
    try:
        return await conn.fetch("SELECT job_id, from_status, to_status, at FROM job_transitions ORDER BY at, id")
    finally:
        await conn.close()


def most_in_flight(moves: list[asyncpg.Record]) -> int:
    """The most renders the provider had from us at any instant, from the audit trail: a render is in flight
    from the move into `submitted` until the job leaves `submitted`/`processing`."""
    now, most = 0, 0
    for move in moves:
        entering = move["to_status"] in RENDERING and move["from_status"] not in RENDERING
        leaving = move["from_status"] in RENDERING and move["to_status"] not in RENDERING
        now += entering - leaving
        most = max(most, now)
    return most


def submit_times(moves: list[asyncpg.Record]) -> list[datetime]:
    return [m["at"] for m in moves if m["to_status"] == "submitted"]


@pytest.mark.slow
async def test_two_submitters_never_exceed_a_providers_cap(tmp_path, database_url, nats_url):
    cap = 3
    limits = {"fake": ProviderLimits(concurrency=cap, rate_per_s=1000, burst=1000)}
    settings = stack_settings(tmp_path, database_url, nats_url, provider_limits=limits)
    async with running_stack(settings, services=TWO_SUBMITTERS) as stack:
        jobs = await asyncio.gather(*(stack.create_job(params={"render_s": 0.5}) for _ in range(24)))
        finals = await asyncio.gather(*(stack.wait_terminal(j["id"], within=120) for j in jobs))
        waited = [m for m in await _moves(database_url)]

    assert all(j["status"] == "completed" for j in finals)
    observed = most_in_flight(waited)
    print(f"\n24 jobs, 2 submitters, cap {cap}: at most {observed} renders in flight at once")
    assert observed == cap  # reached, never passed


@pytest.mark.slow
async def test_two_submitters_keep_a_providers_request_rate(tmp_path, database_url, nats_url):
    rate, burst, n = 4.0, 2, 14
    limits = {"fake": ProviderLimits(concurrency=100, rate_per_s=rate, burst=burst)}
    settings = stack_settings(tmp_path, database_url, nats_url, provider_limits=limits)
    async with running_stack(settings, services=TWO_SUBMITTERS) as stack:
        jobs = await asyncio.gather(*(stack.create_job(params={"render_s": 0.1}) for _ in range(n)))
        await asyncio.gather(*(stack.wait_terminal(j["id"], within=60) for j in jobs))
        times = sorted(submit_times(await _moves(database_url)))

    span = (times[-1] - times[0]).total_seconds()
    print(f"\n{n} submissions at {rate:g}/s with a burst of {burst}: spread over {span:.2f} s")
    assert span >= (n - burst - 1) / rate * 0.9  # the bucket held, allowing for clock granularity


async def test_breaker_opens_on_outages_and_closes_after_a_probe(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, breaker_threshold=2, breaker_cooldown_s=2,
                              retry_base_s=0.2, retry_cap_s=0.5, max_attempts=6, recovery_delay_s=1)
    async with running_stack(settings) as stack:
        await stack.supervisor.stop("fake-provider")  # the provider goes down
        jobs = [await stack.create_job(params={"render_s": 0.1}) for _ in range(4)]

        opened = await wait_until(lambda: _breaker(database_url, "open"), within=30, what="the breaker to open")
        reasons = await wait_until(lambda: _queue_reasons(stack, jobs), within=30, what="a visible reason")
        await stack.supervisor.start("fake-provider")  # and comes back
        finals = await asyncio.gather(*(stack.wait_terminal(j["id"], within=90) for j in jobs))
        closed = await _breaker(database_url, "closed")
        trails = [await stack.trail(j["id"]) for j in jobs]

    assert opened["failures"] >= 2
    assert any("unavailable; submissions paused" in r for r in reasons), reasons
    assert closed is not None and closed["failures"] == 0
    assert [j["status"] for j in finals] == ["completed"] * 4
    # The four first calls may all be in flight before the first refusal comes back; once the breaker is
    # open, only one probe goes out per pause.
    refused = sum(m["to"] == "retrying" for t in trails for m in t)
    assert refused <= len(jobs) + 1, f"the breaker should stop the calls once open, not let {refused} through"


async def _breaker(database_url: str, state: str) -> dict | None:
    conn = await asyncpg.connect(database_url)
    try:
        row = await conn.fetchrow("SELECT * FROM provider_breakers WHERE provider = 'fake' AND state = $1", state)
        return dict(row) if row else None
    finally:
        await conn.close()


async def _queue_reasons(stack, jobs: list[dict]) -> list[str]:
    reasons = [(await stack.job(j["id"]))["queue_reason"] for j in jobs]
    return [r for r in reasons if r]


def test_limits_are_settings():
    from vidjobs.common.settings import load

    settings = load({"VIDJOBS_PROVIDER_LIMITS": msgspec.json.encode({"runway": {"concurrency": 2}}).decode()})
    assert settings.provider_limits["runway"] == ProviderLimits(concurrency=2)
