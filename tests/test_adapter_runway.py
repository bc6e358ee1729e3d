"""The Runway adapter: its reading of every recorded payload, its calls against a stand-in replaying those
payloads over real HTTP (success, each failure kind, rate limit, malformed and slow answers, a wrong key), its
refusals of what Runway cannot render, and a Runway job through the whole stack on tapered polling."""

from __future__ import annotations

import io
import json
import logging
from decimal import Decimal
from pathlib import Path

import aiohttp
import asyncpg
import av
import pytest

from tests import adapter_scaffold as scaffold
from tests.adapter_scaffold import attempt, failed, polls, wired
from tests.standins.runway import PAYLOADS, SCRIPTS, RunwayStandin, running_runway
from vidjobs.common.errors import ErrorCode, ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.providers.base import ProviderState
from vidjobs.providers.runway import RunwayAdapter, http_error, read_task

KEY = "key_test"


runway, adapter = wired(lambda: running_runway(KEY), lambda http, s: RunwayAdapter(http, s.url, KEY), name="runway")


def job(prompt: str = "a red fox in snow", **fields) -> JobRequest:
    return JobRequest(**{"model": "runway/gen4.5", "prompt": prompt, "duration_s": 5, **fields})


# --- the recorded payloads, read directly ---------------------------------------------------------------

@pytest.mark.parametrize(("name", "state", "code"), scaffold.expected_signals("runway"))
def test_each_recorded_task_reads_as_its_signal(name: str, state: ProviderState, code: ErrorCode | None):
    sig = read_task(scaffold.recorded("runway", name))

    assert scaffold.outcome(sig) == ("17f20503-6c24-4c16-946b-35dbbce2af2f", state, code)


def test_the_recorded_details_are_kept():
    running = read_task((PAYLOADS / "task_running.json").read_bytes())
    done = read_task((PAYLOADS / "task_succeeded.json").read_bytes())
    failed = read_task((PAYLOADS / "task_failed_safety.json").read_bytes())

    assert running.progress == 0.42  # Runway's own figure, as reported
    assert done.output_url is not None and done.output_url.startswith("https://dnznrvs05pmza.cloudfront.net/")
    assert failed.error is not None and not failed.error.retryable
    assert "did not pass our content moderation" in failed.error.message  # Runway's `failure`, for a person


def test_an_ended_task_reports_its_bill_in_usd_and_one_under_way_none():
    signals = {name: read_task(scaffold.recorded("runway", name)) for name in
               ("task_pending", "task_running", "task_succeeded", "task_failed_safety", "task_cancelled")}

    # 60 credits at $0.01 each; a refunded task reports 0 credits. While a task runs Runway gives only an
    # estimate (`estimatedCost`), which is no bill.
    assert {name: sig.cost for name, sig in signals.items()} == {
        "task_pending": None, "task_running": None, "task_succeeded": 0.6, "task_failed_safety": 0.0,
        "task_cancelled": 0.0}


@pytest.mark.parametrize(("status", "cost", "usd"), [
    ("SUCCEEDED", {"credits": 7}, 0.07),
    ("SUCCEEDED", {"credits": 100_000}, 1000.0),
    ("SUCCEEDED", {"credits": 100_001}, None),  # beyond any render's bill: not believed
    ("FAILED", {"credits": -5}, None),
    ("RUNNING", {"credits": 60}, None),  # a task under way has been billed nothing yet
])
def test_only_a_plausible_bill_of_an_ended_task_is_believed(status: str, cost: dict, usd: float | None):
    body = {**json.loads(scaffold.recorded("runway", "task_succeeded")), "status": status, "cost": cost,
            "progress": 0.5, "failure": "no"}

    assert read_task(json.dumps(body).encode()).cost == usd


def test_a_bill_that_is_not_a_number_breaks_the_schema():
    body = {**json.loads(scaffold.recorded("runway", "task_succeeded")), "cost": {"credits": "sixty"}}

    with pytest.raises(ProviderError) as caught:
        read_task(json.dumps(body).encode())
    assert caught.value.code is ErrorCode.INTERNAL


