"""The fal.ai adapter against the local stand-in over real HTTP (recorded payloads from fal's documentation),
then a fal job end to end through the real stack."""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, get_type_hints

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.stack import assert_legal_trail, host_port, running_stack, stack_settings
from tests.standins.fal import FalStandIn, Scenario, payload
from tests.support import wait_until
from vidjobs.common.errors import ErrorCode, ProviderError, WebhookRejected
from vidjobs.common.jobs import JobRequest
from vidjobs.common.settings import Settings
from vidjobs.providers.base import ProviderAdapter, ProviderSignal, ProviderState, SubmitRequest
from vidjobs.providers.fal import APPS, FalAdapter
from vidjobs.providers.fal_signature import Jwks, UnknownKey

KLING = "fal-ai/kling-video/v2/master/text-to-video"
KLING_I2V = "fal-ai/kling-video/v2/master/image-to-video"
VEO3 = "fal-ai/veo3"
MINIMAX = "fal-ai/minimax/video-01"
KEY = "test-key"
RID = "764cabcf-b745-4b3e-ae38-1200304cf45b"  # a fal request id
VIDEO = "https://v3.fal.media/files/rabbit/output.mp4"


@pytest.fixture
async def standin():
    async with FalStandIn(api_key=KEY) as server:
        yield server


@pytest.fixture
async def adapter(standin, http):
    fal = FalAdapter(http, standin.url, KEY, standin.jwks_url)
    yield fal
    await fal.close()


def job(model: str = KLING, prompt: str = "a red fox in snow", **fields) -> JobRequest:
    return JobRequest(model=f"fal/{model}", prompt=prompt, **fields)


def submit_request(request: JobRequest, *, callback_url: str | None = None, image_url: str | None = None):
    return SubmitRequest(job_id="job_fal", attempt=1, idempotency_key="job_fal-a1", request=request,
                         callback_url=callback_url, input_image_url=image_url)


async def until_finished(adapter: FalAdapter, request_id: str, model_name: str | None = KLING) -> list[ProviderSignal]:
    """Every status signal from the first poll to a finished one."""
    seen: list[ProviderSignal] = []

    async def finished():
        seen.append(await adapter.status(request_id, model_name=model_name))
        return seen[-1].state in (ProviderState.SUCCEEDED, ProviderState.FAILED, ProviderState.CANCELED)

    await wait_until(finished, within=10, interval=0.05, what=f"{request_id} to finish")
    return seen


@asynccontextmanager
async def serving(method: str, path: str, handler) -> AsyncIterator[str]:
    """A one-route HTTP server on a free loopback port; yields its base URL."""
    app = web.Application()
    app.router.add_route(method, path, handler)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


def refused(err: pytest.ExceptionInfo[ProviderError], code: ErrorCode, field: str) -> None:
    assert err.value.code is code, err.value.message
    assert err.value.message.startswith(field), err.value.message


def _protocol_methods() -> list[str]:
    return sorted(n for n, v in vars(ProviderAdapter).items() if not n.startswith("_") and callable(v))


