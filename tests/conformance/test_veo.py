"""Veo against google-genai 3.3.0, Google's official SDK.

google-genai builds Veo requests for Vertex AI only: on the Gemini API, `generate_videos` refuses before it sends
anything. So on Vertex AI (express mode: `genai.Client(vertexai=True, api_key=...)`, the key in
`x-goog-api-key`) the SDK and our adapter send the same create and the same status read to one recording
server, and the routes, headers and bodies are compared; the SDK has no cancel for a Veo operation, and ours
sends nothing. On the Gemini API (VIDJOBS_VEO_API=gemini) the SDK still reads operations, so the status read is
compared with it, and the create, which it will not build, against the documented route and the SDK's Vertex AI
body. Every recorded operation is read by the SDK and by us, alike; every state the SDK's operation type allows
(`done`, every google.rpc code of `error`) is given a meaning; every model, duration, ratio, resolution and
person setting of models/veo.toml is one the SDK's request types take and its request builder turns into the
body we send.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from google import genai
from google.genai import _common, types
from google.genai.models import _GenerateVideosParameters_to_vertex
from google.rpc import code_pb2
from PIL import Image

from tests.adapter_scaffold import attempt
from tests.conformance.recorder import RecordingServer, recording
from tests.conformance.veo_sdk import gemini_operation, vertex_operation
from tests.standins.veo import PAYLOADS
from vidjobs.common.errors import ErrorCode
from vidjobs.common.jobs import JobRequest
from vidjobs.providers.base import ProviderSignal, ProviderState
from vidjobs.providers.veo import FULL_HD_DURATION_S, MODELS, PEOPLE, VeoAdapter, operation_body

KEY = "AIzaSy-conformance-key"
OUTPUT = "gs://vidjobs-test-renders/veo/"
STORAGE = "https://storage.googleapis.com"
VERTEX_NAME = ("projects/vidjobs-test/locations/us-central1/publishers/google/models/veo-3.0-generate-001/"
               "operations/3f1a9c2e-7b44-4d2a-9e61-0c5d8a7b2f10")
GEMINI_NAME = "models/veo-2.0-generate-001/operations/9a3kd8r7xq2m"
NOWHERE = "http://127.0.0.1:9"  # for an adapter that only reads: it sends nothing

# What a finished operation's google.rpc code means to us: every code google.rpc defines, each on purpose.
MEANING: dict[str, ErrorCode | None] = {
    "OK": ErrorCode.PROVIDER_UNAVAILABLE,  # an `error` that says OK: nothing usable came back
    "CANCELLED": None,  # canceled, not failed
    "UNKNOWN": ErrorCode.PROVIDER_UNAVAILABLE,
    "INVALID_ARGUMENT": ErrorCode.INVALID_INPUT,
    "DEADLINE_EXCEEDED": ErrorCode.TIMEOUT,
    "NOT_FOUND": ErrorCode.PROVIDER_UNAVAILABLE,
    "ALREADY_EXISTS": ErrorCode.PROVIDER_UNAVAILABLE,
    "PERMISSION_DENIED": ErrorCode.PROVIDER_MISCONFIGURED,
    "UNAUTHENTICATED": ErrorCode.PROVIDER_MISCONFIGURED,
    "RESOURCE_EXHAUSTED": ErrorCode.PROVIDER_UNAVAILABLE,
    "FAILED_PRECONDITION": ErrorCode.INVALID_INPUT,
    "ABORTED": ErrorCode.PROVIDER_UNAVAILABLE,
    "OUT_OF_RANGE": ErrorCode.INVALID_INPUT,
    "UNIMPLEMENTED": ErrorCode.INVALID_INPUT,
    "INTERNAL": ErrorCode.PROVIDER_UNAVAILABLE,
    "UNAVAILABLE": ErrorCode.PROVIDER_UNAVAILABLE,
    "DATA_LOSS": ErrorCode.PROVIDER_UNAVAILABLE,
}
RPC_CODES = {value.name: value.number for value in code_pb2.DESCRIPTOR.enum_types_by_name["Code"].values}


def payload(name: str) -> dict[str, Any]:
    return json.loads((PAYLOADS / f"{name}.json").read_bytes())


def operations(api: str) -> list[str]:
    return sorted(p.stem for p in PAYLOADS.glob(f"{api}_operation_*.json")
                  if not p.stem.endswith(("_started", "_malformed")))


def vertex_sdk(url: str) -> genai.Client:
    return genai.Client(vertexai=True, api_key=KEY, http_options=types.HttpOptions(base_url=url))


def gemini_sdk(url: str) -> genai.Client:
    return genai.Client(api_key=KEY, http_options=types.HttpOptions(base_url=url))


@pytest.fixture(scope="module")
async def server() -> AsyncIterator[RecordingServer]:
    """One recording server for the module (an SDK client takes a while to build), cleared for each test."""
    async with recording() as running:
        yield running


@pytest.fixture(scope="module")
def sdks(server: RecordingServer) -> dict[str, genai.Client]:
    """The SDK on each API, pointed at the server (kept: a client closes its connections when collected)."""
    return {"vertex": vertex_sdk(server.url), "gemini": gemini_sdk(server.url)}


@pytest.fixture(autouse=True)
def _cleared(server: RecordingServer) -> None:
    server.clear()


def ours(http: aiohttp.ClientSession, url: str, api: str = "vertex") -> VeoAdapter:
    return VeoAdapter(http, url, KEY, api=api, output_uri=OUTPUT, storage_url=STORAGE)


def png() -> bytes:
    picture = io.BytesIO()
    Image.new("RGB", (64, 36), (200, 80, 20)).save(picture, format="PNG")
    return picture.getvalue()


def sdk_config(r: JobRequest, **extra: Any) -> types.GenerateVideosConfig:
    """The SDK's request type for what our request asks, from the same model table."""
    model = MODELS[r.model_name]
    return types.GenerateVideosConfig(
        aspect_ratio=model.frame_map()[(r.aspect_ratio, r.resolution)], duration_seconds=r.duration_s,
        resolution=r.resolution if model.sends_resolution else None, negative_prompt=r.negative_prompt,
        person_generation=r.params.get("person_generation"), seed=r.seed, **extra)


