"""The fake provider: a real HTTP server that behaves like a generative-video provider and renders real MP4s.

Routes (JSON unless said otherwise; errors are `{"error": {"code", "message", "param"}}`):
  POST /v1/renders                   start a render; `Idempotency-Key` honoured (201 new, 200 replayed)
  GET  /v1/renders?idempotency_key=&job_id=   `{"data": [render, ...]}`
  GET  /v1/renders/{id}              one render
  POST /v1/renders/{id}/cancel       the render, canceled unless it had already finished
  GET  /outputs/{id}.mp4             the rendered clip (video/mp4)
  GET  /v1/_counters                 what was asked for and done, so tests can prove nothing ran twice
  GET  /healthz

`params.scenario` picks a behaviour from API.md's table and `params.render_s` how long rendering takes;
`params.output_mb` pads the served MP4 to that many megabytes with a trailing `free` box (still a valid MP4),
streamed without holding it in memory, so large copies can be tested. A finished render reports what it was
billed (`cost_usd`): `params.cost_usd`, or by default USD_PER_SECOND of video.
An `input_image_url` is fetched over HTTP when the render starts, as a real provider would, and must decode as
an image; if it cannot be fetched or read, the render fails with `invalid_request`. The image's mean colour
tints the clip, and what was fetched is recorded in the counters (`input_images`, by job).
Callbacks are POSTed to `callback_url` as `{"type": "render.<status>", "timestamp", "data": render}`, signed
with Standard Webhooks headers and retried with backoff on connection errors, 429 and 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import aiohttp
import msgspec
from aiohttp import web

from vidjobs.common import ids, signatures
from vidjobs.fakeprovider.render import ClipSpec, clip_size, inspect_image, render_mp4

log = logging.getLogger("vidjobs.fake_provider")

RETRY_AFTER_S = 1  # what a refused submit is told to wait
REFUSALS_PER_JOB = 2  # rate_limit_then_succeed / unavailable_then_succeed refuse this many submits first
NOT_A_VIDEO = b"<html><body>502 Bad Gateway</body></html>\n"  # what bad_output serves as its "video"
# What unsafe_output reports as its render: the cloud metadata service, which a downloader must never fetch.
UNSAFE_OUTPUT_URL = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
MAX_INPUT_IMAGE_BYTES = 20 * 1024 * 1024  # larger input images are refused, as real providers do


class Scenario(enum.StrEnum):
    SUCCEED = "succeed"
    DUPLICATE_CALLBACKS = "duplicate_callbacks"
    NO_CALLBACK = "no_callback"
    RATE_LIMIT_THEN_SUCCEED = "rate_limit_then_succeed"
    UNAVAILABLE_THEN_SUCCEED = "unavailable_then_succeed"
    CONTENT_REJECTED = "content_rejected"
    FAIL_ALWAYS = "fail_always"
    HANG = "hang"
    BAD_OUTPUT = "bad_output"
    EXPIRED_OUTPUT = "expired_output"
    UNSAFE_OUTPUT = "unsafe_output"
    # The first submit of a key is accepted, but its answer is lost: it comes after the caller's timeout
    # (`params.answer_after_s`), or the connection is closed without one. Replays of the key answer at once.
    ACCEPT_THEN_TIMEOUT = "accept_then_timeout"
    ACCEPT_THEN_DROP = "accept_then_drop"


class RenderStatus(enum.StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


FINISHED = frozenset({RenderStatus.SUCCEEDED, RenderStatus.FAILED, RenderStatus.CANCELED})


# --- the wire: what clients send and what they get back ------------------------------------------------


class RenderParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    scenario: Scenario = Scenario.SUCCEED
    render_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 3.0
    output_mb: Annotated[int, msgspec.Meta(ge=0, le=2048)] = 0
    # What a finished render is billed, reported with it; by default USD_PER_SECOND of video.
    cost_usd: Annotated[float, msgspec.Meta(ge=0, le=1000)] | None = None
    # accept_then_timeout: how long the accepted submit's answer is held back.
    answer_after_s: Annotated[float, msgspec.Meta(ge=0, le=600)] = 45.0
    # False: the adapter cannot look renders up (as at providers without a list or key lookup).
    lookup: bool = True


USD_PER_SECOND = 0.10  # the fake's list price per second of video


def billed(req: CreateRender) -> float:
    given = req.params.cost_usd
    return round(req.duration_s * USD_PER_SECOND, 4) if given is None else given


class Metadata(msgspec.Struct, kw_only=True):
    """Echoed back on every read and callback, so the caller can find its own job."""

    job_id: str | None = None
    attempt: int | None = None


class CreateRender(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    model: str
    prompt: Annotated[str, msgspec.Meta(min_length=1, max_length=4000)]
    duration_s: Annotated[float, msgspec.Meta(gt=0, le=60)] = 5.0
    aspect_ratio: Literal["16:9", "9:16", "1:1"] = "16:9"
    resolution: Literal["480p", "720p", "1080p"] = "720p"
    seed: int | None = None
    negative_prompt: str | None = None
    input_image_url: str | None = None
    params: RenderParams = msgspec.field(default_factory=RenderParams)
    callback_url: str | None = None
    metadata: Metadata = msgspec.field(default_factory=Metadata)


class RenderError(msgspec.Struct):
    code: str  # content_policy_violation | render_failed | invalid_request
    message: str


class RenderOut(msgspec.Struct, kw_only=True):
    id: str
    object: str = "render"
    model: str
    status: RenderStatus
    progress: float
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    duration_s: float
    width: int
    height: int
    seed: int
    output_url: str | None
    error: RenderError | None
    cost_usd: float | None  # what the render was billed, once it succeeded
    metadata: Metadata
    idempotency_key: str | None


class RenderList(msgspec.Struct):
    data: list[RenderOut]


class CallbackEvent(msgspec.Struct):
    type: str  # render.running | render.succeeded | render.failed | render.canceled
    timestamp: datetime
    data: RenderOut


class FetchedImage(msgspec.Struct, kw_only=True):
    """An input image as the provider fetched and decoded it."""

    render_id: str
    sha256: str
    bytes: int
    format: str
    width: int
    height: int


class Counters(msgspec.Struct, kw_only=True):
    submissions_by_job: dict[str, int] = msgspec.field(default_factory=dict)  # every POST, by metadata.job_id
    submissions_by_key: dict[str, int] = msgspec.field(default_factory=dict)  # every POST, by Idempotency-Key
    refusals_by_job: dict[str, int] = msgspec.field(default_factory=dict)  # 429/503 answered by a scenario
    renders_by_job: dict[str, int] = msgspec.field(default_factory=dict)  # renders created (each runs once)
    renders_by_attempt: dict[str, int] = msgspec.field(default_factory=dict)  # by "<job_id>/<attempt>"
    lost_answers_by_job: dict[str, int] = msgspec.field(default_factory=dict)  # accept_then_timeout / _drop
    output_fetches: dict[str, int] = msgspec.field(default_factory=dict)  # GETs of an output, by render id
    callbacks_by_render: dict[str, int] = msgspec.field(default_factory=dict)  # deliveries answered 2xx
    input_images: dict[str, FetchedImage] = msgspec.field(default_factory=dict)  # by job (or render) id


def _bump(counter: dict[str, int], key: str | None) -> None:
    if key is not None:
        counter[key] = counter.get(key, 0) + 1


class ApiFailure(Exception):
    """Answered as the provider's JSON error; raised from handlers and from the provider's own logic."""

    def __init__(self, status: int, code: str, message: str, *, param: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.code, self.message, self.param = status, code, message, param
        self.headers = headers or {}

    def response(self) -> web.Response:
        body = {"error": {"code": self.code, "message": self.message, "param": self.param}}
        return web.json_response(body, status=self.status, headers=self.headers)


# --- renders and their lifecycle -----------------------------------------------------------------------


@dataclass
class RenderRecord:
    id: str
    request: CreateRender
    clip: ClipSpec
    idempotency_key: str | None
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    status: RenderStatus = RenderStatus.QUEUED
    started_at: datetime | None = None
    started_mono: float | None = None
    finished_at: datetime | None = None
    settled_progress: float = 0.0  # the figure once the render stops moving
    error: RenderError | None = None
    output_gets: int = 0
    task: asyncio.Task | None = None
    deliveries: asyncio.Task | None = None  # the latest callback; the next one waits for it (keeps order)

    @property
    def scenario(self) -> Scenario:
        return self.request.params.scenario

    def progress(self, now_mono: float) -> float:
        """Elapsed over planned render time while running: the real figure, never an invented one."""
        if self.status is not RenderStatus.RUNNING or self.started_mono is None or self.scenario is Scenario.HANG:
            return self.settled_progress
        render_s = self.request.params.render_s
        done = 1.0 if render_s == 0 else (now_mono - self.started_mono) / render_s
        return round(min(done, 0.99), 3)  # 1.0 is reserved for a finished render


class BackgroundTasks:
    """Tasks a server starts and does not await (renders, callback deliveries): each is held until it ends, and
    `close` cancels and awaits what is left."""

    def __init__(self) -> None:
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


class FakeProvider(BackgroundTasks):
    """All state of one fake provider: its renders, its counters and its in-flight background work."""

    def __init__(self, *, webhook_secret: str, callback_attempts: int = 4, callback_backoff_s: float = 0.25):
        signatures.decode_secret(webhook_secret)  # a bad secret fails at start, not at the first callback
        self.webhook_secret = webhook_secret
        self.callback_attempts = callback_attempts
        self.callback_backoff_s = callback_backoff_s
        self.base_url = ""  # set once the server is listening
        self.renders: dict[str, RenderRecord] = {}
        self.by_key: dict[str, str] = {}
        self.counters = Counters()
        self.session: aiohttp.ClientSession | None = None
        BackgroundTasks.__init__(self)

    @property
    def url(self) -> str:
        return self.base_url

    def view(self, rec: RenderRecord) -> RenderOut:
        req = rec.request
        done = rec.status is RenderStatus.SUCCEEDED
        return RenderOut(
            id=rec.id, model=req.model, status=rec.status, progress=rec.progress(asyncio.get_running_loop().time()),
            created_at=rec.created_at, started_at=rec.started_at, finished_at=rec.finished_at,
            duration_s=req.duration_s, width=rec.clip.width, height=rec.clip.height, seed=rec.clip.seed,
            output_url=self.output_url(rec) if done else None, error=rec.error,
            cost_usd=billed(req) if done else None,
            metadata=req.metadata, idempotency_key=rec.idempotency_key,
        )

    def output_url(self, rec: RenderRecord) -> str:
        if rec.scenario is Scenario.UNSAFE_OUTPUT:
            return UNSAFE_OUTPUT_URL
        return f"{self.base_url}/outputs/{rec.id}.mp4"

    # submissions

    def submit(self, req: CreateRender, key: str | None) -> tuple[RenderRecord, bool]:
        """The render for this request and whether it already existed. No await inside: two concurrent
        submits with one key cannot both pass the lookup."""
        job_id = req.metadata.job_id
        _bump(self.counters.submissions_by_job, job_id)
        _bump(self.counters.submissions_by_key, key)
        if key is not None and key in self.by_key:
            return self.renders[self.by_key[key]], True
        self._maybe_refuse(req)
        rec = self._create(req, key)
        _bump(self.counters.renders_by_job, job_id)
        if job_id is not None:
            _bump(self.counters.renders_by_attempt, f"{job_id}/{req.metadata.attempt}")
        rec.task = self.spawn(self._run(rec), name=f"render-{rec.id}")
        log.info("render accepted", extra={"render_id": rec.id, "job_id": job_id, "scenario": rec.scenario.value})
        return rec, False

    def _maybe_refuse(self, req: CreateRender) -> None:
        scenario = req.params.scenario
        if scenario not in (Scenario.RATE_LIMIT_THEN_SUCCEED, Scenario.UNAVAILABLE_THEN_SUCCEED):
            return
        job_key = req.metadata.job_id or ""
        if self.counters.refusals_by_job.get(job_key, 0) >= REFUSALS_PER_JOB:
            return
        _bump(self.counters.refusals_by_job, job_key)
        if scenario is Scenario.RATE_LIMIT_THEN_SUCCEED:
            raise ApiFailure(429, "rate_limit_exceeded", "Too many concurrent renders for this account.",
                             headers={"Retry-After": str(RETRY_AFTER_S)})
        raise ApiFailure(503, "service_unavailable", "The render fleet is temporarily unavailable.")

    def _create(self, req: CreateRender, key: str | None) -> RenderRecord:
        width, height = clip_size(req.aspect_ratio)
        seed = req.seed if req.seed is not None else secrets.randbelow(2**31)  # reported back, so reproducible
        rec = RenderRecord(id=ids.new("rnd"), request=req, clip=ClipSpec(width, height, req.duration_s, seed),
                           idempotency_key=key)
        self.renders[rec.id] = rec
        if key is not None:
            self.by_key[key] = rec.id
        return rec

    # the render itself

    async def _run(self, rec: RenderRecord) -> None:
        if rec.request.input_image_url is not None and not await self._take_input_image(rec):
            return
        if rec.scenario is Scenario.CONTENT_REJECTED:
            # Moderation runs before any GPU time is spent, as at real providers.
            self._finish(rec, RenderStatus.FAILED, RenderError(
                "content_policy_violation", "The prompt was flagged by the content policy (category: violence)."))
            return
        self._start(rec)
        if rec.scenario is Scenario.HANG:
            return  # stays running with no progress, for ever
        try:
            await asyncio.gather(asyncio.sleep(rec.request.params.render_s), self._produce(rec))
        except Exception:  # whatever breaks in the renderer, the caller sees a failed render, as from any provider
            log.exception("render crashed", extra={"render_id": rec.id})
            self._finish(rec, RenderStatus.FAILED, RenderError("render_failed", "The renderer crashed; try again."))
            return
        if rec.scenario is Scenario.FAIL_ALWAYS:
            self._finish(rec, RenderStatus.FAILED, RenderError(
                "render_failed", "The render node ran out of GPU memory; try again."))
            return
        self._finish(rec, RenderStatus.SUCCEEDED)

    async def _take_input_image(self, rec: RenderRecord) -> bool:
        """Fetch and decode the input image; on failure the render fails, as the request was unusable."""
        url = rec.request.input_image_url
        assert url is not None
        try:
            data = await self._fetch_image(url)
            image = await asyncio.to_thread(inspect_image, data)
        except ValueError as exc:
            log.warning("input image unusable", extra={"render_id": rec.id, "error": str(exc)})
            self._finish(rec, RenderStatus.FAILED, RenderError("invalid_request", f"input_image_url: {exc}"))
            return False
        self.counters.input_images[rec.request.metadata.job_id or rec.id] = FetchedImage(
            render_id=rec.id, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data), format=image.format,
            width=image.width, height=image.height)
        rec.clip = msgspec.structs.replace(rec.clip, tint=image.mean)
        return True

    async def _fetch_image(self, url: str) -> bytes:
        """The image's bytes; ValueError naming what went wrong otherwise."""
        assert self.session is not None
        try:
            async with self.session.get(url) as resp:
                if resp.status != 200:
                    raise ValueError(f"fetching it answered HTTP {resp.status}")
                data = bytearray()
                async for chunk in resp.content.iter_chunked(64 * 1024):
                    data += chunk
                    if len(data) > MAX_INPUT_IMAGE_BYTES:
                        raise ValueError(f"it is larger than {MAX_INPUT_IMAGE_BYTES} bytes")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ValueError(f"it could not be fetched ({exc!r})") from exc
        return bytes(data)

    async def _produce(self, rec: RenderRecord) -> None:
        if rec.scenario is not Scenario.BAD_OUTPUT:
            await render_mp4(rec.clip)  # cached, so serving the output later costs nothing

    def _start(self, rec: RenderRecord) -> None:
        rec.status, rec.started_at = RenderStatus.RUNNING, datetime.now(UTC)
        rec.started_mono = asyncio.get_running_loop().time()
        self.notify(rec)

    def _finish(self, rec: RenderRecord, status: RenderStatus, error: RenderError | None = None) -> None:
        if rec.status in FINISHED:
            return  # canceled while the last step ran
        rec.settled_progress = 1.0 if status is RenderStatus.SUCCEEDED else rec.progress(
            asyncio.get_running_loop().time())
        rec.status, rec.error, rec.finished_at = status, error, datetime.now(UTC)
        log.info("render finished", extra={"render_id": rec.id, "status": status.value,
                                           "error": error.code if error else None})
        self.notify(rec)

    def cancel(self, rec: RenderRecord) -> None:
        if rec.status in FINISHED:
            return
        self._finish(rec, RenderStatus.CANCELED)
        if rec.task is not None:
            rec.task.cancel()

    # callbacks

    def notify(self, rec: RenderRecord) -> None:
        """Queue a signed callback with the render as it is now, after any earlier one for this render."""
        url = rec.request.callback_url
        if url is None or rec.scenario is Scenario.NO_CALLBACK:
            return
        event = CallbackEvent(type=f"render.{rec.status.value}", timestamp=datetime.now(UTC), data=self.view(rec))
        body = msgspec.json.encode(event)
        repeat = rec.scenario is Scenario.DUPLICATE_CALLBACKS and rec.status in FINISHED
        rec.deliveries = self.spawn(self._deliver_after(rec.deliveries, rec.id, url, body, repeat),
                                    name=f"callback-{rec.id}")

    async def _deliver_after(self, previous: asyncio.Task | None, render_id: str, url: str, body: bytes,
                             repeat: bool) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        msg_id = signatures.new_message_id()
        if not repeat:
            await self._deliver(render_id, url, body, msg_id)
            return
        # The same event three times: a re-emission under a new id racing the original, then a late retry of
        # the original (same id), as a provider that lost track of its acks would send.
        await asyncio.gather(self._deliver(render_id, url, body, msg_id),
                             self._deliver(render_id, url, body, signatures.new_message_id()))
        await asyncio.sleep(0.05)
        await self._deliver(render_id, url, body, msg_id)

    async def _deliver(self, render_id: str, url: str, body: bytes, msg_id: str) -> None:
        assert self.session is not None
        for attempt in range(1, self.callback_attempts + 1):
            headers = {"Content-Type": "application/json",
                       **signatures.signed_headers(self.webhook_secret, body, msg_id=msg_id)}
            outcome = await self._post(url, body, headers)
            if isinstance(outcome, int) and outcome < 300:
                _bump(self.counters.callbacks_by_render, render_id)
                log.info("callback delivered", extra={"render_id": render_id, "webhook_id": msg_id})
                return
            if isinstance(outcome, int) and outcome < 500 and outcome != 429:
                log.warning("callback refused", extra={"render_id": render_id, "status": outcome})
                return  # the receiver said no; asking again will not change its mind
            if attempt < self.callback_attempts:
                await asyncio.sleep(self.callback_backoff_s * 3 ** (attempt - 1))
        log.warning("callback undeliverable", extra={"render_id": render_id, "webhook_id": msg_id,
                                                     "last": str(outcome)})

    async def _post(self, url: str, body: bytes, headers: dict[str, str]) -> int | str:
        """The receiver's status code, or what went wrong on the way there."""
        assert self.session is not None
        try:
            async with self.session.post(url, data=body, headers=headers) as resp:
                return resp.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return repr(exc)


