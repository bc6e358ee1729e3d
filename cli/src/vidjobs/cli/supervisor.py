"""Runs each vidjobs service as its own process and restarts any that dies, with backoff.

Used by `vidjobs up` and by the tests, so the tests exercise the very processes a person runs. Each service
starts in a session of its own and, on Linux, dies with the supervisor (vidjobs.cli.processes): Ctrl-C reaches
the supervisor alone, which stops the services itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from vidjobs.cli.processes import child_options

log = logging.getLogger("vidjobs.supervisor")

# Module to run for each service, in start order: the fake provider first so submissions find it.
SERVICES: dict[str, str] = {
    "fake-provider": "vidjobs.fakeprovider",
    "gateway": "vidjobs.gateway",
    "submitter": "vidjobs.submitter",
    "poller": "vidjobs.poller",
    "media": "vidjobs.media",
    "reaper": "vidjobs.reaper",
}

# Settings only the gateway is given: the key that opens the webhook signing secrets kept in the database
# (vidjobs.gateway.sealing). A worker has no use for it, so a compromised worker cannot leak it.
GATEWAY_ONLY = frozenset({"VIDJOBS_SECRETS_KEY"})


@dataclass
class Child:
    name: str
    module: str
    proc: asyncio.subprocess.Process | None = None
    restarts: int = 0
    started_at: float = 0.0
    wanted: bool = True  # False while deliberately stopped
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)


class Supervisor:
    def __init__(self, env: dict[str, str], *, services: dict[str, str] | None = None, restart: bool = True,
                 env_for: dict[str, dict[str, str]] | None = None,
                 on_start: Callable[[str, int], None] | None = None):
        """`env_for` adds to one service's environment: each service its own VIDJOBS_DATABASE_URL, for one.
        `on_start` is told each service's name and pid as it starts (restarts too)."""
        self._env = {**os.environ, **env}
        self._on_start = on_start
        self._env_for = env_for or {}
        self._restart = restart
        self.children = {name: Child(name, module) for name, module in (services or SERVICES).items()}
        self._closing = False

    async def start_all(self) -> None:
        for name in self.children:
            await self.start(name)

    async def start(self, name: str) -> None:
        child = self.children[name]
        child.wanted = True
        child.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", child.module, env=self.env(name), stdin=asyncio.subprocess.DEVNULL,
            **child_options(),
        )
        child.started_at = time.monotonic()
        log.info("started %s (pid %s)", name, child.proc.pid)
        if self._on_start:
            self._on_start(name, child.proc.pid)
        child.watcher = asyncio.create_task(self._watch(child), name=f"watch-{name}")

    def env(self, name: str) -> dict[str, str]:
        env = {**self._env, **self._env_for.get(name, {})}
        if name != "gateway":
            env = {k: v for k, v in env.items() if k not in GATEWAY_ONLY}
        return env

    async def _watch(self, child: Child) -> None:
        assert child.proc is not None
        code = await child.proc.wait()
        if self._closing or not child.wanted or not self._restart:
            return
        # Crash-looping services back off; one that ran a while restarts at once.
        ran_for = time.monotonic() - child.started_at
        child.restarts = 0 if ran_for > 30 else child.restarts + 1
        delay = min(0.2 * 2 ** child.restarts, 10.0)
        log.warning("%s exited with %s; restarting in %.1fs", child.name, code, delay)
        await asyncio.sleep(delay)
        if not self._closing and child.wanted:
            await self.start(child.name)

    async def stop(self, name: str, *, sig: int = signal.SIGTERM, restart: bool = False, grace_s: float = 15) -> None:
        """Stop one service (SIGKILL to simulate a crash). With restart=True the supervisor brings it back."""
        child = self.children[name]
        child.wanted = restart
        proc = child.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def close(self, grace_s: float = 15) -> None:
        self._closing = True
        names = list(self.children)
        # Stop the entry point first so nothing new arrives, then the workers, the provider last.
        await asyncio.gather(*(self.stop(n, grace_s=grace_s) for n in names if n != "fake-provider"))
        if "fake-provider" in self.children:
            await self.stop("fake-provider", grace_s=grace_s)
        for child in self.children.values():
            if child.watcher:
                child.watcher.cancel()

    def pid(self, name: str) -> int | None:
        proc = self.children[name].proc
        return proc.pid if proc and proc.returncode is None else None
