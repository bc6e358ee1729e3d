"""The whole stack for end-to-end tests: every service as its own process (as `vidjobs up` runs them) over
this test's own PostgreSQL database and nats-server, the filesystem backend and the fake provider."""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from tests.support import wait_until
from vidjobs.cli.embedded import free_port
from vidjobs.cli.supervisor import Supervisor
from vidjobs.cli.up import allow_downloads_from, wait_ready
from vidjobs.common import db
from vidjobs.common.settings import Settings
from vidjobs.common.signatures import new_secret
from vidjobs.common.states import TERMINAL, JobStatus, is_legal
from vidjobs.gateway.sealing import new_key as new_secrets_key


class Stack:
    def __init__(self, settings: Settings, supervisor: Supervisor, session: aiohttp.ClientSession, key: str):
        self.settings = settings
        self.supervisor = supervisor
        self.session = session
        self.key = key

    @property
    def url(self) -> str:
        return self.settings.gateway_url

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def as_key(self, key: str) -> Stack:
        """The same stack, spoken to with another account's key."""
        return Stack(self.settings, self.supervisor, self.session, key)

    async def create_job(self, **body: Any) -> dict:
        payload = {"model": "fake/default", "prompt": "a red fox in snow", "duration_s": 1, **body}
        async with self.session.post(f"{self.url}/v1/jobs", json=payload, headers=self.auth) as resp:
            data = await resp.json()
            assert resp.status == 201, data
            return data

    async def job(self, job_id: str) -> dict:
        async with self.session.get(f"{self.url}/v1/jobs/{job_id}", headers=self.auth) as resp:
            data = await resp.json()
            assert resp.status == 200, data
            return data

    async def trail(self, job_id: str) -> list[dict]:
        async with self.session.get(f"{self.url}/v1/jobs/{job_id}/events", headers=self.auth) as resp:
            assert resp.status == 200
            return (await resp.json())["data"]

    async def wait_for_status(self, job_id: str, *statuses: str, within: float = 60) -> dict:
        async def reached():
            job = await self.job(job_id)
            return job if job["status"] in statuses else None

        return await wait_until(reached, within=within, what=f"{job_id} to reach {statuses}")

    async def wait_terminal(self, job_id: str, within: float = 60) -> dict:
        return await self.wait_for_status(job_id, *(s.value for s in TERMINAL), within=within)

    async def upload(self, data: bytes, content_type: str = "image/png") -> dict:
        """Upload an image; the upload as POST /v1/uploads answers it (still processing)."""
        async with self.session.post(f"{self.url}/v1/uploads", data=data,
                                     headers={**self.auth, "Content-Type": content_type}) as resp:
            body = await resp.json()
            assert resp.status == 201, body
            return body

    async def wait_upload(self, upload_id: str, within: float = 30) -> dict:
        """The upload once the media worker has decided it (ready or rejected)."""
        async def decided():
            async with self.session.get(f"{self.url}/v1/uploads/{upload_id}", headers=self.auth) as resp:
                body = await resp.json()
                assert resp.status == 200, body
                return body if body["status"] != "processing" else None

        return await wait_until(decided, within=within, what=f"{upload_id} to be decoded")

    async def ready_upload(self, data: bytes, content_type: str = "image/png") -> dict:
        """Upload an image and wait until a job may name it."""
        upload = await self.wait_upload((await self.upload(data, content_type))["id"])
        assert upload["status"] == "ready", upload
        return upload

    async def counters(self) -> dict:
        async with self.session.get(f"{self.settings.fake_provider_url}/v1/_counters") as resp:
            return await resp.json()

    async def metrics(self, service: str) -> str:
        """A service's /metrics as Prometheus would scrape it: the gateway's on the API port, a worker's on
        the free port it bound (read from its own process)."""
        url = f"{self.url}/metrics" if service == "gateway" else f"http://127.0.0.1:{self.metrics_port(service)}/metrics"
        async with self.session.get(url) as resp:
            assert resp.status == 200, service
            return await resp.text()

    def metrics_port(self, service: str) -> int:
        import psutil

        pid = self.supervisor.pid(service)
        listening = [c.laddr.port for c in psutil.Process(pid).net_connections() if c.status == "LISTEN"]
        assert len(listening) == 1, listening
        return listening[0]

    async def download(self, url: str) -> tuple[int, bytes, dict]:
        async with self.session.get(url) as resp:
            return resp.status, await resp.read(), dict(resp.headers)


