"""Replicate: our adapter against Replicate's official SDK (replicate, pinned in the test group). Both send a
create, a status read and a cancel to one recording server (`replicate.Client(base_url=...)`, its async
calls), and what went over the wire is compared (route, the `Bearer` auth scheme, headers, body); every
recorded prediction parses with the SDK's Prediction and reads alike, and each error answer as the SDK raises
it; every status the SDK's Prediction allows is one our mapping reads; every model in models/replicate.toml is
one the SDK creates predictions for, on the same route.

The SDK types neither a model's input nor its output (a model's schema is fetched from Replicate at run
time), so the durations, ratios and inputs our table sends cannot be checked against it.
"""

from __future__ import annotations

import json
import typing

import pytest
import replicate
from pydantic import v1 as pydantic_v1
from replicate.exceptions import ReplicateError
from replicate.identifier import ModelVersionIdentifier
from replicate.model import _create_prediction_path_from_model
from replicate.prediction import Prediction

from tests.conformance.provenance import PAYLOADS as ALL_PAYLOADS
from tests.conformance.recorder import Exchange, RecordingServer, recording
from vidjobs.common.errors import ErrorCode, ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.common.signatures import new_secret
from vidjobs.providers import http
from vidjobs.providers.base import ProviderState, SubmitRequest
from vidjobs.providers.replicate import ERRORS, MODELS, STATES, WEBHOOK_EVENTS, ReplicateAdapter

TOKEN = "r8_test_3b8f0c1d"
CALLBACK = "https://vidjobs.test/v1/webhooks/replicate"
PID = "x18c1re8mxrma0crb3x8wbwqmg"
IMAGE = "https://files.vidjobs.test/upl_1.png"
PAYLOADS = ALL_PAYLOADS / "replicate"
PREDICTIONS = sorted(p.stem for p in PAYLOADS.glob("prediction_*.json"))


def raw(name: str) -> bytes:
    return (PAYLOADS / f"{name}.json").read_bytes()


@pytest.fixture
async def server():
    async with recording() as server:
        yield server


@pytest.fixture
async def sdk(server: RecordingServer):
    client = replicate.Client(api_token=TOKEN, base_url=server.url)
    yield client
    await client._async_client.aclose()


@pytest.fixture
async def ours(server: RecordingServer, http):
    return ReplicateAdapter(http, server.url, TOKEN, new_secret())


def request_for(model: str, image: bool) -> SubmitRequest:
    spec = MODELS[model]
    job = JobRequest(model=f"replicate/{model}", prompt="a lighthouse in a storm", duration_s=spec.durations[-1],
                     aspect_ratio=spec.aspect_ratios[-1], resolution=spec.resolutions[0],
                     negative_prompt="blur" if spec.negative_prompt_input else None,
                     input_image="upl_1" if image else None)
    return SubmitRequest(job_id="job_1", attempt=1, idempotency_key="job_1-a1", request=job, callback_url=CALLBACK,
                         input_image_url=IMAGE if image else None)


def assert_same_call(sdk: Exchange, ours: Exchange) -> None:
    assert ours.route == sdk.route and ours.query == sdk.query
    assert ours.protocol_headers() == sdk.protocol_headers() == {"authorization": f"Bearer {TOKEN}"}
    assert ours.json() == sdk.json()


# --- the calls, side by side ------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "image"), [(m, image) for m in MODELS for image in (False, True)
                                              if not image or MODELS[m].image_input])
async def test_create_status_and_cancel_go_out_as_the_sdk_sends_them(server, sdk, ours, model, image):
    server.answer("POST", r"/v1/models/.+/predictions", 201, raw("prediction_starting"))
    server.answer("GET", rf"/v1/predictions/{PID}", 200, raw("prediction_processing"))
    server.answer("POST", rf"/v1/predictions/{PID}/cancel", 200, raw("prediction_canceled"))

    accepted = await ours.submit(request_for(model, image))
    sent = server.only().json()
    created = await sdk.models.predictions.async_create(model=model, input=sent["input"], webhook=CALLBACK,
                                                        webhook_events_filter=list(WEBHOOK_EVENTS))
    ours_create, sdk_create = server.exchanges
    server.clear()
    signal = await ours.status(accepted.provider_job_id)
    got = await sdk.predictions.async_get(created.id)
    ours_status, sdk_status = server.exchanges
    server.clear()
    await ours.cancel(accepted.provider_job_id)
    canceled = await sdk.predictions.async_cancel(created.id)
    ours_cancel, sdk_cancel = server.exchanges

    assert_same_call(sdk_create, ours_create)
    assert ours_create.route == ("POST", f"/v1/models/{model}/predictions")
    assert accepted.provider_job_id == created.id and STATES[created.status] is accepted.state
    assert_same_call(sdk_status, ours_status)
    assert signal.state is STATES[got.status] is ProviderState.RUNNING
    assert_same_call(sdk_cancel, ours_cancel)
    assert ours_cancel.route == ("POST", f"/v1/predictions/{PID}/cancel") and canceled.status == "canceled"


