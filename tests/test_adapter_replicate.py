"""The Replicate adapter against the recorded payloads: directly, over real HTTP through the stand-in server
that replays them, and end to end through the whole stack with signed webhooks to the gateway."""

from __future__ import annotations

import json
import time

import msgspec
import pytest

from tests import adapter_scaffold as scaffold
from tests.adapter_scaffold import expected_signals, finished, inbox_count, refusal, wired
from tests.stack import host_port, running_stack, stack_settings
from tests.standins.replicate import ReplicateStandin, payload, running_replicate_standin
from tests.support import wait_until
from vidjobs.common.errors import ErrorCode, ProviderError, WebhookRejected
from vidjobs.common.signatures import new_secret, signed_headers
from vidjobs.providers import replicate
from vidjobs.providers.base import ProviderState
from vidjobs.providers.replicate import ReplicateAdapter

TOKEN = "r8_test_3b8f0c1d"
SECRET = new_secret()


@pytest.fixture
def secret() -> str:
    return SECRET


standin, adapter = wired(lambda: running_replicate_standin(api_token=TOKEN, webhook_secret=SECRET, step_s=0.1),
                         lambda http, s: ReplicateAdapter(http, s.url, TOKEN, SECRET))


request, submit_request, raw = scaffold.makers("replicate", "minimax/video-01", "a lighthouse in a storm",
                                               job_id="job_test1")


# --- the recorded payloads, read directly --------------------------------------------------------------


@pytest.mark.parametrize(("name", "state", "code"), expected_signals("replicate"))
def test_recorded_predictions_become_signals(adapter, name, state, code):
    sig = adapter.parse_callback(raw(name))

    assert scaffold.outcome(sig) == (payload(name)["id"], state, code)
    assert sig.verified and sig.job_id is None and sig.attempt is None  # matched by prediction id
    assert sig.progress is None  # Replicate reports no figure, and none is invented
    if code is not None:
        assert payload(name).get("error") is None or payload(name)["error"] in sig.error.message


def test_success_output_is_the_url_or_the_first_of_a_list(adapter):
    single = adapter.parse_callback(raw("prediction_succeeded"))
    listed = adapter.parse_callback(raw("prediction_succeeded_list"))

    assert single.output_url == payload("prediction_succeeded")["output"]
    assert listed.output_url == payload("prediction_succeeded_list")["output"][0]


def test_a_malformed_callback_is_an_internal_error(adapter):
    with pytest.raises(ProviderError) as caught:
        adapter.parse_callback(raw("prediction_starting")[:80])
    assert caught.value.code is ErrorCode.INTERNAL
    with pytest.raises(ProviderError):
        adapter.parse_callback(json.dumps({**payload("prediction_starting"), "status": "exploded"}).encode())


@pytest.mark.parametrize(("name", "status", "headers", "code", "wait"), [
    ("error_422_validation", 422, {}, ErrorCode.INVALID_INPUT, None),
    ("error_429_throttled", 429, {"Retry-After": "1"}, ErrorCode.RATE_LIMITED, 1.0),
    ("error_429_throttled", 429, {}, ErrorCode.RATE_LIMITED, 1.0),  # "Expected available in 1 second."
    ("error_429_resets", 429, {}, ErrorCode.RATE_LIMITED, 30.0),  # "resets in ~30s."
    ("error_401_unauthenticated", 401, {}, ErrorCode.PROVIDER_MISCONFIGURED, None),
    ("error_402_insufficient_credit", 402, {}, ErrorCode.QUOTA_EXHAUSTED, None),
    ("error_503_unavailable", 503, {}, ErrorCode.PROVIDER_UNAVAILABLE, None),
])
def test_recorded_error_answers_map_to_the_taxonomy(name, status, headers, code, wait):
    err = replicate.http_error(status, raw(name), headers)

    assert err.code is code and err.retry_after == wait
    assert payload(name)["detail"].split()[0] in err.message  # Replicate's own words reach the person


