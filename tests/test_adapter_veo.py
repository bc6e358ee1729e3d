"""The Veo adapter, on Vertex AI (the default) and on the Gemini API: its reading of every recorded payload, its
calls against a stand-in of both APIs replaying those payloads over real HTTP (success, each failure kind, rate
limit, malformed and slow answers, a wrong key), the video read from Cloud Storage without our key (Vertex AI)
or downloaded with it (the Gemini API), its refusals of what Veo cannot render or we cannot fetch, and a Veo job
through the whole stack on tapered polling. tests/conformance/test_veo.py compares it with Google's SDK."""

from __future__ import annotations

import base64
import io
import json
import logging
from pathlib import Path

import aiohttp
import av
import pytest
from PIL import Image

from tests import adapter_scaffold as scaffold
from tests.adapter_scaffold import attempt, failed, polls, wired
from tests.standins.veo import PAYLOADS, VeoStandin, running_veo, scripts
from vidjobs.common.errors import ConfigError, ErrorCode, ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.providers.base import ProviderState
from vidjobs.providers.veo import VeoAdapter, http_error

KEY = "AIzaSy-test-key"
MODEL = "veo-2.0-generate-001"
OUTPUT = "gs://vidjobs-test-renders/veo/"
NAMES = {"vertex": "projects/vidjobs-test/locations/us-central1/publishers/google/models/veo-3.0-generate-001/"
                   "operations/3f1a9c2e-7b44-4d2a-9e61-0c5d8a7b2f10",
         "gemini": f"models/{MODEL}/operations/9a3kd8r7xq2m"}
APIS = ["vertex", "gemini"]


def on(api: str, http: aiohttp.ClientSession, veo: VeoStandin, key: str = KEY) -> VeoAdapter:
    """The adapter on one API, pointed at the stand-in (its Cloud Storage too)."""
    return VeoAdapter(http, veo.url, key, api=api, output_uri=OUTPUT, storage_url=veo.storage_url)


veo, adapter = wired(lambda: running_veo(KEY), lambda http, s: on("vertex", http, s), name="veo")


@pytest.fixture(params=APIS)
def either(request: pytest.FixtureRequest, http: aiohttp.ClientSession, veo: VeoStandin) -> VeoAdapter:
    """The adapter on each API in turn."""
    return on(request.param, http, veo)


def reader(api: str, http: aiohttp.ClientSession) -> VeoAdapter:
    return VeoAdapter(http, "http://veo.invalid", KEY, api=api, output_uri=OUTPUT)


def job(prompt: str = "a red fox in snow", **fields) -> JobRequest:
    return JobRequest(**{"model": f"veo/{MODEL}", "prompt": prompt, "duration_s": 5, **fields})


# --- the recorded payloads, read directly ---------------------------------------------------------------

@pytest.mark.parametrize(("name", "state", "code"), scaffold.expected_signals("veo"))
def test_each_recorded_operation_reads_as_its_signal(http: aiohttp.ClientSession, name: str, state: ProviderState,
                                                     code: ErrorCode | None):
    api = name.split("_")[0]

    sig = reader(api, http).read_operation(scaffold.recorded("veo", name))

    assert scaffold.outcome(sig) == (NAMES[api], state, code)
    assert sig.progress is None  # Veo reports none, and none is invented


def test_the_recorded_details_are_kept(http: aiohttp.ClientSession):
    written = reader("vertex", http).read_operation((PAYLOADS / "vertex_operation_succeeded.json").read_bytes())
    downloaded = reader("gemini", http).read_operation((PAYLOADS / "gemini_operation_succeeded.json").read_bytes())
    filtered = reader("vertex", http).read_operation((PAYLOADS / "vertex_operation_rai_filtered.json").read_bytes())
    inline = reader("vertex", http).read_operation((PAYLOADS / "vertex_operation_inline.json").read_bytes())

    # Cloud Storage's HTTPS form of what Vertex AI wrote under our output place
    assert written.output_url == ("https://storage.googleapis.com/vidjobs-test-renders/veo/"
                                  "3f1a9c2e-7b44-4d2a-9e61-0c5d8a7b2f10/sample_0.mp4")
    assert downloaded.output_url == ("https://generativelanguage.googleapis.com/v1beta/files/3x8vq1m2n7ke:download"
                                     "?alt=media")
    assert filtered.error is not None and not filtered.error.retryable
    assert "may violate our policies" in filtered.error.message  # Veo's own reason, for a person
    assert inline.error is not None and "VIDJOBS_VEO_OUTPUT_URI" in inline.error.message


