"""Every fake-provider scenario of docs/FAKE_PROVIDER.md through the whole stack, each ending where it should with the
right `error.code` and `retryable`, and nothing rendered more often than it had attempts."""

from __future__ import annotations

import asyncio

import pytest

from tests.stack import running_stack, stack_settings

# scenario -> (status, error code, retryable, attempts, renders)
EXPECTED: dict[str, tuple[str, str | None, bool | None, int, int]] = {
    "succeed": ("completed", None, None, 1, 1),
    "duplicate_callbacks": ("completed", None, None, 1, 1),
    "no_callback": ("completed", None, None, 1, 1),
    # A rate limit spends no attempt: two 429s, then the first attempt renders.
    "rate_limit_then_succeed": ("completed", None, None, 1, 1),
    # A 503 does: two refused attempts, the third renders.
    "unavailable_then_succeed": ("completed", None, None, 3, 1),
    "content_rejected": ("failed", "content_rejected", False, 1, 1),
    "fail_always": ("failed", "provider_unavailable", True, 3, 3),
    # Past its deadline the render is stopped and the job fails, once: no second paid render unless the
    # provider's retry policy says retry_on_timeout; its owner may render it again.
    "hang": ("failed", "render_timeout", True, 1, 1),
    "bad_output": ("failed", "verification_failed", False, 1, 1),
    # The render was copied on the first request, before the provider's URL expired.
    "expired_output": ("completed", None, None, 1, 1),
}


# A render's deadline. At it the provider is asked once more, and what it says decides: a render the provider
# failed or finished before a loaded machine handed that on fails or completes as it should, and only `hang`
# (still rendering when asked) times out.
DEADLINE_S = 3


@pytest.fixture
def settings(tmp_path, database_url, nats_url):
    return stack_settings(
        tmp_path, database_url, nats_url, recovery_delay_s=1, recovery_interval_s=1, render_deadline_s=DEADLINE_S,
        retry_base_s=0.2, retry_cap_s=1, max_attempts=3,
        # Every attempt is spent, not the time: by default a job stops retrying render_deadline_s x max_attempts
        # (here 18 s) after its creation, which a loaded machine reaches with attempts still unspent.
        retry_policies={"fake": {"max_elapsed_s": 300}},
    )


async def test_every_scenario_ends_honestly(settings):
    async with running_stack(settings) as stack:
        created = {
            scenario: await stack.create_job(params={"scenario": scenario, "render_s": 0.3})
            for scenario in EXPECTED
        }
        finals = dict(zip(created, await asyncio.gather(
            *(stack.wait_terminal(job["id"], within=90) for job in created.values())), strict=True))
        counters = await stack.counters()

    observed = {}
    for scenario, job in finals.items():
        error = job["error"] or {}
        observed[scenario] = (job["status"], error.get("code"), error.get("retryable"), job["attempt"],
                              counters["renders_by_job"].get(job["id"], 0))
    assert observed == EXPECTED
    for scenario, job in finals.items():
        if job["error"]:
            assert len(job["error"]["message"]) > 20, f"{scenario}: a message a person can act on"
    assert f"within {DEADLINE_S} s" in finals["hang"]["error"]["message"]


async def test_retries_wait_out_the_backoff_and_the_trail_says_why(settings):
    async with running_stack(settings) as stack:
        job = await stack.create_job(params={"scenario": "rate_limit_then_succeed", "render_s": 0.1})
        done = await stack.wait_terminal(job["id"], within=60)
        trail = await stack.trail(job["id"])
        counters = await stack.counters()

    assert done["status"] == "completed"
    moves = [(m["from"], m["to"]) for m in trail]
    assert moves.count(("pending", "retrying")) == 2 and moves.count(("retrying", "pending")) == 2
    assert all("rate_limited" in m["reason"] for m in trail if m["to"] == "retrying")
    assert counters["submissions_by_job"][job["id"]] == 3  # two refused, one accepted
