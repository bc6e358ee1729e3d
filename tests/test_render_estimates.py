"""When a job at its provider is likely to be ready (vidjobs.common.render_estimates): the range from what this
deployment measured of its model's renders, on its own and in the client's words, and through the whole stack
(the job, the list, the stream and the CLI agree while it renders)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import asyncpg
import msgspec

from tests.gateway_harness import read_event
from tests.stack import running_stack, stack_settings
from tests.support import wait_until
from tests.test_cli_render import _env, vidjobs
from vidjobs.common.jobs import JobRequest, JobRow
from vidjobs.common.measurements import Measured
from vidjobs.common.render_estimates import ReadyRange, moved, ready_range
from vidjobs.common.settings import Settings
from vidjobs.common.states import JobStatus
from vidjobs_client import ReadyEstimate, Retry

NOON = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
MEASURED = Measured(samples=8, hold_p50_s=50.0, hold_p90_s=80.0, hold_p99_s=95.0, ready_p50_s=60.0, ready_p90_s=100.0)


def _job(status: JobStatus, started: datetime | None = NOON) -> JobRow:
    return JobRow(id="job_1", account_id="acct_1", status=status, model="fake/default", provider="fake",
                  request=JobRequest(model="fake/default", prompt="a fox"), attempt=1, provider_job_id="r1",
                  provider_output=None, progress=None, error=None, estimated_credits=10, actual_credits=None,
                  created_at=NOON, updated_at=NOON, submitted_at=started, retry_at=None, deadline_at=None,
                  recover_at=None, deleted_at=None)


def test_a_render_under_way_is_ready_at_its_start_plus_what_its_models_renders_took():
    settings = Settings(estimate_min_samples=5)
    at = ready_range(_job(JobStatus.PROCESSING), MEASURED, settings, NOON + timedelta(seconds=10))
    assert at == ReadyRange(ready_p50=NOON + timedelta(seconds=60), ready_p90=NOON + timedelta(seconds=100),
                            note="from its start and the last 8 renders of fake/default measured here "
                                 "(60 s to 2 min from start to ready)")
    # Past the likely end it may be ready any moment; past the late one nothing measured says when.
    late = ready_range(_job(JobStatus.SUBMITTED), MEASURED, settings, NOON + timedelta(seconds=70))
    assert late is not None and late.ready_p50 is not None and late.ready_p50 < NOON + timedelta(seconds=70)
    over = ready_range(_job(JobStatus.PROCESSING), MEASURED, settings, NOON + timedelta(seconds=101))
    assert over == ReadyRange(ready_p50=None, ready_p90=None, unavailable="overdue",
                              note="it has taken longer than 9 in 10 of the last 8 renders of fake/default measured "
                                   "here (2 min from start to ready); it is stopped at its deadline")
    few = ready_range(_job(JobStatus.PROCESSING), Measured(samples=1), settings, NOON)
    assert few is not None and few.unavailable == "too_few_renders" and few.ready_p90 is None
    assert few.note.startswith("only 1 render of fake/default measured here in the last 24 h; an estimate needs 5")
    # Only a job at its provider has one: a waiting job's estimate says when it is ready, an ended one is.
    for status in (JobStatus.PENDING, JobStatus.RETRYING, JobStatus.DOWNLOADING, JobStatus.COMPLETED):
        assert ready_range(_job(status), MEASURED, settings, NOON) is None


def test_a_range_has_moved_only_past_its_rounding_and_the_client_says_it_in_words():
    made = ReadyRange(ready_p50=NOON + timedelta(minutes=2), ready_p90=NOON + timedelta(minutes=4), note="")
    assert not moved(made, msgspec.structs.replace(made, ready_p90=made.ready_p90 + timedelta(seconds=5)), NOON)
    assert moved(made, msgspec.structs.replace(made, ready_p90=made.ready_p90 + timedelta(seconds=6)), NOON)
    assert moved(made, ReadyRange(ready_p50=None, ready_p90=None, unavailable="overdue", note=""), NOON)
    assert moved(None, made, NOON) and not moved(None, None, NOON)

    said = ReadyEstimate(ready_p50=NOON + timedelta(minutes=2), ready_p90=NOON + timedelta(minutes=4))
    assert said.describe(NOON) == "ready in about 2–4 min"
    assert said.describe(NOON + timedelta(minutes=5)) == "ready any moment now"
    assert ReadyEstimate(unavailable="overdue", note="it has taken longer").describe() == (
        "no estimate yet: it has taken longer")
    busy = Retry(code="provider_unavailable", message="The provider was busy.", max_attempts=3)
    assert busy.describe(2) == "attempt 2 of 3; the last try ended: The provider was busy."
    assert busy.describe(1, retrying=True) == "attempt 1 of 3 ended: The provider was busy."


MIN_SAMPLES = 3
HISTORY_S = [60.0, 70.0, 80.0, 90.0]  # each earlier render's seconds from start to ready
P50_S, P90_S = 75.0, 87.0  # percentile_cont of them, as vidjobs.common.measurements reads it


async def _renders_measured_earlier(database_url: str, like: str) -> None:
    """Completed renders of `like`'s model from two hours ago, stored as the stack stores them: what the
    measurements read. Renders of a minute and more, so that the range stays ahead of the test's reads however
    slow the machine, without rendering for minutes here."""
    conn = await asyncpg.connect(database_url)
    try:
        await conn.execute("""
            INSERT INTO jobs (id, account_id, model, provider, request, estimated_credits, actual_credits, status,
                              stage, submitted_at, rendered_at, completed_at)
            SELECT 'job_earlier' || n, j.account_id, j.model, j.provider, j.request, j.estimated_credits,
                   j.estimated_credits, 'completed', 'ready', now() - interval '2 hours',
                   now() - interval '2 hours' + make_interval(secs => s - 1),
                   now() - interval '2 hours' + make_interval(secs => s)
            FROM jobs j, unnest($2::float8[]) WITH ORDINALITY AS h (s, n)
            WHERE j.id = $1""", like, HISTORY_S)
    finally:
        await conn.close()


async def test_a_rendering_job_on_a_measured_model_says_when_it_will_be_ready(tmp_path, database_url, nats_url):
    settings = stack_settings(tmp_path, database_url, nats_url, estimate_min_samples=MIN_SAMPLES,
                              estimate_refresh_s=0.2)
    async with running_stack(settings) as stack:
        job = await stack.create_job(params={"render_s": 60})
        assert job["ready"] is None  # waiting: its `estimate` says when it starts and is ready
        rendering = await stack.wait_for_status(job["id"], "processing")
        # Nothing of its model measured yet: no range, and why.
        assert rendering["ready"]["unavailable"] == "too_few_renders" and rendering["ready"]["ready_p50"] is None
        assert rendering["ready"]["note"].startswith("no renders of fake/default measured here")

        await _renders_measured_earlier(database_url, job["id"])

        async def measured_range():
            shown = await stack.job(job["id"])
            return shown if shown["ready"]["unavailable"] is None else None

        shown = await wait_until(measured_range, within=10, what="the range from the measured renders")
        ready = shown["ready"]
        started = datetime.fromisoformat(rendering["started_at"])
        # Its start plus the model's time from start to ready, p50 rounded down and p90 up: to 5 s, a minute or
        # more away.
        likely, late = datetime.fromisoformat(ready["ready_p50"]), datetime.fromisoformat(ready["ready_p90"])
        assert started + timedelta(seconds=P50_S - 5) <= likely <= started + timedelta(seconds=P50_S), ready
        assert started + timedelta(seconds=P90_S) <= late <= started + timedelta(seconds=P90_S + 5), ready
        assert ready["note"] == ("from its start and the last 4 renders of fake/default measured here "
                                 "(75 s to 87 s from start to ready)")

        # The list and the stream show the same range.
        async with stack.session.get(f"{stack.url}/v1/jobs", headers=stack.auth) as resp:
            listed = {j["id"]: j for j in (await resp.json())["data"]}
        assert listed[job["id"]]["ready"] == ready
        async with stack.session.get(f"{stack.url}/v1/jobs/{job['id']}/stream", headers=stack.auth) as resp:
            _, streamed = await read_event(resp)
        assert streamed["ready"] == ready

        # The CLI says it in words.
        said = await vidjobs(_env(tmp_path, stack.url, stack.key), "jobs", "show", job["id"])
        assert re.search(r"estimate +ready in about \d+(–\d+)? (s|min) *\n", said.stdout), said.stdout
        await stack.session.post(f"{stack.url}/v1/jobs/{job['id']}/cancel", headers=stack.auth)