def sdk_source(r: JobRequest, image: bytes | None = None) -> types.GenerateVideosSource:
    return types.GenerateVideosSource(
        prompt=r.prompt, image=types.Image(image_bytes=image, mime_type="image/png") if image else None)


def posted(server: RecordingServer):
    """The one call to the provider among what the server saw (an input image fetched from it is not one)."""
    calls = [e for e in server.exchanges if not e.path.startswith("/images/")]
    assert len(calls) == 1, [e.route for e in calls]
    return calls[0]


def storage_url(gcs_uri: str) -> str:
    return f"{STORAGE}/{gcs_uri.removeprefix('gs://')}"


def read_alike(sdk: types.GenerateVideosOperation, sig: ProviderSignal, *, vertex: bool) -> None:
    """Our signal says what the SDK's reading of the same answer says."""
    assert sig.progress is None
    if not sdk.done:
        assert (sig.state, sig.error, sig.output_url) == (ProviderState.RUNNING, None, None)
        return
    if sdk.error is not None:
        name = code_pb2.Code.Name(sdk.error["code"])
        if name == "CANCELLED":
            assert (sig.state, sig.error) == (ProviderState.CANCELED, None)
            return
        assert sig.state is ProviderState.FAILED and sig.error is not None
        assert sig.error.code is MEANING[name]
        assert name in sig.error.message and sdk.error.get("message", "") in sig.error.message
        return
    result = sdk.result or types.GenerateVideosResponse()
    videos = [v.video for v in result.generated_videos or [] if v.video is not None]
    uri = next((v.uri for v in videos if v.uri), None)
    if uri is not None:
        assert sig.state is ProviderState.SUCCEEDED and sig.error is None
        assert sig.output_url == (storage_url(uri) if vertex else uri)
        return
    assert sig.state is ProviderState.FAILED and sig.error is not None and sig.output_url is None
    if any(v.video_bytes for v in videos):
        # Inline bytes are nothing our media service can fetch: refused, naming what sends them elsewhere.
        assert sig.error.code is ErrorCode.INTERNAL and "VIDJOBS_VEO_OUTPUT_URI" in sig.error.message
    elif result.rai_media_filtered_count or result.rai_media_filtered_reasons:
        assert sig.error.code is ErrorCode.CONTENT_REJECTED
        assert all(reason in sig.error.message for reason in result.rai_media_filtered_reasons or [])
    else:
        assert sig.error.code is ErrorCode.PROVIDER_UNAVAILABLE


# --- create ------------------------------------------------------------------------------------------------

CREATES = {
    "veo 2, text": JobRequest(model="veo/veo-2.0-generate-001", prompt="a red fox in snow", duration_s=5,
                              negative_prompt="blur", params={"person_generation": "dont_allow"}),
    "veo 3.1, portrait 1080p": JobRequest(model="veo/veo-3.1-fast-generate-preview", prompt="a heron", duration_s=8,
                                          aspect_ratio="9:16", resolution="1080p"),
    "veo 3, from an image": JobRequest(model="veo/veo-3.0-generate-001", prompt="it walks away", duration_s=6,
                                       input_image="upl_1", params={"person_generation": "allow_adult"}),
    "veo 3.1, seeded": JobRequest(model="veo/veo-3.1-generate-preview", prompt="a heron", duration_s=8,
                                  seed=2**32 - 1),
}


