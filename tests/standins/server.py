"""What every stand-in shares: an aiohttp app on a free loopback port for the length of a block, and the
tasks and client session of a stand-in that calls back (renders in flight, webhook deliveries)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web


@contextlib.asynccontextmanager
async def serving(app: web.Application, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """`app` listening on a free port of `host` until the block exits; yields its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, 0).start()
        yield f"http://{host}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@dataclass
class Received:
    """One POST to a stand-in's `/_sink`."""

    headers: dict[str, str]
    body: bytes


class CallingStandin:
    """A stand-in that works in the background and calls out: its tasks and session live as long as its app
    (`app.cleanup_ctx.append(standin.lifetime)`), and `/_sink` keeps what is POSTed to it."""

    session_timeout_s = 10.0

    def __init__(self) -> None:
        self.url = ""  # set once listening
        self.received: list[Received] = []
        self.session: aiohttp.ClientSession | None = None
        self._tasks: set[asyncio.Task] = set()

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def lifetime(self, app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.session_timeout_s)) as session:
            self.session = session
            yield
            await self.close()

    async def sink(self, request: web.Request) -> web.Response:
        self.received.append(Received(dict(request.headers), await request.read()))
        return web.json_response({"received": True})