# --- HTTP ----------------------------------------------------------------------------------------------

PROVIDER = web.AppKey("provider", FakeProvider)


def _json(struct: msgspec.Struct, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=msgspec.json.encode(struct), status=status, content_type="application/json",
                        headers=headers)


def _record(request: web.Request) -> RenderRecord:
    rec = request.app[PROVIDER].renders.get(request.match_info["render_id"])
    if rec is None:
        raise ApiFailure(404, "not_found", "No such render.", param="id")
    return rec


_HINTS = {
    "params.scenario": "one of " + ", ".join(Scenario),
    "params.render_s": "seconds from 0 to 600",
    "params.cost_usd": "USD from 0 to 1000",
}


def _decode_render(raw: bytes) -> CreateRender:
    try:
        return msgspec.json.decode(raw, type=CreateRender)
    except msgspec.ValidationError as exc:
        # msgspec says "Expected `float` >= 0.0 - at `$.params.render_s`"; lead with the field's name.
        text, _, where = str(exc).partition(" - at `$.")
        param = where.rstrip("`") or None
        if param in _HINTS:
            text = f"{text}; {_HINTS[param]}"
        raise ApiFailure(422, "invalid_request", f"{param}: {text}" if param else text, param=param) from exc
    except msgspec.DecodeError as exc:
        raise ApiFailure(400, "invalid_request", f"The body is not valid JSON: {exc}") from exc