def test_an_html_error_page_still_maps_by_status():
    err = replicate.http_error(502, b"<html><body>502 Bad Gateway</body></html>", {})
    assert err.code is ErrorCode.PROVIDER_UNAVAILABLE and "HTTP 502" in err.message


# --- validation ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("job", "field"), [
    (request(params={"frames": 24}), "params.frames"),
    (request(params={"prompt_optimizer": "yes"}), "params.prompt_optimizer"),
    (request(params={"subject_reference": "not a url"}), "params.subject_reference"),
    (request(model="kwaivgi/kling-v2.0", params={"cfg_scale": 1.5}), "params.cfg_scale"),
    (request(model="kwaivgi/kling-v2.0", params={"cfg_scale": True}), "params.cfg_scale"),
    (request(duration_s=7), "duration_s"),  # minimax makes 6 s clips only
    (request(model="kwaivgi/kling-v2.0", duration_s=11), "duration_s"),
    (request(aspect_ratio="9:16"), "aspect_ratio"),
    (request(resolution="1080p"), "resolution"),
    (request(seed=7), "seed"),
    (request(negative_prompt="blurry"), "negative_prompt"),
    (request(model="someone/unknown-model"), "model"),
])
def test_validate_refuses_what_the_model_cannot_take_naming_the_field(adapter, job, field):
    assert scaffold.refused_field(adapter, job) == field


@pytest.mark.parametrize("job", [
    request(duration_s=1), request(duration_s=6, params={"prompt_optimizer": False}),
    request(params={"subject_reference": "https://example.com/face.png"}),
    request(model="kwaivgi/kling-v2.0", duration_s=10, aspect_ratio="9:16", negative_prompt="blurry",
            params={"cfg_scale": 0.7}),
])
def test_validate_accepts_documented_inputs(adapter, job):
    adapter.validate(job)


# --- over HTTP, through the stand-in -------------------------------------------------------------------


async def test_submit_sends_the_model_input_and_the_webhook_and_completes_by_signed_webhook(adapter, standin):
    job = request(params={"prompt_optimizer": False})

    accepted = await adapter.submit(submit_request(standin, job))

    assert accepted.state is ProviderState.QUEUED
    sent = standin.creates[-1]
    assert sent["input"] == {"prompt": job.prompt, "prompt_optimizer": False}  # 6 s and 16:9 are fixed
    assert sent["webhook"] == f"{standin.url}/_sink" and sent["webhook_events_filter"] == ["start", "completed"]
    await wait_until(lambda: _has(standin, 2), within=10, what="the start and completed webhooks")
    start, completed = standin.received
    assert adapter.verify_callback(start.headers, start.body) == start.headers["webhook-id"]
    assert adapter.verify_callback(completed.headers, completed.body) == completed.headers["webhook-id"]
    assert adapter.parse_callback(start.body).state is ProviderState.QUEUED
    sig = adapter.parse_callback(completed.body)
    assert sig.provider_job_id == accepted.provider_job_id and sig.state is ProviderState.SUCCEEDED
    async with adapter.session.get(sig.output_url) as resp:
        video = await resp.read()
    assert resp.status == 200 and video[4:8] == b"ftyp"  # a real MP4
    assert (await adapter.status(accepted.provider_job_id)).output_url == sig.output_url


async def _has(standin: ReplicateStandin, n: int) -> bool:
    return len(standin.received) >= n


async def test_an_input_image_is_the_first_frame(adapter, standin):
    job = request(input_image="upl_1")
    req = msgspec.structs.replace(submit_request(standin, job), input_image_url="https://cdn.example/frame.png")

    await adapter.submit(req)

    assert standin.creates[-1]["input"]["first_frame_image"] == "https://cdn.example/frame.png"
    with pytest.raises(ProviderError) as caught:  # an upload nobody could fetch is our fault, not the job's
        await adapter.submit(submit_request(standin, job))
    assert caught.value.code is ErrorCode.INTERNAL