@pytest.mark.parametrize("uri", [
    "gs://someone-elses-bucket/veo/3f1a/sample_0.mp4",
    "gs://vidjobs-test-renders/other/3f1a/sample_0.mp4",
    "gs://vidjobs-test-renders/veo/../other/sample_0.mp4",
    "gs://vidjobs-test-renders/veo/3f1a/sample 0.mp4?x=1",
    "https://storage.googleapis.com/vidjobs-test-renders/veo/3f1a/sample_0.mp4",
])
def test_a_video_anywhere_but_our_output_place_is_refused(http: aiohttp.ClientSession, uri: str):
    raw = {"name": NAMES["vertex"], "done": True, "response": {"videos": [{"gcsUri": uri, "mimeType": "video/mp4"}]}}

    sig = reader("vertex", http).read_operation(json.dumps(raw).encode())

    assert sig.state is ProviderState.FAILED and sig.output_url is None
    assert sig.error is not None and sig.error.code is ErrorCode.INTERNAL
    assert "VIDJOBS_VEO_OUTPUT_URI" in sig.error.message


def test_an_error_code_google_rpc_does_not_define_is_the_providers_trouble_under_its_number(
    http: aiohttp.ClientSession,
):
    raw = {"name": NAMES["vertex"], "done": True, "error": {"code": 99, "message": "something new"}}

    sig = reader("vertex", http).read_operation(json.dumps(raw).encode())

    assert sig.state is ProviderState.FAILED and sig.error is not None
    assert sig.error.code is ErrorCode.PROVIDER_UNAVAILABLE and "UNKNOWN (99): something new" in sig.error.message


@pytest.mark.parametrize("api", APIS)
def test_a_malformed_recorded_operation_is_internal(http: aiohttp.ClientSession, api: str):
    with pytest.raises(ProviderError) as caught:
        reader(api, http).read_operation((PAYLOADS / f"{api}_operation_malformed.json").read_bytes())
    assert caught.value.code is ErrorCode.INTERNAL


@pytest.mark.parametrize(("status", "name", "code", "wait"), [
    (400, "error_invalid_argument", ErrorCode.INVALID_INPUT, None),
    (400, "vertex_error_api_key_invalid", ErrorCode.PROVIDER_MISCONFIGURED, None),  # a wrong key is a 400 at Google
    (400, "gemini_error_api_key_invalid", ErrorCode.PROVIDER_MISCONFIGURED, None),
    (401, "vertex_error_unauthenticated", ErrorCode.PROVIDER_MISCONFIGURED, None),
    (403, "gemini_error_permission_denied", ErrorCode.PROVIDER_MISCONFIGURED, None),
    (429, "error_rate_limit", ErrorCode.RATE_LIMITED, 33.0),  # RetryInfo's retryDelay: no Retry-After header
    (503, "error_unavailable", ErrorCode.PROVIDER_UNAVAILABLE, None),
    (404, "error_not_found", ErrorCode.PROVIDER_MISCONFIGURED, None),
])
def test_each_recorded_error_answer_maps_to_our_code(status: int, name: str, code: ErrorCode, wait: float | None):
    err = http_error(status, (PAYLOADS / f"{name}.json").read_bytes(), {})

    assert err.code is code
    assert err.retry_after == wait


def test_a_retry_after_header_wins_over_retry_info():
    err = http_error(429, (PAYLOADS / "error_rate_limit.json").read_bytes(), {"Retry-After": "5"})

    assert err.retry_after == 5.0


# --- against the stand-in, over real HTTP ----------------------------------------------------------------


async def test_on_vertex_ai_the_video_is_written_to_our_place_and_read_without_our_key(
    adapter: VeoAdapter, veo: VeoStandin, http: aiohttp.ClientSession,
):
    accepted = await adapter.submit(attempt(job(negative_prompt="blur", params={"person_generation": "dont_allow"})))
    signals = await polls(adapter, accepted.provider_job_id, 3)

    assert accepted.provider_job_id.startswith(f"projects/vidjobs-test/locations/us-central1/publishers/google/"
                                               f"models/{MODEL}/operations/")
    assert veo.submissions == [{
        "instances": [{"prompt": "a red fox in snow"}],
        "parameters": {"aspectRatio": "16:9", "durationSeconds": 5, "negativePrompt": "blur",
                       "personGeneration": "dont_allow", "storageUri": OUTPUT},
    }]
    assert [s.state for s in signals] == [ProviderState.RUNNING, ProviderState.RUNNING, ProviderState.SUCCEEDED]
    assert [s.progress for s in signals] == [None, None, None]
    uri = signals[-1].output_url
    assert uri is not None and uri.startswith(f"{veo.storage_url}/vidjobs-test-renders/veo/")
    assert adapter.download_headers() == {}  # our key is Vertex AI's, never Cloud Storage's
    async with http.get(uri, headers=adapter.download_headers()) as resp:
        assert resp.status == 200
        video = await resp.read()
    assert veo.keyed_storage_reads == 0
    with av.open(io.BytesIO(video)) as container:
        assert container.streams.video[0].codec_context.name == "h264"


