"""The Veo (Gemini API) adapter: its reading of every recorded payload, its calls against a stand-in replaying
those payloads over real HTTP (success, each failure kind, rate limit, malformed and slow answers, a wrong
key), the keyed video download, its refusals of what Veo cannot render, and a Veo job through the whole stack
on tapered polling."""

from __future__ import annotations

import base64
import io
import logging
from pathlib import Path

import aiohttp
import av
import pytest
from PIL import Image

from tests import adapter_scaffold as scaffold
from tests.adapter_scaffold import attempt, failed, polls, wired
from tests.standins.veo import PAYLOADS, SCRIPTS, VeoStandin, running_veo
from vidjobs.common.errors import ErrorCode, ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.providers.base import ProviderState
from vidjobs.providers.veo import VeoAdapter, http_error, read_operation

KEY = "AIzaSy-test-key"
MODEL = "veo-2.0-generate-001"


veo, adapter = wired(lambda: running_veo(KEY), lambda http, s: VeoAdapter(http, s.url, KEY), name="veo")


def job(prompt: str = "a red fox in snow", **fields) -> JobRequest:
    return JobRequest(**{"model": f"veo/{MODEL}", "prompt": prompt, "duration_s": 5, **fields})


# --- the recorded payloads, read directly ---------------------------------------------------------------

@pytest.mark.parametrize(("name", "state", "code"), scaffold.expected_signals("veo"))
def test_each_recorded_operation_reads_as_its_signal(name: str, state: ProviderState, code: ErrorCode | None):
    sig = read_operation(scaffold.recorded("veo", name))

    assert scaffold.outcome(sig) == (f"models/{MODEL}/operations/9a3kd8r7xq2m", state, code)
    assert sig.progress is None  # Veo reports none, and none is invented


def test_the_recorded_details_are_kept():
    done = read_operation((PAYLOADS / "operation_succeeded.json").read_bytes())
    filtered = read_operation((PAYLOADS / "operation_rai_filtered.json").read_bytes())

    assert done.output_url == "https://generativelanguage.googleapis.com/v1beta/files/3x8vq1m2n7ke:download?alt=media"
    assert filtered.error is not None and not filtered.error.retryable
    assert "may violate our policies" in filtered.error.message  # Veo's own reason, for a person


def test_a_malformed_recorded_operation_is_internal():
    with pytest.raises(ProviderError) as caught:
        read_operation((PAYLOADS / "operation_malformed.json").read_bytes())
    assert caught.value.code is ErrorCode.INTERNAL


@pytest.mark.parametrize(("status", "name", "code", "wait"), [
    (400, "error_invalid_argument", ErrorCode.INVALID_INPUT, None),
    (400, "error_api_key_invalid", ErrorCode.INTERNAL, None),  # a wrong key is a 400 at Google
    (403, "error_permission_denied", ErrorCode.INTERNAL, None),
    (429, "error_rate_limit", ErrorCode.RATE_LIMITED, 33.0),  # RetryInfo's retryDelay: no Retry-After header
    (503, "error_unavailable", ErrorCode.PROVIDER_UNAVAILABLE, None),
    (404, "error_not_found", ErrorCode.INTERNAL, None),
])
def test_each_recorded_error_answer_maps_to_our_code(status: int, name: str, code: ErrorCode, wait: float | None):
    err = http_error(status, (PAYLOADS / f"{name}.json").read_bytes(), {})

    assert err.code is code
    assert err.retry_after == wait


def test_a_retry_after_header_wins_over_retry_info():
    err = http_error(429, (PAYLOADS / "error_rate_limit.json").read_bytes(), {"Retry-After": "5"})

    assert err.retry_after == 5.0


# --- against the stand-in, over real HTTP ----------------------------------------------------------------


async def test_an_operation_is_polled_to_a_video_downloaded_with_our_key(
    adapter: VeoAdapter, veo: VeoStandin, http: aiohttp.ClientSession,
):
    accepted = await adapter.submit(attempt(job(negative_prompt="blur", params={"person_generation": "dont_allow"})))
    signals = await polls(adapter, accepted.provider_job_id, 3)

    assert accepted.provider_job_id.startswith(f"models/{MODEL}/operations/")
    assert veo.submissions == [{
        "instances": [{"prompt": "a red fox in snow"}],
        "parameters": {"aspectRatio": "16:9", "durationSeconds": 5, "negativePrompt": "blur",
                       "personGeneration": "dont_allow"},
    }]
    assert [s.state for s in signals] == [ProviderState.RUNNING, ProviderState.RUNNING, ProviderState.SUCCEEDED]
    assert [s.progress for s in signals] == [None, None, None]
    uri = signals[-1].output_url
    async with http.get(uri) as keyless:
        refused = keyless.status
    async with http.get(uri, headers=adapter.download_headers()) as resp:
        assert resp.status == 200
        video = await resp.read()
    assert refused == 403  # the file download wants the API key, which download_headers carries
    assert adapter.download_headers() == {"x-goog-api-key": KEY}
    with av.open(io.BytesIO(video)) as container:
        assert container.streams.video[0].codec_context.name == "h264"