# --- the payloads, as the SDK reads them ---------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in PREDICTIONS if n != "prediction_aborted"])
async def test_each_prediction_parses_with_the_sdk_and_reads_alike(server, sdk, ours, name):
    server.answer("GET", rf"/v1/predictions/{PID}", 200, raw(name))

    theirs = await sdk.predictions.async_get(PID)
    signal = await ours.status(PID)
    webhook = ours.parse_callback(raw(name))  # Replicate's webhook body is the same prediction

    assert signal == webhook
    assert signal.provider_job_id == theirs.id and signal.state is STATES[theirs.status]
    if theirs.status == "succeeded":
        assert signal.output_url == http.first_url(theirs.output) and signal.output_url
    else:
        assert signal.output_url is None
    if theirs.status == "failed":
        assert signal.error is not None and theirs.error and theirs.error in signal.error.message


def test_the_sdk_still_refuses_the_aborted_status_we_read(ours):
    """Replicate documents `aborted` (a deadline passed before the prediction started); replicate 1.0.7's
    Prediction predates it and refuses it. We keep reading it: the day the SDK takes it, this says so, and the
    payload's provenance can name the SDK's model."""
    with pytest.raises(pydantic_v1.ValidationError):
        Prediction.parse_raw(raw("prediction_aborted"))

    signal = ours.parse_callback(raw("prediction_aborted"))
    assert signal.state is ProviderState.CANCELED and signal.error is not None
    assert signal.error.code == ErrorCode.TIMEOUT


def test_every_status_the_sdk_allows_is_one_we_read():
    allowed = set(typing.get_args(Prediction.__fields__["status"].outer_type_))  # its Literal

    assert allowed == {"starting", "processing", "succeeded", "failed", "canceled"}
    assert set(STATES) - allowed == {"aborted"}  # ours beyond the SDK's, see above
    assert allowed <= set(STATES)


# Each recorded error answer, with the status Replicate answers it with and what it is in our taxonomy.
ERROR_ANSWERS = {"error_401_unauthenticated": (401, ErrorCode.PROVIDER_MISCONFIGURED),
                 "error_402_insufficient_credit": (402, ErrorCode.QUOTA_EXHAUSTED),
                 "error_422_validation": (422, ErrorCode.INVALID_INPUT),
                 "error_429_resets": (429, ErrorCode.RATE_LIMITED),
                 "error_429_throttled": (429, ErrorCode.RATE_LIMITED),
                 "error_503_unavailable": (503, ErrorCode.PROVIDER_UNAVAILABLE)}


@pytest.mark.parametrize("name", ERROR_ANSWERS)
async def test_each_error_answer_reads_as_the_sdk_raises_it(server, sdk, ours, name):
    status, code = ERROR_ANSWERS[name]
    server.answer("POST", r"/v1/models/.+/predictions", status, raw(name))

    with pytest.raises(ReplicateError) as raised:
        await sdk.models.predictions.async_create(model="minimax/video-01", input={"prompt": "a storm"})
    with pytest.raises(ProviderError) as ours_raised:
        await ours.submit(request_for("minimax/video-01", False))

    theirs, error = raised.value, ours_raised.value
    assert theirs.status == status == json.loads(raw(name))["status"]
    assert error.code is code
    said = ERRORS.read(status, raw(name)).text
    assert theirs.detail is not None and said == " ".join(theirs.detail.split())


async def test_a_prediction_replicate_does_not_have_is_a_404_to_both(server, sdk, ours):
    server.answer("GET", rf"/v1/predictions/{PID}", 404, raw("error_404_not_found"))

    with pytest.raises(ReplicateError) as raised:
        await sdk.predictions.async_get(PID)
    signal = await ours.status(PID)

    assert raised.value.status == 404
    assert signal.state is ProviderState.FAILED  # a prediction Replicate forgot will never finish


# --- the model table ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", list(MODELS))
def test_every_model_is_one_the_sdk_creates_predictions_for_on_our_route(model):
    owner, name, version = ModelVersionIdentifier.parse(model)

    assert version is None  # an official model: Replicate runs its current version
    assert _create_prediction_path_from_model(model) == f"/v1/models/{owner}/{name}/predictions"