def test_a_malformed_recorded_task_is_internal():
    with pytest.raises(ProviderError) as caught:
        read_task((PAYLOADS / "task_malformed.json").read_bytes())
    assert caught.value.code is ErrorCode.INTERNAL


@pytest.mark.parametrize(("status", "name", "code"), [
    (400, "error_validation", ErrorCode.INVALID_INPUT),
    (401, "error_unauthorized", ErrorCode.PROVIDER_MISCONFIGURED),
    (429, "error_rate_limit", ErrorCode.RATE_LIMITED),
    (503, "error_unavailable", ErrorCode.PROVIDER_UNAVAILABLE),
    (404, "error_not_found", ErrorCode.PROVIDER_MISCONFIGURED),
])
def test_each_recorded_error_answer_maps_to_our_code(status: int, name: str, code: ErrorCode):
    err = http_error(status, (PAYLOADS / f"{name}.json").read_bytes(), {"Retry-After": "7"})

    assert err.code is code
    assert err.retry_after == (7.0 if status == 429 else None)


# --- against the stand-in, over real HTTP ----------------------------------------------------------------


async def test_a_text_render_is_polled_from_pending_to_a_downloadable_video(
    adapter: RunwayAdapter, runway: RunwayStandin, http: aiohttp.ClientSession,
):
    accepted = await adapter.submit(attempt(job()))
    signals = await polls(adapter, accepted.provider_job_id, 5)

    assert runway.routes == ["/v1/text_to_video"]
    assert runway.submissions == [{"model": "gen4.5", "promptText": "a red fox in snow", "duration": 5,
                                   "ratio": "1280:720"}]
    assert [s.state for s in signals] == [ProviderState.QUEUED, ProviderState.QUEUED, ProviderState.RUNNING,
                                          ProviderState.RUNNING, ProviderState.SUCCEEDED]
    assert all(s.error is None for s in signals)
    assert signals[2].progress == 0.42
    # The output URL is signed by Runway: fetched with the (empty) download headers, it is a real video.
    assert adapter.download_headers() == {}
    async with http.get(signals[-1].output_url, headers=adapter.download_headers()) as resp:
        assert resp.status == 200
        video = await resp.read()
    with av.open(io.BytesIO(video)) as container:
        assert container.streams.video[0].codec_context.name == "h264"


async def test_throttled_is_waiting_for_our_concurrency_not_an_error(adapter: RunwayAdapter):
    accepted = await adapter.submit(attempt(job("a heron scenario:throttled")))

    signals = await polls(adapter, accepted.provider_job_id, 5)

    assert [s.state for s in signals[:3]] == [ProviderState.QUEUED] * 3
    assert all(s.error is None for s in signals[:3])
    assert signals[-1].state is ProviderState.SUCCEEDED


async def test_an_image_render_sends_the_image_address_to_image_to_video(adapter: RunwayAdapter,
                                                                         runway: RunwayStandin):
    request = job(model="runway/gen4_turbo", input_image="upl_1", aspect_ratio="1:1", seed=42,
                  params={"public_figure_threshold": "low"})

    await adapter.submit(attempt(request, image_url="https://uploads.example.com/in.png"))

    assert runway.routes == ["/v1/image_to_video"]
    assert runway.submissions == [{
        "model": "gen4_turbo", "promptText": "a red fox in snow", "duration": 5, "ratio": "960:960",
        "promptImage": "https://uploads.example.com/in.png", "seed": 42,
        "contentModeration": {"publicFigureThreshold": "low"},
    }]


@pytest.mark.parametrize(("scenario", "code"), scaffold.failing_scenarios("runway", SCRIPTS))
async def test_a_failed_task_reports_its_kind_and_runways_words(adapter: RunwayAdapter, scenario: str, code: ErrorCode):
    error = await failed(adapter, attempt(job(f"a fox scenario:{scenario}")))

    assert error.code is code and "Runway said:" in error.message  # retryable follows from the code