def _takes_every_call_of(spec: Callable[..., Any], impl: Callable[..., Any]) -> list[str]:
    """Why `impl` could not stand where `spec` is called (empty if it can): the same parameters in the same
    order and kinds with the same types, anything more optional, the same return type, async where it is."""
    problems = []
    if inspect.iscoroutinefunction(spec) != inspect.iscoroutinefunction(impl):
        problems.append("async" if inspect.iscoroutinefunction(spec) else "not async")
    want, have = inspect.signature(spec).parameters, inspect.signature(impl).parameters
    if list(have)[: len(want)] != list(want):
        problems.append(f"parameters {list(have)} do not start with {list(want)}")
    problems += [f"{name} is {have[name].kind.description}" for name in want
                 if name in have and have[name].kind != want[name].kind]
    problems += [f"{name} is required" for name in list(have)[len(want):]
                 if have[name].default is inspect.Parameter.empty
                 and have[name].kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    want_types, have_types = get_type_hints(spec), get_type_hints(impl)
    problems += [f"{name}: {have_types.get(name)} for {hint}" for name, hint in want_types.items()
                 if have_types.get(name) != hint]
    return problems


def test_it_has_every_method_of_a_provider_adapter_with_a_signature_that_takes_its_calls(http):
    fal = FalAdapter(http, "http://x", KEY, "http://x/jwks", prefetch_keys=False)
    assert (fal.name, fal.supports_callbacks) == ("fal", True)
    mismatched = {name: why for name in _protocol_methods()
                  if (why := _takes_every_call_of(getattr(ProviderAdapter, name), getattr(FalAdapter, name)))}
    assert not mismatched, mismatched
    for name in ("status", "cancel"):  # the job's model, which says which app holds the request
        model_name = inspect.signature(getattr(FalAdapter, name)).parameters["model_name"]
        assert model_name.kind is inspect.Parameter.KEYWORD_ONLY and model_name.default is None


def test_the_signature_check_sees_a_method_that_would_not_take_the_protocols_calls():
    """The check itself: each way of not fitting a method of the Protocol is caught."""
    async def status(self: Any, provider_job_id: str, *, model_name: str | None = None) -> ProviderSignal: ...
    async def without_model(self: Any, provider_job_id: str) -> ProviderSignal: ...
    def blocking(self: Any, provider_job_id: str, *, model_name: str | None = None) -> ProviderSignal: ...
    async def renamed(self: Any, job_id: str) -> ProviderSignal: ...
    async def needs_more(self: Any, provider_job_id: str, model_name: str) -> ProviderSignal: ...
    async def wrong_type(self: Any, provider_job_id: int) -> ProviderSignal: ...
    async def wrong_answer(self: Any, provider_job_id: str) -> str: ...

    spec = ProviderAdapter.status
    assert _takes_every_call_of(spec, status) == []
    for impl in (without_model, blocking, renamed, needs_more, wrong_type, wrong_answer):
        assert _takes_every_call_of(spec, impl), impl.__name__


# --- validation: each model family takes its own documented inputs ------------------------------------------


@pytest.mark.parametrize("request_", [
    job(duration_s=5, aspect_ratio="9:16", negative_prompt="blur", params={"cfg_scale": 0.7}),
    job(duration_s=10, aspect_ratio="1:1"),
    job(VEO3, duration_s=8, resolution="1080p", seed=7, params={"generate_audio": False, "enhance_prompt": True}),
    job(MINIMAX, duration_s=6, params={"prompt_optimizer": False}),
    job(KLING_I2V, input_image="upl_1"),
])
def test_documented_inputs_are_accepted(adapter, request_):
    adapter.validate(request_)


@pytest.mark.parametrize(("request_", "field"), [
    (job(params={"scenario": "succeed"}), "params.scenario"),
    (job(params={"cfg_scale": 3}), "params.cfg_scale"),
    (job(VEO3, duration_s=8, params={"generate_audio": "yes"}), "params.generate_audio"),
    (job(duration_s=7), "duration_s"),
    (job(MINIMAX), "duration_s"),  # its clips are 6 s long, not the 5 s asked by default
    (job(MINIMAX, duration_s=6, aspect_ratio="9:16"), "aspect_ratio"),
    (job(resolution="1080p"), "resolution"),
    (job(seed=7), "seed"),
    (job(MINIMAX, duration_s=6, negative_prompt="blur"), "negative_prompt"),
    (job(input_image="upl_1"), "input_image"),
    (job(KLING_I2V), "input_image"),
    (job("fal-ai/flux/dev"), "model"),
])
def test_what_a_model_cannot_take_is_refused_naming_the_field(adapter, request_, field):
    with pytest.raises(ProviderError) as err:
        adapter.validate(request_)
    refused(err, ErrorCode.INVALID_INPUT, field)


# --- submitting and polling ---------------------------------------------------------------------------------


async def test_submit_sends_the_models_own_input_and_the_webhook(adapter, standin):
    request = job(duration_s=10, aspect_ratio="9:16", negative_prompt="blur", params={"cfg_scale": 0.25})

    accepted = await adapter.submit(submit_request(request, callback_url="http://gw.test/v1/webhooks/fal"))

    sent = standin.requests[accepted.provider_job_id]  # fal's request id, as fal handed it out
    assert sent.model_id == KLING and sent.app == "fal-ai/kling-video"
    assert sent.input == {"prompt": "a red fox in snow", "duration": "10", "aspect_ratio": "9:16",
                          "negative_prompt": "blur", "cfg_scale": 0.25}
    assert sent.webhook_url == "http://gw.test/v1/webhooks/fal"
    assert accepted.state is ProviderState.QUEUED and accepted.queue_position == 0


@pytest.mark.parametrize(("request_", "expected"), [
    (job(VEO3, duration_s=8, resolution="1080p", seed=3),
     {"duration": "8s", "aspect_ratio": "16:9", "resolution": "1080p", "seed": 3}),
    (job(MINIMAX, duration_s=6), {}),  # fixed length and ratio: nothing to say but the prompt
])
async def test_each_family_gets_its_own_spelling(adapter, standin, request_, expected):
    accepted = await adapter.submit(submit_request(request_))
    assert standin.requests[accepted.provider_job_id].input == {"prompt": "a red fox in snow", **expected}


async def test_an_image_to_video_model_gets_the_image_url(adapter, standin):
    request = job(KLING_I2V, input_image="upl_1")
    accepted = await adapter.submit(submit_request(request, image_url="https://files.test/upl_1.png"))
    assert standin.requests[accepted.provider_job_id].input["image_url"] == "https://files.test/upl_1.png"


@pytest.mark.parametrize("model_name", [KLING, None])  # None: the adapter finds the request's app itself
async def test_a_render_is_queued_with_positions_then_runs_then_succeeds(adapter, standin, http, model_name):
    prompt = standin.plan("a long queue", Scenario.LONG_QUEUE)
    accepted = await adapter.submit(submit_request(job(prompt=prompt)))

    seen = await until_finished(adapter, accepted.provider_job_id, model_name)

    positions = [s.queue_position for s in seen if s.state is ProviderState.QUEUED]
    assert positions[0] == 3 and positions[-1] == 0 and positions == sorted(positions, reverse=True)
    assert ProviderState.RUNNING in {s.state for s in seen}
    done = seen[-1]
    assert done.state is ProviderState.SUCCEEDED and done.provider_job_id == accepted.provider_job_id
    async with http.get(done.output_url) as resp:
        assert resp.status == 200 and (await resp.read())[4:8] == b"ftyp"


@pytest.mark.parametrize(("scenario", "code", "words"), [
    (Scenario.CONTENT_REJECTED, ErrorCode.CONTENT_REJECTED, "flagged by a content checker"),
    (Scenario.INVALID_INPUT, ErrorCode.INVALID_INPUT, "duration: Input should be '5' or '10'"),
    (Scenario.RUNNER_FAILURE, ErrorCode.PROVIDER_UNAVAILABLE, "Runner disconnected"),
])
async def test_a_failed_render_is_reported_in_our_taxonomy(adapter, standin, scenario, code, words):
    prompt = standin.plan(f"a render that ends in {scenario}", scenario)
    accepted = await adapter.submit(submit_request(job(prompt=prompt)))

    done = (await until_finished(adapter, accepted.provider_job_id))[-1]

    assert done.state is ProviderState.FAILED and done.error is not None
    assert done.error.code is code and words in done.error.message


@pytest.mark.parametrize(("scenario", "code", "start"), [
    (Scenario.UNAVAILABLE, ErrorCode.PROVIDER_UNAVAILABLE, "fal is unavailable: Service temporarily"),
    (Scenario.REFUSED, ErrorCode.INVALID_INPUT, "fal refused the request: duration:"),
    (Scenario.REFUSED_CONTENT, ErrorCode.CONTENT_REJECTED, "fal refused the request: prompt:"),
    (Scenario.MALFORMED, ErrorCode.INTERNAL, "fal sent a malformed queue answer"),
])
async def test_a_refused_submit_is_raised_in_our_taxonomy(adapter, standin, scenario, code, start):
    prompt = standin.plan(f"a submit that meets {scenario}", scenario)
    with pytest.raises(ProviderError) as err:
        await adapter.submit(submit_request(job(prompt=prompt)))
    assert err.value.code is code and err.value.message.startswith(start), err.value.message


async def test_a_rate_limit_carries_retry_after_and_then_lets_the_submit_through(adapter, standin):
    prompt = standin.plan("a busy afternoon", Scenario.RATE_LIMITED)
    for _ in range(2):
        with pytest.raises(ProviderError) as err:
            await adapter.submit(submit_request(job(prompt=prompt)))
        assert err.value.code is ErrorCode.RATE_LIMITED and err.value.retry_after == 1.0

    accepted = await adapter.submit(submit_request(job(prompt=prompt)))

    assert standin.requests[accepted.provider_job_id] and standin.renders[prompt] == 1


async def test_a_wrong_key_is_our_configuration_and_the_key_is_never_repeated(standin, http, caplog):
    wrong = "wrong-key-4f1d9c"
    fal = FalAdapter(http, standin.url, wrong, standin.jwks_url, prefetch_keys=False)
    caplog.set_level(logging.DEBUG)

    with pytest.raises(ProviderError) as err:
        await fal.submit(submit_request(job()))

    assert err.value.code is ErrorCode.PROVIDER_MISCONFIGURED and "check VIDJOBS_FAL_API_KEY" in err.value.message
    assert wrong not in err.value.message and wrong not in repr(fal) and wrong not in caplog.text


async def test_an_unreachable_fal_is_unavailable_and_a_silent_one_times_out(http):
    closed = FalAdapter(http, "http://127.0.0.1:9", KEY, "http://127.0.0.1:9/jwks", prefetch_keys=False)
    with pytest.raises(ProviderError) as err:
        await closed.submit(submit_request(job()))
    assert err.value.code is ErrorCode.PROVIDER_UNAVAILABLE

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response({})

    async with serving("*", "/{tail:.*}", slow) as url, \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.2)) as impatient:
        silent = FalAdapter(impatient, url, KEY, url + "/jwks", prefetch_keys=False)
        with pytest.raises(ProviderError) as err:
            await silent.status(RID, model_name=KLING)
    assert err.value.code is ErrorCode.TIMEOUT


