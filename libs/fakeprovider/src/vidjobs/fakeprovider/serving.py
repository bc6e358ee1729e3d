"""The fake provider listening on a port: a real HTTP server that behaves like a generative-video provider
and renders real MP4s (http_api says what it answers, scenarios how each render plays out)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from vidjobs.fakeprovider.clip_cache import ClipCache
from vidjobs.fakeprovider.clips import ClipKind
from vidjobs.fakeprovider.http_api import create_app
from vidjobs.fakeprovider.scenarios import FakeProvider


@contextlib.asynccontextmanager
async def running_fake_provider(host: str = "127.0.0.1", port: int = 0, *, webhook_secret: str,
                                public_url: str | None = None, callback_attempts: int = 4,
                                callback_backoff_s: float = 0.25, clip: ClipKind = ClipKind.TINY,
                                clip_cache: ClipCache | None = None) -> AsyncIterator[FakeProvider]:
    """A fake provider listening on `host:port` (0 picks a free port) until the block exits.

    `public_url` is the address put in output URLs; by default the bound address. Callbacks are tried
    `callback_attempts` times, `callback_backoff_s` apart at first. Renders make `clip` clips unless their
    params say otherwise; real ones are kept in `clip_cache` (by default, under the system temp dir)."""
    provider = FakeProvider(webhook_secret=webhook_secret, callback_attempts=callback_attempts,
                            callback_backoff_s=callback_backoff_s, clip=clip, clip_cache=clip_cache)
    runner = web.AppRunner(create_app(provider), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_port = runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        provider.base_url = (public_url or f"http://{shown}:{bound_port}").rstrip("/")
        yield provider
    finally:
        await runner.cleanup()
