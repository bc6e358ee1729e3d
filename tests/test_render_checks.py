"""The recovery checks of a rendering job, through the whole stack (docs/ARCHITECTURE.md "Recovery"):

- at its deadline a render is asked about once more, and a render that finished is downloaded, not thrown away;
- a job whose callback never comes is looked at soon after its render should have ended, not a minute later;
- a job whose start callback came but whose last one was lost is looked at then too: a callback does not push
  the check at the render's expected end out;
- a job whose provider keeps talking (callbacks) past its render's expected end is not polled then.

Each render here is the fake provider's; how many times the provider was asked is read from the poller's own
`vidjobs_provider_calls_total{operation="status"}`. Where a word from the provider puts the next check
(`check_after_word`) is also checked on its own."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from tests.stack import running_stack, stack_settings
from tests.test_observability import total
from tests.test_render_estimates import NOON, _job
from vidjobs.common.recovery_checks import check_after_word
from vidjobs.common.settings import Settings
from vidjobs.common.states import JobStatus


async def status_calls(stack) -> float:
    return total({"poller": await stack.metrics("poller")}, "vidjobs_provider_calls_total", operation="status",
                 outcome="ok")


async def test_a_render_that_finished_by_its_deadline_is_downloaded_and_a_hung_one_times_out(
        tmp_path, database_url, nats_url):
    # The first check (2 s) finds the render still going; it ends at 3.5 s and no callback ever says so. Before,
    # the next check came at the deadline (5 s) and failed the job without asking: a paid render thrown away.
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=2, recovery_interval_s=60,
                              render_deadline_s=5)
    async with running_stack(settings) as stack:
        late = await stack.create_job(params={"scenario": "no_callback", "render_s": 3.5})
        hung = await stack.create_job(params={"scenario": "hang"})
        done, timed_out = await asyncio.gather(stack.wait_terminal(late["id"], within=40),
                                               stack.wait_terminal(hung["id"], within=40))
        late_trail, hung_trail = await stack.trail(late["id"]), await stack.trail(hung["id"])

    assert done["status"] == "completed", late_trail
    assert [m["to"] for m in late_trail] == ["pending", "submitted", "processing", "downloading", "completed"]
    assert "deadline" in late_trail[3]["reason"], late_trail  # found by the question asked at the deadline
    # A render still going when asked at its deadline times out then, as before.
    assert (timed_out["status"], timed_out["error"]["code"]) == ("failed", "render_timeout")
    assert "render deadline passed" in hung_trail[-1]["reason"]


async def test_a_lost_callback_is_found_soon_after_the_render_should_have_ended(tmp_path, database_url, nats_url):
    # Unmeasured, a render is expected by the first check (1 s); past it, the job is looked at again after half
    # its silence, at least `recovery_taper_min_s` apart. Before, every check after the first was a whole
    # `recovery_interval_s` (30 s) later.
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=1, recovery_interval_s=30,
                              recovery_taper_min_s=1)
    async with running_stack(settings) as stack:
        job = await stack.create_job(params={"scenario": "no_callback", "render_s": 2})
        done = await stack.wait_terminal(job["id"], within=20)
        calls = await status_calls(stack)

    assert done["status"] == "completed"
    assert 1 <= calls <= 4  # 1 s (still rendering), then a few checks a second or two apart until it is found


async def test_a_lost_last_callback_is_found_at_the_render_s_expected_end_not_a_quiet_span_later(
        tmp_path, database_url, nats_url):
    # A render expected in 2 s (unmeasured: `recovery_delay_s`) calls back when it starts, and its last callback
    # is lost. Before, the start callback put the next check `recovery_quiet_s` (60 s) away, so the finished
    # render was found a minute late; the check at its expected end must stay where it is.
    quiet_s = 60
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=2, recovery_interval_s=30,
                              recovery_taper_min_s=1, recovery_quiet_s=quiet_s, render_deadline_s=600)
    async with running_stack(settings) as stack:
        job = await stack.create_job(params={"scenario": "no_final_callback", "render_s": 2})
        done = await stack.wait_terminal(job["id"], within=quiet_s + 30)
        trail, counters = await stack.trail(job["id"]), await stack.counters()

    assert done["status"] == "completed", trail
    assert [m["to"] for m in trail] == ["pending", "submitted", "processing", "downloading", "completed"]
    assert trail[2]["reason"] == "callback: rendering started", trail  # the start callback came ...
    assert list(counters["callbacks_by_render"].values()) == [1]  # ... and no other
    submitted, found = (datetime.fromisoformat(trail[i]["at"]) for i in (1, 3))
    # Found by a check after the render's expected end (2 s), however slow the machine: well inside the span.
    assert (found - submitted).total_seconds() < quiet_s / 3, trail


async def test_a_job_whose_provider_calls_back_past_its_expected_end_is_not_polled(tmp_path, database_url, nats_url):
    # Checks every second once a render is past its expected end (1 s), as a job nobody hears from would get.
    # Each callback is held back 2 s, so the "started" one lands past that end and puts the next check
    # `recovery_quiet_s` away; the "finished" one (4 s + 2 s) ends the job before then. Before the quiet rule,
    # such a render was asked about every second all the same and found by those polls, not its callback.
    settings = stack_settings(tmp_path, database_url, nats_url, recovery_delay_s=1, recovery_interval_s=1)
    async with running_stack(settings) as stack:
        async with stack.session.put(f"{settings.fake_provider_url}/v1/_weather",
                                     json={"callbacks": "late", "delay_s": 2}) as resp:
            assert resp.status == 200
        jobs = [await stack.create_job(params={"scenario": "succeed", "render_s": 4}) for _ in range(3)]
        for job in jobs:
            assert (await stack.wait_terminal(job["id"], within=30))["status"] == "completed"
        calls, poller = await status_calls(stack), await stack.metrics("poller")

    # Each found by its own callback, asked about only before its "started" one landed: at 1 s and perhaps 2 s
    # (one more each on a loaded machine that delivers the callback late).
    assert total({"poller": poller}, "vidjobs_completions_total", learned_by="callback") == len(jobs)
    assert calls <= 3 * len(jobs)


# --- where a word from the provider puts the next check --------------------------------------------------

WORD = Settings(recovery_delay_s=60, recovery_taper_min_s=10, recovery_quiet_s=120)


def _at(s: float) -> datetime:
    return NOON + timedelta(seconds=s)


def test_a_word_before_the_render_s_expected_end_leaves_the_check_there():
    job = _job(JobStatus.PROCESSING)  # submitted at NOON, its model's renders here take 30 s
    # The start callback, the check already at the expected end: nothing to write.
    assert check_after_word(job, _at(1), _at(30), 30, WORD) is None
    # Unmeasured, the end is `recovery_delay_s` from submission.
    assert check_after_word(job, _at(1), _at(60), None, WORD) is None
    # A check later than the end is pulled in to it; one earlier is moved to it, never past it.
    assert check_after_word(job, _at(1), _at(121), 30, WORD) == _at(30)
    assert check_after_word(job, _at(1), _at(5), 30, WORD) == _at(30)
    # Close to the end: a check not yet scheduled waits at least `recovery_taper_min_s`; one scheduled before
    # the end goes no later than it, and a move under half the taper's step is not written.
    assert check_after_word(job, _at(25), None, 30, WORD) == _at(35)
    assert check_after_word(job, _at(25), _at(28), 30, WORD) is None
    assert check_after_word(job, _at(25), _at(33), 30, WORD) is None
    assert check_after_word(job, _at(25), _at(10), 30, WORD) == _at(30)
    # The expected end further than the quiet span: still at the end, not the quiet span away.
    assert check_after_word(job, _at(1), _at(600), 600, WORD) is None
    assert check_after_word(job, _at(1), _at(900), 600, WORD) == _at(600)


def test_a_word_past_the_render_s_expected_end_puts_the_check_a_quiet_span_away_within_the_deadline():
    job = _job(JobStatus.PROCESSING)
    assert check_after_word(job, _at(40), _at(45), 30, WORD) == _at(160)
    # Written only when that moves the check by more than half the quiet span.
    assert check_after_word(job, _at(40), _at(101), 30, WORD) is None
    assert check_after_word(job, _at(40), _at(99), 30, WORD) == _at(160)
    # Never past the deadline (looked at just after it), before or past the expected end.
    near = _job(JobStatus.PROCESSING)
    near.deadline_at = _at(120)
    assert check_after_word(near, _at(40), _at(45), 30, WORD) == _at(120.1)
    assert check_after_word(near, _at(1), None, 600, WORD) == _at(120.1)
    assert check_after_word(near, _at(1), _at(600), 600, WORD) == _at(120.1)
