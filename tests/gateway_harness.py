"""The gateway on a real loopback port, over this test's own PostgreSQL database, nats-server and filesystem
storage; helpers shared by the gateway tests (each test module makes its own small fixtures from them)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import secrets
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import msgspec
from aiohttp.test_utils import TestClient, TestServer

from vidjobs.cli.embedded import free_port
from vidjobs.common import changes, creation, events
from vidjobs.common.bus import Delivery
from vidjobs.common.events import UploadReceived
from vidjobs.common.jobs import JobRequest, JobRow
from vidjobs.common.renders import Outputs, StoredFile
from vidjobs.common.settings import Settings
from vidjobs.common.signatures import new_secret
from vidjobs.common.states import JobStatus
from vidjobs.common.transitions import JobUpdate, transition
from vidjobs.gateway.accounts import create_account
from vidjobs.gateway.app import create_app
from vidjobs.gateway.sealing import new_key as new_secrets_key
from vidjobs.gateway.state import GATEWAY, Gateway
from vidjobs.media import assets, quarantine

JOB_BODY = {"model": "fake/default", "prompt": "a red fox in snow", "duration_s": 5, "aspect_ratio": "16:9",
            "resolution": "720p", "seed": 7, "negative_prompt": None, "input_image": None, "params": {}}


def gateway_settings(tmp: Path, database_url: str, nats_url: str, **overrides: Any) -> Settings:
    return Settings(
        data_dir=str(tmp / "data"), database_url=database_url, nats_url=nats_url,
        storage_url=f"file://{tmp / 'objects'}", http_port=free_port(),
        # Nothing listens there: these tests never reach a provider.
        fake_provider_url=f"http://127.0.0.1:{free_port()}", fake_webhook_secret=new_secret(),
        signing_secret=secrets.token_urlsafe(24), recovery_delay_s=3600, log_format="text", fake_provider="on",
        secrets_key=new_secrets_key(),
    ).with_(**overrides)


@dataclass
class Harness:
    settings: Settings
    client: TestClient
    app: Any

    @property
    def gw(self) -> Gateway:
        return self.app[GATEWAY]

    @property
    def pool(self) -> asyncpg.Pool:
        return self.gw.rt.pool

    async def account(self, *, credits: int = 100_000, concurrency: int = 2, **limits: Any) -> tuple[str, str]:
        """(account_id, api_key) of a new account; `limits` are create_account's (requests_per_s, ...)."""
        async with self.pool.acquire() as conn:
            return await create_account(conn, f"t-{secrets.token_hex(3)}", credits=credits, concurrency=concurrency,
                                        **limits)

    async def key(self, **kwargs: Any) -> str:
        return (await self.account(**kwargs))[1]

    async def post_job(self, key: str, body: Any = None, *, headers: dict[str, str] | None = None,
                       **changes: Any) -> tuple[int, Any]:
        payload = {**JOB_BODY, **changes} if body is None else body
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        resp = await self.client.post("/v1/jobs", data=data, headers={
            **auth(key), "Content-Type": "application/json", **(headers or {})})
        return resp.status, await resp.json()

    async def get(self, key: str | None, path: str) -> tuple[int, Any]:
        resp = await self.client.get(path, headers=auth(key) if key else {})
        return resp.status, (await resp.json() if resp.content_type == "application/json" else None)

    async def count(self, sql: str, *args: Any) -> int:
        return await self.pool.fetchval(sql, *args)


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@asynccontextmanager
async def running_gateway(settings: Settings) -> AsyncIterator[Harness]:
    app = create_app(settings)
    async with TestClient(TestServer(app, host=settings.http_host, port=settings.http_port)) as client:
        yield Harness(settings=settings, client=client, app=app)


@dataclass
class RawAnswer:
    status: int
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def raw_request(h: Harness, method: str, target: bytes, headers: list[tuple[bytes, bytes]],
                      body: bytes = b"") -> RawAnswer:
    """One request written byte for byte on a socket, for what no HTTP client will send: header values
    that are not ASCII, a target exactly as given. Answers are read to the close (no chunked bodies)."""
    lines = [f"{method} ".encode() + target + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close",
             b"Content-Length: " + str(len(body)).encode(), *(name + b": " + value for name, value in headers)]
    reader, writer = await asyncio.open_connection(h.settings.http_host, h.settings.http_port)
    try:
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n" + body)
        await writer.drain()
        answer = await reader.read()
    finally:
        writer.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    return RawAnswer(status=int(head.split(b" ", 2)[1]), body=rest)


