"""The adapter for Luma's Dream Machine API: generations created, polled and deleted, with unsigned callbacks
that only prompt a poll. docs/PROVIDERS.md has the routes, fields and states it reads."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Literal
from urllib.parse import quote

import msgspec

from vidjobs.common.errors import WebhookRejected
from vidjobs.common.jobs import JobRequest
from vidjobs.providers import base, callbacks, checks, http
from vidjobs.providers.base import ModelInfo, ProviderSignal, ProviderState, Submission, SubmitRequest
from vidjobs.providers.http import ErrorTable, HttpAdapter, refusals

API = "/dream-machine/v1"
KEY_SETTING = "VIDJOBS_LUMA_API_KEY"
MODELS = ("ray-2", "ray-flash-2")
PARAMS = {"loop": checks.boolean}  # documented request fields a job may set through `params`
DURATIONS = {5: "5s", 9: "9s"}
RESOLUTIONS = {"480p": "540p", "720p": "720p", "1080p": "1080p"}
FRAMES = [(ratio, resolution) for ratio in base.ALL_RATIOS for resolution in RESOLUTIONS]
# How far back `find` looks for an attempt's generation: a takeover happens within minutes of the crash.
FIND_PAGES, FIND_PAGE_SIZE = 5, 100

# A generation id is a UUID; anything else in a callback is not Luma's.
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.IGNORECASE)
# Luma's words for a request or generation stopped by moderation ("Advanced moderation failed",
# "400: prompt not allowed because advanced moderation failed").
_CONTENT_WORDS = re.compile(r"moderat|not allowed|nsfw|safety|content polic", re.IGNORECASE)
_CREDIT_WORDS = re.compile(r"insufficient credit|out of credit|no credits", re.IGNORECASE)
_TIMEOUT_WORDS = re.compile(r"timed? ?out", re.IGNORECASE)

STATES = {"queued": ProviderState.QUEUED, "dreaming": ProviderState.RUNNING, "completed": ProviderState.SUCCEEDED,
          "failed": ProviderState.FAILED}


# --- Luma's wire format, as far as we read it ----------------------------------------------------------


class _Assets(msgspec.Struct, kw_only=True):
    video: str | None = None


class _Request(msgspec.Struct, kw_only=True):
    callback_url: str | None = None


class _Generation(msgspec.Struct, kw_only=True):
    id: str
    state: Literal["queued", "dreaming", "completed", "failed"]
    failure_reason: str | None = None
    assets: _Assets | None = None
    request: _Request | None = None

    def attempt(self) -> tuple[str | None, int | None]:
        """Our job id and attempt, from the callback URL Luma echoes with the request in every generation."""
        return callbacks.attempt_of(self.request.callback_url if self.request else None)


class _GenerationList(msgspec.Struct, kw_only=True):
    generations: list[_Generation]
    has_more: bool | None = None


class _Frame(msgspec.Struct, kw_only=True):
    type: str
    url: str


class _CreateGeneration(msgspec.Struct, kw_only=True, omit_defaults=True):
    generation_type: Literal["video"]
    model: str
    prompt: str
    aspect_ratio: str
    resolution: str
    duration: str
    loop: bool | None = None
    keyframes: dict[str, _Frame] | None = None  # frame0: the first frame
    callback_url: str | None = None


# --- the adapter ---------------------------------------------------------------------------------------


ERRORS = ErrorTable("Luma", {**refusals(KEY_SETTING), 402: http.NO_CREDIT}, http.read_detail,
                    credit_words=_CREDIT_WORDS, content_words=_CONTENT_WORDS, timeout_words=_TIMEOUT_WORDS)
http_error = ERRORS.error
failure = ERRORS.failure  # a failed generation's `failure_reason` in our taxonomy


class LumaAdapter(HttpAdapter):
    name = "luma"
    errors = ERRORS
    supports_callbacks = True
    forgotten = "Luma has no record of this generation."

    def says_missing(self, body: bytes) -> bool:
        return http.detail_said(body) is not None

    def models(self) -> list[ModelInfo]:
        return [ModelInfo(id=f"luma/{name}", durations_s=sorted(DURATIONS), rounds_up=True,
                          formats=base.formats(base.ALL_RATIOS, RESOLUTIONS), input_image="optional")
                for name in MODELS]

    def validate(self, request: JobRequest) -> None:
        checks.pick_model(self.name, "Luma", request.model_name, dict.fromkeys(MODELS))
        checks.check_params(f"luma/{request.model_name}", request.params, PARAMS)
        _duration(request)
        checks.check_frame(f"luma/{request.model_name}", FRAMES, request)
        checks.check_optional(f"luma/{request.model_name}", request)

    async def submit(self, req: SubmitRequest) -> Submission:
        self.validate(req.request)
        # A video generation is created on its own route, as the official SDK creates one.
        raw = await self.send(f"{API}/generations/video", _create_body(req))
        generation = self.read(raw, _Generation)
        return Submission(provider_job_id=generation.id, state=STATES[generation.state])

    async def find(self, req: SubmitRequest) -> Submission | None:
        """This attempt's generation among the account's most recent ones, matched by the job id and attempt
        that its callback URL carries."""
        for page in range(FIND_PAGES):
            query = {"limit": str(FIND_PAGE_SIZE), "offset": str(page * FIND_PAGE_SIZE)}
            listed = self.read(await self.call("GET", f"{API}/generations", params=query), _GenerationList)
            for generation in listed.generations:
                if generation.attempt() == (req.job_id, req.attempt):
                    return Submission(provider_job_id=generation.id, state=STATES[generation.state])
            if not listed.has_more or len(listed.generations) < FIND_PAGE_SIZE:
                return None
        return None

    async def status(self, provider_job_id: str, *, model_name: str | None = None) -> ProviderSignal:
        return await self.poll(_generation_path(provider_job_id), provider_job_id, self._polled)

    async def cancel(self, provider_job_id: str, *, model_name: str | None = None) -> None:
        # Luma documents no way to stop a generation, only to delete it; a job that no longer wants its
        # render (canceled, deleted, past its deadline) has no use for the generation either. One already
        # gone is nothing to stop.
        await self.call_known("DELETE", _generation_path(provider_job_id))

    def verify_callback(self, headers: Mapping[str, str], body: bytes) -> str:
        """Luma signs nothing, so nothing can be verified: a well-formed generation is stored under an id made
        from its generation id, state and a hash of the whole body. Luma's retries of one delivery send the
        same body and are stored once; a forged body never shares a genuine delivery's id, so it cannot crowd
        the genuine one out, and all it can cause is a status poll."""
        try:
            generation = msgspec.json.decode(body, type=_Generation)
        except msgspec.DecodeError as exc:
            raise WebhookRejected(f"the body is not a Luma generation: {exc}") from exc
        if not _UUID.match(generation.id):
            raise WebhookRejected("the body's id is not a Luma generation id")
        return f"{generation.id}:{generation.state}:{hashlib.sha256(body).hexdigest()[:32]}"

    def parse_callback(self, body: bytes) -> ProviderSignal:
        # Unsigned, so the job is looked up by the generation id we recorded ourselves, never by what the
        # body claims, and the signal only prompts a status poll.
        return msgspec.structs.replace(_signal(self.read(body, _Generation)), verified=False)

    def _polled(self, raw: bytes) -> ProviderSignal:
        # Luma's own answer, so the job and attempt its callback URL carries can be believed.
        generation = self.read(raw, _Generation)
        job_id, attempt = generation.attempt()
        return msgspec.structs.replace(_signal(generation), job_id=job_id, attempt=attempt)


# --- translation ---------------------------------------------------------------------------------------


def _signal(generation: _Generation) -> ProviderSignal:
    state = STATES[generation.state]
    video = generation.assets.video if generation.assets else None
    return ProviderSignal(
        provider_job_id=generation.id, state=state,
        output_url=video if state is ProviderState.SUCCEEDED else None,
        error=failure(generation.failure_reason) if state is ProviderState.FAILED else None,
    )


def _duration(request: JobRequest) -> str:
    return DURATIONS[checks.round_up(f"luma/{request.model_name}", DURATIONS, request)]


def _create_body(req: SubmitRequest) -> _CreateGeneration:
    r = req.request
    keyframes = None
    if r.input_image is not None:
        keyframes = {"frame0": _Frame(type="image", url=http.image_address(req, "Luma"))}
    return _CreateGeneration(
        generation_type="video", model=r.model_name, prompt=r.prompt, aspect_ratio=r.aspect_ratio,
        resolution=RESOLUTIONS[r.resolution], duration=_duration(r), loop=r.params.get("loop"), keyframes=keyframes,
        callback_url=callbacks.tagged(req.callback_url, req.job_id, req.attempt),
    )


def _generation_path(provider_job_id: str) -> str:
    return f"{API}/generations/{quote(provider_job_id, safe='')}"
