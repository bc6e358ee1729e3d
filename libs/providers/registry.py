"""Which adapters exist and how a job's provider name finds its adapter."""

from __future__ import annotations

import aiohttp

from vidjobs.common.errors import ErrorCode, ProviderError
from vidjobs.common.settings import Settings
from vidjobs.providers.base import ProviderAdapter
from vidjobs.providers.fake.adapter import FakeAdapter, PollingFakeAdapter


def build_adapters(settings: Settings, session: aiohttp.ClientSession) -> dict[str, ProviderAdapter]:
    """Every configured adapter by provider name, sharing the caller's HTTP session (the caller closes it)."""
    adapters: list[ProviderAdapter] = []
    if settings.fake_provider == "on":
        adapters += [
            FakeAdapter(session, settings.fake_provider_url, settings.fake_webhook_secret,
                        tolerance_s=settings.webhook_tolerance_s),
            PollingFakeAdapter(session, settings.fake_provider_url, settings.fake_webhook_secret,
                               tolerance_s=settings.webhook_tolerance_s),
        ]
    # Real providers join only when their API key is configured.
    if settings.replicate_api_token:
        from vidjobs.providers.replicate import ReplicateAdapter

        adapters.append(ReplicateAdapter(session, settings.replicate_url, settings.replicate_api_token,
                                         settings.replicate_webhook_secret, tolerance_s=settings.webhook_tolerance_s))
    if settings.fal_api_key:
        from vidjobs.providers.fal import FalAdapter

        adapters.append(FalAdapter(session, settings.fal_url, settings.fal_api_key, settings.fal_jwks_url,
                                   tolerance_s=settings.webhook_tolerance_s, user_id=settings.fal_user_id))
    if settings.runway_api_key:
        from vidjobs.providers.runway import RunwayAdapter

        adapters.append(RunwayAdapter(session, settings.runway_url, settings.runway_api_key))
    if settings.luma_api_key:
        from vidjobs.providers.luma import LumaAdapter

        adapters.append(LumaAdapter(session, settings.luma_url, settings.luma_api_key))
    if settings.veo_api_key:
        from vidjobs.providers.veo import VeoAdapter

        adapters.append(VeoAdapter(session, settings.veo_url, settings.veo_api_key))
    return {adapter.name: adapter for adapter in adapters}


def adapter_for(adapters: dict[str, ProviderAdapter], provider_name: str) -> ProviderAdapter:
    adapter = adapters.get(provider_name)
    if adapter is None:
        known = ", ".join(sorted(adapters)) or "none"
        raise ProviderError(ErrorCode.INVALID_INPUT, f"unknown provider {provider_name!r} (known: {known})")
    return adapter