async def create_render(request: web.Request) -> web.Response:
    fp = request.app[PROVIDER]
    req = _decode_render(await request.read())
    rec, replayed = fp.submit(req, request.headers.get("Idempotency-Key") or None)
    headers = {"Idempotent-Replayed": "true"} if replayed else None
    if not replayed:
        await _lose_answer(request, rec)
    return _json(fp.view(rec), status=200 if replayed else 201, headers=headers)


async def _lose_answer(request: web.Request, rec: RenderRecord) -> None:
    """The render is accepted either way; what the caller hears of it is what these scenarios spoil."""
    if rec.scenario is Scenario.ACCEPT_THEN_TIMEOUT:
        _bump(request.app[PROVIDER].counters.lost_answers_by_job, rec.request.metadata.job_id)
        await asyncio.sleep(rec.request.params.answer_after_s)
    elif rec.scenario is Scenario.ACCEPT_THEN_DROP:
        _bump(request.app[PROVIDER].counters.lost_answers_by_job, rec.request.metadata.job_id)
        if request.transport is not None:
            request.transport.abort()
        raise ConnectionResetError("the answer to this submit is dropped on purpose")


async def list_renders(request: web.Request) -> web.Response:
    fp = request.app[PROVIDER]
    key, job_id = request.query.get("idempotency_key"), request.query.get("job_id")
    found = [rec for rec in fp.renders.values()
             if key in (None, rec.idempotency_key) and job_id in (None, rec.request.metadata.job_id)]
    return _json(RenderList(data=[fp.view(rec) for rec in found]))


