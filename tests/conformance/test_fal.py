"""fal: our adapter against fal's official SDK (fal-client, pinned in the test group). Both send a create, a
status read, a result fetch and a cancel to one recording server, and what went over the wire is compared
(route, query, the `Key` auth scheme, headers, body); every payload fal-client reads is handed to fal-client
through its own calls and read alike by ours; every status fal-client reads is one our mapping reads; every
model in models/fal.toml is an endpoint fal-client addresses, under the app our table names.

fal-client builds its queue URLs from a module constant (`QUEUE_URL_FORMAT`, https://queue.fal.run/, made from
FAL_QUEUE_RUN_HOST at import and always https), so the test sets that constant to the recorder: it is the
SDK's base URL, and everything else the SDK does runs as it would. fal-client types neither a model's input
nor its output, so the durations, ratios and resolutions our table sends cannot be checked against it; what
can be is checked: that it addresses each model id, and under which app.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import fal_client
import msgspec
import pytest
from fal_client import client as fal_sdk

from tests.conformance.recorder import Exchange, RecordingServer, recording
from tests.standins.fal import payload, payload_json
from vidjobs.common.errors import ErrorCode, ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import fal_queue, http
from vidjobs.providers.base import ProviderState, SubmitRequest
from vidjobs.providers.fal import APPS, ERRORS, MODELS, FalAdapter, ModelSpec
from vidjobs.providers.fal_queue import Status

KEY = "0f1e2d3c-key-id:5a6b7c8d-key-secret"
CALLBACK = "https://vidjobs.test/v1/webhooks/fal"
RID = "764cabcf-b745-4b3e-ae38-1200304cf45b"
IMAGE = "https://files.vidjobs.test/upl_1.png"
STATUS = r"/.+/requests/[^/]+/status"
CANCEL = r"/.+/requests/[^/]+/cancel"


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch):
    async with recording() as server:
        monkeypatch.setattr(fal_sdk, "QUEUE_URL_FORMAT", server.url + "/")  # the SDK's base URL (see above)
        yield server


@pytest.fixture
async def sdk():
    client = fal_client.AsyncClient(key=KEY)
    yield client
    await (await client._client).aclose()


@pytest.fixture
async def ours(server: RecordingServer, http):
    fal = FalAdapter(http, server.url, KEY, f"{server.url}/jwks", prefetch_keys=False)
    yield fal
    await fal.close()


def places(server: RecordingServer, app: str) -> dict[str, str]:
    return {"request_id": RID, "base_url": server.url, "app": app}


def request_for(model: str, spec: ModelSpec) -> SubmitRequest:
    """A job the model takes: its first length, ratio and resolution, and an image where it animates one."""
    job = JobRequest(model=f"fal/{model}", prompt="a red fox in snow", duration_s=min(spec.durations),
                     aspect_ratio=next(iter(spec.aspect_ratios)), resolution=next(iter(spec.resolutions)),
                     input_image="upl_1" if spec.image else None)
    return SubmitRequest(job_id="job_1", attempt=1, idempotency_key="job_1-a1", request=job, callback_url=CALLBACK,
                         input_image_url=IMAGE if spec.image else None)


def assert_same_call(sdk: Exchange, ours: Exchange, *, sdk_adds: dict[str, str] | None = None) -> None:
    """The same call, but for query parameters fal-client adds (`sdk_adds`)."""
    assert ours.route == sdk.route
    assert sdk.query == {**ours.query, **(sdk_adds or {})}
    assert ours.protocol_headers() == sdk.protocol_headers() == {"authorization": f"Key {KEY}"}
    assert ours.json() == sdk.json()


# --- the calls, side by side ------------------------------------------------------------------------------


@pytest.mark.parametrize("model", list(MODELS))
async def test_create_status_and_cancel_go_out_as_fal_client_sends_them(server, sdk, ours, model):
    spec = MODELS[model]
    server.answer("POST", r"/.+", 200, payload("submit_queued", **places(server, spec.app)))
    server.answer("GET", STATUS, 202, payload("status_in_progress", **places(server, spec.app)))
    server.answer("PUT", CANCEL, 202, payload("cancel_requested"))

    accepted = await ours.submit(request_for(model, spec))
    body = server.only().json()
    handle = await sdk.submit(model, arguments=body, webhook_url=CALLBACK)
    ours_create, sdk_create = server.exchanges
    server.clear()
    signal = await ours.status(accepted.provider_job_id, model_name=model)
    ours_status = server.only()
    server.clear()
    await sdk.status(model, handle.request_id)
    sdk_status = server.only()
    server.clear()
    await ours.cancel(accepted.provider_job_id, model_name=model)
    ours_cancel = server.only()
    server.clear()
    await sdk.cancel(model, handle.request_id)
    sdk_cancel = server.only()

    assert_same_call(sdk_create, ours_create)
    assert ours_create.route == ("POST", f"/{model}") and ours_create.query == {"fal_webhook": CALLBACK}
    assert accepted.provider_job_id == handle.request_id == RID
    # fal-client asks for a status without logs explicitly; we leave `logs` at fal's default, which is none.
    assert_same_call(sdk_status, ours_status, sdk_adds={"logs": "false"})
    assert ours_status.route == ("GET", f"/{spec.app}/requests/{RID}/status")
    assert signal.state is ProviderState.RUNNING and signal.provider_job_id == accepted.provider_job_id
    assert_same_call(sdk_cancel, ours_cancel)
    assert ours_cancel.route == ("PUT", f"/{spec.app}/requests/{RID}/cancel")


@pytest.mark.parametrize("model", list(MODELS))
async def test_a_status_read_and_a_cancel_ask_the_jobs_own_app_and_no_other(server, ours, model):
    """What fal-client does by taking the app from the model's endpoint id, we do from the job's model: another
    app is never asked, so its answer (a 400 here, which a status read takes for a failure and a cancel for
    "already done") can neither mislead nor end the call before the job's own app is asked."""
    spec = MODELS[model]
    others = "|".join(re.escape(app) for app in APPS if app != spec.app)
    server.answer("POST", r"/.+", 200, payload("submit_queued", **places(server, spec.app)))
    server.answer("GET", STATUS, 202, payload("status_in_progress", **places(server, spec.app)))
    server.answer("PUT", CANCEL, 202, payload("cancel_requested"))
    # Taking precedence for every other app (a later answer does):
    server.answer("GET", rf"/({others})/requests/.+", 400, {"detail": "Request does not belong to this app"})
    server.answer("PUT", rf"/({others})/requests/.+", 400, {"detail": "Request does not belong to this app"})

    accepted = await ours.submit(request_for(model, spec))
    server.clear()
    signal = await ours.status(accepted.provider_job_id, model_name=model)
    await ours.cancel(accepted.provider_job_id, model_name=model)

    assert [e.route for e in server.exchanges] == [("GET", f"/{spec.app}/requests/{RID}/status"),
                                                   ("PUT", f"/{spec.app}/requests/{RID}/cancel")]
    assert signal.state is ProviderState.RUNNING