@pytest.mark.parametrize(("status", "body", "headers", "code"), [
    # The request's own failure, kept by fal as its result: the render failed.
    (504, "error_request_timeout", {"X-Fal-Error-Type": "request_timeout"}, ErrorCode.PROVIDER_UNAVAILABLE),
    (422, "error_validation", {}, ErrorCode.INVALID_INPUT),
])
async def test_a_completed_requests_failed_result_is_a_failed_render(http, status, body, headers, code):
    async with _completed_request_whose_result_answers(http, status, payload(body), headers) as fal:
        signal = await fal.status(RID, model_name=VEO3)
    assert signal.state is ProviderState.FAILED and signal.error is not None and signal.error.code is code


@pytest.mark.parametrize(("status", "body", "headers", "code", "retry_after"), [
    (503, None, {}, ErrorCode.PROVIDER_UNAVAILABLE, None),
    (429, "error_rate_limited", {"Retry-After": "3"}, ErrorCode.RATE_LIMITED, 3.0),
    (200, None, {}, ErrorCode.INTERNAL, None),  # a result that is not JSON
])
async def test_a_failed_fetch_of_a_completed_requests_result_is_raised_to_be_tried_again(
        http, status, body, headers, code, retry_after):
    """The fetch itself failing says nothing about the render: it is raised with a code the poller tries
    again (and fal's pacing), never reported as a failed render."""
    data = payload(body) if body else b"<html>upstream trouble</html>"
    async with _completed_request_whose_result_answers(http, status, data, headers) as fal:
        with pytest.raises(ProviderError) as err:
            await fal.status(RID, model_name=VEO3)
    assert err.value.code is code, err.value.message
    assert err.value.retryable and err.value.retry_after == retry_after


