"""The fake provider over real HTTP, driven through its adapter: every scenario of docs/FAKE_PROVIDER.md's table, signed
callbacks captured by a stand-in webhook receiver and verified by the adapter, idempotent submission proven
by the provider's own counters, and real MP4s decoded with PyAV."""

from __future__ import annotations

import asyncio
import contextlib
import io
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import av
import pytest
from aiohttp import web

from tests.standins.server import serving as serving_app
from tests.support import wait_until
from vidjobs.cli.embedded import free_port
from vidjobs.common import ids
from vidjobs.common.errors import ErrorCode, ProviderError, WebhookRejected
from vidjobs.common.jobs import JobRequest
from vidjobs.common.settings import Settings
from vidjobs.common.signatures import new_secret, signed_headers
from vidjobs.fakeprovider.clips import ClipSpec, clip_size, render_mp4
from vidjobs.fakeprovider.scenarios import FakeProvider
from vidjobs.fakeprovider.serving import running_fake_provider
from vidjobs.fakeprovider.wire import Scenario
from vidjobs.providers.base import ProviderAdapter, ProviderSignal, ProviderState, SubmitRequest
from vidjobs.providers.fake import adapter as fake_adapter
from vidjobs.providers.fake.adapter import FakeAdapter
from vidjobs.providers.registry import adapter_for, build_adapters

# --- a stand-in for our gateway's webhook route, and other servers on loopback -----------------------


@dataclass
class Delivery:
    headers: dict[str, str]
    body: bytes


@dataclass
class Receiver:
    """Keeps every callback it is sent, verbatim; answers 503 to the next `fail_next` of them."""

    url: str = ""
    deliveries: list[Delivery] = field(default_factory=list)
    fail_next: int = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.deliveries.append(Delivery(dict(request.headers), await request.read()))
        if self.fail_next:
            self.fail_next -= 1
            return web.Response(status=503)
        return web.json_response({"received": True})


def serving(routes: list[web.RouteDef]) -> contextlib.AbstractAsyncContextManager[str]:
    """A small aiohttp server on a free loopback port, for the duration of the block; yields its base URL."""
    app = web.Application()
    app.add_routes(routes)
    return serving_app(app)


@pytest.fixture
def secret() -> str:
    return new_secret()


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    rec = Receiver()
    async with serving([web.post("/v1/webhooks/fake", rec.handle)]) as base:
        rec.url = f"{base}/v1/webhooks/fake"
        yield rec


@pytest.fixture
async def provider(secret: str) -> AsyncIterator[FakeProvider]:
    async with running_fake_provider("127.0.0.1", 0, webhook_secret=secret, callback_backoff_s=0.05) as fp:
        yield fp


@pytest.fixture
def adapter(http: aiohttp.ClientSession, provider: FakeProvider, secret: str) -> FakeAdapter:
    return FakeAdapter(http, provider.url, secret)


# --- helpers -------------------------------------------------------------------------------------------


def attempt(receiver: Receiver | None, scenario: str = "succeed", render_s: float = 0.0, *, job_id: str | None = None,
            number: int = 1, **request) -> SubmitRequest:
    job_id = job_id or ids.new("job")
    job = JobRequest(model="fake/default", prompt="a red fox in snow", duration_s=request.pop("duration_s", 1),
                     params={"scenario": scenario, "render_s": render_s}, **request)
    return SubmitRequest(job_id=job_id, attempt=number, idempotency_key=f"{job_id}-a{number}", request=job,
                         callback_url=receiver.url if receiver else None)


async def callbacks(receiver: Receiver, adapter: FakeAdapter, count: int) -> list[tuple[str, ProviderSignal]]:
    """The first `count` callbacks, each verified and parsed by the adapter, as (webhook id, signal)."""

    async def arrived():
        return len(receiver.deliveries) >= count

    await wait_until(arrived, within=10, interval=0.02, what=f"{count} callbacks")
    return [(adapter.verify_callback(d.headers, d.body), adapter.parse_callback(d.body))
            for d in receiver.deliveries[:count]]