@pytest.mark.parametrize("model_name", [None, "fal-ai/a-model-since-dropped"])
async def test_a_job_whose_model_is_not_known_is_looked_up_under_each_app_in_turn(server, ours, model_name):
    """A job whose model we cannot name (None: a cancel from the previous release; or a model no longer in
    models/fal.toml) has its request looked up under each app of ours in turn, as before."""
    server.answer("GET", rf"/fal-ai/minimax/requests/{RID}/status", 202,
                  payload("status_in_progress", **places(server, "fal-ai/minimax")))
    server.answer("PUT", rf"/fal-ai/minimax/requests/{RID}/cancel", 202, payload("cancel_requested"))

    signal = await ours.status(RID, model_name=model_name)
    await ours.cancel(RID, model_name=model_name)

    assert signal.state is ProviderState.RUNNING
    assert APPS[-1] == "fal-ai/minimax" and len(APPS) > 1  # every other app answers 404 (the recorder's default)
    assert [e.route for e in server.exchanges] == [*(("GET", f"/{app}/requests/{RID}/status") for app in APPS),
                                                   *(("PUT", f"/{app}/requests/{RID}/cancel") for app in APPS)]


async def test_the_result_is_fetched_where_fal_client_fetches_it_and_read_alike(server, sdk, ours):
    model, app = "fal-ai/veo3", "fal-ai/veo3"
    video = "https://v3.fal.media/files/rabbit/output.mp4"
    server.answer("GET", STATUS, 200, payload("status_completed", **places(server, app)))
    server.answer("GET", rf"/{app}/requests/{RID}", 200, payload("result_video", video_url=video))

    signal = await ours.status(RID, model_name=model)
    ours_status, ours_result = server.exchanges
    server.clear()
    result = await sdk.result(model, RID)
    sdk_status, sdk_result = server.exchanges

    assert_same_call(sdk_status, ours_status, sdk_adds={"logs": "false"})
    assert_same_call(sdk_result, ours_result)
    assert signal.state is ProviderState.SUCCEEDED and signal.output_url == result["video"]["url"] == video


# --- the payloads, as fal-client reads them ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["status_in_queue", "status_in_progress", "status_completed",
                                  "status_completed_error"])
async def test_each_status_payload_reads_alike(server, sdk, name):
    body = payload_json(name, **places(server, "fal-ai/veo3"))
    server.answer("GET", STATUS, 200, body)

    theirs = await sdk.status("fal-ai/veo3", RID)
    signal = fal_queue.waiting(RID, msgspec.json.decode(payload(name, **places(server, "fal-ai/veo3")), type=Status))

    match theirs:
        case fal_client.Queued(position=position):
            assert signal is not None and signal.state is ProviderState.QUEUED
            assert signal.queue_position == position == body["queue_position"]
        case fal_client.InProgress():
            assert signal is not None and signal.state is ProviderState.RUNNING
        case fal_client.Completed(error=None, error_type=None):
            assert signal is None  # done: the result is fetched next
        case fal_client.Completed(error=error, error_type=error_type):
            assert signal is not None and signal.state is ProviderState.FAILED and signal.error is not None
            assert error is not None and error in signal.error.message and error_type == body["error_type"]
        case _:
            pytest.fail(f"fal-client read {name} as {theirs!r}")