@asynccontextmanager
async def _completed_request_whose_result_answers(http: aiohttp.ClientSession, status: int, body: bytes,
                                                  headers: dict[str, str]) -> AsyncIterator[FalAdapter]:
    """An adapter talking to a fal whose request has completed and whose result answers `status` and `body`."""
    async def queue(request: web.Request) -> web.Response:
        if request.path.endswith("/status"):
            return web.Response(body=payload("status_completed", request_id=RID, base_url=url, app="fal-ai/veo3"),
                                content_type="application/json")
        return web.Response(status=status, body=body, headers=headers, content_type="application/json")

    async with serving("GET", "/{tail:.*}", queue) as url:
        yield FalAdapter(http, url, KEY, url + "/jwks", prefetch_keys=False)


@pytest.mark.parametrize("model_name", [VEO3, None])
async def test_a_request_fal_does_not_know_has_failed(adapter, model_name):
    signal = await adapter.status(RID, model_name=model_name)
    assert signal.state is ProviderState.FAILED and signal.error.code is ErrorCode.PROVIDER_UNAVAILABLE
    assert signal.provider_job_id == RID


async def test_cancel_stops_a_queued_request_and_is_quiet_about_finished_ones(adapter, standin):
    hung = await adapter.submit(submit_request(job(prompt=standin.plan("a request that waits", Scenario.HANG))))
    done = await adapter.submit(submit_request(job(prompt="a quick one")))
    await until_finished(adapter, done.provider_job_id)

    await adapter.cancel(hung.provider_job_id, model_name=KLING)
    await adapter.cancel(done.provider_job_id, model_name=KLING)  # ALREADY_COMPLETED: nothing to stop
    await adapter.cancel(RID, model_name=VEO3)  # unknown to its app: nothing to stop
    await adapter.cancel(RID)  # no model named, unknown under every app: nothing to stop

    assert standin.requests[hung.provider_job_id].canceled
    assert not standin.requests[done.provider_job_id].canceled


async def a_hung_veo3_request(adapter, standin) -> str:
    """A veo3 request that never finishes, its id; the stand-in's record of the apps asked starts empty."""
    accepted = await adapter.submit(submit_request(job(VEO3, duration_s=8,
                                                       prompt=standin.plan("a long wait", Scenario.HANG))))
    standin.asked.clear()
    return accepted.provider_job_id