async def get_render(request: web.Request) -> web.Response:
    return _json(request.app[PROVIDER].view(_record(request)))


async def cancel_render(request: web.Request) -> web.Response:
    fp, rec = request.app[PROVIDER], _record(request)
    fp.cancel(rec)
    return _json(fp.view(rec))


async def get_output(request: web.Request) -> web.Response:
    fp = request.app[PROVIDER]
    render_id = request.match_info["render_id"]
    counting = request.method == "GET"  # a HEAD neither counts nor uses up an expiring output
    if counting:
        _bump(fp.counters.output_fetches, render_id)
    rec = fp.renders.get(render_id)
    if rec is None or rec.status is not RenderStatus.SUCCEEDED:
        raise ApiFailure(404, "not_found", "No output for this render.")
    if rec.scenario is Scenario.EXPIRED_OUTPUT and rec.output_gets >= 1:
        raise ApiFailure(404, "not_found", "This output has expired.")
    if counting:
        rec.output_gets += 1
    body = NOT_A_VIDEO if rec.scenario is Scenario.BAD_OUTPUT else await render_mp4(rec.clip)
    if rec.request.params.output_mb:
        return await _stream_padded(request, body, rec.request.params.output_mb * 1_000_000)
    return web.Response(body=body, content_type="video/mp4")


