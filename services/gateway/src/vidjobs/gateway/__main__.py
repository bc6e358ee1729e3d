"""`python -m vidjobs.gateway`: serve the API until SIGTERM or SIGINT, then stop cleanly."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import uvloop
from aiohttp import web

from vidjobs.common import gcpolicy, logs, tracing
from vidjobs.common.errors import ConfigError
from vidjobs.common.settings import Settings, load
from vidjobs.gateway.app import create_app
from vidjobs.gateway.state import GATEWAY

log = logging.getLogger("vidjobs.gateway")

# Open event streams end on shutdown at once; ordinary requests get this long to finish.
SHUTDOWN_TIMEOUT_S = 10.0


async def serve(settings: Settings) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()  # opens the database pool, NATS, storage and provider adapters
    try:
        site = web.TCPSite(runner, settings.http_host, settings.http_port)
        await site.start()
        log.info("gateway listening", extra={"url": settings.gateway_url})
        gcpolicy.install()
        rt = app[GATEWAY].rt
        # Asked to stop, or a long-lived task of the runtime stopped (then the exit code says so).
        waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(rt.stop.wait())]
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        for waiting in waits:
            waiting.cancel()
        log.info("gateway stopping", extra={"why": rt.failure or "asked to"})
        return 0 if rt.failure is None else 1
    finally:
        await runner.cleanup()


def main() -> None:
    try:
        settings = load()
    except ConfigError as exc:
        print(f"vidjobs gateway: {exc}", file=sys.stderr)
        sys.exit(2)
    logs.setup("gateway", level=settings.log_level, fmt=settings.log_format)
    tracing.setup("gateway")
    try:
        code = uvloop.run(serve(settings))
    except ConfigError as exc:
        log.error(str(exc))
        code = 2
    finally:
        tracing.shutdown()
    sys.exit(code)


if __name__ == "__main__":
    main()