async def test_status_and_cancel_ask_the_jobs_own_app_and_no_other(adapter, standin):
    rid = await a_hung_veo3_request(adapter, standin)

    assert (await adapter.status(rid, model_name=VEO3)).state is ProviderState.QUEUED
    await adapter.cancel(rid, model_name=VEO3)

    assert standin.asked == [("GET", f"/fal-ai/veo3/requests/{rid}/status"),
                             ("PUT", f"/fal-ai/veo3/requests/{rid}/cancel")]
    assert standin.requests[rid].canceled


@pytest.mark.parametrize("model_name", [None, "fal-ai/a-model-since-dropped"])
async def test_a_job_whose_model_is_not_known_is_looked_up_under_each_app_in_turn(adapter, standin, model_name):
    rid = await a_hung_veo3_request(adapter, standin)

    assert (await adapter.status(rid, model_name=model_name)).state is ProviderState.QUEUED
    await adapter.cancel(rid, model_name=model_name)

    up_to_veo3 = APPS[:APPS.index("fal-ai/veo3") + 1]
    assert len(up_to_veo3) > 1  # another app is asked first, and answers 404
    assert standin.asked == [*(("GET", f"/{app}/requests/{rid}/status") for app in up_to_veo3),
                             *(("PUT", f"/{app}/requests/{rid}/cancel") for app in up_to_veo3)]
    assert standin.requests[rid].canceled


async def test_there_is_no_earlier_submission_to_find(adapter):
    # fal has no idempotency key: the submitter's own record is what prevents a second render.
    assert await adapter.find(submit_request(job())) is None


# --- callbacks: the recorded webhook payloads ---------------------------------------------------------------

def recorded(name: str) -> bytes:
    return payload(name, request_id=RID, video_url=VIDEO, prompt="a red fox in snow")


def test_an_ok_webhook_is_a_finished_render(adapter):
    signal = adapter.parse_callback(recorded("webhook_ok"))
    assert signal == ProviderSignal(provider_job_id=RID, state=ProviderState.SUCCEEDED, output_url=VIDEO)


def test_an_ok_webhook_without_its_payload_only_says_where_to_look(adapter):
    signal = adapter.parse_callback(recorded("webhook_ok_payload_error"))
    assert signal.provider_job_id == RID and signal.output_url is None and not signal.verified


@pytest.mark.parametrize(("name", "code"), [
    ("webhook_error_content_policy", ErrorCode.CONTENT_REJECTED),
    ("webhook_error_validation", ErrorCode.INVALID_INPUT),
    ("webhook_error_runner", ErrorCode.PROVIDER_UNAVAILABLE),
])
def test_an_error_webhook_is_a_failed_render_in_our_taxonomy(adapter, name, code):
    signal = adapter.parse_callback(recorded(name))
    assert signal.state is ProviderState.FAILED and signal.provider_job_id == RID
    assert signal.error.code is code and "fal said:" in signal.error.message


@pytest.mark.parametrize("body", [recorded("webhook_malformed"), b"<html>502</html>", b'{"request_id": 7}',
                                  recorded("webhook_ok").replace(RID.encode(), b"fal-ai/veo3/x")])
def test_a_malformed_webhook_is_internal(adapter, body):
    with pytest.raises(ProviderError) as err:
        adapter.parse_callback(body)
    assert err.value.code is ErrorCode.INTERNAL


# --- webhook signatures: ED25519 against fal's JWKS, keys cached --------------------------------------------

BODY = recorded("webhook_ok")


async def loaded(fal: FalAdapter) -> FalAdapter:
    await wait_until(lambda: _has_keys(fal), within=5, what="fal's keys to load")
    return fal


async def _has_keys(fal: FalAdapter) -> bool:
    return bool(fal.jwks.keys)


async def test_a_signed_webhook_verifies_and_names_its_request(adapter, standin):
    await loaded(adapter)
    assert adapter.verify_callback(standin.sign(BODY, RID), BODY) == RID


async def test_a_validly_signed_webhook_for_another_fal_user_is_refused(standin, http):
    """fal signs every customer's callbacks with one key set: another fal user can have fal sign a callback
    and point it at our URL. With our user id configured, only ours are taken."""
    ours = FalAdapter(http, standin.url, KEY, standin.jwks_url, user_id=standin.user_id)
    theirs = FalAdapter(http, standin.url, KEY, standin.jwks_url, user_id="another-fal-user")
    try:
        await loaded(ours)
        await loaded(theirs)
        headers = standin.sign(BODY, RID)
        assert ours.verify_callback(headers, BODY) == RID
        with pytest.raises(WebhookRejected, match="not our fal user"):
            theirs.verify_callback(headers, BODY)
    finally:
        await ours.close()
        await theirs.close()


