"""The Luma adapter against the recorded payloads: directly, over real HTTP through the stand-in server that
replays them, and end to end through the whole stack, where an unsigned callback is confirmed by a poll."""

from __future__ import annotations

import json

import msgspec
import pytest

from tests import adapter_scaffold as scaffold
from tests.adapter_scaffold import expected_signals, finished, inbox_count, refusal, wired
from tests.stack import host_port, running_stack, stack_settings
from tests.standins.luma import LumaStandin, payload, running_luma_standin
from tests.support import wait_until
from vidjobs.common.errors import ErrorCode, ProviderError, WebhookRejected
from vidjobs.providers import luma
from vidjobs.providers.base import ProviderState
from vidjobs.providers.luma import LumaAdapter

KEY = "luma-test-7c41e2"


standin, adapter = wired(lambda: running_luma_standin(api_key=KEY, step_s=0.1),
                         lambda http, s: LumaAdapter(http, s.url, KEY))


request, submit_request, raw = scaffold.makers("luma", "ray-2", "a glass whale drifting over a desert",
                                               job_id="job_luma1")


# --- the recorded payloads, read directly --------------------------------------------------------------


@pytest.mark.parametrize(("name", "state", "code"), expected_signals("luma"))
def test_recorded_generations_become_unverified_signals(adapter, name, state, code):
    sig = adapter.parse_callback(raw(name))

    assert sig.verified is False  # unsigned: the poller asks Luma before acting
    assert scaffold.outcome(sig) == (payload(name)["id"], state, code)
    assert sig.job_id is None  # found by the generation id we recorded, never by what the body claims
    assert sig.progress is None
    if state is ProviderState.SUCCEEDED:
        assert sig.output_url == payload(name)["assets"]["video"]
    if code is not None:
        assert payload(name)["failure_reason"] in sig.error.message


def test_a_malformed_callback_is_rejected_at_the_door_and_unreadable_later(adapter):
    for body in [raw("generation_queued")[:60], b"[]", json.dumps({**payload("generation_queued"), "id": "1"}).encode(),
                 json.dumps({**payload("generation_queued"), "state": "exploded"}).encode()]:
        with pytest.raises(WebhookRejected):
            adapter.verify_callback({}, body)
    with pytest.raises(ProviderError) as caught:
        adapter.parse_callback(raw("generation_queued")[:60])
    assert caught.value.code is ErrorCode.INTERNAL


def test_a_callback_gets_a_delivery_id_stable_across_retries_and_distinct_per_body(adapter):
    dreaming, completed = raw("generation_dreaming"), raw("generation_completed")

    first, retried = adapter.verify_callback({}, dreaming), adapter.verify_callback({}, dreaming)
    later = adapter.verify_callback({}, completed)
    forged = adapter.verify_callback({}, completed.replace(b"result.mp4", b"evil.mp4"))

    gid = payload("generation_dreaming")["id"]
    assert first == retried and first.startswith(f"{gid}:dreaming:")
    assert later.startswith(f"{gid}:completed:") and later != first
    assert forged != later  # a forged body can never take a genuine delivery's place in the inbox


@pytest.mark.parametrize(("name", "status", "headers", "code", "wait"), [
    ("error_400_invalid", 400, {}, ErrorCode.INVALID_INPUT, None),
    ("error_400_moderation", 400, {}, ErrorCode.CONTENT_REJECTED, None),
    ("error_422_schema", 422, {}, ErrorCode.INVALID_INPUT, None),
    ("error_401_invalid_key", 401, {}, ErrorCode.PROVIDER_MISCONFIGURED, None),
    ("error_429_rate_limited", 429, {"Retry-After": "2"}, ErrorCode.RATE_LIMITED, 2.0),
    ("error_429_rate_limited", 429, {}, ErrorCode.RATE_LIMITED, None),
    ("error_500_internal", 500, {}, ErrorCode.PROVIDER_UNAVAILABLE, None),
])
def test_recorded_error_answers_map_to_the_taxonomy(name, status, headers, code, wait):
    err = luma.http_error(status, raw(name), headers)

    assert err.code is code and err.retry_after == wait


def test_schema_errors_name_the_field():
    err = luma.http_error(422, raw("error_422_schema"), {})
    assert "duration: Input should be '5s' or '9s'" in err.message


