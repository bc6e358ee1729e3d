"""The fake provider's renders and how each scenario plays them out: submits refused or accepted, renders run
(or hung, rejected, failed), outputs served (or spoiled), and a callback queued at every change.

`params.scenario` picks a behaviour from docs/FAKE_PROVIDER.md's table and `params.render_s` how long rendering takes. A
finished render reports what it was billed (`cost_usd`): `params.cost_usd`, or by default USD_PER_SECOND of
video; a render that failed after it started reports `params.failed_cost_usd`, if given (a partial render).
An `input_image_url` is fetched when the render starts, as a real provider would, and must decode as an
image; if it cannot be fetched or read, the render fails with `invalid_request`. The image's mean colour tints
the clip, and what was fetched is recorded in the counters (`input_images`, by job).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import msgspec

from vidjobs.common import ids, signatures
from vidjobs.fakeprovider import input_images
from vidjobs.fakeprovider.background import BackgroundTasks
from vidjobs.fakeprovider.callback_delivery import CallbackCourier
from vidjobs.fakeprovider.clip_cache import ClipCache, default_dir
from vidjobs.fakeprovider.clips import ClipKind, ClipSpec, clip_size, real_spec, render_mp4
from vidjobs.fakeprovider.weather import Callbacks, Weather
from vidjobs.fakeprovider.wire import (
    FINISHED,
    ApiFailure,
    CallbackEvent,
    Counters,
    CreateRender,
    FetchedImage,
    RenderError,
    RenderOut,
    RenderStatus,
    Scenario,
    billed_as,
    bump,
)

log = logging.getLogger("vidjobs.fake_provider")

RETRY_AFTER_S = 1  # what a refused submit is told to wait
REFUSALS_PER_JOB = 2  # rate_limit_then_succeed / unavailable_then_succeed refuse this many submits first
NOT_A_VIDEO = b"<html><body>502 Bad Gateway</body></html>\n"  # what bad_output serves as its "video"
# What unsafe_output reports as its render: the cloud metadata service, which a downloader must never fetch.
UNSAFE_OUTPUT_URL = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
CLIP_CACHE_BYTES = 2 * 1024**3  # real clips kept on disk by default: ~200 ten-second 1080p clips

# What our account with the provider answers when it refuses us, whatever the request (no_credit, key_refused;
# key_revoked's calls after its submit).
ACCOUNT_REFUSALS = {
    Scenario.NO_CREDIT: (402, "insufficient_credit", "Your account has no credit left; top it up to render."),
    Scenario.KEY_REFUSED: (401, "invalid_api_key", "The API key is invalid or has been revoked."),
}


def refused_account(scenario: Scenario) -> ApiFailure:
    """The answer of an account the provider refuses, as `scenario` refuses it."""
    return ApiFailure(*ACCOUNT_REFUSALS[scenario])

# A clip as served: a tiny clip's bytes, or a real clip's file.
ClipData = bytes | Path


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
    task: asyncio.Task[None] | None = None
    deliveries: asyncio.Task[None] | None = None  # the latest callback; the next one waits for it (keeps order)
    ordinal: int = 1  # which of its job's renders this is (fail_then_succeed fails the first few)

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


class FakeProvider(BackgroundTasks):
    """All state of one fake provider: its renders, its counters and its in-flight background work."""

    def __init__(self, *, webhook_secret: str, callback_attempts: int = 4, callback_backoff_s: float = 0.25,
                 clip: ClipKind = ClipKind.TINY, clip_cache: ClipCache | None = None):
        signatures.decode_secret(webhook_secret)  # a bad secret fails at start, not at the first callback
        BackgroundTasks.__init__(self)
        self.clip_kind = clip  # what a render makes unless its params.clip says otherwise
        self.clip_cache = clip_cache or ClipCache(default_dir(), CLIP_CACHE_BYTES)
        self.base_url = ""  # set once the server is listening
        self.renders: dict[str, RenderRecord] = {}
        self.by_key: dict[str, str] = {}
        self.counters = Counters()
        self.weather = Weather()  # the whole provider's behaviour beside each render's scenario (weather.py)
        self.courier = CallbackCourier(webhook_secret, callback_attempts, callback_backoff_s,
                                       delivered=self.counters.callbacks_by_render)
        self.session: aiohttp.ClientSession | None = None  # for input images and callbacks, while serving

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
            cost_usd=billed_as(req, rec.status, rec.started_at is not None),
            metadata=req.metadata, idempotency_key=rec.idempotency_key,
        )

    def output_url(self, rec: RenderRecord) -> str:
        if rec.scenario is Scenario.UNSAFE_OUTPUT:
            return UNSAFE_OUTPUT_URL
        return f"{self.base_url}/outputs/{rec.id}.mp4"

    def _session(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise RuntimeError("the fake provider is not serving: it has no HTTP client")
        return self.session

    # submissions

    def submit(self, req: CreateRender, key: str | None) -> tuple[RenderRecord, bool]:
        """The render for this request and whether it already existed. No await inside: two concurrent
        submits with one key cannot both pass the lookup."""
        job_id = req.metadata.job_id
        bump(self.counters.submissions_by_job, job_id)
        bump(self.counters.submissions_by_key, key)
        if key is not None and key in self.by_key:
            return self.renders[self.by_key[key]], True
        self._maybe_refuse(req)
        rec = self._create(req, key)
        bump(self.counters.renders_by_job, job_id)
        rec.ordinal = self.counters.renders_by_job.get(job_id or "", 1)
        if job_id is not None:
            bump(self.counters.renders_by_attempt, f"{job_id}/{req.metadata.attempt}")
        rec.task = self.spawn(self._run(rec), name=f"render-{rec.id}")
        log.info("render accepted", extra={"render_id": rec.id, "job_id": job_id, "scenario": rec.scenario.value})
        return rec, False

    def loses_answer(self, rec: RenderRecord) -> bool:
        """Whether the answer to this accepted submit is to be lost (late or dropped); counted if so."""
        if rec.scenario not in (Scenario.ACCEPT_THEN_TIMEOUT, Scenario.ACCEPT_THEN_DROP):
            return False
        bump(self.counters.lost_answers_by_job, rec.request.metadata.job_id)
        return True

    def _maybe_refuse(self, req: CreateRender) -> None:
        scenario = req.params.scenario
        if scenario in ACCOUNT_REFUSALS:
            bump(self.counters.refusals_by_job, req.metadata.job_id)
            raise refused_account(scenario)
        if scenario not in (Scenario.RATE_LIMIT_THEN_SUCCEED, Scenario.UNAVAILABLE_THEN_SUCCEED):
            return
        job_key = req.metadata.job_id or ""
        if self.counters.refusals_by_job.get(job_key, 0) >= REFUSALS_PER_JOB:
            return
        bump(self.counters.refusals_by_job, job_key)
        if scenario is Scenario.RATE_LIMIT_THEN_SUCCEED:
            raise ApiFailure(429, "rate_limit_exceeded", "Too many concurrent renders for this account.",
                             headers={"Retry-After": str(RETRY_AFTER_S)})
        raise ApiFailure(503, "service_unavailable", "The render fleet is temporarily unavailable.")

    def _create(self, req: CreateRender, key: str | None) -> RenderRecord:
        seed = req.seed if req.seed is not None else secrets.randbelow(2**31)  # reported back, so reproducible
        rec = RenderRecord(id=ids.new("rnd"), request=req, clip=self._clip_spec(req, seed), idempotency_key=key)
        self.renders[rec.id] = rec
        if key is not None:
            self.by_key[key] = rec.id
        return rec

    def _clip_spec(self, req: CreateRender, seed: int) -> ClipSpec:
        if ClipKind(req.params.clip or self.clip_kind) is ClipKind.REAL:
            return real_spec(req.aspect_ratio, req.resolution, req.duration_s, seed)
        width, height = clip_size(req.aspect_ratio)
        return ClipSpec(width, height, req.duration_s, seed)

    async def clip_data(self, spec: ClipSpec) -> ClipData:
        """A tiny clip's bytes (kept in memory) or a real clip's file (kept on disk), made on first use."""
        return await self.clip_cache.get(spec) if spec.real else await render_mp4(spec)

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
        if rec.scenario is Scenario.FAIL_ALWAYS or (
                rec.scenario is Scenario.FAIL_THEN_SUCCEED and rec.ordinal <= rec.request.params.failures):
            self._finish(rec, RenderStatus.FAILED, RenderError(
                "render_failed", "The render node ran out of GPU memory; try again."))
            return
        self._finish(rec, RenderStatus.SUCCEEDED)

    async def _take_input_image(self, rec: RenderRecord) -> bool:
        """Fetch and decode the input image; on failure the render fails, as the request was unusable."""
        url = rec.request.input_image_url
        assert url is not None
        try:
            data, image = await input_images.take(self._session(), url)
        except ValueError as exc:
            log.warning("input image unusable", extra={"render_id": rec.id, "error": str(exc)})
            self._finish(rec, RenderStatus.FAILED, RenderError("invalid_request", f"input_image_url: {exc}"))
            return False
        self.counters.input_images[rec.request.metadata.job_id or rec.id] = FetchedImage(
            render_id=rec.id, sha256=hashlib.sha256(data).hexdigest(), bytes=len(data), format=image.format,
            width=image.width, height=image.height)
        rec.clip = msgspec.structs.replace(rec.clip, tint=image.mean)
        return True

    async def _produce(self, rec: RenderRecord) -> None:
        if rec.scenario is not Scenario.BAD_OUTPUT:
            await self.clip_data(rec.clip)  # cached, so serving the output later costs nothing

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

    # outputs

    async def output(self, render_id: str, *, counting: bool) -> tuple[RenderRecord, ClipData]:
        """A finished render and its clip (not padded); ApiFailure 404 if there is none to serve.
        `counting` fetches are counted and use up an expiring output."""
        if counting:
            bump(self.counters.output_fetches, render_id)
        rec = self.renders.get(render_id)
        if rec is None or rec.status is not RenderStatus.SUCCEEDED:
            raise ApiFailure(404, "not_found", "No output for this render.")
        if rec.scenario is Scenario.EXPIRED_OUTPUT and rec.output_gets >= 1:
            raise ApiFailure(404, "not_found", "This output has expired.")
        if counting:
            rec.output_gets += 1
        return rec, NOT_A_VIDEO if rec.scenario is Scenario.BAD_OUTPUT else await self.clip_data(rec.clip)

    # callbacks

    def notify(self, rec: RenderRecord) -> None:
        """Queue a signed callback with the render as it is now, after any earlier one for this render."""
        url = rec.request.callback_url
        if url is None or rec.scenario is Scenario.NO_CALLBACK or (
                rec.scenario is Scenario.NO_FINAL_CALLBACK and rec.status in FINISHED):
            return
        event = CallbackEvent(type=f"render.{rec.status.value}", timestamp=datetime.now(UTC), data=self.view(rec))
        body = msgspec.json.encode(event)
        repeat = (rec.scenario is Scenario.DUPLICATE_CALLBACKS and rec.status in FINISHED
                  or self.weather.callbacks is Callbacks.TWICE)
        late_s = self.weather.delay_s if self.weather.callbacks is Callbacks.LATE else 0.0
        rec.deliveries = self.spawn(
            self.courier.send_after(self._session(), rec.deliveries, rec.id, url, body, repeat=repeat,
                                    late_s=late_s),
            name=f"callback-{rec.id}")