@pytest.mark.parametrize("tamper", ["signature", "body", "foreign_key", "stale", "future", "missing", "user"])
async def test_an_unverifiable_webhook_is_rejected(adapter, standin, tamper):
    await loaded(adapter)
    headers, body = standin.sign(BODY, RID), BODY
    if tamper == "signature":
        headers["X-Fal-Webhook-Signature"] = "ab" * 64
    elif tamper == "body":
        body = BODY.replace(b'"OK"', b'"ERROR"')
    elif tamper == "foreign_key":
        headers = standin.sign(BODY, RID, key=Ed25519PrivateKey.generate())
    elif tamper == "stale":
        headers = standin.sign(BODY, RID, timestamp=int(time.time()) - 3600)
    elif tamper == "future":
        headers = standin.sign(BODY, RID, timestamp=int(time.time()) + 3600)
    elif tamper == "missing":
        del headers["X-Fal-Webhook-Signature"]
    elif tamper == "user":
        headers["X-Fal-Webhook-User-Id"] = "someone-else"

    with pytest.raises(WebhookRejected):
        adapter.verify_callback(headers, body)


async def test_keys_are_fetched_once_for_many_verifications(adapter, standin):
    await loaded(adapter)
    for i in range(50):
        body = BODY.replace(RID.encode(), f"req-{i}".encode())
        assert adapter.verify_callback(standin.sign(body, f"req-{i}"), body) == f"req-{i}"
    assert standin.jwks_fetches == 1


async def test_a_signature_by_a_new_key_refetches_once_then_verifies(standin, http):
    now = [1000.0]
    jwks = Jwks(http, standin.jwks_url, refetch_gap_s=60, clock=lambda: now[0])
    fal = await loaded(FalAdapter(http, standin.url, KEY, standin.jwks_url, jwks=jwks))
    standin.rotate_key()  # fal published a new key; ours is the old one
    now[0] += 3600
    headers = standin.sign(BODY, RID)

    with pytest.raises(UnknownKey):
        fal.verify_callback(headers, BODY)
    for _ in range(20):  # more of them at once: still one refetch
        with pytest.raises(UnknownKey):
            fal.verify_callback(standin.sign(BODY, RID, key=Ed25519PrivateKey.generate()), BODY)
    await wait_until(lambda: _refreshed(fal), within=5, what="the refetch")

    assert fal.verify_callback(headers, BODY) == RID  # fal's retry of the same delivery
    assert standin.jwks_fetches == 2
    await fal.close()


async def _refreshed(fal: FalAdapter) -> bool:
    return not fal.jwks.refreshing and fal.jwks.fetches == 2


async def test_before_the_keys_arrive_webhooks_are_refused_and_the_keys_fetched(standin, http):
    fal = FalAdapter(http, standin.url, KEY, standin.jwks_url, prefetch_keys=False)
    headers = standin.sign(BODY, RID)

    with pytest.raises(UnknownKey, match="not loaded yet"):
        fal.verify_callback(headers, BODY)
    await loaded(fal)

    assert fal.verify_callback(headers, BODY) == RID and standin.jwks_fetches == 1
    await fal.close()


async def test_old_keys_keep_verifying_while_fresh_ones_are_fetched(standin, http):
    now = [1000.0]
    jwks = Jwks(http, standin.jwks_url, ttl_s=60, clock=lambda: now[0])
    fal = await loaded(FalAdapter(http, standin.url, KEY, standin.jwks_url, jwks=jwks))
    now[0] += 61  # the cached set is a day old, so to speak

    assert fal.verify_callback(standin.sign(BODY, RID), BODY) == RID
    await wait_until(lambda: _fetched_twice(standin), within=5, what="the background refresh")
    await fal.close()


async def _fetched_twice(standin: FalStandIn) -> bool:
    return standin.jwks_fetches == 2


async def test_the_async_check_waits_for_the_keys_instead_of_refusing(standin, http):
    fal = FalAdapter(http, standin.url, KEY, standin.jwks_url, prefetch_keys=False,
                     jwks=Jwks(http, standin.jwks_url, refetch_gap_s=0))
    assert await fal.verifier.verify_fresh(standin.sign(BODY, RID), BODY) == RID
    standin.rotate_key()
    assert await fal.verifier.verify_fresh(standin.sign(BODY, RID), BODY) == RID  # refetched on the new key
    assert standin.jwks_fetches == 2
    await fal.close()


