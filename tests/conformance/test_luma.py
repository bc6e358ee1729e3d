"""The Luma adapter against Luma's official SDK (lumaai, pinned in the test group): both send the same create
(from text and from an image), status read, cancel and listing to one recording server, and the routes, the
auth scheme, the queries and the bodies must agree; every recorded generation parses with the SDK's models and
reads as the SDK reads it (state, video, failure reason, the job its callback URL names); every state the SDK's
types allow is one our mapping knows; and every model, duration, resolution and aspect ratio the adapter offers
is one the SDK's request type accepts."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, get_args, get_origin, get_type_hints
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from lumaai import AsyncLumaAI
from lumaai.types import Generation, GenerationListResponse
from lumaai.types.generations.video_create_params import VideoCreateParams

from tests.adapter_scaffold import attempt
from tests.conformance.provenance import PAYLOADS
from tests.conformance.recorder import RecordingServer, assert_same_call, recording
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import base, luma
from vidjobs.providers.luma import STATES, LumaAdapter

KEY = "luma-conformance-51d0"
GENERATION = "d1968551-6113-4b46-b567-09210c2e79b0"
PROMPT = "a glass whale drifting over a desert"
IMAGE = "https://uploads.example.com/frame.png"
HOOK = "https://vidjobs.example.com/v1/webhooks/luma"
RECORDED = sorted(p.stem for p in (PAYLOADS / "luma").glob("generation_*.json") if p.stem != "generation_list")

SdkCall = Callable[[AsyncLumaAI], Awaitable[Any]]


@pytest.fixture
async def server() -> AsyncIterator[RecordingServer]:
    async with recording() as recorder:
        yield recorder


@pytest.fixture
async def sdk(server: RecordingServer) -> AsyncIterator[AsyncLumaAI]:
    # The SDK's base URL carries the API's prefix; ours is the host. Strict: an answer that breaks the SDK's
    # models is an error, not an object missing what it breaks.
    async with AsyncLumaAI(auth_token=KEY, base_url=f"{server.url}{luma.API}", max_retries=0,
                           _strict_response_validation=True) as client:
        yield client


@pytest.fixture
def adapter(server: RecordingServer, http: aiohttp.ClientSession) -> LumaAdapter:
    return LumaAdapter(http, server.url, KEY)


def recorded(name: str) -> Any:
    return json.loads((PAYLOADS / "luma" / f"{name}.json").read_bytes())


def job(model: str, **fields: Any) -> JobRequest:
    return JobRequest(**{"model": f"luma/{model}", "prompt": PROMPT, "duration_s": 5, **fields})


HEADERS = {"authorization": f"Bearer {KEY}"}  # the key as a Bearer token


# --- the same calls, over the wire ---------------------------------------------------------------------

# Each case: our request, the address of its input image, and the SDK's call for the same generation, written
# from the SDK's own parameters (the callback URL carries our job and attempt).
CREATES: dict[str, tuple[JobRequest, str | None, SdkCall]] = {
    "ray-2 from text": (
        job("ray-2", duration_s=7, aspect_ratio="9:16", resolution="480p", params={"loop": True}), None,
        lambda c: c.generations.video.create(
            generation_type="video", model="ray-2", prompt=PROMPT, aspect_ratio="9:16", resolution="540p",
            duration="9s", loop=True, callback_url=f"{HOOK}?job=job_conf&attempt=2")),
    "ray-flash-2 from an image": (
        job("ray-flash-2", input_image="upl_1", aspect_ratio="1:1", resolution="1080p"), IMAGE,
        lambda c: c.generations.video.create(
            generation_type="video", model="ray-flash-2", prompt=PROMPT, aspect_ratio="1:1", resolution="1080p",
            duration="5s", keyframes={"frame0": {"type": "image", "url": IMAGE}},
            callback_url=f"{HOOK}?job=job_conf&attempt=2")),
}


@pytest.mark.parametrize("case", list(CREATES))
async def test_a_create_is_sent_as_the_sdk_sends_it(case: str, server: RecordingServer, sdk: AsyncLumaAI,
                                                    adapter: LumaAdapter):
    request, image_url, sdk_call = CREATES[case]
    # Answered on either route, so a difference shows in the comparison rather than as a refused call.
    server.answer("POST", r"/dream-machine/v1/generations(/video)?", 201, recorded("generation_queued"))

    created = await sdk_call(sdk)
    accepted = await adapter.submit(attempt(request, job_id="job_conf", number=2, callback_url=HOOK,
                                            image_url=image_url))

    assert_same_call(server, HEADERS)
    assert server.exchanges[0].route == ("POST", "/dream-machine/v1/generations/video")
    assert (accepted.provider_job_id, accepted.state) == (created.id, STATES[created.state])


@pytest.mark.parametrize("name", RECORDED)
async def test_a_status_read_is_sent_and_read_as_the_sdk_does(name: str, server: RecordingServer,
                                                              sdk: AsyncLumaAI, adapter: LumaAdapter):
    server.answer("GET", f"/dream-machine/v1/generations/{GENERATION}", 200, recorded(name))

    generation = await sdk.generations.get(GENERATION)
    sig = await adapter.status(GENERATION)

    assert_same_call(server, HEADERS)
    assert (sig.provider_job_id, sig.state) == (generation.id, STATES[generation.state])
    assert sig.output_url == (generation.assets.video if generation.state == "completed" else None)
    if generation.state == "failed":
        assert sig.error is not None and generation.failure_reason in sig.error.message
    else:
        assert sig.error is None
    query = parse_qs(urlsplit(generation.request.callback_url).query)
    assert (sig.job_id, sig.attempt) == (query["job"][0], int(query["attempt"][0]))


async def test_a_cancel_is_sent_as_the_sdk_sends_it(server: RecordingServer, sdk: AsyncLumaAI,
                                                    adapter: LumaAdapter):
    server.answer("DELETE", f"/dream-machine/v1/generations/{GENERATION}", 204, b"")

    await sdk.generations.delete(GENERATION)
    await adapter.cancel(GENERATION)

    assert_same_call(server, HEADERS)
    assert server.exchanges[0].route == ("DELETE", f"/dream-machine/v1/generations/{GENERATION}")


async def test_the_listing_find_reads_is_asked_for_as_the_sdk_asks(server: RecordingServer, sdk: AsyncLumaAI,
                                                                  adapter: LumaAdapter):
    server.answer("GET", "/dream-machine/v1/generations", 200, recorded("generation_list"))

    listed = await sdk.generations.list(limit=luma.FIND_PAGE_SIZE, offset=0)
    found = await adapter.find(attempt(job("ray-2"), job_id="job_01jexample", number=1))

    assert_same_call(server, HEADERS)
    assert found is not None and found.provider_job_id == listed.generations[0].id


# --- the recorded payloads and the SDK's types ---------------------------------------------------------


@pytest.mark.parametrize("name", RECORDED)
def test_every_recorded_generation_parses_with_the_sdks_model(name: str):
    Generation.model_validate(recorded(name))


def test_the_recorded_listing_parses_with_the_sdks_model():
    GenerationListResponse.model_validate(recorded("generation_list"))


def test_every_state_the_sdk_allows_is_mapped_read_and_recorded():
    states = literals(Generation.model_fields["state"].annotation)  # Optional[Literal[...]]

    assert states == set(STATES)
    assert states == set(get_args(get_type_hints(luma._Generation)["state"]))  # what the reader accepts
    assert states == {recorded(name)["state"] for name in RECORDED}


def literals(annotation: Any) -> set[Any]:
    """The values the Literal parts of an annotation name: `Union[Literal["5s", "9s"], str]` gives the two
    documented values, not the open-ended `str` the SDK also lets through."""
    if get_origin(annotation) is Literal:
        return set(get_args(annotation))
    return {value for part in get_args(annotation) for value in literals(part)}


def test_every_model_and_choice_the_adapter_offers_is_one_the_sdk_can_create():
    fields = get_type_hints(VideoCreateParams)

    assert set(luma.MODELS) <= literals(fields["model"])
    assert set(luma.DURATIONS.values()) <= literals(fields["duration"])
    assert set(luma.RESOLUTIONS.values()) <= literals(fields["resolution"])
    assert set(base.ALL_RATIOS) <= literals(fields["aspect_ratio"])
    assert set(luma.PARAMS) <= set(fields)  # each `params` entry is a field of the request
