"""The contract every provider adapter keeps, checked for each one (the fake provider's included) against its
stand-in replaying its recorded payloads over real HTTP: submit, status in each state, callbacks verified and
refused, cancel, a 429 with its wait, a 5xx, a timeout and a malformed body."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.standins import luma as luma_standin
from tests.standins.fal import FalStandIn, Scenario
from tests.standins.replicate import running_replicate_standin
from tests.standins.runway import running_runway
from tests.standins.server import serving
from tests.standins.veo import running_veo
from vidjobs.cli.embedded import free_port
from vidjobs.common import signatures
from vidjobs.common.errors import ErrorCode, ProviderError, WebhookRejected
from vidjobs.common.jobs import JobRequest
from vidjobs.common.settings import Settings
from vidjobs.fakeprovider.serving import running_fake_provider
from vidjobs.providers.base import ProviderAdapter, ProviderSignal, ProviderState, SubmitRequest
from vidjobs.providers.fake.adapter import FakeAdapter
from vidjobs.providers.fal import FalAdapter
from vidjobs.providers.luma import LumaAdapter
from vidjobs.providers.registry import build_adapters
from vidjobs.providers.replicate import ReplicateAdapter
from vidjobs.providers.runway import RunwayAdapter
from vidjobs.providers.veo import VeoAdapter

KEY = "contract-key"
SECRET = signatures.new_secret()
WAITING = (ProviderState.QUEUED, ProviderState.RUNNING)


@dataclass
class Provider:
    """One adapter wired to its stand-in, and how its stand-in is asked for each behaviour."""

    adapter: ProviderAdapter
    job: Callable[[str], SubmitRequest]  # a submit that plays the named behaviour
    # Behaviour (succeed, fail, hang, rate_limit, unavailable, and lost where the stand-in can forget a render)
    # -> the stand-in's scenario.
    plays: dict[str, str]
    after_cancel: ProviderState  # where a canceled render then stands (a provider that deletes forgets it)
    callback: Callable[[bytes], dict[str, str]] | None = None  # genuine headers for a callback body
    callback_body: bytes = b""


def attempt(model: str, prompt: str, **fields) -> SubmitRequest:
    request = JobRequest(model=model, prompt=prompt, **fields)
    return SubmitRequest(job_id="job_contract", attempt=1, idempotency_key=f"job_contract-{prompt}", request=request)


def plays(**differ: str) -> dict[str, str]:
    """Behaviour -> the stand-in's scenario, where most stand-ins name a behaviour as we do."""
    same = ("succeed", "fail", "hang", "rate_limit", "unavailable")
    return {**{b: b for b in same}, **differ}


@contextlib.asynccontextmanager
async def fake(http: aiohttp.ClientSession) -> AsyncIterator[Provider]:
    async with running_fake_provider(webhook_secret=SECRET, callback_backoff_s=0.05) as server:
        yield Provider(
            FakeAdapter(http, server.url, SECRET),
            lambda s: attempt("fake/default", f"a fox {s}", duration_s=2, params={"scenario": s, "render_s": 0.3}),
            plays(fail="fail_always", rate_limit="rate_limit_then_succeed", unavailable="unavailable_then_succeed"),
            ProviderState.CANCELED, lambda body: signatures.signed_headers(SECRET, body),
            json.dumps({"type": "render.succeeded", "data": {"id": "r_1", "status": "succeeded"}}).encode(),
        )


@contextlib.asynccontextmanager
async def replicate(http: aiohttp.ClientSession) -> AsyncIterator[Provider]:
    async with running_replicate_standin(api_token=KEY, webhook_secret=SECRET, step_s=0.1) as standin:
        yield Provider(
            ReplicateAdapter(http, standin.url, KEY, SECRET),
            lambda s: attempt("replicate/kwaivgi/kling-v2.0", f"a fox standin:{s}", duration_s=5),
            plays(fail="oom"),
            ProviderState.CANCELED, lambda body: signatures.signed_headers(SECRET, body),
            json.dumps({"id": "p1", "status": "processing"}).encode(),
        )


@contextlib.asynccontextmanager
async def fal(http: aiohttp.ClientSession) -> AsyncIterator[Provider]:
    async with FalStandIn(api_key=KEY, queue_step_s=0.05, render_s=0.1) as standin:
        adapter = FalAdapter(http, standin.url, KEY, standin.jwks_url)
        body = json.dumps({"request_id": "r1", "status": "OK", "payload": {"video": {"url": "x"}}}).encode()
        await adapter.verifier.verify_fresh(standin.sign(body, "r1"), body)  # the keys are fetched
        plan = {s.value: s for s in Scenario}
        yield Provider(
            adapter, lambda s: attempt("fal/fal-ai/kling-video/v2/master/text-to-video",
                                       standin.plan(f"a fox {s}", plan[s]), duration_s=5),
            plays(succeed="success", fail="runner_failure", rate_limit="rate_limited"),
            ProviderState.FAILED, lambda b: standin.sign(b, "r1"), body,
        )
        await adapter.close()