def test_every_status_fal_client_reads_is_one_we_read():
    """fal-client has no type listing the statuses: they are the ones its status reader compares against."""
    source = inspect.getsource(fal_sdk._BaseRequestHandle._parse_status)
    statuses = set(re.findall(r'data\["status"\] == "(\w+)"', source))

    assert statuses == {"IN_QUEUE", "IN_PROGRESS", "COMPLETED"}
    for status in statuses:
        fal_queue.waiting(RID, Status(status=status))  # raises for a status it does not read
    with pytest.raises(ProviderError):
        fal_queue.waiting(RID, Status(status="SOMETHING_NEW"))  # as fal-client raises ValueError


async def test_the_submit_answer_reads_alike(server, sdk, ours):
    spec = MODELS["fal-ai/veo3"]
    server.answer("POST", r"/.+", 200, payload("submit_queued", **places(server, spec.app)))

    handle = await sdk.submit("fal-ai/veo3", arguments={"prompt": "a red fox in snow"})
    accepted = await ours.submit(request_for("fal-ai/veo3", spec))

    assert accepted.provider_job_id == handle.request_id  # the request id, stored as fal hands it out
    assert handle.status_url == f"{server.url}/{spec.app}/requests/{RID}/status"  # the route we build ourselves


# Each recorded error answer, with the status fal answers it with and what it is in our taxonomy.
ERROR_ANSWERS = {"error_unauthorized": 401, "error_not_found": 404, "error_rate_limited": 429,
                 "error_validation": 422, "error_content_policy": 422, "error_request_timeout": 504,
                 "error_runner_disconnected": 503, "error_unavailable": 503}
EXPECTED_CODES = {"error_unauthorized": ErrorCode.PROVIDER_MISCONFIGURED,
                  "error_not_found": ErrorCode.PROVIDER_MISCONFIGURED,
                  "error_rate_limited": ErrorCode.RATE_LIMITED, "error_validation": ErrorCode.INVALID_INPUT,
                  "error_content_policy": ErrorCode.CONTENT_REJECTED,
                  "error_request_timeout": ErrorCode.PROVIDER_UNAVAILABLE,
                  "error_runner_disconnected": ErrorCode.PROVIDER_UNAVAILABLE,
                  "error_unavailable": ErrorCode.PROVIDER_UNAVAILABLE}


@pytest.mark.parametrize(("name", "status"), ERROR_ANSWERS.items())
async def test_each_error_answer_reads_alike(server, sdk, monkeypatch, name, status):
    # fal-client tries a 429 ten times over with backoff (a policy of its own, as ours is the submitter's):
    # one try is enough to read the answer.
    monkeypatch.setattr(fal_sdk, "MAX_ATTEMPTS", 1)
    raw = payload(name, prompt="a red fox in snow")
    server.answer("POST", r"/.+", status, raw)

    with pytest.raises(fal_client.FalClientHTTPError) as raised:
        await sdk.submit("fal-ai/veo3", arguments={"prompt": "a red fox in snow"})
    theirs = raised.value
    said = fal_queue.read_error(status, raw).text

    assert theirs.status_code == status
    if isinstance(theirs.message, str):
        assert said == theirs.message
    else:  # a model error: fal-client hands over the `detail` list as it came; we name its first entry
        first: dict[str, Any] = theirs.message[0]
        assert said.endswith(first["msg"])
    assert _error_type(raw) == theirs.error_type
    assert ERRORS.error(status, raw, {}).code is EXPECTED_CODES[name]


def _error_type(raw: bytes) -> str | None:
    body = http.read_or_none(raw, fal_queue.ErrorBody)
    return body.error_type if body is not None else None


async def test_a_cancel_answer_reads_alike(server, sdk, ours):
    """fal-client raises the 400 of a request already done; for us it is nothing left to stop, as a 202 is."""
    server.answer("PUT", CANCEL, 202, payload("cancel_requested"))
    await sdk.cancel("fal-ai/veo3", RID)
    await ours.cancel(RID, model_name="fal-ai/veo3")
    server.answer("PUT", CANCEL, 400, payload("cancel_already_completed"))

    with pytest.raises(fal_client.FalClientHTTPError) as raised:
        await sdk.cancel("fal-ai/veo3", RID)
    await ours.cancel(RID, model_name="fal-ai/veo3")

    assert raised.value.status_code == 400 and len(server.exchanges) == 4


# --- the model table ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", list(MODELS))
def test_every_model_is_an_endpoint_fal_client_addresses_under_our_app(model):
    app_id = fal_sdk.AppId.from_endpoint_id(model)
    prefix = f"{app_id.namespace}/" if app_id.namespace else ""

    assert fal_sdk._format_app_path(app_id) == model  # submitted as named
    assert MODELS[model].app == f"{prefix}{app_id.owner}/{app_id.alias}"  # polled and canceled where it is
