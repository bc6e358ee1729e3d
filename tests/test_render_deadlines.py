"""Render deadlines from each model's measured renders, the `render_timeout` ending, reruns and the count of
regenerations: the arithmetic alone, the normalised prompt against PostgreSQL's, and the whole stack with the
fake provider (a slow model's render given a later deadline than a fast one's, a hung render failing once,
its rerun, the CLI's `--again` and vidjobs_regenerations_total)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import asyncpg
import pytest

from tests.gateway_harness import drive
from tests.stack import Stack, demo_key, running_stack, stack_settings
from tests.support import wait_until
from tests.test_cli_render import _env, _json, vidjobs
from tests.test_observability import value
from vidjobs.cli.exitcodes import Exit
from vidjobs.common import creation, db
from vidjobs.common.errors import ErrorCode, JobError
from vidjobs.common.estimates import Measured
from vidjobs.common.jobs import JobRequest
from vidjobs.common.regenerations import normalise_prompt, normalised_prompt_sql
from vidjobs.common.render_deadlines import deadline_for
from vidjobs.common.retry import RetryPolicy, next_retry
from vidjobs.common.settings import DeadlinePolicy, Settings, load
from vidjobs.common.states import JobStatus

# ---- the arithmetic ---------------------------------------------------------------------------------------


def _measured(samples: int, p99: float) -> Measured:
    return Measured(samples=samples, hold_p99_s=p99)


def test_the_deadline_is_the_p99_and_its_margin_between_the_floor_and_the_ceiling():
    settings = Settings(render_deadline_s=900, render_deadline_floor_s=60, render_deadline_ceiling_s=1800,
                        render_deadline_margin=0.5, render_deadline_min_samples=10)
    assert deadline_for("fake/default", _measured(10, 200), settings).seconds == 300
    assert deadline_for("fake/default", _measured(10, 10), settings).seconds == 60  # the floor
    assert deadline_for("fake/default", _measured(10, 5000), settings).seconds == 1800  # the ceiling
    few = deadline_for("fake/default", _measured(9, 200), settings)
    assert (few.seconds, few.p99_s) == (900, None)  # too few measured: the fixed deadline
    assert "300 s" in deadline_for("fake/default", _measured(10, 200), settings).said()


def test_a_provider_overrides_each_part_of_its_deadline():
    settings = load({"VIDJOBS_RENDER_DEADLINE_MIN_SAMPLES": "10",
                     "VIDJOBS_RENDER_DEADLINES": '{"runway": {"margin": 1, "ceiling_s": 500, "unmeasured_s": 1200}}'})
    assert settings.render_deadlines == {"runway": DeadlinePolicy(margin=1, ceiling_s=500, unmeasured_s=1200)}
    assert deadline_for("runway/gen4", _measured(10, 200), settings).seconds == 400
    assert deadline_for("runway/gen4", _measured(10, 300), settings).seconds == 500
    assert deadline_for("runway/gen4", _measured(0, 0), settings).seconds == 1200
    assert deadline_for("fake/default", _measured(10, 200), settings).seconds == 300  # the global margin


def test_a_render_timeout_is_retried_only_where_the_provider_policy_says_so():
    error = JobError.of(ErrorCode.RENDER_TIMEOUT)
    now = datetime.now(UTC)
    assert error.retryable  # the same request may well render in time later: its owner may rerun it
    assert next_retry(RetryPolicy(), error, attempt=1, created_at=now, now=now) is None
    assert next_retry(RetryPolicy(retry_on_timeout=True), error, attempt=1, created_at=now, now=now) is not None
    settings = load({"VIDJOBS_RETRY_POLICIES": '{"luma": {"retry_on_timeout": true}}'})
    assert RetryPolicy.from_settings(settings, "luma").retry_on_timeout
    assert not RetryPolicy.from_settings(settings, "fake").retry_on_timeout


PROMPTS = ["A Red Fox", "  a red fox  ", "a\tred\n\nfox", "a red  fox in SNOW", " \t a red fox", "ÀB  c", ""]


async def test_the_normalised_prompt_is_postgresqls_own(database_url):
    conn = await asyncpg.connect(database_url)
    try:
        for prompt in PROMPTS:
            assert await conn.fetchval(f"SELECT {normalised_prompt_sql('$1::text')}", prompt) == \
                normalise_prompt(prompt), repr(prompt)
    finally:
        await conn.close()
    assert normalise_prompt("  A  Red\tFox ") == "a red fox"


# ---- the whole stack ---------------------------------------------------------------------------------------

FAST, SLOW = "fake/default", "fake-poll/default"
# Seconds each seeded render held its provider slot: p99 (PostgreSQL's percentile_cont) 1.99 and 39.8.
HOLDS = {FAST: [1.0, 1.5, 2.0], SLOW: [20.0, 30.0, 40.0]}
MARGIN = 0.5


@pytest.fixture
def settings(tmp_path, database_url, nats_url):
    return stack_settings(
        tmp_path, database_url, nats_url, recovery_delay_s=1, recovery_interval_s=1, render_deadline_s=600,
        render_deadline_floor_s=1, render_deadline_ceiling_s=300, render_deadline_margin=MARGIN,
        render_deadline_min_samples=3, retry_base_s=0.2, retry_cap_s=1, regeneration_window_s=600)


async def _seed_measured_renders(database_url: str) -> None:
    """Completed renders of each model, of another account, that held their slot HOLDS seconds: the rows the
    measurements read, moved there by the real transition function."""
    await db.migrate(database_url)
    await demo_key(database_url)
    pool = await db.create_pool(database_url, min_size=1, max_size=2)
    try:
        account = await pool.fetchval("SELECT id FROM accounts ORDER BY created_at LIMIT 1")
        for model, holds in HOLDS.items():
            for i, hold in enumerate(holds):
                async with pool.acquire() as conn, conn.transaction():
                    job = await creation.create(conn, account_id=account, estimated_credits=10,
                                                request=JobRequest(model=model, prompt=f"seed {i}"),
                                                recovery_delay_s=600)
                await drive(pool, job.id, JobStatus.SUBMITTED, JobStatus.PROCESSING, JobStatus.DOWNLOADING,
                            JobStatus.COMPLETED)
                await pool.execute("UPDATE jobs SET submitted_at = rendered_at - make_interval(secs => $2) "
                                   "WHERE id = $1", job.id, hold)
    finally:
        await pool.close()


def _p99(holds: list[float]) -> float:
    """percentile_cont(0.99): linear between the two values around 0.99 * (n - 1)."""
    ordered = sorted(holds)
    at = 0.99 * (len(ordered) - 1)
    low = int(at)
    return ordered[low] + (at - low) * (ordered[min(low + 1, len(ordered) - 1)] - ordered[low])


def _deadline_s(job: dict) -> float:
    return (datetime.fromisoformat(job["deadline_at"]) - datetime.fromisoformat(job["started_at"])).total_seconds()


async def _post(stack: Stack, path: str, *, key: str | None = None, **kwargs) -> tuple[int, dict, dict]:
    headers = {**stack.auth, **({"Idempotency-Key": key} if key else {}), **kwargs.pop("headers", {})}
    async with stack.session.post(f"{stack.url}{path}", headers=headers, **kwargs) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


async def _regenerations(stack: Stack, model: str) -> float | None:
    return value(await stack.metrics("gateway"), "vidjobs_regenerations_total", model=model)


async def test_deadlines_follow_each_model_and_a_hung_render_fails_once_and_is_rerun(settings, tmp_path):
    # One stack for the whole story (about 35 s on two cores, most of it the stack starting, the ~3 s deadline
    # running out and the CLI's own processes): a stack of its own for each part would cost that many times.
    await _seed_measured_renders(settings.database_url)
    async with running_stack(settings) as stack:
        assert await _regenerations(stack, FAST) == 0  # exported from the start, for every model offered
        fast = await stack.create_job(model=FAST, params={"scenario": "hang"})
        slow = await stack.create_job(model=SLOW, params={"scenario": "hang"})
        fast_rendering = await stack.wait_for_status(fast["id"], "submitted", "processing", "failed")
        slow_rendering = await stack.wait_for_status(slow["id"], "submitted", "processing")
        # The deadline in force is public, and set from each model's own renders.
        assert _deadline_s(fast_rendering) == pytest.approx(_p99(HOLDS[FAST]) * (1 + MARGIN), abs=0.01)
        assert _deadline_s(slow_rendering) == pytest.approx(_p99(HOLDS[SLOW]) * (1 + MARGIN), abs=0.01)
        await _post(stack, f"/v1/jobs/{slow['id']}/cancel")

        failed = await stack.wait_terminal(fast["id"], within=60)
        counters = await stack.counters()
        # One attempt, one paid render, stopped at the provider; nothing left reserved.
        assert (failed["status"], failed["error"]["code"], failed["attempt"]) == ("failed", "render_timeout", 1)
        assert "within 3 s" in failed["error"]["message"] and failed["cost"]["actual_credits"] == 0
        assert counters["renders_by_job"][fast["id"]] == 1 and counters["submissions_by_job"][fast["id"]] == 1
        await wait_until(lambda: _render_status(stack, fast["id"], "canceled"), within=30,
                         what="the timed-out render to be canceled at the provider")
        await wait_until(lambda: _nothing_reserved(stack), within=30, what="the reservations to be released")
        assert [m["to"] for m in await stack.trail(fast["id"])].count("retrying") == 0

        # Rendered again: a new job of the same request, linked to it; the same key answers the same job.
        status, again, headers = await _post(stack, f"/v1/jobs/{fast['id']}/rerun", key="again-1")
        assert status == 201 and headers["Location"] == f"/v1/jobs/{again['id']}"
        assert (again["rerun_of"], again["prompt"], again["params"], again["model"]) == (
            fast["id"], fast["prompt"], {"scenario": "hang"}, FAST)
        assert fast["rerun_of"] is None
        replayed = await _post(stack, f"/v1/jobs/{fast['id']}/rerun", key="again-1")
        assert (replayed[0], replayed[1]["id"], replayed[2].get("Idempotent-Replayed")) == (200, again["id"], "true")
        reused = await _post(stack, "/v1/jobs", key="again-1", json={"model": FAST, "prompt": "x"})
        assert (reused[0], reused[1]["error"]["code"]) == (409, "conflict")
        await _post(stack, f"/v1/jobs/{again['id']}/cancel")
        assert await _regenerations(stack, FAST) == 1  # the rerun, once

        # Another account's job is nobody's; a deleted one says why it cannot be rerun.
        other = stack.as_key(await demo_key(settings.database_url))
        assert (await _post(other, f"/v1/jobs/{fast['id']}/rerun"))[0] == 404
        async with stack.session.delete(f"{stack.url}/v1/jobs/{slow['id']}", headers=stack.auth) as resp:
            assert resp.status == 204
        gone = await _post(stack, f"/v1/jobs/{slow['id']}/rerun")
        assert gone[0] == 409 and "deleted" in gone[1]["error"]["message"]

        await _same_prompt_counts(stack)
        await _the_cli_renders_again(stack, tmp_path)


async def _same_prompt_counts(stack: Stack) -> None:
    """A job of the model and normalised prompt of one of its account's ready jobs counts; others do not."""
    quick = {"params": {"render_s": 0.1}}
    ready = await stack.create_job(model=FAST, prompt="A lighthouse at dusk", **quick)
    await stack.wait_for_status(ready["id"], "completed")
    await stack.create_job(model=FAST, prompt="  a LIGHTHOUSE   at\tdusk ", **quick)
    await stack.create_job(model=FAST, prompt="a lighthouse at dawn", **quick)
    await stack.create_job(model=SLOW, prompt="a lighthouse at dusk", **quick)
    assert await _regenerations(stack, FAST) == 2
    assert await _regenerations(stack, SLOW) == 0


