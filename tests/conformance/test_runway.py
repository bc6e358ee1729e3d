"""The Runway adapter against Runway's official SDK (runwayml, pinned in the test group): both send the same
create (from text and from an image), status read and cancel to one recording server, and the routes, the auth
scheme, the API version header and the bodies must agree; every recorded task parses with the SDK's
`TaskRetrieveResponse` and reads as the SDK reads it (state, progress, output, failure, billed cost); every
status the SDK's types allow is one our mapping knows; and every model, duration and frame the adapter's model
table offers is one the SDK's request types accept."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, get_args, get_type_hints

import aiohttp
import pydantic
import pytest
from runwayml import AsyncRunwayML
from runwayml.types import TaskRetrieveResponse, TextToVideoCreateResponse
from runwayml.types import image_to_video_create_params as image_params
from runwayml.types import text_to_video_create_params as text_params

from tests.adapter_scaffold import attempt
from tests.conformance.provenance import PAYLOADS
from tests.conformance.recorder import RecordingServer, assert_same_call, recording
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import runway
from vidjobs.providers.base import ProviderState
from vidjobs.providers.runway import MODELS, STATES, RunwayAdapter

KEY = "key_conformance_2f9c"
TASK = "17f20503-6c24-4c16-946b-35dbbce2af2f"
PROMPT = "a red fox trotting through fresh snow"
IMAGE = "https://uploads.example.com/in.png"
# Runway sells API credits at $0.01 each (https://docs.dev.runwayml.com/guides/setup, "Add credits"); the SDK
# reports a task's cost in credits.
USD_PER_CREDIT = 0.01
RECORDED_TASKS = sorted(p.stem for p in (PAYLOADS / "runway").glob("task_*.json") if p.stem != "task_malformed")

SdkCall = Callable[[AsyncRunwayML], Awaitable[Any]]


@pytest.fixture
async def server() -> AsyncIterator[RecordingServer]:
    async with recording() as recorder:
        yield recorder


@pytest.fixture
async def sdk(server: RecordingServer) -> AsyncIterator[AsyncRunwayML]:
    # Strict: an answer that breaks the SDK's response models is an error, as it would be to a strict reader,
    # not an object missing the fields it breaks.
    async with AsyncRunwayML(api_key=KEY, base_url=server.url, max_retries=0,
                             _strict_response_validation=True) as client:
        yield client


@pytest.fixture
def adapter(server: RecordingServer, http: aiohttp.ClientSession) -> RunwayAdapter:
    return RunwayAdapter(http, server.url, KEY)


def recorded(name: str) -> Any:
    return json.loads((PAYLOADS / "runway" / f"{name}.json").read_bytes())


def job(model: str, **fields: Any) -> JobRequest:
    return JobRequest(**{"model": f"runway/{model}", "prompt": PROMPT, "duration_s": 5, **fields})


# The key as a Bearer token, and the API version.
HEADERS = {"authorization": f"Bearer {KEY}", "x-runway-version": runway.API_VERSION}


# --- the same calls, over the wire ---------------------------------------------------------------------

# Each case: our request, the address of its input image, and the SDK's call for the same render, written from
# the SDK's own parameters (our aspect ratio and resolution as Runway's "width:height" output frame).
CREATES: dict[str, tuple[JobRequest, str | None, SdkCall]] = {
    "gen4.5 from text": (
        job("gen4.5", duration_s=10, aspect_ratio="9:16", seed=42, params={"public_figure_threshold": "low"}),
        None,
        lambda c: c.text_to_video.create(model="gen4.5", prompt_text=PROMPT, ratio="720:1280", duration=10, seed=42,
                                         content_moderation={"public_figure_threshold": "low"})),
    "veo3.1 from text": (
        job("veo3.1", duration_s=8, resolution="1080p", negative_prompt="blur", params={"audio": True}),
        None,
        lambda c: c.text_to_video.create(model="veo3.1", prompt_text=PROMPT, ratio="1920:1080", duration=8,
                                         negative_prompt="blur", audio=True)),
    "gen4.5 from an image": (
        job("gen4.5", input_image="upl_1", duration_s=3), IMAGE,
        lambda c: c.image_to_video.create(model="gen4.5", prompt_image=IMAGE, prompt_text=PROMPT, ratio="1280:720",
                                          duration=3)),
    "gen4_turbo from an image": (
        job("gen4_turbo", input_image="upl_1", aspect_ratio="1:1", seed=7, params={"public_figure_threshold": "auto"}),
        IMAGE,
        lambda c: c.image_to_video.create(model="gen4_turbo", prompt_image=IMAGE, prompt_text=PROMPT, ratio="960:960",
                                          duration=5, seed=7, content_moderation={"public_figure_threshold": "auto"})),
    "veo3.1_fast from an image": (
        job("veo3.1_fast", input_image="upl_1", duration_s=4, aspect_ratio="9:16", resolution="1080p",
            params={"audio": False}),
        IMAGE,
        lambda c: c.image_to_video.create(model="veo3.1_fast", prompt_image=IMAGE, prompt_text=PROMPT,
                                          ratio="1080:1920", duration=4, audio=False)),
}


@pytest.mark.parametrize("case", list(CREATES))
async def test_a_create_is_sent_as_the_sdk_sends_it(case: str, server: RecordingServer, sdk: AsyncRunwayML,
                                                    adapter: RunwayAdapter):
    request, image_url, sdk_call = CREATES[case]
    server.answer("POST", r"/v1/(text|image)_to_video", 200, recorded("create_task"))

    created = await sdk_call(sdk)
    accepted = await adapter.submit(attempt(request, image_url=image_url))

    assert_same_call(server, HEADERS)
    assert accepted.provider_job_id == created.id
    assert accepted.state is ProviderState.QUEUED


@pytest.mark.parametrize("name", RECORDED_TASKS)
async def test_a_status_read_is_sent_and_read_as_the_sdk_does(name: str, server: RecordingServer,
                                                              sdk: AsyncRunwayML, adapter: RunwayAdapter):
    server.answer("GET", f"/v1/tasks/{TASK}", 200, recorded(name))

    task = await sdk.tasks.retrieve(TASK)
    sig = await adapter.status(TASK)

    assert_same_call(server, HEADERS)
    assert (sig.provider_job_id, sig.state) == (task.id, STATES[task.status])
    assert sig.progress == (task.progress if task.status == "RUNNING" else None)
    assert sig.output_url == (task.output[0] if task.status == "SUCCEEDED" else None)
    if task.status == "FAILED":
        assert sig.error is not None and task.failure in sig.error.message
        assert sig.error.code is runway.failure_code(task.failure_code)
    else:
        assert sig.error is None
    # What Runway billed, in USD, once a task has ended (`cost`); a task still under way carries only an
    # estimate against current pricing (`estimatedCost`), which is no bill.
    billed = task.cost.credits * USD_PER_CREDIT if task.status in ("SUCCEEDED", "FAILED", "CANCELLED") else None
    assert sig.cost == (pytest.approx(billed) if billed is not None else None)


async def test_a_cancel_is_sent_as_the_sdk_sends_it(server: RecordingServer, sdk: AsyncRunwayML,
                                                    adapter: RunwayAdapter):
    server.answer("DELETE", f"/v1/tasks/{TASK}", 204, b"")

    await sdk.tasks.delete(TASK)
    await adapter.cancel(TASK)

    assert_same_call(server, HEADERS)
    assert server.exchanges[0].route == ("DELETE", f"/v1/tasks/{TASK}")


# --- the recorded payloads and the SDK's types ---------------------------------------------------------


@pytest.mark.parametrize("name", RECORDED_TASKS)
def test_every_recorded_task_parses_with_the_sdks_model(name: str):
    pydantic.TypeAdapter(TaskRetrieveResponse).validate_python(recorded(name))


def test_the_recorded_create_answer_parses_and_the_malformed_task_does_not():
    TextToVideoCreateResponse.model_validate(recorded("create_task"))
    with pytest.raises(pydantic.ValidationError):
        pydantic.TypeAdapter(TaskRetrieveResponse).validate_python(recorded("task_malformed"))


def sdk_statuses() -> set[str]:
    """Every `status` TaskRetrieveResponse allows: one Literal per member of its union."""
    union = get_args(TaskRetrieveResponse)[0]  # Annotated[Union[...], discriminator]
    return {status for member in get_args(union) for status in get_args(member.model_fields["status"].annotation)}


def test_every_status_the_sdk_allows_is_mapped_and_recorded():
    statuses = sdk_statuses()

    assert statuses == set(STATES)
    assert statuses == {recorded(name)["status"] for name in RECORDED_TASKS}


def sdk_request_type(name: str, from_image: bool) -> Any:
    """The SDK's request TypedDict for model `name` on the image_to_video or text_to_video route, or None."""
    union = image_params.ImageToVideoCreateParams if from_image else text_params.TextToVideoCreateParams
    return next((member for member in get_args(union) if name in get_args(get_type_hints(member)["model"])), None)


