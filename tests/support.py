"""Helpers shared by tests."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import NamedTuple
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from vidjobs.cli.processes import command_line


def with_database(url: str, name: str) -> str:
    """The same server URL pointing at another database (keeps host, socket query and credentials)."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


async def wait_until(predicate, *, within: float = 30.0, interval: float = 0.1, what: str = "condition"):
    """Poll an async predicate until it returns something truthy; fail naming `what` if it never does."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = await predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}; last value: {value!r}")
        await asyncio.sleep(interval)


class Run(NamedTuple):
    code: int
    out: str
    err: str


def operator_command(database_url: str, nats_url: str = "", **settings: str) -> Callable[..., Awaitable[Run]]:
    """`vidjobs ...` as an operator runs it, on this database (and NATS), with no other VIDJOBS_* setting than
    `settings` (storage_url="file:///...", say)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIDJOBS_")}
    env.update(VIDJOBS_DATABASE_URL=database_url, VIDJOBS_NATS_URL=nats_url)
    env.update({f"VIDJOBS_{name.upper()}": value for name, value in settings.items()})

    async def run(*args: str) -> Run:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vidjobs.cli", *args, env=env, cwd=Path(__file__).resolve().parents[1],
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate()
        return Run(proc.returncode, out.decode(), err.decode())

    return run


async def wait_process_ready(url: str, proc: asyncio.subprocess.Process) -> None:
    """Until the service process started as `proc` answers /readyz at `url`; fails at once if it exits."""
    async with aiohttp.ClientSession() as session:

        async def ready() -> bool:
            assert proc.returncode is None, "the process exited before it was ready"
            try:
                async with session.get(f"{url}/readyz") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await wait_until(ready, within=60, what="the process to be ready")


def processes_running(marker: str) -> list[int]:
    """The processes running now (zombies aside) whose command line holds `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and marker in (command_line(int(entry.name)) or ""):
            found.append(int(entry.name))
    return found