async def _the_cli_renders_again(stack: Stack, tmp_path) -> None:
    env = _env(tmp_path, stack.url, stack.key)
    done = _json(await vidjobs(env, "render", "--model", FAST, "--param", "render_s=0.1", "a kite over a dune",
                               "--wait", "--json"))[0]
    again = await vidjobs(env, "render", "--again", done["id"], "--wait", "--json")
    assert again.returncode == Exit.OK, again.stderr
    [job] = _json(again)
    assert (job["rerun_of"], job["prompt"], job["status"]) == (done["id"], "a kite over a dune", "completed")
    mixed = await vidjobs(env, "render", "a kite", "--again", done["id"])
    assert mixed.returncode == Exit.USAGE and "PROMPT" in mixed.stderr
    assert await _regenerations(stack, FAST) == 3


async def _render_status(stack: Stack, job_id: str, wanted: str) -> bool:
    async with stack.session.get(f"{stack.settings.fake_provider_url}/v1/renders", params={"job_id": job_id}) as resp:
        renders = (await resp.json())["data"]
    return len(renders) == 1 and renders[0]["status"] == wanted


async def _nothing_reserved(stack: Stack) -> bool:
    async with stack.session.get(f"{stack.url}/v1/account", headers=stack.auth) as resp:
        return (await resp.json())["credits"]["reserved"] == 0


def test_a_deadline_is_from_submission():
    deadline = deadline_for(FAST, _measured(5, 10), Settings(render_deadline_min_samples=5,
                                                             render_deadline_floor_s=1, render_deadline_margin=1))
    at = datetime(2025, 1, 1, tzinfo=UTC)
    assert deadline.at(at) == at + timedelta(seconds=20)