def accepts(annotation: Any, value: Any) -> bool:
    """Whether a value passes the SDK's annotation of one field: a Literal's values, or the plain type."""
    choices = get_args(annotation)
    return value in choices if choices else isinstance(value, annotation)


# Every model on each route the table offers it on: from text where it has text frames, from an image where
# it has image frames.
OFFERED = [(name, from_image) for name, model in MODELS.items() for from_image in (False, True)
           if model.frames(from_image)]


@pytest.mark.parametrize(("name", "from_image"), OFFERED,
                         ids=[f"{name}-{'image' if image else 'text'}" for name, image in OFFERED])
def test_every_model_and_choice_in_the_table_is_one_the_sdk_can_create(name: str, from_image: bool):
    model = MODELS[name]
    frames = model.frames(from_image)
    request_type = sdk_request_type(name, from_image)
    route = "image_to_video" if from_image else "text_to_video"

    assert request_type is not None, f"runwayml cannot create {name} on {route}"
    fields = get_type_hints(request_type)
    assert {f for f in frames.values() if not accepts(fields["ratio"], f)} == set(), f"{name} {route} ratio"
    assert {d for d in model.durations if not accepts(fields["duration"], d)} == set(), f"{name} {route} duration"
    assert not model.seed or "seed" in fields
    assert not model.negative_prompt or "negative_prompt" in fields
    for param in model.params:
        if param == "public_figure_threshold":
            moderation = get_type_hints(fields["content_moderation"])
            assert set(get_args(moderation["public_figure_threshold"])) == {"auto", "low"}
        else:
            assert fields[param] is bool, param