@contextlib.asynccontextmanager
async def luma(http: aiohttp.ClientSession) -> AsyncIterator[Provider]:
    async with luma_standin.running_luma_standin(api_key=KEY, step_s=0.1) as standin:
        yield Provider(
            LumaAdapter(http, standin.url, KEY),
            lambda s: attempt("luma/ray-2", f"a fox standin:{s}", duration_s=5),
            plays(),
            ProviderState.FAILED, lambda body: {},
            json.dumps(luma_standin.payload("generation_completed")).encode(),
        )


def polled(running: Callable[[str], Any], adapter: Callable[..., ProviderAdapter], model: str, duration_s: int,
           fail: str, after_cancel: ProviderState) -> Callable[[aiohttp.ClientSession], Any]:
    """A provider that sends no callbacks, whose stand-in reads the scenario from the prompt."""

    @contextlib.asynccontextmanager
    async def wire(http: aiohttp.ClientSession) -> AsyncIterator[Provider]:
        async with running(KEY) as standin:
            job = functools.partial(attempt, model, duration_s=duration_s)
            yield Provider(adapter(http, standin.url, KEY), lambda s: job(f"a fox scenario:{s}"),
                           plays(fail=fail, lost="lost"), after_cancel)

    return wire


PROVIDERS = {
    "fake": fake, "replicate": replicate, "fal": fal, "luma": luma,
    "runway": polled(running_runway, RunwayAdapter, "runway/gen4.5", 5, "bad_output", ProviderState.CANCELED),
    # Veo (on Vertex AI) cannot stop an operation.
    "veo": polled(running_veo, functools.partial(VeoAdapter, output_uri="gs://vidjobs-test-renders/veo/"),
                  "veo/veo-3.0-generate-001", 8, "internal", ProviderState.RUNNING),
}


@pytest.fixture(params=sorted(PROVIDERS))
async def provider(request: pytest.FixtureRequest, http: aiohttp.ClientSession) -> AsyncIterator[Provider]:
    async with PROVIDERS[request.param](http) as wired:
        yield wired


def play(provider: Provider, behaviour: str) -> SubmitRequest:
    return provider.job(provider.plays[behaviour])


async def until_finished(adapter: ProviderAdapter, provider_job_id: str, model_name: str) -> list[ProviderSignal]:
    """Every status from the first to a finished one, each asked with the job's model, as the poller asks."""
    seen = [await adapter.status(provider_job_id, model_name=model_name)]
    while seen[-1].state in WAITING:
        assert len(seen) < 100, f"{provider_job_id} never finished"
        await asyncio.sleep(0.1)
        seen.append(await adapter.status(provider_job_id, model_name=model_name))
    return seen


async def test_a_render_is_submitted_and_its_states_only_move_forward(provider: Provider):
    req = play(provider, "succeed")
    accepted = await provider.adapter.submit(req)

    seen = await until_finished(provider.adapter, accepted.provider_job_id, req.request.model_name)

    order = [ProviderState.QUEUED, ProviderState.RUNNING, ProviderState.SUCCEEDED]
    assert [order.index(s.state) for s in seen] == sorted(order.index(s.state) for s in seen)
    assert seen[-1].state is ProviderState.SUCCEEDED and seen[-1].output_url
    assert all(s.provider_job_id == accepted.provider_job_id and s.error is None for s in seen)


async def test_a_failed_render_says_why_in_our_taxonomy(provider: Provider):
    req = play(provider, "fail")
    accepted = await provider.adapter.submit(req)

    last = (await until_finished(provider.adapter, accepted.provider_job_id, req.request.model_name))[-1]

    assert last.state is ProviderState.FAILED
    assert last.error is not None and last.error.code in set(ErrorCode) and last.error.message


async def test_cancel_stops_a_render_and_a_gone_one_is_no_error(provider: Provider):
    req = play(provider, "hang")
    accepted = await provider.adapter.submit(req)

    # As the poller asks: with the job's model (which only fal needs, to find the request's app).
    await provider.adapter.cancel(accepted.provider_job_id, model_name=req.request.model_name)
    after = await provider.adapter.status(accepted.provider_job_id, model_name=req.request.model_name)

    assert after.state is provider.after_cancel