PAD_CHUNK = 1 << 20


async def _stream_padded(request: web.Request, mp4: bytes, total: int) -> web.StreamResponse:
    """The clip, then one top-level `free` box filling it up to `total` bytes; players skip such boxes."""
    pad = max(8, total - len(mp4))
    resp = web.StreamResponse(headers={"Content-Type": "video/mp4", "Content-Length": str(len(mp4) + pad)})
    await resp.prepare(request)
    await resp.write(mp4)
    await resp.write(pad.to_bytes(4, "big") + b"free")  # box size (header included) and type
    left, zeros = pad - 8, bytes(PAD_CHUNK)
    while left > 0:
        await resp.write(zeros[: min(left, PAD_CHUNK)])
        left -= PAD_CHUNK
    await resp.write_eof()
    return resp


async def get_counters(request: web.Request) -> web.Response:
    return _json(request.app[PROVIDER].counters)


async def healthz(_: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "service": "fake-provider"})


@web.middleware
async def json_errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiFailure as failure:
        return failure.response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return ApiFailure(exc.status, "not_found" if exc.status == 404 else "invalid_request", exc.reason).response()


def create_app(provider: FakeProvider) -> web.Application:
    app = web.Application(middlewares=[json_errors])
    app[PROVIDER] = provider
    app.router.add_post("/v1/renders", create_render)
    app.router.add_get("/v1/renders", list_renders)
    app.router.add_get("/v1/renders/{render_id}", get_render)
    app.router.add_post("/v1/renders/{render_id}/cancel", cancel_render)
    app.router.add_get("/outputs/{render_id}.mp4", get_output)
    app.router.add_get("/v1/_counters", get_counters)
    app.router.add_get("/healthz", healthz)
    app.cleanup_ctx.append(_background)
    return app


async def _background(app: web.Application) -> AsyncIterator[None]:
    """The callback client and every render and delivery task live exactly as long as the app."""
    provider = app[PROVIDER]
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        provider.session = session
        yield
        await provider.close()


@contextlib.asynccontextmanager
async def running_fake_provider(host: str = "127.0.0.1", port: int = 0, *, webhook_secret: str,
                                public_url: str | None = None, **options: Any) -> AsyncIterator[FakeProvider]:
    """A fake provider listening on `host:port` (0 picks a free port) until the block exits.

    `public_url` is the address put in output URLs; by default the bound address."""
    provider = FakeProvider(webhook_secret=webhook_secret, **options)
    runner = web.AppRunner(create_app(provider), access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
        bound_port = runner.addresses[0][1]
        shown = f"[{host}]" if ":" in host else host
        provider.base_url = (public_url or f"http://{shown}:{bound_port}").rstrip("/")
        yield provider
    finally:
        await runner.cleanup()