async def test_a_veo_3_request_names_its_resolution(adapter: VeoAdapter, veo: VeoStandin):
    await adapter.submit(attempt(job(model="veo/veo-3.1-fast-generate-preview", aspect_ratio="9:16",
                                     resolution="1080p", duration_s=8)))

    assert veo.submissions[0]["parameters"] == {"aspectRatio": "9:16", "durationSeconds": 8, "resolution": "1080p"}


async def test_an_input_image_is_sent_inline(adapter: VeoAdapter, veo: VeoStandin):
    picture = io.BytesIO()
    Image.new("RGB", (64, 36), (200, 80, 20)).save(picture, format="PNG")
    url = veo.serve_image("first.png", picture.getvalue(), "image/png")

    await adapter.submit(attempt(job(input_image="upl_1"), image_url=url))

    image = veo.submissions[0]["instances"][0]["image"]
    assert image["mimeType"] == "image/png"
    assert base64.b64decode(image["bytesBase64Encoded"]) == picture.getvalue()


async def test_an_input_image_that_is_not_an_image_is_refused(adapter: VeoAdapter, veo: VeoStandin):
    url = veo.serve_image("page.html", b"<html></html>", "text/html")

    with pytest.raises(ProviderError) as caught:
        await adapter.submit(attempt(job(input_image="upl_1"), image_url=url))

    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert caught.value.message.startswith("input_image:")
    assert veo.submissions == []


@pytest.mark.parametrize(("scenario", "code"), scaffold.failing_scenarios("veo", SCRIPTS))
async def test_a_failed_operation_reports_its_kind_and_veos_words(adapter: VeoAdapter, scenario: str, code: ErrorCode):
    error = await failed(adapter, attempt(job(f"a fox scenario:{scenario}")))

    assert error.code is code and "Veo said:" in error.message  # retryable follows from the code


async def test_a_cancelled_operation_is_canceled(adapter: VeoAdapter):
    accepted = await adapter.submit(attempt(job("a fox scenario:cancelled")))

    sig = await adapter.status(accepted.provider_job_id)

    assert sig.state is ProviderState.CANCELED


async def test_a_rate_limit_carries_the_retry_delay_and_the_next_submit_is_taken(adapter: VeoAdapter,
                                                                                veo: VeoStandin):
    request = job("a fox scenario:rate_limit")

    refused, accepted = await scaffold.limited_then_taken(adapter, veo, attempt(request))

    assert (refused.code, refused.retry_after) == (ErrorCode.RATE_LIMITED, 33.0)
    assert accepted.provider_job_id.startswith(f"models/{MODEL}/operations/")
    assert len(veo.submitted(request.prompt)) == 1


@pytest.mark.parametrize(("scenario", "code", "words"), [
    ("unavailable", ErrorCode.PROVIDER_UNAVAILABLE, "overloaded"),
    ("invalid", ErrorCode.INVALID_INPUT, "aspectRatio 1:1 is not supported"),
])
async def test_a_refused_submit_maps_to_our_code(adapter: VeoAdapter, scenario: str, code: ErrorCode, words: str):
    with pytest.raises(ProviderError) as caught:
        await adapter.submit(attempt(job(f"a fox scenario:{scenario}")))

    assert caught.value.code is code
    assert words in caught.value.message


@pytest.mark.parametrize("key", ["AIzaSy-not-our-key", ""])
async def test_a_wrong_or_missing_key_is_our_configuration_and_is_never_shown(
    veo: VeoStandin, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture, key: str,
):
    caplog.set_level(logging.DEBUG)
    adapter = VeoAdapter(http, veo.url, key)

    with pytest.raises(ProviderError) as caught:
        await adapter.submit(attempt(job()))

    assert caught.value.code is ErrorCode.INTERNAL
    assert "VIDJOBS_VEO_API_KEY" in caught.value.message
    if key:
        assert key not in caught.value.message and key not in repr(adapter) and key not in caplog.text
    assert veo.submissions == []


@pytest.mark.parametrize("name", ["../../v1beta/files/x", "operations/abc", "models/veo/operations/a?b=c"])
async def test_only_operation_names_reach_a_request_path(adapter: VeoAdapter, name: str):
    with pytest.raises(ProviderError) as caught:
        await adapter.status(name)

    assert caught.value.code is ErrorCode.INTERNAL


