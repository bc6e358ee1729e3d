"""A service that starts while a part it needs is away waits for it instead of exiting.

A process restarted during a database restart or a NATS node's outage (a rollout, a node drained, the fault
suite's kills) met the part gone after its first look and exited with status 1, to be restarted again; under
Kubernetes each such exit lengthens the crash-loop back-off before the next try. Here the service is started
through a TCP fault proxy that refuses its connects for a while, and must still be running, and then serve,
once the part is back.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from urllib.parse import urlsplit

import aiohttp

from tests.faults.proxy import FaultProxy
from tests.stack import stack_settings
from tests.support import wait_until
from tests.test_stream_feeds import own_database
from vidjobs.cli.embedded import free_port

AWAY_S = 3.0  # long enough for today's code to have exited; well inside the start's patience


async def _healthy(port: int) -> bool:
    try:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/healthz") as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


async def _start_reaper(tmp_path, database_url: str, nats_url: str) -> tuple[asyncio.subprocess.Process, int]:
    metrics_port = free_port()
    settings = stack_settings(tmp_path, database_url, nats_url, metrics_port=metrics_port)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDJOBS_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vidjobs.reaper", env={**env, **settings.to_env(), "VIDJOBS_LOG_FORMAT": "json"},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    return proc, metrics_port


async def _away_then_back(proxy: FaultProxy, proc: asyncio.subprocess.Process, metrics_port: int, part: str) -> str:
    """The reaper's log, once it outlived the part's absence, served after its return and stopped cleanly."""
    try:
        await asyncio.sleep(AWAY_S)
        assert proc.returncode is None, f"the reaper exited with {proc.returncode} while {part} was away"
        proxy.heal()
        await wait_until(lambda: _healthy(metrics_port), within=60, what="the reaper to serve /healthz")
    finally:
        if proc.returncode is None:
            proc.terminate()
        _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()[-3000:]
    return err.decode()


async def test_a_worker_started_as_its_database_goes_away_waits_for_it_and_serves(tmp_path, own_postgres, nats_url):
    database_url = await own_database(own_postgres)
    target = urlsplit(database_url)
    async with FaultProxy(target.hostname or "127.0.0.1", target.port or 0) as proxy:
        # The database answers the start's first look, then is gone for the next connects (a restart beginning).
        proxy.refuse_after(1)
        proc, metrics_port = await _start_reaper(tmp_path, proxy.url_for(database_url), nats_url)
        err = await _away_then_back(proxy, proc, metrics_port, "the database")

    waits = [line for line in map(_json, err.splitlines())
             if line and line.get("msg") == "could not start yet; trying again"]
    assert waits, err[-3000:]  # each wait is logged, saying what failed and when it tries again
    assert {"step", "error", "delay_s"} <= set(waits[0]), waits[0]


async def test_a_worker_started_while_nats_is_away_waits_for_it_and_serves(tmp_path, database_url, nats_url):
    target = urlsplit(nats_url)
    async with FaultProxy(target.hostname or "127.0.0.1", target.port or 0) as proxy:
        proxy.refuse_after(0)  # NATS refuses from the first connect
        proc, metrics_port = await _start_reaper(tmp_path, database_url, proxy.url_for(nats_url))
        await _away_then_back(proxy, proc, metrics_port, "NATS")


def _json(line: str) -> dict | None:
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
