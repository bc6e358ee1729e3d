"""A job's retries are bounded by time as well as by attempts: by default by as long as its attempts may take
under its provider's render deadlines (each render up to its deadline, each backoff up to its cap), so a
provider whose renders are allowed an hour is not cut off after the 45 minutes a 15-minute deadline gives, and a
job whose next retry would pass the bound fails instead."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg

from vidjobs.common import creation, jobs
from vidjobs.common.errors import ErrorCode, JobError
from vidjobs.common.jobs import JobRequest
from vidjobs.common.outcomes import fail_or_retry
from vidjobs.common.retry import Policies, RetryPolicy, next_retry
from vidjobs.common.settings import DeadlinePolicy, ProviderPolicy, Settings
from vidjobs.common.states import JobStatus

# Runway's renders may take an hour here; every other provider keeps the global deadlines (15 min).
SETTINGS = Settings(max_attempts=3, retry_base_s=2, retry_cap_s=60, render_deadline_s=900,
                    render_deadline_ceiling_s=900, render_deadlines={"runway": DeadlinePolicy(ceiling_s=3600)})
RUNWAY_BOUND_S = 3 * 3600 + 2 * 60  # three renders to their deadline, two backoffs to their cap
DEFAULT_BOUND_S = 3 * 900 + 2 * 60
UNAVAILABLE = JobError.of(ErrorCode.PROVIDER_UNAVAILABLE)


def test_the_bound_follows_each_provider_s_render_deadlines_and_its_retry_policy():
    assert RetryPolicy.from_settings(SETTINGS, "runway").max_elapsed_s == RUNWAY_BOUND_S
    assert RetryPolicy.from_settings(SETTINGS, "luma").max_elapsed_s == DEFAULT_BOUND_S
    assert RetryPolicy.from_settings(SETTINGS).max_elapsed_s == DEFAULT_BOUND_S
    # A deadline while renders are unmeasured longer than the ceiling is one a render may be given.
    unmeasured = SETTINGS.with_(render_deadlines={"veo": DeadlinePolicy(unmeasured_s=1800)})
    assert RetryPolicy.from_settings(unmeasured, "veo").max_elapsed_s == 3 * 1800 + 2 * 60
    # The provider's own attempts and cap count; a bound it sets itself wins.
    own = SETTINGS.with_(retry_policies={"runway": ProviderPolicy(max_attempts=5, cap_s=120)})
    assert RetryPolicy.from_settings(own, "runway").max_elapsed_s == 5 * 3600 + 4 * 120
    fixed = SETTINGS.with_(retry_policies={"runway": ProviderPolicy(max_elapsed_s=600)})
    assert RetryPolicy.from_settings(fixed, "runway").max_elapsed_s == 600
    assert Policies(own).for_provider("runway").max_elapsed_s == 5 * 3600 + 4 * 120


def test_a_retry_that_would_pass_the_bound_is_not_made():
    policy = RetryPolicy.from_settings(SETTINGS, "runway")
    now = datetime.now(UTC)
    # Whatever the jitter draws, the next try comes within the cap: one the bound still has room for is made...
    roomy = now - timedelta(seconds=policy.max_elapsed_s - policy.cap_s - 1)
    when = next_retry(policy, UNAVAILABLE, attempt=1, created_at=roomy, now=now)
    assert when is not None and (when - roomy).total_seconds() <= policy.max_elapsed_s
    # ... and one past it is not, even with attempts left.
    spent = now - timedelta(seconds=policy.max_elapsed_s)
    assert next_retry(policy, UNAVAILABLE, attempt=1, created_at=spent, now=now) is None
    # A rate limit spends no attempt: only the bound ends a provider that never stops saying so.
    limited = JobError.of(ErrorCode.RATE_LIMITED)
    assert next_retry(policy, limited, attempt=99, created_at=roomy, now=now) is not None
    assert next_retry(policy, limited, attempt=99, created_at=spent, now=now) is None


async def _job_created_ago(pool: asyncpg.Pool, model: str, seconds: float) -> jobs.JobRow:
    async with pool.acquire() as conn, conn.transaction():
        job = await creation.create(conn, account_id="acct_e", request=JobRequest(model=model, prompt="p"),
                                    estimated_credits=10, recovery_delay_s=60)
        await conn.execute("UPDATE jobs SET created_at = now() - make_interval(secs => $2) WHERE id = $1",
                           job.id, seconds)
    found = await jobs.fetch(pool, job.id)
    assert found is not None
    return found


async def test_a_failed_attempt_retries_within_its_provider_s_bound_and_fails_past_it(pool):
    await pool.execute("INSERT INTO accounts (id, name, credits_balance) VALUES ('acct_e', 'e', 10000)")
    # Two hours in: past what 15-minute renders allow, well within what hour-long ones do.
    hour_long = await _job_created_ago(pool, "runway/gen4_turbo", 2 * 3600)
    past = await _job_created_ago(pool, "runway/gen4_turbo", RUNWAY_BOUND_S + 1)
    quarter_hour = await _job_created_ago(pool, "luma/ray-2", 2 * 3600)
    policies = Policies(SETTINGS)

    moved = {}
    for name, job in {"hour_long": hour_long, "past": past, "quarter_hour": quarter_hour}.items():
        async with pool.acquire() as conn, conn.transaction():
            done = await fail_or_retry(conn, job, UNAVAILABLE, policies=policies, reason="provider down",
                                       expect=[JobStatus.PENDING])
        assert done is not None
        moved[name] = done.job.status

    assert moved == {"hour_long": JobStatus.RETRYING, "past": JobStatus.FAILED, "quarter_hour": JobStatus.FAILED}