async def test_kling_gets_the_next_documented_length_and_our_aspect_ratio(adapter, standin):
    job = request(model="kwaivgi/kling-v2.0", duration_s=7, aspect_ratio="1:1", negative_prompt="text",
                  params={"cfg_scale": 0.25})

    await adapter.submit(submit_request(standin, job))

    assert standin.creates[-1]["input"] == {"prompt": job.prompt, "cfg_scale": 0.25, "duration": 10,
                                            "aspect_ratio": "1:1", "negative_prompt": "text"}


@pytest.mark.parametrize(("scenario", "state", "code"), [
    ("sensitive", ProviderState.FAILED, ErrorCode.CONTENT_REJECTED),
    ("oom", ProviderState.FAILED, ErrorCode.PROVIDER_UNAVAILABLE),
    ("canceled", ProviderState.CANCELED, ErrorCode.CANCELED),
    ("aborted", ProviderState.CANCELED, ErrorCode.TIMEOUT),
])
async def test_each_failed_render_maps_to_its_code(adapter, standin, scenario, state, code):
    accepted = await adapter.submit(submit_request(standin, request(f"a dog standin:{scenario}")))

    sig = await finished(adapter, accepted.provider_job_id)

    assert sig.state is state and sig.error is not None and sig.error.code is code
    assert sig.output_url is None


test_each_refused_submit_maps_to_its_code = scaffold.refused_submits(submit_request, request, [
    ("rate_limit", ErrorCode.RATE_LIMITED, 1.0, "throttled"),
    ("throttled", ErrorCode.RATE_LIMITED, 30.0, "throttled"),  # no Retry-After: the body's figure
    ("unavailable", ErrorCode.PROVIDER_UNAVAILABLE, None, "temporarily unavailable"),
    ("invalid", ErrorCode.INVALID_INPUT, None, "input.duration"),
    ("no_credit", ErrorCode.QUOTA_EXHAUSTED, None, "insufficient credit"),
    ("malformed", ErrorCode.INTERNAL, None, "malformed"),
])


async def test_a_wrong_token_names_the_setting_and_never_the_token(http, standin, secret):
    adapter = ReplicateAdapter(http, standin.url, "r8_wrong_secret_value", secret)

    err = await refusal(adapter, submit_request(standin, request()))

    assert err.code is ErrorCode.PROVIDER_MISCONFIGURED and "VIDJOBS_REPLICATE_API_TOKEN" in err.message
    assert "r8_wrong_secret_value" not in err.message and "r8_wrong" not in repr(adapter)


async def test_cancel_stops_a_prediction_and_a_lost_one_is_failed(adapter, standin):
    accepted = await adapter.submit(submit_request(standin, request("a kite standin:hang")))

    await adapter.cancel(accepted.provider_job_id)
    await adapter.cancel("nosuchprediction0000000000")  # nothing there: not an error

    sig = await adapter.status(accepted.provider_job_id)
    assert sig.state is ProviderState.CANCELED and sig.error.code is ErrorCode.CANCELED
    lost = await adapter.status("nosuchprediction0000000000")
    assert lost.state is ProviderState.FAILED and lost.error.code is ErrorCode.PROVIDER_UNAVAILABLE


async def test_find_never_claims_a_prediction(adapter, standin):
    req = submit_request(standin, request())
    await adapter.submit(req)
    assert await adapter.find(req) is None  # no key to match an attempt by; see ReplicateAdapter.find


# --- webhook verification ------------------------------------------------------------------------------


def test_a_signed_delivery_is_verified_and_a_forged_one_rejected(adapter, secret):
    body = raw("prediction_succeeded")
    good = signed_headers(secret, body, msg_id="msg_2f8a")

    assert adapter.verify_callback(good, body) == "msg_2f8a"
    forged = signed_headers(new_secret(), body)
    tampered = body.replace(b"succeeded", b"failed", 1)
    stale = signed_headers(secret, body, timestamp=int(time.time()) - 3600)
    future = signed_headers(secret, body, timestamp=int(time.time()) + 3600)
    missing = {k: v for k, v in good.items() if k != "webhook-signature"}
    for headers, sent in [(forged, body), (good, tampered), (stale, body), (future, body), (missing, body)]:
        with pytest.raises(WebhookRejected):
            adapter.verify_callback(headers, sent)