async def test_a_rate_limit_carries_retry_after_and_the_next_submit_is_taken(adapter: RunwayAdapter,
                                                                            runway: RunwayStandin):
    request = job("a fox scenario:rate_limit")

    refused, accepted = await scaffold.limited_then_taken(adapter, runway, attempt(request))

    assert (refused.code, refused.retry_after, refused.retryable) == (ErrorCode.RATE_LIMITED, 1.0, True)
    assert accepted.provider_job_id in runway.tasks
    assert len(runway.submitted(request.prompt)) == 1


@pytest.mark.parametrize(("scenario", "code", "words"), [
    ("unavailable", ErrorCode.PROVIDER_UNAVAILABLE, "shedding load"),
    ("invalid", ErrorCode.INVALID_INPUT, "Validation of body failed"),
])
async def test_a_refused_submit_maps_to_our_code(adapter: RunwayAdapter, scenario: str, code: ErrorCode,
                                                 words: str):
    with pytest.raises(ProviderError) as caught:
        await adapter.submit(attempt(job(f"a fox scenario:{scenario}")))

    assert caught.value.code is code
    assert words in caught.value.message


async def test_a_wrong_key_is_our_configuration_and_is_never_shown(runway: RunwayStandin,
                                                                   http: aiohttp.ClientSession,
                                                                   caplog: pytest.LogCaptureFixture):
    wrong = "key_" + "0badc0de" * 16
    caplog.set_level(logging.DEBUG)

    with pytest.raises(ProviderError) as caught:
        await RunwayAdapter(http, runway.url, wrong).submit(attempt(job()))

    assert caught.value.code is ErrorCode.PROVIDER_MISCONFIGURED
    assert "VIDJOBS_RUNWAY_API_KEY" in caught.value.message
    assert wrong not in caught.value.message and wrong not in repr(RunwayAdapter(http, runway.url, wrong))
    assert wrong not in caplog.text
    assert runway.submissions == []


async def test_cancel_deletes_the_task_and_a_gone_task_is_no_error(adapter: RunwayAdapter, runway: RunwayStandin):
    accepted = await adapter.submit(attempt(job("a fox scenario:hang")))

    await adapter.cancel(accepted.provider_job_id)
    await adapter.cancel("00000000-0000-0000-0000-000000000000")
    sig = await adapter.status(accepted.provider_job_id)

    assert runway.deletes == [accepted.provider_job_id]
    assert sig.state is ProviderState.CANCELED


# --- what Runway cannot render is refused before any call --------------------------------------------


@pytest.mark.parametrize(("fields", "named"), [
    ({"model": "runway/gen5_ultra"}, "model:"),
    # Models Runway's SDK can no longer create are not offered.
    ({"model": "runway/gen3a_turbo", "input_image": "upl_1"}, "model:"),
    ({"model": "runway/veo3", "duration_s": 8}, "model:"),
    ({"model": "runway/gen4_turbo"}, "input_image:"),
    ({"duration_s": 11}, "duration_s:"),
    ({"model": "runway/veo3.1"}, "duration_s:"),
    ({"model": "runway/veo3.1_fast", "input_image": "upl_1", "duration_s": 7}, "duration_s:"),
    ({"resolution": "1080p"}, "resolution:"),
    ({"aspect_ratio": "1:1"}, "aspect_ratio:"),
    ({"model": "runway/veo3.1", "input_image": "upl_1", "duration_s": 4, "aspect_ratio": "1:1"}, "aspect_ratio:"),
    ({"model": "runway/veo3.1", "duration_s": 8, "seed": 3}, "seed:"),
    ({"negative_prompt": "blur"}, "negative_prompt:"),
    ({"prompt": "fox " * 251}, "prompt:"),
    ({"params": {"motion": 5}}, "params.motion:"),
    ({"params": {"audio": True}}, "params.audio:"),
    ({"params": {"public_figure_threshold": "none"}}, "params.public_figure_threshold:"),
    ({"model": "runway/veo3.1", "duration_s": 4, "params": {"audio": "yes"}}, "params.audio:"),
])
def test_validate_refuses_naming_the_field(adapter: RunwayAdapter, fields: dict, named: str):
    with pytest.raises(ProviderError) as caught:
        adapter.validate(job(**fields))

    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert caught.value.message.startswith(named), caught.value.message