async def test_on_the_gemini_api_the_video_is_downloaded_with_our_key(veo: VeoStandin, http: aiohttp.ClientSession):
    adapter = on("gemini", http, veo)

    accepted = await adapter.submit(attempt(job()))
    signals = await polls(adapter, accepted.provider_job_id, 3)

    assert accepted.provider_job_id.startswith(f"models/{MODEL}/operations/")
    assert veo.submissions == [{"instances": [{"prompt": "a red fox in snow"}],
                                "parameters": {"aspectRatio": "16:9", "durationSeconds": 5}}]  # no storageUri
    assert [s.state for s in signals] == [ProviderState.RUNNING, ProviderState.RUNNING, ProviderState.SUCCEEDED]
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


def test_vertex_ai_without_an_output_place_refuses_to_start(http: aiohttp.ClientSession):
    # Vertex AI would send the video back inline, which nothing of ours can fetch: no job is taken to fail.
    with pytest.raises(ConfigError, match="VIDJOBS_VEO_OUTPUT_URI"):
        VeoAdapter(http, "", KEY, api="vertex")


@pytest.mark.parametrize(("api", "output"), [
    ("vertx", OUTPUT), ("vertex", "s3://vidjobs/veo/"), ("vertex", "gs://Bad_Bucket/veo/"),
    ("vertex", "gs://vidjobs-test-renders/../veo/"),
])
def test_a_malformed_veo_setting_stops_the_start(http: aiohttp.ClientSession, api: str, output: str):
    with pytest.raises(ConfigError, match="VIDJOBS_VEO_API|VIDJOBS_VEO_OUTPUT_URI"):
        VeoAdapter(http, "", KEY, api=api, output_uri=output)


def test_each_api_has_its_public_endpoint_by_default(http: aiohttp.ClientSession):
    assert VeoAdapter(http, api="vertex", output_uri=OUTPUT).base_url == "https://aiplatform.googleapis.com"
    assert VeoAdapter(http, api="gemini").base_url == "https://generativelanguage.googleapis.com"
    assert VeoAdapter(http).base_url == "https://generativelanguage.googleapis.com"  # a deployment's key keeps working


async def test_a_veo_3_request_names_its_resolution(adapter: VeoAdapter, veo: VeoStandin):
    await adapter.submit(attempt(job(model="veo/veo-3.1-fast-generate-preview", aspect_ratio="9:16",
                                     resolution="1080p", duration_s=8)))

    assert veo.submissions[0]["parameters"] == {"aspectRatio": "9:16", "durationSeconds": 8, "resolution": "1080p",
                                                "storageUri": OUTPUT}


async def test_an_input_image_is_sent_inline(either: VeoAdapter, veo: VeoStandin):
    picture = io.BytesIO()
    Image.new("RGB", (64, 36), (200, 80, 20)).save(picture, format="PNG")
    url = veo.serve_image("first.png", picture.getvalue(), "image/png")

    await either.submit(attempt(job(input_image="upl_1"), image_url=url))

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


@pytest.mark.parametrize(("api", "scenario", "code"), [
    (api, scenario, code) for api in APIS for scenario, code in scaffold.failing_scenarios("veo", scripts(api))])
async def test_a_failed_operation_reports_its_kind_and_veos_words(http: aiohttp.ClientSession, veo: VeoStandin,
                                                                 api: str, scenario: str, code: ErrorCode):
    error = await failed(on(api, http, veo), attempt(job(f"a fox scenario:{scenario}")))

    assert error.code is code and "Veo said:" in error.message  # retryable follows from the code


async def test_a_cancelled_operation_is_canceled(either: VeoAdapter):
    accepted = await either.submit(attempt(job("a fox scenario:cancelled")))

    sig = await either.status(accepted.provider_job_id)

    assert sig.state is ProviderState.CANCELED


async def test_a_rate_limit_carries_the_retry_delay_and_the_next_submit_is_taken(either: VeoAdapter,
                                                                                veo: VeoStandin):
    request = job("a fox scenario:rate_limit")

    refused, accepted = await scaffold.limited_then_taken(either, veo, attempt(request))

    assert (refused.code, refused.retry_after) == (ErrorCode.RATE_LIMITED, 33.0)
    assert either.api.operation.match(accepted.provider_job_id)
    assert len(veo.submitted(request.prompt)) == 1