async def test_cancel_asks_nothing_of_veo(adapter: VeoAdapter, veo: VeoStandin):
    accepted = await adapter.submit(attempt(job("a fox scenario:hang")))

    await adapter.cancel(accepted.provider_job_id)

    assert veo.operations[accepted.provider_job_id.rsplit("/", 1)[1]].polls == 0


# --- what Veo cannot render is refused before any call -----------------------------------------------


@pytest.mark.parametrize(("fields", "named"), [
    ({"model": "veo/veo-9"}, "model:"),
    ({"duration_s": 4}, "duration_s:"),
    ({"model": "veo/veo-3.1-generate-preview", "duration_s": 5}, "duration_s:"),
    ({"model": "veo/veo-3.1-generate-preview", "duration_s": 6, "resolution": "1080p"}, "duration_s:"),
    ({"resolution": "1080p"}, "resolution:"),
    ({"resolution": "480p"}, "resolution:"),
    ({"aspect_ratio": "1:1"}, "aspect_ratio:"),
    ({"model": "veo/veo-3.0-generate-001", "duration_s": 8, "aspect_ratio": "9:16", "resolution": "1080p"},
     "resolution:"),
    ({"seed": 7}, "seed:"),
    ({"params": {"sample_count": 2}}, "params.sample_count:"),
    ({"params": {"person_generation": "allow_everyone"}}, "params.person_generation:"),
    ({"input_image": "upl_1", "params": {"person_generation": "allow_all"}}, "params.person_generation:"),
    ({"model": "veo/veo-3.0-generate-001", "duration_s": 8, "params": {"person_generation": "dont_allow"}},
     "params.person_generation:"),
])
def test_validate_refuses_naming_the_field(adapter: VeoAdapter, fields: dict, named: str):
    with pytest.raises(ProviderError) as caught:
        adapter.validate(job(**fields))

    assert caught.value.code is ErrorCode.INVALID_INPUT
    assert caught.value.message.startswith(named), caught.value.message


@pytest.mark.parametrize("fields", [
    {},
    {"aspect_ratio": "9:16", "duration_s": 8, "negative_prompt": "blur", "params": {"person_generation": "allow_all"}},
    {"input_image": "upl_1", "params": {"person_generation": "allow_adult"}},
    {"model": "veo/veo-3.0-generate-preview", "duration_s": 8, "resolution": "1080p"},
    {"model": "veo/veo-3.0-fast-generate-001", "duration_s": 4},
    {"model": "veo/veo-3.1-generate-preview", "duration_s": 8, "aspect_ratio": "9:16", "resolution": "1080p"},
])
def test_validate_accepts_what_the_model_renders(adapter: VeoAdapter, fields: dict):
    adapter.validate(job(**fields))


# --- through the whole stack -----------------------------------------------------------------------------


async def test_veo_jobs_finish_through_tapered_polling(tmp_path: Path, database_url: str, nats_url: str):
    async with running_veo(KEY) as veo:
        async with scaffold.polling_stack(tmp_path, database_url, nats_url, veo.url, veo_url=veo.url,
                                 veo_api_key=KEY) as stack:
            ok = await stack.create_job(model=f"veo/{MODEL}", prompt="a red fox in snow", duration_s=5)
            filtered = await stack.create_job(model=f"veo/{MODEL}", prompt="a fox scenario:rai", duration_s=5)
            unusable = await stack.create_job(model=f"veo/{MODEL}", prompt="a fox scenario:invalid_argument",
                                              duration_s=6)
            done = await stack.wait_terminal(ok["id"], within=60)
            rejected = await stack.wait_terminal(filtered["id"], within=60)
            invalid = await stack.wait_terminal(unusable["id"], within=60)
            trail = await stack.trail(ok["id"])

    assert done["status"] == "completed", done
    assert [m["to"] for m in trail] == ["pending", "submitted", "processing", "downloading", "completed"]
    assert all("scheduled poll" in m["reason"] for m in trail[2:4])
    assert done["progress"] is None and done["outputs"]["duration_s"] == pytest.approx(5, abs=0.2)
    # The media service fetched the video with the key the adapter's download headers carry.
    assert (veo.downloads, veo.keyless_downloads) == (1, 0)
    assert rejected["status"] == "failed" and rejected["error"]["code"] == "content_rejected"
    assert invalid["status"] == "failed" and invalid["error"]["code"] == "invalid_input"
    assert all(len(veo.submitted(p)) == 1 for p in ("a red fox in snow", "a fox scenario:rai",
                                                   "a fox scenario:invalid_argument"))
