"""How each render's finish was learned, per provider (`vidjobs_completions_total{provider, learned_by}`): the
figure to read before choosing the recovery delay. Three jobs through the real stack, one per door: a callback,
the poll schedule of a provider without callbacks, and the recovery check of a job whose callback never came.
Each is counted once, on the committed move, whatever else arrives afterwards."""

from __future__ import annotations

from tests.stack import running_stack, stack_settings
from tests.test_observability import total

SERVICES = ("gateway", "submitter", "poller", "media", "reaper")


async def test_each_completion_is_counted_by_the_door_it_came_through(tmp_path, database_url, nats_url):
    # The recovery check comes after the first scheduled poll (2 s), so each door is the one that moved its job.
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=5, recovery_interval_s=5)
    async with running_stack(settings) as stack:
        called_back = await stack.create_job(params={"render_s": 0.1, "scenario": "duplicate_callbacks"})
        polled = await stack.create_job(model="fake-poll/default", params={"render_s": 0.1})
        lost = await stack.create_job(params={"render_s": 0.1, "scenario": "no_callback"})
        refused = await stack.create_job(params={"scenario": "content_rejected"})
        for job in (called_back, polled, lost):
            await stack.wait_for_status(job["id"], "completed")
        await stack.wait_for_status(refused["id"], "failed")
        scraped = {name: await stack.metrics(name) for name in SERVICES}

    def completions(provider: str, learned_by: str) -> float:
        return total(scraped, "vidjobs_completions_total", provider=provider, learned_by=learned_by)

    # The duplicate callback moved nothing, so it counted nothing.
    assert completions("fake", "callback") == 1
    assert completions("fake-poll", "scheduled_poll") == 1
    assert completions("fake", "recovery_poll") == 1
    assert completions("fake", "scheduled_poll") + completions("fake-poll", "callback") == 0
    assert total(scraped, "vidjobs_job_errors_total", code="content_rejected", provider="fake") == 1