def test_failure_reasons_map_to_the_taxonomy():
    assert luma.failure("400: prompt not allowed because advanced moderation failed").code is ErrorCode.CONTENT_REJECTED
    assert luma.failure("Request timed out").code is ErrorCode.TIMEOUT
    assert luma.failure("Insufficient credits").code is ErrorCode.QUOTA_EXHAUSTED
    assert luma.failure(None).code is ErrorCode.PROVIDER_UNAVAILABLE


# --- validation ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("job", "field"), [
    (request(params={"loop": "yes"}), "params.loop"),
    (request(params={"enhance_prompt": True}), "params.enhance_prompt"),
    (request(duration_s=10), "duration_s"),
    (request(negative_prompt="fog"), "negative_prompt"),
    (request(seed=3), "seed"),
    (request(model="ray-9"), "model"),
])
def test_validate_refuses_what_luma_cannot_take_naming_the_field(adapter, job, field):
    assert scaffold.refused_field(adapter, job) == field


@pytest.mark.parametrize(("fields", "duration", "resolution"), [
    ({"duration_s": 1}, "5s", "720p"),
    ({"duration_s": 5, "resolution": "480p"}, "5s", "540p"),
    ({"duration_s": 6, "resolution": "1080p"}, "9s", "1080p"),
    ({"duration_s": 9, "model": "ray-flash-2"}, "9s", "720p"),
])
async def test_our_fields_map_to_the_documented_request(adapter, standin, fields, duration, resolution):
    job = request(aspect_ratio="9:16", params={"loop": True}, **fields)

    await adapter.submit(submit_request(standin, job, number=2))

    sent = standin.creates[-1]
    assert sent == {"generation_type": "video", "model": job.model_name, "prompt": job.prompt,
                    "aspect_ratio": "9:16", "resolution": resolution, "duration": duration, "loop": True,
                    "callback_url": f"{standin.url}/_sink?job=job_luma1&attempt=2"}


async def test_an_input_image_is_the_first_keyframe(adapter, standin):
    job = request(input_image="upl_1")
    req = msgspec.structs.replace(submit_request(standin, job), input_image_url="https://cdn.example/frame.png")

    await adapter.submit(req)

    assert standin.creates[-1]["keyframes"] == {"frame0": {"type": "image", "url": "https://cdn.example/frame.png"}}
    with pytest.raises(ProviderError) as caught:  # an upload nobody could fetch is our fault, not the job's
        await adapter.submit(submit_request(standin, job))
    assert caught.value.code is ErrorCode.INTERNAL


# --- over HTTP, through the stand-in -------------------------------------------------------------------


async def test_a_generation_calls_back_unsigned_and_its_status_is_the_truth(adapter, standin):
    accepted = await adapter.submit(submit_request(standin, request()))

    assert accepted.state is ProviderState.QUEUED
    await wait_until(lambda: _has(standin, 2), within=10, what="the dreaming and completed callbacks")
    dreaming, completed = (adapter.parse_callback(r.body) for r in standin.received)
    assert (dreaming.state, completed.state) == (ProviderState.RUNNING, ProviderState.SUCCEEDED)
    assert not dreaming.verified and not completed.verified
    assert "authorization" not in {k.lower() for k in standin.received[0].headers}  # nothing signed, nothing leaked
    sig = await adapter.status(accepted.provider_job_id)
    assert sig.verified and sig.state is ProviderState.SUCCEEDED and sig.output_url == completed.output_url
    assert (sig.job_id, sig.attempt) == ("job_luma1", 1)  # echoed through the callback URL
    async with adapter.session.get(sig.output_url) as resp:
        video = await resp.read()
    assert resp.status == 200 and video[4:8] == b"ftyp"  # a real MP4


async def _has(standin: LumaStandin, n: int) -> bool:
    return len(standin.received) >= n


@pytest.mark.parametrize(("scenario", "code"), [
    ("moderation", ErrorCode.CONTENT_REJECTED), ("fail", ErrorCode.PROVIDER_UNAVAILABLE),
])
async def test_each_failed_generation_maps_to_its_code(adapter, standin, scenario, code):
    accepted = await adapter.submit(submit_request(standin, request(f"a storm standin:{scenario}")))

    sig = await finished(adapter, accepted.provider_job_id)

    assert sig.state is ProviderState.FAILED and sig.error.code is code and sig.output_url is None


