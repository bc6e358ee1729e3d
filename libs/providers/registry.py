"""Which adapters exist and how a job's provider name finds its adapter."""

from __future__ import annotations

import aiohttp

from libs.common.errors import ErrorCode, ProviderError
from libs.common.settings import Settings
from libs.providers.base import ProviderAdapter
from libs.providers.fake.adapter import FakeAdapter, PollingFakeAdapter


def build_adapters(settings: Settings, session: aiohttp.ClientSession) -> dict[str, ProviderAdapter]:
    """Every configured adapter by provider name, sharing the caller's HTTP session (the caller closes it)."""
    adapters: list[ProviderAdapter] = [
        FakeAdapter(session, settings.fake_provider_url, settings.fake_webhook_secret,
                    tolerance_s=settings.webhook_tolerance_s),
        PollingFakeAdapter(session, settings.fake_provider_url, settings.fake_webhook_secret,
                           tolerance_s=settings.webhook_tolerance_s),
    ]
    # Real providers join only when their API key is configured.
    # replicate
    # fal
    # runway
    # luma
    # veo
    return {adapter.name: adapter for adapter in adapters}


def adapter_for(adapters: dict[str, ProviderAdapter], provider_name: str) -> ProviderAdapter:
    adapter = adapters.get(provider_name)
    if adapter is None:
        known = ", ".join(sorted(adapters)) or "none"
        raise ProviderError(ErrorCode.INVALID_INPUT, f"unknown provider {provider_name!r} (known: {known})")
    return adapter
