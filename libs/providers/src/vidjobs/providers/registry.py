"""Which adapters exist and how a job's provider name finds its adapter."""

from __future__ import annotations

import aiohttp

from vidjobs.common.errors import ConfigError, ErrorCode, ProviderError
from vidjobs.common.settings import Settings
from vidjobs.providers.base import ProviderAdapter
from vidjobs.providers.fake.adapter import FakeAdapter, PollingFakeAdapter

# Each real provider and the setting that holds its API key.
API_KEY_SETTINGS = {"replicate": "replicate_api_token", "fal": "fal_api_key", "runway": "runway_api_key",
                    "luma": "luma_api_key", "veo": "veo_api_key"}
# Providers whose render URLs are fetched with our API key (Gemini API file downloads): media holds these keys.
KEYED_DOWNLOADS = frozenset({"veo"})


def offered(settings: Settings) -> frozenset[str]:
    """The real providers whose adapters this process builds: those named in VIDJOBS_PROVIDERS, with or without
    their key here, and those whose API key is set."""
    named = {name.strip().lower() for name in settings.providers.split(",") if name.strip()}
    if unknown := sorted(named - API_KEY_SETTINGS.keys()):
        raise ConfigError(f"VIDJOBS_PROVIDERS names no provider we have: {', '.join(unknown)} "
                          f"(known: {', '.join(API_KEY_SETTINGS)})")
    return frozenset(named | {name for name, field in API_KEY_SETTINGS.items() if getattr(settings, field)})


def require_api_keys(settings: Settings, providers: frozenset[str] | None = None) -> None:
    """For a process that calls providers with our key: refuse to start while an offered provider (of
    `providers`, when given) has no key here, rather than fail each of its jobs at the provider."""
    wanted = offered(settings) if providers is None else offered(settings) & providers
    missing = [f"VIDJOBS_{API_KEY_SETTINGS[name].upper()}" for name in sorted(wanted)
               if not getattr(settings, API_KEY_SETTINGS[name])]
    if missing:
        raise ConfigError(f"VIDJOBS_PROVIDERS offers providers this process calls without their key: "
                          f"set {', '.join(missing)}")


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
    # Real providers join when offered. A process without a provider's key still validates its jobs, lists
    # its models and reads its callbacks; only calls to the provider need the key.
    providers = offered(settings)
    if "replicate" in providers:
        from vidjobs.providers.replicate import ReplicateAdapter

        adapters.append(ReplicateAdapter(session, settings.replicate_url, settings.replicate_api_token,
                                         settings.replicate_webhook_secret, tolerance_s=settings.webhook_tolerance_s))
    if "fal" in providers:
        from vidjobs.providers.fal import FalAdapter

        adapters.append(FalAdapter(session, settings.fal_url, settings.fal_api_key, settings.fal_jwks_url,
                                   tolerance_s=settings.webhook_tolerance_s, user_id=settings.fal_user_id))
    if "runway" in providers:
        from vidjobs.providers.runway import RunwayAdapter

        adapters.append(RunwayAdapter(session, settings.runway_url, settings.runway_api_key))
    if "luma" in providers:
        from vidjobs.providers.luma import LumaAdapter

        adapters.append(LumaAdapter(session, settings.luma_url, settings.luma_api_key))
    if "veo" in providers:
        from vidjobs.providers.veo import VeoAdapter

        adapters.append(VeoAdapter(session, settings.veo_url, settings.veo_api_key))
    return {adapter.name: adapter for adapter in adapters}


def adapter_for(adapters: dict[str, ProviderAdapter], provider_name: str) -> ProviderAdapter:
    adapter = adapters.get(provider_name)
    if adapter is None:
        known = ", ".join(sorted(adapters)) or "none"
        raise ProviderError(ErrorCode.INVALID_INPUT, f"unknown provider {provider_name!r} (known: {known})")
    return adapter


async def every_model() -> frozenset[str]:
    """Every model of every adapter we have, whether this deployment offers its provider or not: the models a
    route may name (`vidjobs routes set`). Builds each adapter without a key; nothing is called."""
    everything = Settings(fake_provider="on", providers=",".join(API_KEY_SETTINGS))
    async with aiohttp.ClientSession() as session:
        adapters = build_adapters(everything, session)
        try:
            return frozenset(info.id for adapter in adapters.values() for info in adapter.models())
        finally:
            for adapter in adapters.values():
                await adapter.close()