@pytest.mark.parametrize(("scenario", "code", "words"), [
    ("unavailable", ErrorCode.PROVIDER_UNAVAILABLE, "overloaded"),
    ("invalid", ErrorCode.INVALID_INPUT, "aspectRatio 1:1 is not supported"),
])
async def test_a_refused_submit_maps_to_our_code(either: VeoAdapter, scenario: str, code: ErrorCode, words: str):
    with pytest.raises(ProviderError) as caught:
        await either.submit(attempt(job(f"a fox scenario:{scenario}")))

    assert caught.value.code is code
    assert words in caught.value.message


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("key", ["AIzaSy-not-our-key", ""])
async def test_a_wrong_or_missing_key_is_our_configuration_and_is_never_shown(
    veo: VeoStandin, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture, key: str, api: str,
):
    caplog.set_level(logging.DEBUG)
    adapter = on(api, http, veo, key)

    with pytest.raises(ProviderError) as caught:
        await adapter.submit(attempt(job()))

    assert caught.value.code is ErrorCode.PROVIDER_MISCONFIGURED
    assert "VIDJOBS_VEO_API_KEY" in caught.value.message
    if key:
        assert key not in caught.value.message and key not in repr(adapter) and key not in caplog.text
    assert veo.submissions == []


@pytest.mark.parametrize(("api", "name"), [
    ("vertex", "../../v1beta1/x"), ("vertex", "publishers/google/models/veo/operations/a?b=c"),
    ("vertex", NAMES["gemini"]),  # an operation of the other API (VIDJOBS_VEO_API changed under it)
    ("gemini", "../../v1beta/files/x"), ("gemini", "operations/abc"), ("gemini", "models/veo/operations/a?b=c"),
    ("gemini", NAMES["vertex"]),
])
async def test_only_operation_names_of_our_api_reach_a_request_path(http: aiohttp.ClientSession, veo: VeoStandin,
                                                                    api: str, name: str):
    with pytest.raises(ProviderError) as caught:
        await on(api, http, veo).status(name)

    assert caught.value.code is ErrorCode.INTERNAL


async def test_cancel_asks_nothing_of_veo(either: VeoAdapter, veo: VeoStandin):
    accepted = await either.submit(attempt(job("a fox scenario:hang")))

    await either.cancel(accepted.provider_job_id)

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
    ({"seed": 2**32}, "seed:"),
    ({"seed": -1}, "seed:"),
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


@pytest.mark.parametrize("seed", [0, 7, 2**32 - 1])
async def test_a_seed_is_sent_on_vertex_ai_and_refused_on_the_gemini_api(http: aiohttp.ClientSession,
                                                                         veo: VeoStandin, seed: int):
    vertex, gemini = on("vertex", http, veo), on("gemini", http, veo)

    await vertex.submit(attempt(job(seed=seed)))
    with pytest.raises(ProviderError) as caught:
        gemini.validate(job(seed=seed))

    assert veo.submissions[-1]["parameters"]["seed"] == seed
    assert caught.value.code is ErrorCode.INVALID_INPUT and caught.value.message.startswith("seed:")
    assert {m.seed for m in vertex.models()} == {True} and {m.seed for m in gemini.models()} == {False}


# --- through the whole stack -----------------------------------------------------------------------------


@pytest.mark.parametrize("api", APIS)
async def test_veo_jobs_finish_through_tapered_polling(tmp_path: Path, database_url: str, nats_url: str, api: str):
    async with running_veo(KEY) as veo:
        async with scaffold.polling_stack(tmp_path, database_url, nats_url, veo.url, veo_url=veo.url,
                                          veo_api_key=KEY, veo_api=api, veo_output_uri=OUTPUT,
                                          veo_storage_url=veo.storage_url) as stack:
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
    # The media service read the video as the adapter's download headers say: from Cloud Storage without our
    # key (Vertex AI), or as a Gemini API file download with it.
    assert (veo.downloads, veo.keyless_downloads, veo.keyed_storage_reads) == (1, 0, 0)
    assert rejected["status"] == "failed" and rejected["error"]["code"] == "content_rejected"
    assert invalid["status"] == "failed" and invalid["error"]["code"] == "invalid_input"
    assert all(len(veo.submitted(p)) == 1 for p in ("a red fox in snow", "a fox scenario:rai",
                                                   "a fox scenario:invalid_argument"))
