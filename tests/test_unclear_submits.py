"""A submit whose outcome is unclear is not a refusal. The provider accepted the render, but its answer came
after our timeout or the connection dropped before it: the attempt is resolved under the same idempotency
key (looking the render up first where the provider allows it), so every attempt is rendered once."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from tests.stack import running_stack, stack_settings


@pytest.mark.parametrize("lookup", [True, False], ids=["with-lookup", "key-only"])
async def test_unclear_submits_render_each_attempt_once(tmp_path, database_url, nats_url, lookup):
    settings = stack_settings(tmp_path, database_url, nats_url, provider_timeout_s=1.0)
    lost = [{"scenario": "accept_then_timeout", "answer_after_s": 4}, {"scenario": "accept_then_drop"}]
    async with running_stack(settings) as stack:
        unclear = [await stack.create_job(params={**p, "render_s": 0.3, "lookup": lookup}) for p in lost * 2]
        clear = [await stack.create_job(params={"render_s": 0.3}) for _ in range(2)]
        done = await asyncio.gather(*(stack.wait_terminal(j["id"], within=90) for j in unclear + clear))
        counters = await stack.counters()

    assert [j["status"] for j in done] == ["completed"] * len(done)
    assert all(j["attempt"] == 1 for j in done), [j["attempt"] for j in done]
    for job in unclear:
        assert counters["lost_answers_by_job"][job["id"]] == 1  # the fault really happened
        assert counters["renders_by_attempt"][f"{job['id']}/1"] == 1
        assert counters["submissions_by_job"][job["id"]] >= 1
    assert set(counters["renders_by_job"].values()) == {1}


# Longer than one attempt's resolving calls (three provider timeouts of 1 s and the waits between them) and
# a retry's backoff: the submitter has every chance to give the attempt up while its requests wait, unread,
# in the stopped provider's socket.
STALL_S = 15.0


async def test_a_provider_that_stops_answering_renders_each_job_once(tmp_path, database_url, nats_url):
    """The fake provider stopped (SIGSTOP: connections are accepted and requests kept, nothing is answered)
    while jobs are submitted, then continued: it renders every request it kept. The attempts stay the same
    through the stall, so every request carried the same idempotency key and each job is rendered once."""
    settings = stack_settings(tmp_path, database_url, nats_url, provider_timeout_s=1.0, retry_base_s=0.5,
                              retry_cap_s=1.0, breaker_cooldown_s=3.0, queue_sweep_interval_s=1.0)
    async with running_stack(settings) as stack:
        pid = stack.supervisor.pid("fake-provider")
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            created = [await stack.create_job(params={"render_s": 0.3}) for _ in range(3)]
            await asyncio.sleep(STALL_S)
            during = [await stack.job(j["id"]) for j in created]
        finally:
            os.kill(pid, signal.SIGCONT)
        done = await asyncio.gather(*(stack.wait_terminal(j["id"], within=120) for j in created))
        counters = await stack.counters()

    assert [j["status"] for j in done] == ["completed"] * len(done)
    renders = {j["id"]: counters["renders_by_job"].get(j["id"], 0) for j in created}
    assert set(renders.values()) == {1}, renders
    assert all(j["attempt"] == 1 for j in done), [j["attempt"] for j in done]
    # While it lasted, each job waited on its first attempt, saying why.
    assert [(j["status"], j["attempt"]) for j in during] == [("pending", 1)] * len(during), during
    reasons = [j.get("queue_reason") or "" for j in during]
    # A kept attempt says the provider is not answering; once the timeouts have opened the breaker, a job
    # looked at again may say that instead: both are the stall, told honestly.
    assert all("not answering" in r or "is unavailable; submissions paused" in r for r in reasons), reasons
    assert any("not answering" in r for r in reasons), reasons


async def test_an_attempt_unanswered_past_the_limit_is_given_up(tmp_path, database_url, nats_url):
    """Past VIDJOBS_UNCLEAR_SUBMIT_LIMIT_S from its first call, an unanswered attempt is given up for a new
    one, as a timeout (a late render of it is stopped when its signal arrives)."""
    settings = stack_settings(tmp_path, database_url, nats_url, provider_timeout_s=1.0, retry_base_s=0.5,
                              retry_cap_s=1.0, breaker_cooldown_s=3.0, queue_sweep_interval_s=1.0,
                              unclear_submit_limit_s=2.0, max_attempts=10)
    async with running_stack(settings) as stack:
        pid = stack.supervisor.pid("fake-provider")
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            job = await stack.create_job(params={"render_s": 0.3})
            await stack.wait_for_status(job["id"], "retrying", within=30)
        finally:
            os.kill(pid, signal.SIGCONT)
        done = await stack.wait_terminal(job["id"], within=120)
        trail = await stack.trail(job["id"])

    assert done["status"] == "completed"
    assert done["attempt"] > 1
    given_up = [t for t in trail if t["to"] == "retrying"]
    assert given_up and all("timeout" in t["reason"] for t in given_up), trail
