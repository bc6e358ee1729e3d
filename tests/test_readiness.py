"""A worker's /readyz is what Kubernetes takes a pod out of rotation (and a rollout's progress) on: it must
fail while the worker cannot take work, although the process and its /healthz are fine."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from tests.stack import stack_settings
from tests.support import wait_until
from vidjobs.cli.embedded import EmbeddedNats, free_port
from vidjobs.common import bus, events
from vidjobs.common.runtime import consumer, health_app, open_runtime


async def probe(session: aiohttp.ClientSession, url: str) -> tuple[int, dict]:
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=3)) as resp:
            return resp.status, await resp.json()
    except (aiohttp.ClientError, TimeoutError):
        return 0, {}


@contextlib.asynccontextmanager
async def worker_process(module: str, env: dict[str, str]) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", module, env=env,
                                                stdin=asyncio.subprocess.DEVNULL)
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)


async def test_worker_is_unready_while_nats_is_down_and_live_throughout(
        tmp_path: Path, database_url: str, nats_server: EmbeddedNats) -> None:
    port = free_port()
    settings = stack_settings(tmp_path, database_url, nats_server.url, metrics_port=port)
    base = f"http://127.0.0.1:{port}"
    async with worker_process("vidjobs.reaper", settings.to_env()) as proc, aiohttp.ClientSession() as session:

        async def readiness(expected: int):
            status, body = await probe(session, f"{base}/readyz")
            return (status, body) if status == expected else None

        await wait_until(lambda: readiness(200), within=60, what="the reaper ready")

        nats_server.stop()
        status, body = await wait_until(lambda: readiness(503), within=20, what="the reaper unready")
        assert body["reason"] == "NATS unreachable"
        # Liveness never depends on NATS: restarting the pod would not bring NATS back.
        assert (await probe(session, f"{base}/healthz"))[0] == 200

        nats_server.start()  # the same directory and port, and still the fixture's to stop
        await wait_until(lambda: readiness(200), within=60, what="the reaper ready again")
        assert proc.returncode is None


async def test_readyz_names_a_consumer_whose_pull_loop_stopped(
        tmp_path: Path, database_url: str, nats_url: str) -> None:
    port = free_port()
    settings = stack_settings(tmp_path, database_url, nats_url, metrics_port=port)
    async with (open_runtime("readiness-test", settings) as rt, aiohttp.ClientSession() as session):
        runner = await health_app(rt)

        async def noop(_event: events.Event, _delivery: bus.Delivery) -> None:
            return None

        # Run the way a worker runs its consumers: inside its main task, not watched one by one, so a loop
        # that ends leaves the process (and its /healthz) alive.
        spec = consumer(rt, "reaper-recovery", events.RECOVERY, noop)
        loop = asyncio.create_task(bus.consume(rt.js, spec, rt.stop))
        try:
            async def ready():
                return (await probe(session, f"http://127.0.0.1:{port}/readyz"))[0] == 200

            await wait_until(ready, within=30, what="the consumer subscribed")

            loop.cancel()
            await asyncio.wait({loop})
            status, body = await probe(session, f"http://127.0.0.1:{port}/readyz")
            assert status == 503
            assert body["reason"] == "consumer reaper-recovery stopped"
            assert (await probe(session, f"http://127.0.0.1:{port}/healthz"))[0] == 200
        finally:
            loop.cancel()
            await runner.cleanup()