test_each_refused_submit_maps_to_its_code = scaffold.refused_submits(submit_request, request, [
    ("rate_limit", ErrorCode.RATE_LIMITED, 2.0, "Too many requests"),
    ("unavailable", ErrorCode.PROVIDER_UNAVAILABLE, None, "Internal server error"),
    ("refused", ErrorCode.CONTENT_REJECTED, None, "moderation"),
    ("invalid", ErrorCode.INVALID_INPUT, None, "keyframes.frame0.url"),
    ("schema", ErrorCode.INVALID_INPUT, None, "duration"),
    ("malformed", ErrorCode.INTERNAL, None, "malformed"),
])


async def test_a_wrong_key_names_the_setting_and_never_the_key(http, standin):
    adapter = LumaAdapter(http, standin.url, "luma-wrong-key-value")

    err = await refusal(adapter, submit_request(standin, request()))

    assert err.code is ErrorCode.PROVIDER_MISCONFIGURED and "VIDJOBS_LUMA_API_KEY" in err.message
    assert "luma-wrong-key-value" not in err.message and "wrong" not in repr(adapter)


async def test_find_looks_the_attempt_up_by_its_callback_url(adapter, standin):
    first = submit_request(standin, request(), number=1)
    accepted = await adapter.submit(first)
    for n in range(3):  # other jobs' generations in between
        await adapter.submit(submit_request(standin, request(), job_id=f"job_other{n}"))

    found = await adapter.find(first)

    assert found is not None and found.provider_job_id == accepted.provider_job_id
    assert await adapter.find(submit_request(standin, request(), number=2)) is None


async def test_find_pages_through_the_recent_generations(adapter, standin, monkeypatch):
    monkeypatch.setattr(luma, "FIND_PAGE_SIZE", 2)
    first = submit_request(standin, request(), job_id="job_oldest")
    accepted = await adapter.submit(first)
    for n in range(5):
        await adapter.submit(submit_request(standin, request(), job_id=f"job_newer{n}"))

    found = await adapter.find(first)

    assert found is not None and found.provider_job_id == accepted.provider_job_id


async def test_cancel_deletes_the_generation_and_a_lost_one_is_failed(adapter, standin):
    accepted = await adapter.submit(submit_request(standin, request("a kite standin:hang")))

    await adapter.cancel(accepted.provider_job_id)
    await adapter.cancel(accepted.provider_job_id)  # already gone: not an error

    assert standin.deleted == [accepted.provider_job_id]
    lost = await adapter.status(accepted.provider_job_id)
    assert lost.state is ProviderState.FAILED and lost.error.code is ErrorCode.PROVIDER_UNAVAILABLE


# --- end to end through the stack ----------------------------------------------------------------------


async def test_luma_jobs_run_end_to_end_by_unsigned_callbacks_confirmed_by_polls(tmp_path, database_url, nats_url):
    async with running_luma_standin(api_key=KEY, step_s=0.2) as standin:
        settings = stack_settings(tmp_path, database_url, nats_url, luma_url=standin.url, luma_api_key=KEY,
                                  download_allow_hosts=host_port(standin.url))
        async with running_stack(settings) as stack:
            created = await stack.create_job(model="luma/ray-2", prompt="a lantern floating up a canyon",
                                             aspect_ratio="9:16", params={"loop": False})
            moderated = await stack.create_job(model="luma/ray-2", prompt="a brawl standin:moderation")

            job = await stack.wait_terminal(created["id"])
            failed = await stack.wait_terminal(moderated["id"])

            assert job["status"] == "completed", job
            assert job["outputs"]["duration_s"] == pytest.approx(5.0, abs=0.2)  # 1 s asked: Luma's shortest
            assert job["outputs"]["height"] > job["outputs"]["width"]  # 9:16 as asked
            status, video, _ = await stack.download(job["outputs"]["video_url"])
            assert status == 200 and video[4:8] == b"ftyp"
            reasons = {m["to"]: m["reason"] for m in await stack.trail(job["id"])}
            assert reasons["downloading"].startswith("unsigned callback, confirmed by a status poll"), reasons
            assert failed["status"] == "failed" and failed["error"]["code"] == "content_rejected", failed
            assert "Advanced moderation failed" in failed["error"]["message"]
            # Each job's two callbacks (dreaming, then completed or failed) were taken and stored once each,
            # however often a slow answer made the stand-in retry; and each job was rendered once.
            taken = {d.body for d in standin.deliveries if d.outcome == 200}
            assert len(taken) == 4 and await inbox_count(settings.database_url, "luma") == 4
            assert len(standin.generations) == 2
            sent = next(c for c in standin.creates if c["prompt"] == created["prompt"])
            assert sent["callback_url"] == f"{stack.url}/v1/webhooks/luma?job={job['id']}&attempt=1"