async def test_a_broken_key_endpoint_trusts_nothing(standin, http):
    fal = FalAdapter(http, standin.url, KEY, standin.url + "/.well-known/missing.json")
    await wait_until(lambda: _tried(fal), within=5, what="the failed fetch")
    with pytest.raises(UnknownKey):
        fal.verify_callback(standin.sign(BODY, RID), BODY)
    await fal.close()


async def _tried(fal: FalAdapter) -> bool:
    return fal.jwks.fetches == 1 and not fal.jwks.refreshing


async def test_webhooks_from_the_standin_are_verified_by_a_receiver_over_http(standin, http):
    """What the gateway does with a delivery — verify, 401 if untrusted, else read it — against the stand-in's
    own signed deliveries; the keys are not loaded when the first one arrives, so fal's retry is what lands."""
    fal = FalAdapter(http, standin.url, KEY, standin.jwks_url, prefetch_keys=False)
    received: list[ProviderSignal] = []

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        try:
            fal.verify_callback(request.headers, body)
        except WebhookRejected:
            return web.json_response({"error": "unauthorized"}, status=401)
        received.append(fal.parse_callback(body))
        return web.json_response({"received": True})

    async with serving("POST", "/v1/webhooks/fal", receive) as url:
        accepted = await fal.submit(submit_request(job(), callback_url=f"{url}/v1/webhooks/fal"))
        await wait_until(lambda: _got(received), within=10, what="a verified delivery")
    await fal.close()

    assert [d.status for d in standin.delivered(accepted.provider_job_id)] == [401, 200]
    assert received[0].provider_job_id == accepted.provider_job_id and received[0].output_url.endswith(".mp4")


async def _got(received: list) -> bool:
    return bool(received)


# --- end to end through the real stack ----------------------------------------------------------------------


def fal_settings(tmp_path, database_url, nats_url, standin: FalStandIn, **more: Any) -> Settings:
    """A stack that renders fal jobs at the stand-in, with its key and key set, fetching renders from it."""
    return stack_settings(tmp_path, database_url, nats_url, fal_url=standin.url, fal_api_key=KEY,
                          fal_jwks_url=standin.jwks_url, download_allow_hosts=host_port(standin.url), **more)


@pytest.fixture
async def fal_stack(tmp_path, database_url, nats_url, standin):
    async with running_stack(fal_settings(tmp_path, database_url, nats_url, standin)) as stack:
        yield stack


async def test_a_fal_job_completes_through_a_verified_webhook(fal_stack, standin):
    prompt = "a heron lifting off a misty lake"
    created = await fal_stack.create_job(model=f"fal/{KLING}", prompt=prompt, duration_s=5, aspect_ratio="9:16")

    done = await fal_stack.wait_terminal(created["id"])

    assert done["status"] == "completed", done
    [request] = [r for r in standin.requests.values() if r.input["prompt"] == prompt]
    assert standin.delivered(request.id)[-1].status == 200  # the webhook was verified and stored
    status, video, _ = await fal_stack.download(done["outputs"]["video_url"])
    assert status == 200 and video[4:8] == b"ftyp"
    assert hashlib.sha256(video).hexdigest() == done["outputs"]["sha256"]
    assert done["outputs"]["height"] > done["outputs"]["width"]  # 9:16 as asked
    trail = await fal_stack.trail(done["id"])
    assert_legal_trail(trail)
    assert any("callback" in m["reason"] for m in trail), trail
    assert standin.renders[prompt] == 1


async def test_the_gateway_refuses_a_fal_webhook_it_cannot_verify(fal_stack, standin):
    url = f"{fal_stack.url}/v1/webhooks/fal"
    body = payload("webhook_ok", request_id=RID, video_url=VIDEO)

    async def post(data: bytes, headers: dict[str, str]) -> int:
        async with fal_stack.session.post(url, data=data, headers=headers) as resp:
            return resp.status

    # A genuine delivery is taken (the gateway holds fal's keys), so the refusals below are about the signature.
    assert await wait_until(lambda: _accepted(post, body, standin.sign(body, RID)), within=10, what="keys")
    other = body.replace(RID.encode(), b"req-2")
    bad = {**standin.sign(other, "req-2"), "X-Fal-Webhook-Signature": "00" * 64}
    refusals = [
        await post(other, bad),
        await post(other, standin.sign(other, "req-2", key=Ed25519PrivateKey.generate())),
        await post(other.replace(b'"OK"', b'"ERROR"'), standin.sign(other, "req-2")),
        await post(other, standin.sign(other, "req-2", timestamp=int(time.time()) - 3600)),
    ]

    assert refusals == [401, 401, 401, 401]
    # The genuine delivery names no render of ours: it was acknowledged and, like every refusal, not stored.
    assert await _inbox(fal_stack.settings.database_url) == []


