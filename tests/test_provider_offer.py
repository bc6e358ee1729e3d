"""Which providers a process offers, apart from which keys it holds: VIDJOBS_PROVIDERS names them, every
process builds their adapters, and only the processes that call a provider need its key. So the gateway,
which faces the internet, validates jobs, lists models and verifies callbacks with no provider API key."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.gateway_harness import auth, gateway_settings, running_gateway
from vidjobs.common import signatures
from vidjobs.common.errors import ConfigError
from vidjobs.common.settings import Settings
from vidjobs.providers.registry import API_KEY_SETTINGS, KEYED_DOWNLOADS, build_adapters, offered, require_api_keys

PAYLOADS = Path(__file__).resolve().parent / "payloads"
EVERY = ",".join(API_KEY_SETTINGS)
SECRET = signatures.new_secret()


async def _names(settings: Settings) -> set[str]:
    async with aiohttp.ClientSession() as session:
        adapters = build_adapters(settings, session)
        for adapter in adapters.values():
            await adapter.close()
    return set(adapters)


async def test_named_providers_are_built_without_their_keys():
    assert await _names(Settings(providers=f" {EVERY.upper()} ")) == set(API_KEY_SETTINGS)
    assert await _names(Settings(providers="luma", veo_api_key="k")) == {"luma", "veo"}  # a key still offers
    assert await _names(Settings()) == set()


def test_an_unknown_provider_name_is_a_configuration_error():
    with pytest.raises(ConfigError, match="VIDJOBS_PROVIDERS.*replicat"):
        offered(Settings(providers="replicat"))


def test_a_process_that_calls_providers_refuses_to_start_without_their_keys():
    require_api_keys(Settings())  # offers none, needs none
    require_api_keys(Settings(providers="fal", fal_api_key="k"))
    with pytest.raises(ConfigError, match="VIDJOBS_LUMA_API_KEY, VIDJOBS_REPLICATE_API_TOKEN"):
        require_api_keys(Settings(providers="replicate,luma,fal", fal_api_key="k"))
    # media fetches only some providers' renders with the key
    require_api_keys(Settings(providers=EVERY, veo_api_key="k"), KEYED_DOWNLOADS)
    with pytest.raises(ConfigError, match="VIDJOBS_VEO_API_KEY"):
        require_api_keys(Settings(providers=EVERY), KEYED_DOWNLOADS)


@pytest.mark.parametrize("service", ["submitter", "poller", "media"])
async def test_the_worker_exits_2_naming_the_missing_key(service):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDJOBS_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", f"vidjobs.{service}", env={**env, "VIDJOBS_PROVIDERS": "veo"},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert (proc.returncode, b"VIDJOBS_VEO_API_KEY" in err) == (2, True), err.decode()


async def test_the_gateway_takes_jobs_and_callbacks_with_no_provider_key(tmp_path, database_url, nats_url):
    settings = gateway_settings(tmp_path, database_url, nats_url, fake_provider="off", providers="replicate,luma",
                                replicate_webhook_secret=SECRET)
    assert not any(getattr(settings, field) for field in API_KEY_SETTINGS.values())
    async with running_gateway(settings) as h:
        key = await h.key()
        models = await h.get(key, "/v1/models")
        assert {m["id"].split("/")[0] for m in models[1]["data"]} == {"replicate", "luma"}
        status, job = await h.post_job(key, model="luma/ray-2", seed=None)
        assert status == 201, job

        body = (PAYLOADS / "replicate" / "prediction_succeeded.json").read_bytes()
        signed = await h.client.post("/v1/webhooks/replicate", data=body,
                                     headers={**signatures.signed_headers(SECRET, body), **auth(key)})
        forged = await h.client.post("/v1/webhooks/replicate", data=body,
                                     headers=signatures.signed_headers(signatures.new_secret(), body))
        assert (signed.status, forged.status) == (200, 401), await signed.text()


def test_every_provider_has_its_key_setting():
    assert set(API_KEY_SETTINGS.values()) <= set(Settings.__struct_fields__)
    assert KEYED_DOWNLOADS <= API_KEY_SETTINGS.keys()