def test_gen4_from_text_alone_is_refused_with_a_way_out(adapter: RunwayAdapter):
    with pytest.raises(ProviderError) as caught:
        adapter.validate(job(model="runway/gen4_turbo"))

    assert "needs input_image" in caught.value.message
    assert "runway/gen4.5" in caught.value.message  # a model that renders from a prompt alone


@pytest.mark.parametrize("fields", [
    {},
    {"aspect_ratio": "9:16", "duration_s": 10, "seed": 9, "params": {"public_figure_threshold": "auto"}},
    {"model": "runway/gen4_turbo", "input_image": "upl_1", "duration_s": 2},
    {"model": "runway/gen4_turbo", "input_image": "upl_1", "duration_s": 10, "aspect_ratio": "9:16"},
    {"model": "runway/veo3.1", "duration_s": 8, "resolution": "1080p"},
    {"model": "runway/veo3.1", "input_image": "upl_1", "duration_s": 4, "aspect_ratio": "9:16", "resolution": "1080p"},
    {"model": "runway/veo3.1_fast", "duration_s": 6, "negative_prompt": "blur", "params": {"audio": False}},
])
def test_validate_accepts_what_the_model_renders(adapter: RunwayAdapter, fields: dict):
    adapter.validate(job(**fields))


async def test_submit_validates_before_calling(adapter: RunwayAdapter, runway: RunwayStandin):
    with pytest.raises(ProviderError) as caught:
        await adapter.submit(attempt(job(model="runway/gen4_turbo", input_image="upl_1")))  # no image address

    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert runway.submissions == []


# --- through the whole stack -----------------------------------------------------------------------------


async def test_runway_jobs_finish_through_tapered_polling(tmp_path: Path, database_url: str, nats_url: str):
    async with running_runway(KEY) as runway:
        async with scaffold.polling_stack(tmp_path, database_url, nats_url, runway.url, runway_url=runway.url,
                                 runway_api_key=KEY) as stack:
            ok = await stack.create_job(model="runway/gen4.5", prompt="a red fox in snow", duration_s=5)
            rejected = await stack.create_job(model="runway/gen4.5", prompt="a fox scenario:safety", duration_s=5)
            async with stack.session.post(f"{stack.url}/v1/jobs", headers=stack.auth, json={
                    "model": "runway/gen4_turbo", "prompt": "a fox", "duration_s": 5}) as resp:
                refused = (resp.status, await resp.json())
            rendering = await stack.wait_for_status(ok["id"], "processing", within=30)
            done = await stack.wait_terminal(ok["id"], within=60)
            failed = await stack.wait_terminal(rejected["id"], within=60)
            trail = await stack.trail(ok["id"])
            failed_trail = await stack.trail(rejected["id"])
    conn = await asyncpg.connect(database_url)
    try:
        billed = dict(await conn.fetch("SELECT job_id, cost_usd FROM attempt_costs WHERE job_id = ANY($1)",
                                       [ok["id"], rejected["id"]]))
    finally:
        await conn.close()

    assert rendering["progress"] == pytest.approx(0.42)  # Runway's own figure, shown as reported
    assert done["status"] == "completed", done
    assert [m["to"] for m in trail] == ["pending", "submitted", "processing", "downloading", "completed"]
    assert all("scheduled poll" in m["reason"] for m in trail[2:4])
    assert done["outputs"]["duration_s"] == pytest.approx(5, abs=0.2)
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "content_rejected" and not failed["error"]["retryable"]
    assert [m["to"] for m in failed_trail] == ["pending", "submitted", "failed"]
    assert refused[0] == 422 and "input_image" in refused[1]["error"]["message"]
    # One task per job: nothing was rendered twice.
    assert len(runway.submitted("a red fox in snow")) == 1 and len(runway.submitted("a fox scenario:safety")) == 1
    assert runway.downloads == 1
    # What Runway billed each render (60 credits, and 0 for the refused one) is kept as the attempt's cost.
    assert billed == {ok["id"]: Decimal("0.6"), rejected["id"]: Decimal("0")}