def assert_legal_trail(trail: list[dict]) -> None:
    """Every move in an audit trail is in the table, each starts where the previous ended, and nothing
    follows a terminal state."""
    previous: JobStatus | None = None
    for i, move in enumerate(trail):
        source = None if move["from"] is None else JobStatus(move["from"])
        target = JobStatus(move["to"])
        assert source == previous, f"move {i} starts at {source}, previous ended at {previous}: {trail}"
        assert is_legal(source, target), f"illegal move {source} -> {target}: {trail}"
        previous = target


async def assert_every_trail_legal(database_url: str) -> None:
    """Whatever a test did, every job's audit trail in the database holds only legal moves."""
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT job_id, from_status, to_status, at, reason FROM job_transitions ORDER BY id")
    finally:
        await conn.close()
    trails: dict[str, list[dict]] = {}
    for r in rows:
        trails.setdefault(r["job_id"], []).append({"from": r["from_status"], "to": r["to_status"]})
    for trail in trails.values():
        assert_legal_trail(trail)


def stack_settings(tmp: Path, database_url: str, nats_url: str, **overrides: Any) -> Settings:
    """Settings for a test's own stack. Downloads are allowed from the fake provider, as `vidjobs up` allows
    them; a `download_allow_hosts` override adds to that (a stand-in provider's host:port)."""
    settings = Settings(
        data_dir=str(tmp / "data"), database_url=database_url, nats_url=nats_url,
        storage_url=f"file://{tmp / 'objects'}", http_port=free_port(),
        fake_provider_url=f"http://127.0.0.1:{free_port()}", fake_webhook_secret=new_secret(),
        signing_secret=secrets.token_urlsafe(24), recovery_delay_s=30, recovery_interval_s=30,
        fake_provider="on", secrets_key=new_secrets_key(),
    ).with_(**overrides)
    return settings.with_(
        download_allow_hosts=allow_downloads_from(settings.download_allow_hosts, settings.fake_provider_url))


def host_port(url: str) -> str:
    """A server's `host:port`, as VIDJOBS_DOWNLOAD_ALLOW_HOSTS lists it."""
    return allow_downloads_from("", url)


async def demo_key(database_url: str, **limits: Any) -> str:
    """A key of a fresh account. By default its limits stay out of the way (many slots, a fast request rate),
    so a test about something else is not shaped by them; tests of the limits pass their own."""
    from vidjobs.gateway.accounts import create_account

    options = {"credits": 1_000_000, "concurrency": 64, "requests_per_s": 1000.0, "request_burst": 1000, **limits}
    conn = await asyncpg.connect(database_url)
    try:
        async with conn.transaction():
            _, key = await create_account(conn, f"test-{secrets.token_hex(3)}", **options)
        return key
    finally:
        await conn.close()


async def _healthy(session: aiohttp.ClientSession, base: str) -> bool:
    try:
        async with session.get(f"{base}/healthz") as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


@asynccontextmanager
async def running_stack(
    settings: Settings, *, key: str | None = None, services: dict[str, str] | None = None,
    supervisor_factory: Callable[..., Supervisor] = Supervisor,
) -> AsyncIterator[Stack]:
    """The stack until the block exits. `supervisor_factory` makes the Supervisor (the fault suite's sends each
    service's output to a file of its own)."""
    await db.migrate(settings.database_url)
    key = key or await demo_key(settings.database_url)
    supervisor = supervisor_factory(settings.to_env(), services=services)
    await supervisor.start_all()
    try:
        async with aiohttp.ClientSession() as session:
            await wait_ready(settings.gateway_url, supervisor, timeout_s=60)
            await wait_until(lambda: _healthy(session, settings.fake_provider_url), within=30, what="fake provider")
            yield Stack(settings, supervisor, session, key)
        await assert_every_trail_legal(settings.database_url)
    finally:
        await supervisor.close(grace_s=10)
        await asyncio.sleep(0)