@pytest.mark.parametrize("request_", CREATES.values(), ids=CREATES.keys())
async def test_a_create_is_the_request_the_sdk_sends_to_vertex_ai(http: aiohttp.ClientSession, server: RecordingServer,
                                                                   sdks: dict[str, genai.Client], request_: JobRequest):
    image = png() if request_.input_image else None
    server.answer("POST", r"/.*:predictLongRunning", 200, payload("vertex_operation_started"))
    server.answer("GET", r"/images/first\.png", 200, image or b"", {"Content-Type": "image/png"})
    await asyncio.to_thread(sdks["vertex"].models.generate_videos, model=request_.model_name,
                            source=sdk_source(request_, image), config=sdk_config(request_, output_gcs_uri=OUTPUT))
    sdk = server.only()
    server.clear()
    accepted = await ours(http, server.url).submit(
        attempt(request_, image_url=f"{server.url}/images/first.png" if image else None))
    mine = posted(server)

    assert mine.route == sdk.route == ("POST", f"/v1beta1/publishers/google/models/{request_.model_name}"
                                               ":predictLongRunning")
    assert mine.query == sdk.query
    assert mine.protocol_headers() == sdk.protocol_headers() == {"x-goog-api-key": KEY}
    assert mine.json() == sdk.json()
    assert accepted.provider_job_id == VERTEX_NAME


def test_the_sdk_builds_no_veo_request_for_the_gemini_api(server: RecordingServer, sdks: dict[str, genai.Client]):
    # google-genai 3.3.0 refuses before sending: the Gemini API's predictLongRunning is a route only its REST
    # docs still describe, which is why `VIDJOBS_VEO_API=vertex` is the API to move to.
    with pytest.raises(ValueError, match="only supported in Gemini Enterprise Agent Platform"):
        sdks["gemini"].models.generate_videos(model="veo-2.0-generate-001",
                                              source=types.GenerateVideosSource(prompt="a fox"))
    assert server.exchanges == []


async def test_a_gemini_api_create_is_the_documented_route_with_the_sdks_body(
    http: aiohttp.ClientSession, server: RecordingServer, sdks: dict[str, genai.Client],
):
    request_ = CREATES["veo 2, text"]
    server.answer("POST", r"/.*:predictLongRunning", 200, payload("gemini_operation_started"))
    await asyncio.to_thread(sdks["vertex"].models.generate_videos, model=request_.model_name,
                            source=sdk_source(request_), config=sdk_config(request_))
    sdk = server.only()
    server.clear()
    await ours(http, server.url, "gemini").submit(attempt(request_))
    mine = server.only()

    # https://ai.google.dev/gemini-api/docs/video (REST): the same instances and parameters, with no storageUri.
    assert mine.route == ("POST", "/v1beta/models/veo-2.0-generate-001:predictLongRunning")
    assert mine.protocol_headers() == sdk.protocol_headers() == {"x-goog-api-key": KEY}
    assert mine.json() == sdk.json()


# --- status read ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", operations("vertex"))
async def test_a_vertex_ai_status_read_is_the_sdks_and_reads_alike(http: aiohttp.ClientSession, server: RecordingServer,
                                                                    sdks: dict[str, genai.Client], name: str):
    server.answer("POST", r"/.*:fetchPredictOperation", 200, payload(name))
    theirs = await asyncio.to_thread(sdks["vertex"].operations.get, types.GenerateVideosOperation(name=VERTEX_NAME))
    sdk = server.only()
    server.clear()
    sig = await ours(http, server.url).status(VERTEX_NAME)
    mine = server.only()

    resource = VERTEX_NAME.rpartition("/operations/")[0]
    assert mine.route == sdk.route == ("POST", f"/v1beta1/{resource}:fetchPredictOperation")
    assert mine.protocol_headers() == sdk.protocol_headers() == {"x-goog-api-key": KEY}
    assert mine.json() == sdk.json() == {"operationName": VERTEX_NAME}
    read_alike(theirs, sig, vertex=True)


@pytest.mark.parametrize("name", operations("gemini"))
async def test_a_gemini_api_status_read_is_the_sdks_and_reads_alike(http: aiohttp.ClientSession,
                                                                     server: RecordingServer,
                                                                     sdks: dict[str, genai.Client], name: str):
    server.answer("GET", r"/.*/operations/.*", 200, payload(name))
    theirs = await asyncio.to_thread(sdks["gemini"].operations.get, types.GenerateVideosOperation(name=GEMINI_NAME))
    sdk = server.only()
    server.clear()
    sig = await ours(http, server.url, "gemini").status(GEMINI_NAME)
    mine = server.only()

    assert mine.route == sdk.route == ("GET", f"/v1/{GEMINI_NAME}")
    assert mine.protocol_headers() == sdk.protocol_headers() == {"x-goog-api-key": KEY}
    assert mine.body == sdk.body == b""
    read_alike(theirs, sig, vertex=False)


