"""A provider callback is parsed once: the gateway parses it as it verifies it and stores the signal with the
inbox row, and the poller acts on the stored signal. A row stored without one (before the inbox kept signals,
or by a gateway of the release before during a rollout) is still handled: the poller parses its raw body."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import msgspec
import pytest

from tests.gateway_harness import Harness, drive, gateway_settings, running_gateway
from tests.support import wait_until
from vidjobs.common import outbox, signatures
from vidjobs.common.events import InboxReceived
from vidjobs.common.runtime import open_runtime
from vidjobs.common.settings import Settings
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate
from vidjobs.poller import worker as poller
from vidjobs.providers.base import ProviderSignal, ProviderState
from vidjobs.providers.fake.adapter import FakeAdapter


class Parses:
    """Every call of the fake adapter's callback parser, in the gateway and the poller alike (both run in
    this process), by the render id it read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch):
        self.render_ids: list[str] = []
        parse: Callable[[FakeAdapter, bytes], ProviderSignal] = FakeAdapter.parse_callback

        def counted(adapter: FakeAdapter, body: bytes) -> ProviderSignal:
            sig = parse(adapter, body)
            self.render_ids.append(sig.provider_job_id)
            return sig

        monkeypatch.setattr(FakeAdapter, "parse_callback", counted)


def running_callback(job_id: str, render_id: str) -> bytes:
    """What the fake provider posts when a render starts."""
    render = {"id": render_id, "status": "running", "progress": 0.25, "metadata": {"job_id": job_id, "attempt": 1}}
    return json.dumps({"type": "render.running", "data": render}).encode()


@asynccontextmanager
async def running_poller(settings: Settings) -> AsyncIterator[None]:
    async with open_runtime("poller", settings) as rt:
        task = asyncio.create_task(poller.main(rt))
        try:
            yield
        finally:
            rt.stop.set()
            await asyncio.wait_for(task, timeout=30)


async def submitted_job(h: Harness, render_id: str) -> str:
    """A job of ours the submitter has started as `render_id` (attempt 1)."""
    _, job = await h.post_job(await h.key())
    await drive(h.pool, job["id"], JobStatus.SUBMITTED, update=JobUpdate(provider_job_id=render_id))
    return str(job["id"])


async def rendering(h: Harness, job_id: str) -> bool:
    return await h.pool.fetchval("SELECT status FROM jobs WHERE id = $1", job_id) == JobStatus.PROCESSING.value


@pytest.fixture
def settings(tmp_path, database_url, nats_url) -> Settings:
    return gateway_settings(tmp_path, database_url, nats_url)


async def test_a_callback_through_the_gateway_and_the_poller_is_parsed_once(settings, monkeypatch):
    parses = Parses(monkeypatch)
    async with running_gateway(settings) as h, running_poller(settings):
        job_id = await submitted_job(h, "rnd_once")
        body = running_callback(job_id, "rnd_once")

        resp = await h.client.post("/v1/webhooks/fake", data=body, headers={
            "Content-Type": "application/json", **signatures.signed_headers(settings.fake_webhook_secret, body)})
        assert resp.status == 200 and (await resp.json())["stored"] is True

        await wait_until(lambda: rendering(h, job_id), within=20, what="the poller to act on the callback")
        stored = await h.pool.fetchval("SELECT signal::text FROM webhook_inbox")
        assert msgspec.json.decode(stored, type=ProviderSignal) == ProviderSignal(
            provider_job_id="rnd_once", state=ProviderState.RUNNING, job_id=job_id, attempt=1, progress=0.25)
        assert await h.pool.fetchval("SELECT progress FROM jobs WHERE id = $1", job_id) == 0.25
    assert parses.render_ids == ["rnd_once"]  # the gateway's parse; the poller read what it stored


async def test_a_row_stored_without_its_signal_is_parsed_by_the_poller(settings, monkeypatch):
    parses = Parses(monkeypatch)
    async with running_gateway(settings) as h, running_poller(settings):
        job_id = await submitted_job(h, "rnd_old")
        # As a gateway of the release before stores a callback: the raw body only, and its message.
        async with h.pool.acquire() as conn, conn.transaction():
            inbox_id = await conn.fetchval(
                "INSERT INTO webhook_inbox (provider, webhook_id, payload) VALUES ('fake', 'msg_old', $1) RETURNING id",
                running_callback(job_id, "rnd_old"))
            await outbox.add(conn, [InboxReceived(inbox_id=inbox_id, provider="fake")])

        await wait_until(lambda: rendering(h, job_id), within=20, what="the poller to act on the old row")
        assert await h.pool.fetchval("SELECT signal FROM webhook_inbox WHERE id = $1", inbox_id) is None
    assert parses.render_ids == ["rnd_old"]  # the poller's parse of the raw body
