"""`python -m vidjobs.fakeprovider`: the fake provider as a process of its own.

Listens at VIDJOBS_FAKE_PROVIDER_URL, signs callbacks with VIDJOBS_FAKE_WEBHOOK_SECRET, renders the clips
VIDJOBS_FAKE_CLIP names (real ones kept in VIDJOBS_FAKE_CLIP_DIR, VIDJOBS_FAKE_CLIP_CACHE_MB), logs one JSON object
per line, says "fake provider ready" once it accepts connections, and stops cleanly on SIGTERM or SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path

import uvloop
from yarl import URL

from vidjobs.common import logs
from vidjobs.common.errors import ConfigError
from vidjobs.common.settings import Settings, load
from vidjobs.common.signatures import decode_secret
from vidjobs.fakeprovider.clip_cache import ClipCache, default_dir
from vidjobs.fakeprovider.clips import ClipKind
from vidjobs.fakeprovider.serving import running_fake_provider

log = logging.getLogger("vidjobs.fake_provider")


def bind_address(url: str) -> tuple[str, int]:
    parsed = URL(url)
    if parsed.scheme != "http" or not parsed.host:
        raise ConfigError(f"VIDJOBS_FAKE_PROVIDER_URL must be http://host:port, not {url!r}")
    return parsed.host, parsed.port or 80


async def serve(settings: Settings) -> int:
    host, port = bind_address(settings.fake_provider_url)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    cache = ClipCache(Path(settings.fake_clip_dir) if settings.fake_clip_dir else default_dir(),
                      settings.fake_clip_cache_mb * 1024 * 1024)
    try:
        async with running_fake_provider(host, port, webhook_secret=settings.fake_webhook_secret,
                                         public_url=settings.fake_provider_url, clip=ClipKind(settings.fake_clip),
                                         clip_cache=cache) as provider:
            log.info("fake provider ready", extra={"url": provider.url})
            await stop.wait()
            log.info("fake provider stopping")
    except OSError as exc:
        log.error("fake provider cannot listen", extra={"host": host, "port": port, "error": str(exc)})
        return 1
    return 0


def main() -> None:
    try:
        settings = load()
        bind_address(settings.fake_provider_url)
        if not settings.fake_webhook_secret:
            raise ConfigError("VIDJOBS_FAKE_WEBHOOK_SECRET must be set (`vidjobs up` generates one)")
        decode_secret(settings.fake_webhook_secret)
    except ConfigError as exc:
        print(f"vidjobs fake-provider: {exc}", file=sys.stderr)
        sys.exit(2)
    logs.setup("fake-provider", level=settings.log_level, fmt=settings.log_format)
    sys.exit(uvloop.run(serve(settings)))


if __name__ == "__main__":
    main()