async def _accepted(post, body: bytes, headers: dict[str, str]) -> bool:
    return await post(body, headers) == 200


async def _inbox(database_url: str) -> list[str]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT webhook_id FROM webhook_inbox WHERE provider = 'fal'")
        return [r["webhook_id"] for r in rows]
    finally:
        await conn.close()


async def test_a_fal_render_refused_for_content_fails_the_job_with_that_code(fal_stack, standin):
    prompt = standin.plan("a prompt fal's checker flags", Scenario.CONTENT_REJECTED)
    created = await fal_stack.create_job(model=f"fal/{KLING}", prompt=prompt, duration_s=5)

    done = await fal_stack.wait_terminal(created["id"])

    assert done["status"] == "failed", done
    assert done["error"]["code"] == "content_rejected" and done["error"]["retryable"] is False
    assert "flagged by a content checker" in done["error"]["message"]
    assert standin.renders[prompt] == 1  # never retried


async def test_a_fal_job_without_a_webhook_is_found_by_polling(tmp_path, database_url, nats_url, standin):
    settings = fal_settings(tmp_path, database_url, nats_url, standin, recovery_delay_s=2, recovery_interval_s=2)
    prompt = standin.plan("a render whose webhook never comes", Scenario.NO_WEBHOOK)
    async with running_stack(settings) as stack:
        created = await stack.create_job(model=f"fal/{VEO3}", prompt=prompt, duration_s=8)
        done = await stack.wait_terminal(created["id"])
        reasons = [m["reason"] for m in await stack.trail(done["id"])]

    assert done["status"] == "completed", done
    assert any("recovery" in r for r in reasons), reasons


async def test_the_pollers_status_polls_and_cancel_ask_only_the_jobs_own_app(tmp_path, database_url, nats_url,
                                                                               standin):
    """A veo3 job through the real stack: its recovery polls and its cancel carry its model, so fal-ai/veo3 alone
    is asked, never fal-ai/kling-video, which comes first in our table and would be asked first otherwise."""
    settings = fal_settings(tmp_path, database_url, nats_url, standin, recovery_delay_s=1, recovery_interval_s=1)
    prompt = standin.plan("a render that waits until it is canceled", Scenario.HANG)
    async with running_stack(settings) as stack:
        created = await stack.create_job(model=f"fal/{VEO3}", prompt=prompt, duration_s=8)
        await stack.wait_for_status(created["id"], "submitted", "processing")
        [request] = [r for r in standin.requests.values() if r.input["prompt"] == prompt]
        await wait_until(lambda: _asked(standin, "GET", request.id), within=20, what="a status poll")
        async with stack.session.post(f"{stack.url}/v1/jobs/{created['id']}/cancel", headers=stack.auth) as resp:
            assert resp.status == 200
        await wait_until(lambda: _asked(standin, "PUT", request.id), within=20, what="the cancel to reach fal")

    asked = [(method, path) for method, path in standin.asked if request.id in path]
    assert ("GET", f"/fal-ai/veo3/requests/{request.id}/status") in asked
    assert ("PUT", f"/fal-ai/veo3/requests/{request.id}/cancel") in asked
    assert all(path.startswith("/fal-ai/veo3/") for _, path in asked), asked
    assert request.canceled


async def _asked(standin: FalStandIn, method: str, request_id: str) -> bool:
    return any(m == method and request_id in path for m, path in standin.asked)


def test_recorded_payloads_are_json():
    for name in ("submit_queued", "status_in_queue", "status_completed", "result_video", "webhook_ok"):
        json.loads(payload(name, request_id=RID, base_url="http://x", app="fal-ai/veo3", video_url=VIDEO))


async def test_a_queued_fal_job_shows_its_place_in_fals_queue(fal_stack, standin):
    standin.queue_step_s = 1.0  # long enough to be seen waiting on a busy machine
    prompt = standin.plan("a lighthouse in a storm", Scenario.LONG_QUEUE)
    created = await fal_stack.create_job(model=f"fal/{KLING}", prompt=prompt, duration_s=5)

    queued = await fal_stack.wait_for_status(created["id"], "submitted")
    done = await fal_stack.wait_terminal(created["id"])

    assert queued["stage"] == "submitted" and queued["queue_position"] == 3  # as fal answered the submit
    assert done["status"] == "completed" and done["queue_position"] is None