async def test_a_render_the_provider_forgot_has_failed(provider: Provider):
    if "lost" not in provider.plays:
        pytest.skip("this stand-in never forgets a render")
    req = play(provider, "lost")
    accepted = await provider.adapter.submit(req)

    sig = await provider.adapter.status(accepted.provider_job_id, model_name=req.request.model_name)

    assert sig.state is ProviderState.FAILED
    assert sig.error is not None and sig.error.code is ErrorCode.PROVIDER_UNAVAILABLE


async def test_a_rate_limit_carries_the_wait(provider: Provider):
    with pytest.raises(ProviderError) as caught:
        await provider.adapter.submit(play(provider, "rate_limit"))

    assert caught.value.code is ErrorCode.RATE_LIMITED and caught.value.retryable
    assert caught.value.retry_after is not None and caught.value.retry_after > 0


async def test_a_server_error_is_the_provider_unavailable(provider: Provider):
    with pytest.raises(ProviderError) as caught:
        await provider.adapter.submit(play(provider, "unavailable"))

    assert caught.value.code is ErrorCode.PROVIDER_UNAVAILABLE and caught.value.retryable


async def test_a_genuine_callback_is_taken_and_a_forged_one_refused(provider: Provider):
    adapter = provider.adapter
    if provider.callback is None:
        assert adapter.supports_callbacks is False
    else:
        body = provider.callback_body
        assert adapter.verify_callback(provider.callback(body), body)
        assert adapter.parse_callback(body).provider_job_id
    forged = provider.callback(b"{}") if provider.callback else {}
    with pytest.raises(WebhookRejected):
        adapter.verify_callback(forged, b'{"id": "not yours", "status": "succeeded"}')


async def test_a_provider_without_callbacks_reads_none_and_finds_no_earlier_render(provider: Provider):
    if provider.callback is not None:
        pytest.skip("this provider calls back")

    with pytest.raises(ProviderError) as caught:
        provider.adapter.parse_callback(b'{"id": "x", "status": "SUCCEEDED", "done": true}')

    assert caught.value.code is ErrorCode.INTERNAL
    assert await provider.adapter.find(play(provider, "succeed")) is None


@pytest.mark.parametrize(("name", "settings"), [
    ("replicate", {"replicate_api_token": KEY, "replicate_webhook_secret": SECRET}),
    ("luma", {"luma_api_key": KEY}),
    ("runway", {"runway_api_key": KEY}),
    ("veo", {"veo_api_key": KEY}),
])
async def test_the_registry_offers_a_provider_only_with_its_key(http: aiohttp.ClientSession, name: str,
                                                                settings: dict[str, str]):
    url = f"http://{name}.invalid"

    offered = build_adapters(Settings(**settings, **{f"{name}_url": url}), http)

    assert name not in build_adapters(Settings(), http)
    assert isinstance(offered[name], ProviderAdapter) and offered[name].name == name
    assert offered[name].base_url == url  # type: ignore[attr-defined]


# --- what no stand-in plays: answers too slow, and answers that are not the provider's ----------------------


def retarget(adapter: ProviderAdapter, url: str) -> ProviderAdapter:
    adapter.base_url = url  # type: ignore[attr-defined]  # every HTTP adapter keeps its base URL here
    return adapter


async def test_an_answer_too_slow_is_a_timeout(provider: Provider, http: aiohttp.ClientSession):
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(2)
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", slow)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.3)) as impatient, serving(app) as url:
        provider.adapter.session = impatient  # type: ignore[attr-defined]
        with pytest.raises(ProviderError) as caught:
            await retarget(provider.adapter, url).submit(play(provider, "succeed"))

    assert caught.value.code is ErrorCode.TIMEOUT and caught.value.unclear


async def test_a_malformed_answer_is_internal(provider: Provider):
    async def garbled(request: web.Request) -> web.Response:
        return web.Response(text='{"id": ', content_type="application/json")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", garbled)
    async with serving(app) as url:
        with pytest.raises(ProviderError) as caught:
            await retarget(provider.adapter, url).submit(play(provider, "succeed"))

    assert caught.value.code is ErrorCode.INTERNAL and "malformed" in caught.value.message


async def test_an_unreachable_provider_is_unavailable(provider: Provider):
    with pytest.raises(ProviderError) as caught:
        await retarget(provider.adapter, f"http://127.0.0.1:{free_port()}").submit(play(provider, "succeed"))

    assert caught.value.code is ErrorCode.PROVIDER_UNAVAILABLE and caught.value.retryable