async def settles_at(receiver: Receiver, count: int) -> None:
    """No callback beyond `count` arrives (a retry would come within the provider's short test backoff)."""
    await asyncio.sleep(0.4)
    assert len(receiver.deliveries) == count, [d.body for d in receiver.deliveries]


async def status_until(adapter: FakeAdapter, render_id: str, *states: ProviderState) -> ProviderSignal:
    async def reached():
        sig = await adapter.status(render_id)
        return sig if sig.state in states else None

    return await wait_until(reached, within=10, interval=0.02, what=f"{render_id} to reach {states}")


async def counters(http: aiohttp.ClientSession, provider: FakeProvider) -> dict:
    async with http.get(f"{provider.url}/v1/_counters") as resp:
        assert resp.status == 200
        return await resp.json()


async def fetch(http: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with http.get(url) as resp:
        return resp.status, await resp.read()


def probe(data: bytes) -> tuple[str, int, int, float, int]:
    """Codec, width, height, duration and decoded frame count of an MP4."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = sum(1 for _ in container.decode(stream))
        return stream.codec_context.name, stream.width, stream.height, container.duration / av.time_base, frames


async def refused(submit: Callable[[], Awaitable[object]]) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await submit()
    return caught.value


# --- the happy path ------------------------------------------------------------------------------------


async def test_succeed_calls_back_running_then_once_succeeded_and_serves_a_real_mp4(adapter, receiver, http,
                                                                                     provider):
    req = attempt(receiver, duration_s=2, aspect_ratio="16:9", seed=7)

    accepted = await adapter.submit(req)

    assert accepted.state is ProviderState.QUEUED
    (first_id, running), (last_id, done) = await callbacks(receiver, adapter, 2)
    await settles_at(receiver, 2)
    assert first_id != last_id
    assert running.state is ProviderState.RUNNING and running.provider_job_id == accepted.provider_job_id
    assert done.state is ProviderState.SUCCEEDED and done.progress == 1.0 and done.error is None
    assert (done.job_id, done.attempt) == (req.job_id, 1)
    assert done.output_url.startswith(f"{provider.url}/outputs/")
    status, body = await fetch(http, done.output_url)
    assert status == 200 and body[4:8] == b"ftyp"
    assert probe(body) == ("h264", 320, 180, 2.0, 24)
    seen = await counters(http, provider)
    assert seen["renders_by_job"] == {req.job_id: 1}
    assert seen["callbacks_by_render"] == {accepted.provider_job_id: 2}
    assert seen["output_fetches"] == {accepted.provider_job_id: 1}


async def test_progress_is_the_real_fraction_of_render_time(adapter):
    render_id = (await adapter.submit(attempt(None, render_s=0.6))).provider_job_id
    seen: list[float] = []

    while (sig := await adapter.status(render_id)).state is not ProviderState.SUCCEEDED:
        if sig.state is ProviderState.RUNNING:
            seen.append(sig.progress)
        await asyncio.sleep(0.05)

    assert sig.progress == 1.0 and sig.output_url
    assert seen == sorted(seen) and all(0 <= p < 1 for p in seen)
    assert len({p for p in seen if p > 0}) >= 3, seen


@pytest.mark.parametrize(("aspect_ratio", "size"), [("16:9", (320, 180)), ("9:16", (180, 320)), ("1:1", (320, 320))])
async def test_the_clip_has_the_asked_aspect_ratio(adapter, http, aspect_ratio, size):
    render_id = (await adapter.submit(attempt(None, aspect_ratio=aspect_ratio))).provider_job_id
    done = await status_until(adapter, render_id, ProviderState.SUCCEEDED)
    _, body = await fetch(http, done.output_url)
    assert probe(body)[1:3] == size == clip_size(aspect_ratio)


async def test_a_clip_is_made_faster_than_it_plays():
    """The fake provider's render time is its scenario's `render_s`, never the clip's length: a tiny clip is
    encoded, not played out. Made in less than its own duration holds however slow or busy the machine (the
    usual figure, tens of milliseconds for 5 s, is printed by bench/fake_clips.py)."""
    spec = ClipSpec(*clip_size("16:9"), duration_s=5, seed=int(time.time_ns() % 2**31))  # a seed not cached yet
    started = time.perf_counter()
    data = await render_mp4(spec)
    assert time.perf_counter() - started < spec.duration_s
    assert probe(data) == ("h264", 320, 180, 5.0, 60)
    assert await render_mp4(spec) is data  # remembered, not rendered again


# --- idempotency ---------------------------------------------------------------------------------------


async def test_the_same_idempotency_key_never_renders_twice(adapter, http, provider):
    req = attempt(None)

    first, second = await asyncio.gather(adapter.submit(req), adapter.submit(req))
    again = await adapter.submit(req)
    found = await adapter.find(req)

    assert first.provider_job_id == second.provider_job_id == again.provider_job_id == found.provider_job_id
    seen = await counters(http, provider)
    assert seen["submissions_by_key"] == {req.idempotency_key: 3}
    assert seen["submissions_by_job"] == {req.job_id: 3}
    assert seen["renders_by_job"] == {req.job_id: 1}


async def test_find_knows_nothing_of_an_attempt_never_submitted(adapter):
    assert await adapter.find(attempt(None)) is None


async def test_a_new_attempt_is_a_new_render(adapter, http, provider):
    first = attempt(None)
    second = attempt(None, job_id=first.job_id, number=2)
    a, b = await adapter.submit(first), await adapter.submit(second)
    assert a.provider_job_id != b.provider_job_id
    assert (await counters(http, provider))["renders_by_job"] == {first.job_id: 2}


# --- scenarios -----------------------------------------------------------------------------------------


async def test_duplicate_callbacks_deliver_the_terminal_event_three_times(adapter, receiver):
    render_id = (await adapter.submit(attempt(receiver, "duplicate_callbacks"))).provider_job_id

    delivered = await callbacks(receiver, adapter, 4)
    await settles_at(receiver, 4)

    assert delivered[0][1].state is ProviderState.RUNNING
    terminal = delivered[1:]
    assert all(sig.state is ProviderState.SUCCEEDED and sig.provider_job_id == render_id for _, sig in terminal)
    assert len({receiver.deliveries[i].body for i in (1, 2, 3)}) == 1  # the same event, byte for byte
    webhook_ids = [wid for wid, _ in terminal]
    assert len(set(webhook_ids)) == 2, webhook_ids  # one retried under its id, one re-emitted under a new id
    assert sorted(webhook_ids.count(w) for w in set(webhook_ids)) == [1, 2]


async def test_no_callback_renders_but_only_polling_finds_out(adapter, receiver, http, provider):
    render_id = (await adapter.submit(attempt(receiver, "no_callback"))).provider_job_id

    done = await status_until(adapter, render_id, ProviderState.SUCCEEDED)

    assert done.output_url
    await settles_at(receiver, 0)
    assert (await counters(http, provider))["callbacks_by_render"] == {}


async def test_no_final_callback_calls_back_at_the_start_and_never_at_the_end(adapter, receiver, http, provider):
    render_id = (await adapter.submit(attempt(receiver, "no_final_callback"))).provider_job_id

    done = await status_until(adapter, render_id, ProviderState.SUCCEEDED)
    [(_, started)] = await callbacks(receiver, adapter, 1)

    assert done.output_url
    assert (started.state, started.provider_job_id) == (ProviderState.RUNNING, render_id)
    await settles_at(receiver, 1)  # the finished render's callback never comes
    assert (await counters(http, provider))["callbacks_by_render"] == {render_id: 1}


@pytest.mark.parametrize(("scenario", "code", "retry_after"), [
    ("rate_limit_then_succeed", ErrorCode.RATE_LIMITED, 1.0),
    ("unavailable_then_succeed", ErrorCode.PROVIDER_UNAVAILABLE, None),
])
async def test_the_first_two_submits_are_refused_then_one_is_accepted(adapter, http, provider, scenario, code,
                                                                        retry_after):
    job_id = ids.new("job")
    tries = [attempt(None, scenario, job_id=job_id, number=n) for n in (1, 2, 3)]

    errors = [await refused(lambda r=r: adapter.submit(r)) for r in tries[:2]]
    accepted = await adapter.submit(tries[2])

    assert [(e.code, e.retry_after, e.retryable) for e in errors] == [(code, retry_after, True)] * 2
    assert (await status_until(adapter, accepted.provider_job_id, ProviderState.SUCCEEDED)).output_url
    seen = await counters(http, provider)
    assert seen["refusals_by_job"] == {job_id: 2}
    assert seen["submissions_by_job"] == {job_id: 3}
    assert seen["renders_by_job"] == {job_id: 1}


@pytest.mark.parametrize(("scenario", "code"), [
    ("no_credit", ErrorCode.QUOTA_EXHAUSTED),
    ("key_refused", ErrorCode.PROVIDER_MISCONFIGURED),
])
async def test_an_account_the_provider_refuses_is_refused_every_submit_and_nothing_renders(adapter, http, provider,
                                                                                           scenario, code):
    job_id = ids.new("job")
    errors = [await refused(lambda n=n: adapter.submit(attempt(None, scenario, job_id=job_id, number=n)))
              for n in (1, 2, 3)]

    # Our account, not the request: no attempt of it can pass until a person puts the key or the credit right.
    assert [(e.code, e.retryable, e.unclear) for e in errors] == [(code, False, False)] * 3
    seen = await counters(http, provider)
    assert seen["refusals_by_job"] == {job_id: 3}
    assert seen["renders_by_job"] == {}


async def test_key_revoked_accepts_the_submit_then_refuses_every_call_about_its_render(adapter):
    req = attempt(None, "key_revoked")
    render_id = (await adapter.submit(req)).provider_job_id

    errors = [await refused(call) for call in (lambda: adapter.status(render_id), lambda: adapter.cancel(render_id),
                                               lambda: adapter.find(req))]

    assert [(e.code, e.retryable) for e in errors] == [(ErrorCode.PROVIDER_MISCONFIGURED, False)] * 3


async def test_content_rejected_fails_with_a_policy_error_that_is_not_retried(adapter, receiver):
    render_id = (await adapter.submit(attempt(receiver, "content_rejected"))).provider_job_id

    [(_, failed)] = await callbacks(receiver, adapter, 1)

    assert failed.state is ProviderState.FAILED and failed.output_url is None
    assert failed.error.code is ErrorCode.CONTENT_REJECTED and not failed.error.retryable
    assert "content policy" in failed.error.message
    assert (await adapter.status(render_id)).error == failed.error
    await settles_at(receiver, 1)


async def test_fail_always_fails_every_attempt_with_a_transient_error(adapter, receiver, http, provider):
    first = attempt(receiver, "fail_always")
    second = attempt(receiver, "fail_always", job_id=first.job_id, number=2)

    for req in (first, second):
        render_id = (await adapter.submit(req)).provider_job_id
        failed = await status_until(adapter, render_id, ProviderState.FAILED, ProviderState.SUCCEEDED)
        assert failed.state is ProviderState.FAILED and failed.attempt == req.attempt
        assert failed.error.code is ErrorCode.PROVIDER_UNAVAILABLE and failed.error.retryable

    assert (await counters(http, provider))["renders_by_job"] == {first.job_id: 2}
    signals = [sig for _, sig in await callbacks(receiver, adapter, 4)]
    assert [s.state for s in signals].count(ProviderState.FAILED) == 2


async def test_hang_runs_for_ever_until_canceled(adapter, receiver):
    render_id = (await adapter.submit(attempt(receiver, "hang", render_s=0.05))).provider_job_id
    [(_, running)] = await callbacks(receiver, adapter, 1)
    assert running.state is ProviderState.RUNNING

    await asyncio.sleep(0.3)  # several times the render time
    still = await adapter.status(render_id)
    await adapter.cancel(render_id)

    assert still.state is ProviderState.RUNNING and still.progress == 0.0
    assert (await adapter.status(render_id)).state is ProviderState.CANCELED
    [_, (_, canceled)] = await callbacks(receiver, adapter, 2)
    assert canceled.state is ProviderState.CANCELED
    await adapter.cancel(render_id)  # canceling a finished render changes nothing
    await settles_at(receiver, 2)


async def test_bad_output_reports_success_but_serves_something_that_is_not_a_video(adapter, http):
    render_id = (await adapter.submit(attempt(None, "bad_output"))).provider_job_id
    done = await status_until(adapter, render_id, ProviderState.SUCCEEDED)

    status, body = await fetch(http, done.output_url)

    assert status == 200 and body
    with pytest.raises(av.error.InvalidDataError):
        probe(body)


async def test_expired_output_serves_the_video_once_then_answers_404(adapter, http, provider):
    render_id = (await adapter.submit(attempt(None, "expired_output"))).provider_job_id
    done = await status_until(adapter, render_id, ProviderState.SUCCEEDED)

    first, body = await fetch(http, done.output_url)
    second, _ = await fetch(http, done.output_url)

    assert (first, second) == (200, 404)
    assert probe(body)[0] == "h264"
    assert (await counters(http, provider))["output_fetches"] == {render_id: 2}


def test_the_adapter_knows_exactly_the_provider_s_scenarios():
    assert set(fake_adapter.SCENARIOS) == {s.value for s in Scenario}


# --- callbacks on the wire -----------------------------------------------------------------------------


async def test_a_refused_delivery_is_retried_under_the_same_webhook_id(adapter, receiver, http, provider):
    receiver.fail_next = 2
    render_id = (await adapter.submit(attempt(receiver))).provider_job_id

    delivered = await callbacks(receiver, adapter, 4)  # running x3 (two refused), then succeeded
    await settles_at(receiver, 4)

    ids_ = [wid for wid, _ in delivered]
    assert ids_[0] == ids_[1] == ids_[2] != ids_[3]
    assert [sig.state for _, sig in delivered] == [ProviderState.RUNNING] * 3 + [ProviderState.SUCCEEDED]
    assert (await counters(http, provider))["callbacks_by_render"] == {render_id: 2}


async def test_a_tampered_or_replayed_callback_is_rejected(adapter, receiver):
    await adapter.submit(attempt(receiver))
    [(_, _), (_, _)] = await callbacks(receiver, adapter, 2)
    real = receiver.deliveries[1]

    with pytest.raises(WebhookRejected):
        adapter.verify_callback(real.headers, real.body.replace(b"succeeded", b"failed"))
    with pytest.raises(WebhookRejected):
        adapter.verify_callback({k: v for k, v in real.headers.items() if k.lower() != "webhook-signature"}, real.body)
    # Correctly signed, but six minutes old: a captured delivery replayed after the tolerance.
    stale = signed_headers(adapter.webhook_secret, real.body, msg_id=real.headers["webhook-id"],
                           timestamp=int(time.time()) - 360)
    with pytest.raises(WebhookRejected, match="tolerance"):
        adapter.verify_callback(stale, real.body)
    other = FakeAdapter(adapter.session, adapter.base_url, new_secret())
    with pytest.raises(WebhookRejected):
        other.verify_callback(real.headers, real.body)


@pytest.mark.parametrize("body", [b"not json", b'{"type": "render.succeeded"}',
                                  b'{"type": "x", "data": {"id": "rnd_1", "status": "exploded"}}'])
def test_a_malformed_callback_body_is_an_internal_error(adapter, body):
    with pytest.raises(ProviderError) as caught:
        adapter.parse_callback(body)
    assert caught.value.code is ErrorCode.INTERNAL


# --- validation and error mapping ----------------------------------------------------------------------


@pytest.mark.parametrize(("params", "field"), [
    ({"scenario": "explode"}, "params.scenario"),
    ({"scenario": 3}, "params.scenario"),
    ({"render_s": -1}, "params.render_s"),
    ({"render_s": 601}, "params.render_s"),
    ({"render_s": True}, "params.render_s"),
    ({"render_s": "3"}, "params.render_s"),
    ({"render_s": float("nan")}, "params.render_s"),
    ({"colour": "red"}, "params.colour"),
])
def test_validate_names_the_bad_parameter(adapter, params, field):
    with pytest.raises(ProviderError) as caught:
        adapter.validate(JobRequest(model="fake/default", prompt="p", params=params))
    assert caught.value.code is ErrorCode.INVALID_INPUT and caught.value.message.startswith(f"{field}: ")


@pytest.mark.parametrize("params", [{}, {"scenario": "hang"}, {"render_s": 0}, {"render_s": 600.0},
                                    {"scenario": "succeed", "render_s": 0.5}])
def test_validate_accepts_the_documented_parameters(adapter, params):
    adapter.validate(JobRequest(model="fake/default", prompt="p", params=params))


async def test_an_invalid_attempt_is_refused_before_reaching_the_provider(adapter, http, provider):
    req = attempt(None, "explode")
    assert (await refused(lambda: adapter.submit(req))).code is ErrorCode.INVALID_INPUT
    assert (await counters(http, provider))["submissions_by_key"] == {}


@pytest.mark.parametrize(("params", "field"), [({"scenario": "explode"}, "params.scenario"),
                                               ({"render_s": -2}, "params.render_s")])
async def test_the_server_itself_answers_422_naming_the_field(http, provider, params, field):
    body = {"model": "default", "prompt": "p", "params": params}
    async with http.post(f"{provider.url}/v1/renders", json=body) as resp:
        answer = await resp.json()
    assert resp.status == 422
    assert answer["error"]["param"] == field and answer["error"]["message"].startswith(f"{field}: ")


async def test_status_of_a_render_the_provider_forgot_is_a_transient_failure(adapter):
    sig = await adapter.status("rnd_unknown")
    assert sig.state is ProviderState.FAILED and sig.error.code is ErrorCode.PROVIDER_UNAVAILABLE
    await adapter.cancel("rnd_unknown")  # nothing to stop, and no error


async def test_a_404_from_something_other_than_the_provider_is_not_a_lost_render(http, secret):
    async with serving([]) as base:  # answers aiohttp's plain 404 to everything
        error = await refused(lambda: FakeAdapter(http, base, secret).status("rnd_1"))
    assert error.code is ErrorCode.PROVIDER_MISCONFIGURED  # our address for it is wrong, not the render lost


@pytest.mark.parametrize(("status", "body", "headers", "code", "retry_after"), [
    (429, b'{"error": {"code": "rate_limit_exceeded", "message": "slow down"}}', {"Retry-After": "7"},
     ErrorCode.RATE_LIMITED, 7.0),
    (429, b"", {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, ErrorCode.RATE_LIMITED, 0.0),
    (502, b"<html>bad gateway</html>", {}, ErrorCode.PROVIDER_UNAVAILABLE, None),
    (422, b'{"error": {"code": "invalid_request", "message": "prompt: too long"}}', {}, ErrorCode.INVALID_INPUT,
     None),
    (400, b'{"error": {"code": "content_policy_violation", "message": "flagged"}}', {},
     ErrorCode.CONTENT_REJECTED, None),
    (401, b'{"error": {"code": "unauthorized", "message": "bad key"}}', {}, ErrorCode.PROVIDER_MISCONFIGURED, None),
    (200, b"this is not json", {}, ErrorCode.INTERNAL, None),
    (201, b'{"id": "rnd_1"}', {}, ErrorCode.INTERNAL, None),
    (402, b'{"error": {"code": "insufficient_credit", "message": "top up"}}', {}, ErrorCode.QUOTA_EXHAUSTED, None),
])
async def test_provider_answers_map_onto_the_taxonomy(http, secret, status, body, headers, code, retry_after):
    async def answer(_: web.Request) -> web.Response:
        return web.Response(status=status, body=body, headers=headers)

    async with serving([web.post("/v1/renders", answer)]) as base:
        error = await refused(lambda: FakeAdapter(http, base, secret).submit(attempt(None)))
    assert (error.code, error.retry_after) == (code, retry_after)


# --- the weather: the whole provider's outages -------------------------------------------------------------


async def set_weather(http: aiohttp.ClientSession, provider: FakeProvider, **weather) -> dict:
    async with http.put(f"{provider.url}/v1/_weather", json=weather) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.json()


@pytest.mark.parametrize(("api", "code", "retry_after"), [
    ("rate_limited", ErrorCode.RATE_LIMITED, 1.0),
    ("unavailable", ErrorCode.PROVIDER_UNAVAILABLE, None),
    ("failing", ErrorCode.PROVIDER_UNAVAILABLE, None),
])
async def test_a_refusing_provider_refuses_every_call_until_the_weather_clears(adapter, http, provider, api, code,
                                                                              retry_after):
    first = attempt(None)
    submitted = await adapter.submit(first)
    await set_weather(http, provider, api=api)
    error = await refused(lambda: adapter.submit(attempt(None)))
    assert (error.code, error.retry_after) == (code, retry_after)
    assert (await refused(lambda: adapter.status(submitted.provider_job_id))).code is code
    assert (await counters(http, provider))["renders_by_job"] == {first.job_id: 1}  # the refused one never ran

    assert await set_weather(http, provider) == {"api": "clear", "callbacks": "normal", "delay_s": 0.0}
    assert (await adapter.status(submitted.provider_job_id)).state is not ProviderState.FAILED


async def test_a_slow_provider_answers_late_and_late_callbacks_come_late(adapter, http, provider, receiver):
    await set_weather(http, provider, api="slow", callbacks="late", delay_s=0.5)
    began = time.monotonic()
    render_id = (await adapter.submit(attempt(receiver, render_s=0.0))).provider_job_id
    assert time.monotonic() - began >= 0.5
    assert not receiver.deliveries  # the first callback waits its half second too
    delivered = await callbacks(receiver, adapter, 2)
    assert time.monotonic() - began >= 1.0
    assert delivered[-1][1].provider_job_id == render_id


async def test_callbacks_twice_sends_every_event_again_under_a_new_id(adapter, http, provider, receiver):
    await set_weather(http, provider, callbacks="twice")
    await adapter.submit(attempt(receiver))
    delivered = await callbacks(receiver, adapter, 6)  # running and succeeded, each three times
    await settles_at(receiver, 6)
    assert {sig.state for _, sig in delivered} == {ProviderState.RUNNING, ProviderState.SUCCEEDED}
    assert len({wid for wid, _ in delivered}) == 4


@pytest.mark.parametrize("weather", [{"api": "stormy"}, {"delay_s": 31}, {"delay_s": -1}, {"rain": 1}])
async def test_a_weather_it_does_not_know_is_refused_and_nothing_changes(http, provider, weather):
    async with http.put(f"{provider.url}/v1/_weather", json=weather) as resp:
        assert resp.status == 400, await resp.text()
    async with http.get(f"{provider.url}/v1/_weather") as resp:
        assert (await resp.json())["api"] == "clear"


# --- wiring --------------------------------------------------------------------------------------------


async def test_the_registry_builds_the_fake_adapter_from_settings(http, secret):
    settings = Settings(fake_provider="on", fake_provider_url="http://127.0.0.1:1/", fake_webhook_secret=secret,
                        webhook_tolerance_s=9)
    adapters = build_adapters(settings, http)

    fake = adapter_for(adapters, "fake")

    assert isinstance(fake, ProviderAdapter) and fake.supports_callbacks and fake.download_headers() == {}
    assert (fake.base_url, fake.tolerance_s) == ("http://127.0.0.1:1", 9)
    with pytest.raises(ProviderError) as caught:
        adapter_for(adapters, "sora")
    assert caught.value.code is ErrorCode.INVALID_INPUT and "sora" in caught.value.message


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDJOBS_")}
    return {**env, **{f"VIDJOBS_{k.upper()}": v for k, v in values.items()}}


async def test_as_a_process_it_serves_until_sigterm(http, secret):
    url = f"http://127.0.0.1:{free_port()}"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vidjobs.fakeprovider", env=_env(fake_provider_url=url, fake_webhook_secret=secret),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(20):
            while b"fake provider ready" not in (line := await proc.stderr.readline()):
                assert line, "the fake provider exited before it was ready"
        async with http.get(f"{url}/healthz") as resp:
            assert resp.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(20):
            code = await proc.wait()
    assert code == 0


async def test_as_a_process_it_refuses_to_start_without_a_webhook_secret():
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vidjobs.fakeprovider", env=_env(fake_provider_url=f"http://127.0.0.1:{free_port()}"),
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 2 and b"VIDJOBS_FAKE_WEBHOOK_SECRET" in err