@pytest.mark.parametrize("api", ["vertex", "gemini"])
def test_every_recorded_operation_parses_with_the_sdk_and_reads_alike(http: aiohttp.ClientSession, api: str):
    adapter, parse = ours(http, NOWHERE, api), {"vertex": vertex_operation, "gemini": gemini_operation}[api]
    for name in operations(api):
        read_alike(parse(payload(name)), adapter.read_operation((PAYLOADS / f"{name}.json").read_bytes()),
                   vertex=api == "vertex")


# --- every state the SDK's operation type allows ------------------------------------------------------------


@pytest.mark.parametrize("api", ["vertex", "gemini"])
@pytest.mark.parametrize("done", [None, False, True])
def test_every_done_value_is_read(http: aiohttp.ClientSession, api: str, done: bool | None):
    raw = {"name": VERTEX_NAME if api == "vertex" else GEMINI_NAME, **({} if done is None else {"done": done})}
    sdk = (vertex_operation if api == "vertex" else gemini_operation)(raw)

    read_alike(sdk, ours(http, NOWHERE, api).read_operation(json.dumps(raw).encode()), vertex=api == "vertex")


def test_every_google_rpc_code_is_given_a_meaning():
    assert set(MEANING) == set(RPC_CODES)


@pytest.mark.parametrize("code", sorted(RPC_CODES, key=RPC_CODES.__getitem__))
def test_an_operation_ending_in_each_google_rpc_code_reads_as_the_sdk_reads_it(http: aiohttp.ClientSession,
                                                                               code: str):
    raw = {"name": VERTEX_NAME, "done": True, "error": {"code": RPC_CODES[code], "message": "what Veo said"}}

    read_alike(vertex_operation(raw), ours(http, NOWHERE).read_operation(json.dumps(raw).encode()), vertex=True)


# --- cancel -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("api", "name"), [("vertex", VERTEX_NAME), ("gemini", GEMINI_NAME)])
async def test_cancel_sends_nothing_as_the_sdk_has_no_cancel(http: aiohttp.ClientSession, server: RecordingServer,
                                                             sdks: dict[str, genai.Client], api: str, name: str):
    # google-genai has no cancel for a Veo operation on either API (operations: get only), and neither API's REST
    # reference documents one: a render runs to its end, and its late signals find a finished job.
    assert [m for m in dir(sdks[api].operations) if "cancel" in m.lower()] == []

    await ours(http, server.url, api).cancel(name)

    assert server.exchanges == []


# --- the model table against the SDK's request types -----------------------------------------------------------


def every_request() -> list[JobRequest]:
    """Each model with each (ratio, resolution) and each duration models/veo.toml allows for it."""
    return [JobRequest(model=f"veo/{name}", prompt="a fox", aspect_ratio=ratio, resolution=resolution, duration_s=d)
            for name, model in MODELS.items() for ratio, resolution in model.frame_map()
            for d in ([FULL_HD_DURATION_S] if resolution == "1080p" else model.durations)]


def test_every_model_and_format_the_table_allows_is_built_by_the_sdk_as_we_build_it(http: aiohttp.ClientSession,
                                                                                    sdks: dict[str, genai.Client]):
    client, adapter = sdks["vertex"], ours(http, NOWHERE)  # only its request builder is used: nothing is sent
    described = types.GenerateVideosConfig.model_fields
    requests = every_request()

    assert {r.model_name for r in requests} == set(MODELS)
    for r in requests:
        adapter.validate(r)
        config = sdk_config(r, output_gcs_uri=OUTPUT)  # the SDK's request type takes it
        # The SDK types ratio and resolution as strings and says which it supports in their descriptions.
        assert config.aspect_ratio in (described["aspect_ratio"].description or "")
        assert r.resolution in (described["resolution"].description or "")
        parameters = types._GenerateVideosParameters(model=r.model_name, source=sdk_source(r), config=config)
        built = _GenerateVideosParameters_to_vertex(client._api_client, parameters)
        assert built.pop("_url") == {"model": f"publishers/google/models/{r.model_name}"}
        built.pop("config", None)
        assert _common.convert_to_dict(built) == operation_body(attempt(r), storage_uri=OUTPUT), r


def test_every_person_setting_the_table_allows_is_one_the_sdk_knows():
    for people in PEOPLE.values():
        for value in people["text"] + people["image"]:
            assert types.PersonGeneration(value.upper()).value == value.upper()
            assert types.GenerateVideosConfig(person_generation=value).person_generation == value