async def test_without_a_signing_secret_no_webhook_is_asked_for_or_trusted(http, standin):
    adapter = ReplicateAdapter(http, standin.url, TOKEN, "")

    await adapter.submit(submit_request(standin, request()))

    assert not adapter.supports_callbacks
    assert "webhook" not in standin.creates[-1] and "webhook_events_filter" not in standin.creates[-1]
    with pytest.raises(WebhookRejected):
        adapter.verify_callback(signed_headers(new_secret(), b"{}"), b"{}")


# --- end to end through the stack ----------------------------------------------------------------------


async def test_replicate_jobs_run_end_to_end_by_verified_webhooks(tmp_path, database_url, nats_url, secret):
    async with running_replicate_standin(api_token=TOKEN, webhook_secret=secret, step_s=0.2) as standin:
        settings = stack_settings(tmp_path, database_url, nats_url, replicate_url=standin.url,
                                  replicate_api_token=TOKEN, replicate_webhook_secret=secret,
                                  download_allow_hosts=host_port(standin.url))
        async with running_stack(settings) as stack:
            created = await stack.create_job(model="replicate/minimax/video-01", prompt="a heron lifting off a pond",
                                             params={"prompt_optimizer": False})
            rejected = await stack.create_job(model="replicate/minimax/video-01", prompt="a duel standin:sensitive")
            paced = await stack.create_job(model="replicate/kwaivgi/kling-v2.0", duration_s=5, aspect_ratio="1:1",
                                           prompt="a tram standin:rate_limit_once")

            job = await stack.wait_terminal(created["id"])
            failed = await stack.wait_terminal(rejected["id"])
            retried = await stack.wait_terminal(paced["id"])

            # The render arrived by a webhook the gateway verified, and was copied into our storage.
            assert job["status"] == "completed", job
            assert job["outputs"]["duration_s"] == pytest.approx(6.0, abs=0.2)  # minimax's fixed length
            status, video, _ = await stack.download(job["outputs"]["video_url"])
            assert status == 200 and video[4:8] == b"ftyp"
            reasons = {m["to"]: m["reason"] for m in await stack.trail(job["id"])}
            assert reasons["downloading"].startswith("callback"), reasons
            answered = {d.headers["webhook-id"]: d.outcome for d in standin.deliveries}  # the last try of each
            assert set(answered.values()) == {200}
            assert failed["status"] == "failed" and failed["error"]["code"] == "content_rejected", failed
            assert "(E005)" in failed["error"]["message"]
            # A 429 is waited out and the submission retried; the retry renders.
            assert retried["status"] == "completed", retried
            assert [m["to"] for m in await stack.trail(paced["id"])][:3] == ["pending", "retrying", "pending"]
            assert retried["outputs"]["width"] == retried["outputs"]["height"]  # 1:1 as asked

            # A delivery whose body was changed after signing is refused, and nothing is stored.
            genuine = standin.deliveries[-1]
            before = await inbox_count(settings.database_url, "replicate")
            tampered = genuine.body.replace(b'"status": "', b'"status": "x', 1)
            async with stack.session.post(f"{stack.url}/v1/webhooks/replicate", data=tampered,
                                          headers=genuine.headers) as resp:
                assert resp.status == 401
            forged = signed_headers(new_secret(), genuine.body)
            async with stack.session.post(f"{stack.url}/v1/webhooks/replicate", data=genuine.body,
                                          headers={**forged, "Content-Type": "application/json"}) as resp:
                assert resp.status == 401
            assert await inbox_count(settings.database_url, "replicate") == before
            assert len(standin.predictions) == 3  # each job rendered once
