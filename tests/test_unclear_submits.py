"""A submit whose outcome is unclear is not a refusal. The provider accepted the render, but its answer came
after our timeout or the connection dropped before it: the attempt is resolved under the same idempotency
key (looking the render up first where the provider allows it), so every attempt is rendered once."""

from __future__ import annotations

import asyncio

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