def assert_no_traceback(caplog: Any) -> None:
    """Nothing was logged as an unhandled error: a refused request is no fault of ours."""
    faults = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not faults, [(r.name, r.getMessage()) for r in faults]


def assert_error(body: Any, code: str, *mentions: str) -> None:
    """The one error shape, with the given code, whose message names each of `mentions`, and the request's id."""
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "retryable", "request_id"}, body
    assert isinstance(body["error"]["request_id"], str) and body["error"]["request_id"], body
    assert body["error"]["code"] == code, body
    assert isinstance(body["error"]["retryable"], bool)
    for word in mentions:
        assert word in body["error"]["message"], body


async def drive(pool: asyncpg.Pool, job_id: str, *path: JobStatus, update: JobUpdate | None = None,
                outputs: Outputs | None = None) -> JobRow:
    """Move a job through `path` with the real transition function, as the workers would; `outputs` are
    recorded with the last move, in its transaction, as the media service records a render's files."""
    moved = None
    async with pool.acquire() as conn:
        for to in path:
            last = to is path[-1]
            # As a worker's Runtime.tx does it: the change hints go out once the move commits, not before.
            async with changes.after_commit(), conn.transaction():
                moved = await transition(conn, job_id, to, reason=f"test: {to}", update=update if last else None)
                assert moved is not None, f"{job_id} could not move to {to}"
                if last and outputs is not None:
                    await assets.upsert(conn, job_id, moved.job.account_id, outputs)
    assert moved is not None
    return moved.job


async def store_outputs(h: Harness, account_id: str, job_id: str, *, video: bytes,
                        thumbnail: bytes = b"\xff\xd8\xff\xe0thumb", preview: bytes | None = None) -> Outputs:
    """Files in storage and the outputs that name them, as the media service would make them."""
    prefix = f"accounts/{account_id}/jobs/{job_id}/"
    files = {"video": ("video.mp4", video, "video/mp4"), "thumbnail": ("thumb.jpg", thumbnail, "image/jpeg")}
    if preview is not None:
        files["preview"] = ("preview.mp4", preview, "video/mp4")
    stored = {}
    for kind, (name, body, content_type) in files.items():
        await h.gw.storage.put_bytes(prefix + name, body, content_type)
        stored[kind] = StoredFile(key=prefix + name, content_type=content_type, bytes=len(body),
                                  sha256=hashlib.sha256(body).hexdigest())
    video_file = msgspec.structs.replace(stored["video"], width=1280, height=720, duration_s=1.0)
    return Outputs(video=video_file, thumbnail=stored["thumbnail"], preview=stored.get("preview"))


async def completed_job(h: Harness, account_id: str, *, video: bytes = b"\x00\x00\x00\x18ftypmp42" + bytes(4096),
                        ) -> JobRow:
    """A job that rendered and whose files are in storage."""
    async with h.pool.acquire() as conn, conn.transaction():
        job = await creation.create(conn, account_id=account_id,
                                    request=JobRequest(model="fake/default", prompt="done"),
                                    estimated_credits=10, recovery_delay_s=3600)
    outputs = await store_outputs(h, account_id, job.id, video=video)
    return await drive(h.pool, job.id, JobStatus.SUBMITTED, JobStatus.DOWNLOADING, JobStatus.COMPLETED,
                       update=JobUpdate(actual_credits=10), outputs=outputs)


async def decode_upload(h: Harness, upload_id: str) -> None:
    """Decode a processing upload with the media worker's own handler, as its consumer would (no media
    process runs beside the harness's gateway)."""
    received = quarantine.Quarantine.of(h.gw.rt, h.gw.storage)
    await quarantine.on_upload_received(received, UploadReceived(upload_id=upload_id),
                                        Delivery(attempt=1, subject=events.UPLOADS))


async def read_event(resp: aiohttp.ClientResponse) -> tuple[str, dict] | None:
    """The next SSE event (keepalive comments skipped), or None when the stream ends."""
    name, data = "message", []
    while True:
        line = await resp.content.readline()
        if not line:
            return None
        text = line.decode().rstrip("\r\n")
        if text == "" and data:
            return name, json.loads("\n".join(data))
        if text.startswith("event:"):
            name = text[6:].strip()
        elif text.startswith("data:"):
            data.append(text[5:].strip())
