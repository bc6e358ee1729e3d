"""The model catalogue (`GET /v1/models`) against each adapter's own validation: every duration and format a
model lists is one it accepts, with an input image exactly when it says, and a length past its longest is
refused, so the catalogue can never promise what a create would refuse."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import msgspec
import pytest

from tests.gateway_harness import JOB_BODY, assert_error, auth, gateway_settings, running_gateway
from vidjobs.common import ratecard
from vidjobs.common.errors import ProviderError
from vidjobs.common.jobs import JobRequest
from vidjobs.common.settings import RouteShare, Settings
from vidjobs.gateway.bodies import AccountPatch, CreateJob, ListQuery
from vidjobs.providers.base import ModelInfo, ProviderAdapter
from vidjobs.providers.registry import build_adapters, every_model

EVERY_PROVIDER = Settings(
    fake_provider="on", replicate_api_token="r8_test", replicate_webhook_secret="whsec_dGVzdHNlY3JldHRlc3RzZWNyZXQ=",
    fal_api_key="fal-test", runway_api_key="rw-test", luma_api_key="luma-test", veo_api_key="veo-test",
)


@pytest.fixture
async def adapters() -> AsyncIterator[dict[str, ProviderAdapter]]:
    async with aiohttp.ClientSession() as session:
        built = build_adapters(EVERY_PROVIDER, session)
        yield built
        for adapter in built.values():
            await adapter.close()


def _request(model: ModelInfo, duration_s: int, ratio: str, resolution: str, *, image: bool) -> JobRequest:
    return JobRequest(model=model.id, prompt="a fox", duration_s=duration_s, aspect_ratio=ratio,
                      resolution=resolution, input_image="upl_test" if image else None)


def _refused(adapter: ProviderAdapter, request: JobRequest) -> str | None:
    try:
        adapter.validate(request)
    except ProviderError as err:
        return err.message
    return None


async def test_every_listed_model_accepts_what_it_lists(adapters):
    assert set(adapters) == {"fake", "fake-poll", "replicate", "fal", "runway", "luma", "veo"}
    checked = 0
    for adapter in adapters.values():
        for model in adapter.models():
            assert model.durations_s and model.formats, model.id
            with_image = [] if model.input_image != "optional" else (model.formats_with_image or model.formats)
            for fmt, image in [*((f, model.input_image == "required") for f in model.formats),
                               *((f, True) for f in with_image)]:
                for duration in fmt.durations_s or model.durations_s:
                    request = _request(model, duration, fmt.aspect_ratio, fmt.resolution, image=image)
                    assert _refused(adapter, request) is None, (model.id, duration, fmt, image)
                    checked += 1
                if fmt.durations_s:  # fewer lengths in this format: the others are refused in it
                    others = set(model.durations_s) - set(fmt.durations_s)
                    assert all(_refused(adapter, _request(model, d, fmt.aspect_ratio, fmt.resolution, image=image))
                               for d in others), (model.id, fmt)
            fmt = next(f for f in model.formats if not f.durations_s)
            too_long = _request(model, max(model.durations_s) + 1, fmt.aspect_ratio, fmt.resolution,
                                image=model.input_image == "required")
            if max(model.durations_s) < 60:
                assert _refused(adapter, too_long) is not None, model.id
            at_first = (model.durations_s[0], fmt.aspect_ratio, fmt.resolution)
            if model.input_image == "none":
                assert _refused(adapter, _request(model, *at_first, image=True)) is not None, model.id
            if model.input_image == "optional":
                assert _refused(adapter, _request(model, *at_first, image=True)) is None, model.id
            if model.input_image == "required":
                assert _refused(adapter, _request(model, *at_first, image=False)) is not None, model.id
    assert checked > 100


def _refused_by_gateway(kind: type, fields: dict[str, object]) -> str | None:
    """Why the gateway's decoder (vidjobs.gateway.decoding: msgspec over these bodies) refuses `fields`."""
    try:
        msgspec.json.decode(msgspec.json.encode(fields), type=kind)
    except msgspec.ValidationError as err:
        return str(err)
    return None


async def test_the_gateway_takes_every_model_name_an_adapter_lists():
    """Model ids hold slashes of their own (`fal/fal-ai/kling-video/...`, `replicate/<owner>/<name>`): a model
    the catalogue lists must be one a create, a fallback list and a list filter may name, or its jobs could
    never be made."""
    names = await every_model()
    assert {name.split("/", 1)[0] for name in names} >= {"fake", "replicate", "fal", "runway", "luma", "veo"}

    refused = {name: why for name in sorted(names) for why in [
        _refused_by_gateway(CreateJob, {"model": name, "prompt": "a fox", "fallback_models": [name]}),
        _refused_by_gateway(AccountPatch, {"fallback_models": [name]}),
        _refused_by_gateway(ListQuery, {"model": name}),
    ] if why is not None}

    assert refused == {}
    # The check can tell: a name the pattern does not allow is refused here, as it is at the door.
    assert _refused_by_gateway(CreateJob, {"model": "fal/kling video", "prompt": "a fox"}) is not None


async def test_the_catalogue_lists_each_model_with_its_price_and_aliases(tmp_path, database_url, nats_url):
    routes = {"video/best": [RouteShare(model="fake/default", share=9), RouteShare(model="fake-poll/default",
                                                                                   share=1)]}
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url, model_routes=routes)) as h:
        key = await h.key()
        status, listing = await h.get(key, "/v1/models")
        card = await ratecard.current(h.pool)
        unauthenticated, _ = await h.get(None, "/v1/models")

    assert status == 200 and unauthenticated == 401
    assert listing["rate_card_version"] == card.version
    by_id = {m["id"]: m for m in listing["data"]}
    assert set(by_id) == {"fake/default", "fake-poll/default"}
    fake = by_id["fake/default"]
    assert (fake["provider"], fake["aliases"], fake["input_image"]) == ("fake", ["video/best"], "optional")
    assert fake["credits_per_second"] == {
        res: ratecard.price_of(card, "fake/default", res).credits_per_second for res in ("480p", "720p", "1080p")}


async def test_an_estimate_is_what_a_create_reserves_and_creates_nothing(tmp_path, database_url, nats_url):
    async with running_gateway(gateway_settings(tmp_path, database_url, nats_url)) as h:
        key = await h.key()
        body = {**JOB_BODY, "duration_s": 7, "resolution": "1080p"}
        resp = await h.client.post("/v1/estimates", json=body, headers=auth(key))
        estimate = await resp.json()
        jobs_after_estimate = await h.count("SELECT count(*) FROM jobs")
        bad = await h.client.post("/v1/estimates", json={**body, "duration_s": 61}, headers=auth(key))
        bad_body = await bad.json()
        unknown = await h.client.post("/v1/estimates", json={**body, "model": "nope/x"}, headers=auth(key))
        unknown_body = await unknown.json()
        _, job = await h.post_job(key, body)
        account = (await h.get(key, "/v1/account"))[1]

    assert resp.status == 200 and jobs_after_estimate == 0
    assert estimate["estimated_credits"] == job["cost"]["estimated_credits"]
    assert estimate["model"] == "fake/default" and estimate["affordable"] is True
    assert estimate["available_credits"] == account["credits"]["balance"]
    assert bad.status == 422 and unknown.status == 422
    assert_error(bad_body, "invalid_input", "duration_s")
    assert_error(unknown_body, "invalid_input", "unknown provider")
